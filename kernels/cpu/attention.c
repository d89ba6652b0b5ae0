/* CPU kernels for fused attention (core/op_attention.c) and its backward helper.
 *
 * The Tq x Tk score matrix is never stored: a task handles a block of ATT_RB query rows
 * (forward, dq) or key rows (dk, dv) of one leading index, one row at a time, with
 * Tk- (or Tq-) long scratch rows. The other operand is first transposed into the
 * thread's scratch (hd x T) so that every inner loop runs over contiguous memory with
 * independent accumulators (vectorisable without reordering any sum).
 * The backward is two passes, dq over query blocks and dk, dv over key blocks, both
 * recomputing the probabilities from q, k and lse: each output row is written by one
 * task, so there are no atomics and results do not depend on the number of threads.
 * The math is the exact softmax(scale q k^T [mask]) v; scores and products accumulate
 * in the data type (as the BLAS products of the composed ops do), row sums in double. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu.h"
#include "fastmath.h"

#define ATT_RB 16

/* float32 exps on the vectorisable rm_expf (each exp loop below is a SIMD loop of its
 * own), float64 on libm */
#define EXP(x) _Generic((x), float: rm_expf, default: exp)(x)

/* Geometry shared by both kernels. */
typedef struct {
  int64_t bh, Tq, Tk, hd, off; /* off = Tk - Tq: causal query i sees keys j <= i + off */
  bool causal;
  double scale;
} att_geo;

static void geometry(rm_tensor *const *in, const rm_attrs *a, att_geo *g) {
  const rm_tensor *q = in[0], *k = in[1];
  int n = q->ndim;
  g->hd = q->shape[n - 1];
  g->Tq = q->shape[n - 2];
  g->Tk = k->shape[n - 2];
  g->bh = 1;
  for (int d = 0; d < n - 2; d++) g->bh *= q->shape[d];
  g->off = g->Tk - g->Tq;
  g->causal = a->i[0] != 0;
  g->scale = a->f[0] != 0 ? a->f[0] : 1.0 / sqrt((double)(g->hd > 0 ? g->hd : 1));
}

/* Keys that query i sees: [0, key_end). */
static inline int64_t key_end(const att_geo *g, int64_t i) {
  return g->causal ? i + g->off + 1 : g->Tk;
}

/* First query that sees key j. */
static inline int64_t query_start(const att_geo *g, int64_t j) {
  return g->causal && j - g->off > 0 ? j - g->off : 0;
}

/* Per-thread scratch: one workspace tensor (accounted, honours the memory limit) of
 * nth slices of `per` elements each. */
static rm_tensor *scratch(rm_ctx *ctx, rm_dtype dt, int nth, int64_t per) {
  int64_t n = (int64_t)nth * (per > 0 ? per : 1);
  return rm_tensor_new(ctx, dt, RM_CPU, 1, &n, RM_CAT_WORKSPACE);
}

/* dst (hd x ld) = rows [r0, r1) of src (rows x hd), transposed, times mul. */
#define DEFINE_TRANSPOSE(T)                                                          \
  static void transpose_##T(const T *src, int64_t r0, int64_t r1, int64_t hd, T mul, \
                            T *dst, int64_t ld) {                                    \
    for (int64_t r = r0; r < r1; r++)                                                \
      for (int64_t d = 0; d < hd; d++) dst[d * ld + (r - r0)] = src[r * hd + d] * mul; \
  }

/* out[0, n) = sum_d x[d] * mT[d * ld + (0, n)] (mT: a transposed block). */
#define DEFINE_ROWDOT(T)                                                                \
  static void rowdots_##T(const T *x, const T *mT, int64_t hd, int64_t ld, int64_t n, \
                          T *out) {                                                     \
    for (int64_t j = 0; j < n; j++) out[j] = 0;                                         \
    for (int64_t d = 0; d < hd; d++) {                                                  \
      T xd = x[d];                                                                      \
      const T *row = mT + d * ld;                                                       \
      _Pragma("omp simd")                                                             \
      for (int64_t j = 0; j < n; j++) out[j] += xd * row[j];                            \
    }                                                                                   \
  }

/* ---- forward: in q, k, v; out y, lse ---- */

#define DEFINE_FWD(T)                                                                    \
  static void fwd_##T(const att_geo *g, const T *q, const T *k, const T *v, T *y, T *lse, \
                      T *work, int64_t per) {                                            \
    int64_t nb = (g->Tq + ATT_RB - 1) / ATT_RB, hd = g->hd, Tq = g->Tq, Tk = g->Tk;    \
    _Pragma("omp for schedule(dynamic, 1)")                                              \
    for (int64_t t = 0; t < g->bh * nb; t++) {                                           \
      T *qs = work + per * omp_get_thread_num(), *kT = qs + hd, *s = kT + hd * Tk;      \
      int64_t b = t / nb, i0 = t % nb * ATT_RB;                                          \
      int64_t i1 = i0 + ATT_RB < Tq ? i0 + ATT_RB : Tq;                                  \
      const T *qb = q + b * Tq * hd, *kb = k + b * Tk * hd, *vb = v + b * Tk * hd;       \
      int64_t kmax = key_end(g, i1 - 1);                                                 \
      transpose_##T(kb, 0, kmax, hd, (T)1, kT, kmax);                                    \
      for (int64_t i = i0; i < i1; i++) {                                                \
        int64_t ke = key_end(g, i);                                                      \
        T *yr = y + (b * Tq + i) * hd;                                                   \
        for (int64_t d = 0; d < hd; d++) qs[d] = qb[i * hd + d] * (T)g->scale;           \
        rowdots_##T(qs, kT, hd, kmax, ke, s);                                            \
        T m = -INFINITY;                                                                 \
        for (int64_t j = 0; j < ke; j++)                                                 \
          if (s[j] > m) m = s[j];                                                        \
        double l = 0;                                                                    \
        _Pragma("omp simd")                                                             \
        for (int64_t j = 0; j < ke; j++) s[j] = EXP(s[j] - m);                           \
        _Pragma("omp simd reduction(+:l)")                                              \
        for (int64_t j = 0; j < ke; j++) l += s[j];                                      \
        for (int64_t d = 0; d < hd; d++) yr[d] = 0;                                      \
        for (int64_t j = 0; j < ke; j++) {                                               \
          T p = s[j];                                                                    \
          const T *vr = vb + j * hd;                                                     \
          _Pragma("omp simd")                                                           \
          for (int64_t d = 0; d < hd; d++) yr[d] += p * vr[d];                           \
        }                                                                                \
        T inv = l > 0 ? (T)(1.0 / l) : (T)0;                                             \
        for (int64_t d = 0; d < hd; d++) yr[d] *= inv;                                   \
        lse[b * Tq + i] = (T)(m + log(l));                                               \
      }                                                                                  \
    }                                                                                    \
  }

/* ---- backward: in q, k, v, y, lse, gy; out gq, gk, gv ----
 * ds_ij = p_ij (dp_ij - D_i), dp_ij = gy_i . v_j, D_i = gy_i . y_i;
 * gq_i = scale sum_j ds_ij k_j, gk_j = scale sum_i ds_ij q_i, gv_j = sum_i p_ij gy_i. */

#define DEFINE_BWD(T)                                                                    \
  static void bwd_dq_##T(const att_geo *g, const T *q, const T *k, const T *v, const T *y, \
                         const T *lse, const T *gy, T *gq, T *work, int64_t per) {       \
    int64_t nb = (g->Tq + ATT_RB - 1) / ATT_RB, hd = g->hd, Tq = g->Tq, Tk = g->Tk;    \
    _Pragma("omp for schedule(dynamic, 1)")                                              \
    for (int64_t t = 0; t < g->bh * nb; t++) {                                           \
      T *qs = work + per * omp_get_thread_num(), *kT = qs + hd, *vT = kT + hd * Tk;     \
      T *s = vT + hd * Tk, *dp = s + Tk;                                                 \
      int64_t b = t / nb, i0 = t % nb * ATT_RB;                                          \
      int64_t i1 = i0 + ATT_RB < Tq ? i0 + ATT_RB : Tq;                                  \
      const T *kb = k + b * Tk * hd, *vb = v + b * Tk * hd;                              \
      int64_t kmax = key_end(g, i1 - 1);                                                 \
      transpose_##T(kb, 0, kmax, hd, (T)1, kT, kmax);                                    \
      transpose_##T(vb, 0, kmax, hd, (T)1, vT, kmax);                                    \
      for (int64_t i = i0; i < i1; i++) {                                                \
        int64_t r = b * Tq + i, ke = key_end(g, i);                                      \
        const T *gyr = gy + r * hd, *yr = y + r * hd;                                    \
        T *gqr = gq + r * hd;                                                            \
        double D = 0;                                                                    \
        for (int64_t d = 0; d < hd; d++) {                                               \
          qs[d] = q[r * hd + d] * (T)g->scale;                                           \
          D += (double)gyr[d] * yr[d];                                                   \
        }                                                                                \
        rowdots_##T(qs, kT, hd, kmax, ke, s);                                            \
        rowdots_##T(gyr, vT, hd, kmax, ke, dp);                                          \
        T L = lse[r], Dt = (T)D;                                                         \
        for (int64_t d = 0; d < hd; d++) gqr[d] = 0;                                     \
        _Pragma("omp simd")                                                             \
        for (int64_t j = 0; j < ke; j++) s[j] = EXP(s[j] - L);                           \
        for (int64_t j = 0; j < ke; j++) {                                               \
          T ds = s[j] * (dp[j] - Dt);                                                    \
          const T *kr = kb + j * hd;                                                     \
          _Pragma("omp simd")                                                           \
          for (int64_t d = 0; d < hd; d++) gqr[d] += ds * kr[d];                         \
        }                                                                                \
        for (int64_t d = 0; d < hd; d++) gqr[d] *= (T)g->scale;                          \
      }                                                                                  \
    }                                                                                    \
  }                                                                                      \
                                                                                         \
  static void bwd_dkv_##T(const att_geo *g, const T *q, const T *k, const T *v, const T *y, \
                          const T *lse, const T *gy, T *gk, T *gv, T *work, int64_t per) { \
    int64_t nb = (g->Tk + ATT_RB - 1) / ATT_RB, hd = g->hd, Tq = g->Tq, Tk = g->Tk;    \
    _Pragma("omp for schedule(dynamic, 1)")                                              \
    for (int64_t t = 0; t < g->bh * nb; t++) {                                           \
      T *qT = work + per * omp_get_thread_num(), *gT = qT + hd * Tq;                    \
      T *s = gT + hd * Tq, *dp = s + Tq, *D = dp + Tq;                                   \
      int64_t b = t / nb, j0 = t % nb * ATT_RB;                                          \
      int64_t j1 = j0 + ATT_RB < Tk ? j0 + ATT_RB : Tk;                                  \
      const T *qb = q + b * Tq * hd, *gyb = gy + b * Tq * hd, *yb = y + b * Tq * hd;     \
      const T *Lb = lse + b * Tq;                                                        \
      int64_t is = query_start(g, j0), nq = Tq - is;                                     \
      transpose_##T(qb, is, Tq, hd, (T)g->scale, qT, nq);                                \
      transpose_##T(gyb, is, Tq, hd, (T)1, gT, nq);                                      \
      for (int64_t i = is; i < Tq; i++) {                                                \
        double acc = 0;                                                                  \
        for (int64_t d = 0; d < hd; d++) acc += (double)gyb[i * hd + d] * yb[i * hd + d]; \
        D[i - is] = (T)acc;                                                              \
      }                                                                                  \
      for (int64_t j = j0; j < j1; j++) {                                                \
        int64_t r = b * Tk + j, i0 = query_start(g, j) - is;                             \
        T *gkr = gk + r * hd, *gvr = gv + r * hd;                                        \
        /* scores of key j against queries is + [i0, nq), stored from s[i0] */          \
        rowdots_##T(k + r * hd, qT + i0, hd, nq, nq - i0, s + i0);                       \
        rowdots_##T(v + r * hd, gT + i0, hd, nq, nq - i0, dp + i0);                      \
        for (int64_t d = 0; d < hd; d++) gkr[d] = gvr[d] = 0;                            \
        _Pragma("omp simd")                                                             \
        for (int64_t i = i0; i < nq; i++) s[i] = EXP(s[i] - Lb[is + i]);                 \
        for (int64_t i = i0; i < nq; i++) {                                              \
          T p = s[i], ds = p * (dp[i] - D[i]);                                           \
          const T *qr = qb + (is + i) * hd, *gr = gyb + (is + i) * hd;                   \
          _Pragma("omp simd")                                                           \
          for (int64_t d = 0; d < hd; d++) {                                             \
            gvr[d] += p * gr[d];                                                         \
            gkr[d] += ds * qr[d];                                                        \
          }                                                                              \
        }                                                                                \
        for (int64_t d = 0; d < hd; d++) gkr[d] *= (T)g->scale;                          \
      }                                                                                  \
    }                                                                                    \
  }

typedef double f64;
typedef float f32;
DEFINE_TRANSPOSE(f32)
DEFINE_TRANSPOSE(f64)
DEFINE_ROWDOT(f32)
DEFINE_ROWDOT(f64)
DEFINE_FWD(f32)
DEFINE_FWD(f64)
DEFINE_BWD(f32)
DEFINE_BWD(f64)

/* Threads for a problem of this much work (1 below the parallel threshold). */
static int threads_for(const att_geo *g) {
  double work = (double)g->bh * (double)g->Tq * (double)g->Tk * (double)(g->hd > 0 ? g->hd : 1);
  return work > RM_CPU_PAR_MIN ? omp_get_max_threads() : 1;
}

static int attention_contig(rm_ctx *ctx, rm_tensor *const *in, rm_tensor *const *out, const rm_attrs *a);
static int attention_backward_contig(rm_ctx *ctx, rm_tensor *const *in, rm_tensor *const *out,
                                     const rm_attrs *a);

/* The ops take strided inputs (the CUDA kernels read (B, H, T, D) views of a packed
 * projection in place); these kernels walk contiguous rows: c[i] is in[i] itself (held)
 * or a contiguous workspace copy made by the copy kernel (nothing recorded). */
RM_CPU_KERNEL(copy);

static int contig_inputs(rm_ctx *ctx, int nin, rm_tensor *const *in, rm_tensor **c) {
  int rc = RM_OK;
  rm_attrs none;
  memset(&none, 0, sizeof none);
  for (int i = 0; i < nin; i++) c[i] = NULL;
  for (int i = 0; i < nin && !rc; i++) {
    rm_tensor *t = in[i];
    if (rm_tensor_is_contiguous(t)) {
      rm_tensor_hold(t);
      c[i] = t;
      continue;
    }
    c[i] = rm_tensor_new(ctx, t->dtype, RM_CPU, t->ndim, t->shape, RM_CAT_WORKSPACE);
    rc = c[i] ? rm_cpu_copy(ctx, 1, &t, 1, &c[i], &none) : (ctx->err_code ? ctx->err_code : RM_ERR_OOM);
  }
  if (rc)
    for (int i = 0; i < nin; i++) rm_tensor_drop(ctx, c[i]), c[i] = NULL;
  return rc;
}

static void drop_inputs(rm_ctx *ctx, int nin, rm_tensor **c) {
  for (int i = 0; i < nin; i++) rm_tensor_drop(ctx, c[i]);
}

RM_CPU_KERNEL(attention) {
  (void)nout;
  rm_tensor *c[3];
  if (nin != 3 || contig_inputs(ctx, nin, in, c)) return ctx->err_code ? ctx->err_code : RM_ERR_ARG;
  int rc = attention_contig(ctx, c, out, a);
  drop_inputs(ctx, nin, c);
  return rc;
}

RM_CPU_KERNEL(attention_backward) {
  (void)nout;
  rm_tensor *c[6];
  if (nin != 6 || contig_inputs(ctx, nin, in, c)) return ctx->err_code ? ctx->err_code : RM_ERR_ARG;
  int rc = attention_backward_contig(ctx, c, out, a);
  drop_inputs(ctx, nin, c);
  return rc;
}

static int attention_contig(rm_ctx *ctx, rm_tensor *const *in, rm_tensor *const *out, const rm_attrs *a) {
  att_geo g;
  geometry(in, a, &g);
  if (g.bh * g.Tq == 0) return RM_OK;
  int nth = threads_for(&g);
  int64_t per = g.hd + g.hd * g.Tk + g.Tk;
  rm_tensor *w = scratch(ctx, in[0]->dtype, nth, per);
  if (!w) return ctx->err_code;
  void *q = rm_tensor_ptr(in[0]), *k = rm_tensor_ptr(in[1]), *v = rm_tensor_ptr(in[2]);
  void *y = rm_tensor_ptr(out[0]), *lse = rm_tensor_ptr(out[1]), *wp = rm_tensor_ptr(w);
  bool dbl = in[0]->dtype == RM_F64;
  #pragma omp parallel num_threads(nth) if (nth > 1)
  {
    if (dbl) fwd_f64(&g, q, k, v, y, lse, wp, per);
    else fwd_f32(&g, q, k, v, y, lse, wp, per);
  }
  rm_tensor_drop(ctx, w);
  return RM_OK;
}

static int attention_backward_contig(rm_ctx *ctx, rm_tensor *const *in, rm_tensor *const *out,
                                     const rm_attrs *a) {
  att_geo g;
  geometry(in, a, &g);
  if (g.bh == 0) return RM_OK;
  int nth = threads_for(&g);
  int64_t per_q = g.hd + 2 * g.hd * g.Tk + 2 * g.Tk, per_k = 2 * g.hd * g.Tq + 3 * g.Tq;
  int64_t per = per_q > per_k ? per_q : per_k;
  rm_tensor *w = scratch(ctx, in[0]->dtype, nth, per);
  if (!w) return ctx->err_code;
  void *q = rm_tensor_ptr(in[0]), *k = rm_tensor_ptr(in[1]), *v = rm_tensor_ptr(in[2]);
  void *y = rm_tensor_ptr(in[3]), *lse = rm_tensor_ptr(in[4]), *gy = rm_tensor_ptr(in[5]);
  void *gq = rm_tensor_ptr(out[0]), *gk = rm_tensor_ptr(out[1]), *gv = rm_tensor_ptr(out[2]);
  void *wp = rm_tensor_ptr(w);
  bool dbl = in[0]->dtype == RM_F64;
  #pragma omp parallel num_threads(nth) if (nth > 1)
  {
    if (dbl) {
      bwd_dq_f64(&g, q, k, v, y, lse, gy, gq, wp, per);
      bwd_dkv_f64(&g, q, k, v, y, lse, gy, gk, gv, wp, per);
    } else {
      bwd_dq_f32(&g, q, k, v, y, lse, gy, gq, wp, per);
      bwd_dkv_f32(&g, q, k, v, y, lse, gy, gk, gv, wp, per);
    }
  }
  rm_tensor_drop(ctx, w);
  return RM_OK;
}
