/* CPU kernels for fused attention (core/op_attention.c) and its backward helper.
 *
 * Blocked over query rows, with the BLAS for every product: a task takes one leading
 * index (b) and a block of BQ query rows, computes their scores against the keys they
 * can see with one GEMM (BQ x kmax, sized by SCORE_BUDGET to stay in cache), turns them
 * into probabilities in place (a vectorised row pass), and multiplies by v with a
 * second GEMM. The Tq x Tk matrix is never stored whole.
 * Backward recomputes the probabilities of each block from q, k and lse, then
 *   dp = gy v^T, ds = p (dp - D) scale (D_i = gy_i . y_i),
 *   gq = ds k, gk += ds^T q, gv += p^T gy      (five GEMMs a block)
 * with one task per leading index walking its query blocks in order: gk and gv are
 * accumulated by one thread in a fixed order, so there are no atomics and the results
 * do not depend on the number of threads.
 * q, k, v, y and gy are read in place when their rows are contiguous; anything else is
 * first copied. y, gq, gk and gv are written as rows ld apart. The packed form
 * (attention(qkv), attention_qkv_backward) runs the same code on (B, H, T, D) views
 * (core/attention_views.h): q, k, v rows 3C apart inside the projection, y rows C apart
 * in its (B, T, C) output, gq, gk, gv rows 3C apart in the three parts of one dqkv, so
 * it computes the same numbers as the three-input form and moves no data. When there are fewer tasks than threads, the loop runs on one thread and the
 * BLAS calls use the threads instead.
 * float32 row passes use rm_expf (vectorised, per ISA); float64 stays on libm. Row
 * sums are accumulated in double. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "../../core/attention_views.h"
#include "cpu.h"
#include "fastmath.h"

/* Scores a task holds at once (elements): BQ = SCORE_BUDGET / Tk rows, a multiple of 8
 * in [8, 256], so a block's scores (and, in backward, dp) stay in L2. */
#define SCORE_BUDGET 16384

typedef struct {
  int64_t bh, Tq, Tk, hd, off; /* off = Tk - Tq: causal query i sees keys j <= i + off */
  int64_t bq;                  /* query rows per block */
  bool causal;
  double scale;
} att_geo;

static void geometry(const rm_tensor *const *in, const rm_attrs *a, att_geo *g) {
  const rm_tensor *q = in[0], *k = in[1];
  int n = q->ndim;
  g->hd = q->shape[n - 1];
  g->Tq = q->shape[n - 2];
  g->Tk = k->shape[n - 2];
  g->bh = 1;
  for (int d = 0; d < n - 2; d++) g->bh *= q->shape[d];
  g->off = g->Tk - g->Tq;
  g->causal = a->attention.causal;
  g->scale = a->attention.scale != 0 ? a->attention.scale : 1.0 / sqrt((double)(g->hd > 0 ? g->hd : 1));
  int64_t bq = SCORE_BUDGET / (g->Tk > 1 ? g->Tk : 1) / 8 * 8;
  g->bq = bq < 8 ? 8 : bq > 256 ? 256 : bq;
}

/* Keys that query i sees: [0, key_end). */
static inline int64_t key_end(const att_geo *g, int64_t i) { return g->causal ? i + g->off + 1 : g->Tk; }

/* A (..., T, hd) operand as the BLAS reads it: base pointer, row stride (ld) and the
 * element offset of each leading index. */
typedef struct {
  const rm_tensor *t;
  char *p;
  int64_t ld;
} mat;

static mat mat_of(const rm_tensor *t, int64_t hd) {
  int n = t->ndim;
  mat m = { t, rm_tensor_ptr(t), n >= 2 && t->shape[n - 2] > 1 ? t->stride[n - 2] : (hd > 1 ? hd : 1) };
  return m;
}

/* Address of row 0 of leading index b. */
static void *mat_at(const mat *m, int64_t b, size_t es) {
  const rm_tensor *t = m->t;
  int64_t off = 0;
  for (int d = t->ndim - 3; d >= 0; d--) {
    off += b % t->shape[d] * t->stride[d];
    b /= t->shape[d];
  }
  return m->p + off * (int64_t)es;
}

/* Whether the BLAS can read t's (T, hd) matrices in place: unit column stride, rows
 * at least hd apart, strides within int. */
static bool blas_readable(const rm_tensor *t) {
  int n = t->ndim;
  int64_t hd = t->shape[n - 1], T = t->shape[n - 2];
  if (hd > 1 && t->stride[n - 1] != 1) return false;
  if (T > 1 && (t->stride[n - 2] < hd || t->stride[n - 2] >= INT32_MAX)) return false;
  for (int d = 0; d < n - 2; d++)
    if (t->stride[d] < 0) return false;
  return true;
}

/* ---- row passes over one block of scores (f32 vectorised per ISA) ----
 * fwd: s (nq x n, ld n) holds q k^T for queries i0.. ; each row becomes its
 * probabilities (0 beyond the keys it sees) and lse[i] its log-sum-exp.
 * bwd: s becomes scale * p (dp - D) and p (written to p), from s = q k^T, dp = gy v^T. */

#define DEFINE_ROWS(T, EXPF, MV)                                                                 \
  MV(void, fwd_rows_##T,                                                                         \
     (const att_geo *g, int64_t i0, int64_t nq, int64_t n, T *restrict s, T *restrict lse),     \
     (g, i0, nq, n, s, lse), {                                                                   \
       T sc = (T)g->scale;                                                                       \
       for (int64_t r = 0; r < nq; r++) {                                                        \
         T *row = s + r * n;                                                                     \
         int64_t ke = key_end(g, i0 + r);                                                        \
         T m = -INFINITY;                                                                        \
         _Pragma("omp simd reduction(max:m)")                                                    \
         for (int64_t j = 0; j < ke; j++) {                                                      \
           T x = row[j] * sc;                                                                    \
           row[j] = x;                                                                           \
           m = x > m ? x : m;                                                                    \
         }                                                                                       \
         double l = 0;                                                                           \
         _Pragma("omp simd reduction(+:l)")                                                      \
         for (int64_t j = 0; j < ke; j++) {                                                      \
           T e = EXPF(row[j] - m);                                                               \
           row[j] = e;                                                                           \
           l += e;                                                                               \
         }                                                                                       \
         T inv = l > 0 ? (T)(1.0 / l) : (T)0;                                                    \
         _Pragma("omp simd")                                                                     \
         for (int64_t j = 0; j < ke; j++) row[j] *= inv;                                         \
         for (int64_t j = ke; j < n; j++) row[j] = 0;                                            \
         lse[r] = ke > 0 ? (T)(m + log(l)) : (T)-INFINITY;                                      \
       }                                                                                         \
     })                                                                                          \
  MV(void, bwd_rows_##T,                                                                         \
     (const att_geo *g, int64_t i0, int64_t nq, int64_t n, T *restrict s, T *restrict dp,       \
      const T *restrict lse, const T *restrict D),                                               \
     (g, i0, nq, n, s, dp, lse, D), {                                                            \
       T sc = (T)g->scale;                                                                       \
       for (int64_t r = 0; r < nq; r++) {                                                        \
         T *srow = s + r * n;                                                                    \
         T *drow = dp + r * n;                                                                   \
         int64_t ke = key_end(g, i0 + r);                                                        \
         T L = lse[r];                                                                           \
         T Dr = D[r];                                                                            \
         _Pragma("omp simd")                                                                     \
         for (int64_t j = 0; j < ke; j++) {                                                      \
           T p = EXPF(srow[j] * sc - L);                                                         \
           srow[j] = p;                                                                          \
           drow[j] = p * (drow[j] - Dr) * sc;                                                    \
         }                                                                                       \
         for (int64_t j = ke; j < n; j++) srow[j] = drow[j] = 0;                                 \
       }                                                                                         \
     })

#define PLAIN(ret, name, params, args, body) static ret name params body
typedef float f32;
typedef double f64;
DEFINE_ROWS(f32, rm_expf, RM_FM_MULTIVERSION)
DEFINE_ROWS(f64, exp, PLAIN)

/* D[r] = gy_r . y_r over hd, in double. */
#define DEFINE_ROWDOT(T)                                                                  \
  static void rowdot_##T(const T *gy, int64_t ldg, const T *y, int64_t ldy, int64_t hd,  \
                         int64_t nq, T *D) {                                              \
    for (int64_t r = 0; r < nq; r++) {                                                    \
      double acc = 0;                                                                     \
      for (int64_t d = 0; d < hd; d++) acc += (double)gy[r * ldg + d] * y[r * ldy + d];  \
      D[r] = (T)acc;                                                                      \
    }                                                                                     \
  }
DEFINE_ROWDOT(f32)
DEFINE_ROWDOT(f64)

/* ---- tasks ---- */

/* Zeroes n rows of hd elements, ld apart (one memset when they are contiguous). */
static void zero_rows(char *p, int64_t n, int64_t hd, int64_t ld, size_t es) {
  if (n <= 0 || hd <= 0) return;
  if (ld == hd) memset(p, 0, (size_t)(n * hd) * es);
  else
    for (int64_t r = 0; r < n; r++) memset(p + r * ld * (int64_t)es, 0, (size_t)hd * es);
}

/* C (m x n, ldc) = op(A) op(B) + beta C through the context's BLAS; an empty inner
 * dimension gives beta C (0 or C) without a call. */
static void gemm(rm_ctx *ctx, rm_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *a,
                 int64_t lda, const void *b, int64_t ldb, double beta, void *c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0) {
      size_t es = rm_dtype_size(dt);
      for (int64_t r = 0; r < m; r++) memset((char *)c + r * ldc * (int64_t)es, 0, (size_t)n * es);
    }
    return;
  }
  rm_cpu_gemm(ctx, rm_cpu_blas_of(ctx), dt, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

typedef struct {
  rm_ctx *ctx;
  att_geo g;
  rm_dtype dt;
  size_t es;
  mat q, k, v, gy, y, gq, gk, gv; /* y, gq, gk, gv: rows ld apart, written by the BLAS */
  char *lse, *work;
  int64_t per; /* work elements per thread */
} att_job;

#define EL(p, i) ((p) + (int64_t)(i) * (int64_t)J->es)
#define N_ RM_BLAS_NOTRANS
#define T_ RM_BLAS_TRANS

/* Forward of query block t (of leading index t / nblocks). */
static void fwd_task(const att_job *J, int64_t t, char *s) {
  const att_geo *g = &J->g;
  int64_t nb = (g->Tq + g->bq - 1) / g->bq, b = t / nb, i0 = t % nb * g->bq;
  int64_t nq = i0 + g->bq < g->Tq ? g->bq : g->Tq - i0, hd = g->hd;
  int64_t kmax = key_end(g, i0 + nq - 1);
  char *y = EL((char *)mat_at(&J->y, b, J->es), i0 * J->y.ld), *lse = EL(J->lse, b * g->Tq + i0);
  const char *qb = EL((char *)mat_at(&J->q, b, J->es), i0 * J->q.ld);
  /* s = q k^T (nq x kmax) */
  gemm(J->ctx, J->dt, N_, T_, nq, kmax, hd, qb, J->q.ld, mat_at(&J->k, b, J->es), J->k.ld, 0.0, s, kmax);
  if (J->dt == RM_F64) fwd_rows_f64(g, i0, nq, kmax, (f64 *)s, (f64 *)lse);
  else fwd_rows_f32(g, i0, nq, kmax, (f32 *)s, (f32 *)lse);
  /* y = p v (nq x hd) */
  gemm(J->ctx, J->dt, N_, N_, nq, hd, kmax, s, kmax, mat_at(&J->v, b, J->es), J->v.ld, 0.0, y, J->y.ld);
}

/* Backward of leading index b: its query blocks in order. */
static void bwd_task(const att_job *J, int64_t b, char *work) {
  const att_geo *g = &J->g;
  int64_t hd = g->hd, Tq = g->Tq, Tk = g->Tk;
  char *s = work, *dp = EL(work, g->bq * Tk), *D = EL(dp, g->bq * Tk);
  const char *qb = mat_at(&J->q, b, J->es), *kb = mat_at(&J->k, b, J->es);
  const char *vb = mat_at(&J->v, b, J->es), *gyb = mat_at(&J->gy, b, J->es);
  char *gk = mat_at(&J->gk, b, J->es), *gv = mat_at(&J->gv, b, J->es);
  zero_rows(gk, Tk, hd, J->gk.ld, J->es);
  zero_rows(gv, Tk, hd, J->gv.ld, J->es);
  for (int64_t i0 = 0; i0 < Tq; i0 += g->bq) {
    int64_t nq = i0 + g->bq < Tq ? g->bq : Tq - i0;
    int64_t kmax = key_end(g, i0 + nq - 1);
    const char *qi = EL(qb, i0 * J->q.ld), *gyi = EL(gyb, i0 * J->gy.ld);
    const char *yi = EL((char *)mat_at(&J->y, b, J->es), i0 * J->y.ld), *lse = EL(J->lse, b * Tq + i0);
    char *gq = EL((char *)mat_at(&J->gq, b, J->es), i0 * J->gq.ld);
    if (kmax == 0) {
      zero_rows(gq, nq, hd, J->gq.ld, J->es);
      continue;
    }
    gemm(J->ctx, J->dt, N_, T_, nq, kmax, hd, qi, J->q.ld, kb, J->k.ld, 0.0, s, kmax);    /* q k^T */
    gemm(J->ctx, J->dt, N_, T_, nq, kmax, hd, gyi, J->gy.ld, vb, J->v.ld, 0.0, dp, kmax); /* gy v^T */
    if (J->dt == RM_F64) {
      rowdot_f64((const f64 *)gyi, J->gy.ld, (const f64 *)yi, J->y.ld, hd, nq, (f64 *)D);
      bwd_rows_f64(g, i0, nq, kmax, (f64 *)s, (f64 *)dp, (const f64 *)lse, (const f64 *)D);
    } else {
      rowdot_f32((const f32 *)gyi, J->gy.ld, (const f32 *)yi, J->y.ld, hd, nq, (f32 *)D);
      bwd_rows_f32(g, i0, nq, kmax, (f32 *)s, (f32 *)dp, (const f32 *)lse, (const f32 *)D);
    }
    /* dp now holds ds (scaled), s holds p */
    gemm(J->ctx, J->dt, N_, N_, nq, hd, kmax, dp, kmax, kb, J->k.ld, 0.0, gq, J->gq.ld);  /* gq = ds k */
    gemm(J->ctx, J->dt, T_, N_, kmax, hd, nq, dp, kmax, qi, J->q.ld, 1.0, gk, J->gk.ld);  /* gk += ds^T q */
    gemm(J->ctx, J->dt, T_, N_, kmax, hd, nq, s, kmax, gyi, J->gy.ld, 1.0, gv, J->gv.ld); /* gv += p^T gy */
  }
}

/* Threads for a problem of this much work (1 below the parallel threshold). */
static int threads_for(const att_geo *g) {
  double work = (double)g->bh * (double)g->Tq * (double)g->Tk * (double)(g->hd > 0 ? g->hd : 1);
  return work > RM_CPU_PAR_MIN ? omp_get_max_threads() : 1;
}

/* Runs ntask tasks: over the threads when there are enough tasks (the BLAS then runs
 * single-threaded inside each), else in order on this thread (the BLAS uses the
 * threads). */
static void run_tasks(const att_job *J, int64_t ntask, int nth, bool fwd) {
  if (nth > 1 && ntask >= nth) {
    _Pragma("omp parallel for schedule(dynamic, 1) num_threads(nth)")
    for (int64_t t = 0; t < ntask; t++) {
      char *w = EL(J->work, J->per * omp_get_thread_num());
      if (fwd) fwd_task(J, t, w);
      else bwd_task(J, t, w);
    }
  } else {
    for (int64_t t = 0; t < ntask; t++) {
      if (fwd) fwd_task(J, t, J->work);
      else bwd_task(J, t, J->work);
    }
  }
}

/* ---- kernels ---- */

RM_CPU_KERNEL(copy);

/* Operands as the BLAS reads them: t[i] = in[i] when it can be read in place (borrowed),
 * else a contiguous workspace copy made by the copy kernel (owned, nothing recorded). */
typedef struct {
  const rm_tensor *t[6];
  rm_tensor *copy[6];
} operands;

static void operands_free(rm_ctx *ctx, operands *o) {
  for (int i = 0; i < 6; i++) rm_tensor_drop(ctx, o->copy[i]), o->copy[i] = NULL;
}

/* need_rows bit i: in[i] is read row by row (blas_readable), else it must be contiguous. */
static int operands_of(rm_ctx *ctx, int nin, const rm_tensor *const *in, unsigned need_rows, operands *o) {
  int rc = RM_OK;
  rm_attrs none;
  memset(&none, 0, sizeof none);
  memset(o, 0, sizeof *o);
  for (int i = 0; i < nin && !rc; i++) {
    rm_tensor *t = (rm_tensor *)in[i];
    o->t[i] = t;
    if ((need_rows >> i & 1) ? blas_readable(t) : rm_tensor_is_contiguous(t)) continue;
    o->copy[i] = rm_tensor_new(ctx, t->dtype, RM_CPU, t->ndim, t->shape, RM_CAT_WORKSPACE);
    rc = o->copy[i] ? rm_cpu_copy(ctx, 1, &t, 1, &o->copy[i], &none) : (ctx->err_code ? ctx->err_code : RM_ERR_OOM);
    o->t[i] = o->copy[i];
  }
  if (rc) operands_free(ctx, o);
  return rc;
}

/* Per-thread scratch: one workspace tensor (accounted, honours the memory limit). */
static int job_init(rm_ctx *ctx, att_job *J, const rm_tensor *const *c, const rm_attrs *a, int64_t per, int nth,
                    rm_tensor **w) {
  memset(J, 0, sizeof *J);
  J->ctx = ctx;
  geometry(c, a, &J->g);
  J->dt = c[0]->dtype;
  J->es = rm_dtype_size(J->dt);
  J->q = mat_of(c[0], J->g.hd);
  J->k = mat_of(c[1], J->g.hd);
  J->v = mat_of(c[2], J->g.hd);
  J->per = per > 0 ? per : 1;
  int64_t n = (int64_t)nth * J->per;
  if (!(*w = rm_tensor_new(ctx, J->dt, RM_CPU, 1, &n, RM_CAT_WORKSPACE))) return ctx->err_code;
  J->work = rm_tensor_ptr(*w);
  rm_cpu_blas *bl = rm_cpu_blas_of(ctx);
  if (!bl->warned) rm_cpu_blas_warn(ctx, bl); /* once, before any thread calls the BLAS */
  return RM_OK;
}

/* in: q, k, v; y written as rows (y's rows may be apart: the packed form). */
static int forward(rm_ctx *ctx, const rm_tensor *const *in, const rm_tensor *y, rm_tensor *lse, const rm_attrs *a) {
  operands o;
  rm_tensor *w = NULL;
  if (operands_of(ctx, 3, in, 7, &o)) return ctx->err_code ? ctx->err_code : RM_ERR_OOM;
  att_geo g;
  geometry(o.t, a, &g);
  int rc = RM_OK;
  if (g.bh * g.Tq > 0) {
    int nth = threads_for(&g);
    att_job J;
    int64_t Tk1 = g.Tk > 0 ? g.Tk : 1;
    if (!(rc = job_init(ctx, &J, o.t, a, g.bq * Tk1, nth, &w))) {
      J.y = mat_of(y, g.hd);
      J.lse = rm_tensor_ptr(lse);
      run_tasks(&J, g.bh * ((g.Tq + g.bq - 1) / g.bq), nth, true);
    }
  }
  rm_tensor_drop(ctx, w);
  operands_free(ctx, &o);
  return rc;
}

/* in: q, k, v, y, lse, gy; g3: gq, gk, gv, written as rows. */
static int backward(rm_ctx *ctx, const rm_tensor *const *in, const rm_tensor *const *g3, const rm_attrs *a) {
  operands o;
  rm_tensor *w = NULL;
  /* q, k, v, y and gy read as rows; lse contiguous */
  if (operands_of(ctx, 6, in, 1 | 2 | 4 | 8 | 32, &o)) return ctx->err_code ? ctx->err_code : RM_ERR_OOM;
  att_geo g;
  geometry(o.t, a, &g);
  int rc = RM_OK;
  if (g.bh > 0) {
    int nth = threads_for(&g);
    att_job J;
    int64_t Tk1 = g.Tk > 0 ? g.Tk : 1;
    if (!(rc = job_init(ctx, &J, o.t, a, 2 * g.bq * Tk1 + g.bq, nth, &w))) {
      J.gy = mat_of(o.t[5], g.hd);
      J.y = mat_of(o.t[3], g.hd);
      J.lse = rm_tensor_ptr(o.t[4]);
      J.gq = mat_of(g3[0], g.hd);
      J.gk = mat_of(g3[1], g.hd);
      J.gv = mat_of(g3[2], g.hd);
      run_tasks(&J, g.bh, nth, false);
    }
  }
  rm_tensor_drop(ctx, w);
  operands_free(ctx, &o);
  return rc;
}

/* What operands_of copies: the bytes of each operand the BLAS cannot read in place. */
static size_t copies_of(int nin, const rm_tensor *const *in, unsigned need_rows) {
  size_t bytes = 0;
  for (int i = 0; i < nin; i++)
    if (!((need_rows >> i & 1) ? blas_readable(in[i]) : rm_tensor_is_contiguous(in[i])))
      bytes += rm_tensor_nbytes(in[i]);
  return bytes;
}

/* forward's and backward's peak workspace: the copies, then job_init's per-thread blocks. */
static size_t workspace_bytes(const rm_tensor *const *in, bool fwd, const rm_attrs *a) {
  att_geo g;
  geometry(in, a, &g);
  size_t es = rm_dtype_size(in[0]->dtype);
  size_t bytes = fwd ? copies_of(3, in, 7) : copies_of(6, in, 1 | 2 | 4 | 8 | 32);
  int64_t Tk1 = g.Tk > 0 ? g.Tk : 1;
  if (fwd ? g.bh * g.Tq > 0 : g.bh > 0) {
    int64_t per = fwd ? g.bq * Tk1 : 2 * g.bq * Tk1 + g.bq;
    bytes += (size_t)threads_for(&g) * (size_t)(per > 0 ? per : 1) * es;
  }
  return bytes;
}

size_t rm_cpu_attention_workspace(rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a) {
  int64_t H = a->attention.heads;
  rm_tensor v[5];
  if (op == RM_OP_ATTENTION && nin == 3) return workspace_bytes((const rm_tensor *const *)in, true, a);
  if (op == RM_OP_ATTENTION_BACKWARD && nin == 6) return workspace_bytes((const rm_tensor *const *)in, false, a);
  if (op == RM_OP_ATTENTION && nin == 1) {
    for (int i = 0; i < 3; i++) rm_attention_part(in[0], H, i, 3, &v[i]);
    const rm_tensor *qkv[3] = { &v[0], &v[1], &v[2] };
    return workspace_bytes(qkv, true, a);
  }
  if (op == RM_OP_ATTENTION_QKV_BACKWARD && nin == 4) {
    const rm_tensor *args[6];
    rm_attention_qkv_backward_args(in, H, v, args);
    return workspace_bytes(args, false, a);
  }
  return 0;
}

RM_CPU_KERNEL(attention) {
  if (nin == 3) return forward(ctx, (const rm_tensor *const *)in, out[0], out[1], a);
  if (nin != 1) return RM_ERR_ARG;
  /* packed: the three parts of qkv and y as (..., H, T, D) views */
  rm_tensor v[4];
  for (int i = 0; i < 3; i++) rm_attention_part(in[0], a->attention.heads, i, 3, &v[i]);
  rm_attention_part(out[0], a->attention.heads, 0, 1, &v[3]);
  const rm_tensor *qkv[3] = { &v[0], &v[1], &v[2] };
  return forward(ctx, qkv, &v[3], out[1], a);
}

RM_CPU_KERNEL(attention_backward) {
  if (nin != 6) return RM_ERR_ARG;
  return backward(ctx, (const rm_tensor *const *)in, (const rm_tensor *const *)out, a);
}

/* qkv, y, lse, gy -> dqkv: the three-input backward on views, gq, gk and gv written into
 * dqkv's three parts (each row of dqkv is written by exactly one of them). */
RM_CPU_KERNEL(attention_qkv_backward) {
  if (nin != 4) return RM_ERR_ARG;
  int64_t H = a->attention.heads;
  rm_tensor v[5], g[3];
  const rm_tensor *args[6];
  rm_attention_qkv_backward_args(in, H, v, args);
  for (int i = 0; i < 3; i++) rm_attention_part(out[0], H, i, 3, &g[i]);
  const rm_tensor *g3[3] = { &g[0], &g[1], &g[2] };
  return backward(ctx, args, g3, a);
}
