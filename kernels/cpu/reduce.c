/* CPU kernels for reductions (sum, mean, sum_to, max, argmax) and softmax /
 * log_softmax with their backward helpers. Inputs are contiguous (core copies strided
 * views first). Sums accumulate in double and split work at fixed boundaries, so the
 * result does not depend on the number of threads (replays are bit for bit). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu.h"
#include "fastmath.h"
#include "lanes.h"

#include "../../core/ops.h"

#define BLK 64                 /* columns accumulated together (fits in registers/L1) */
#define SEG_CHUNK (1 << 16)    /* fixed chunk of a long contiguous sum */
#define SEG_MAXCHUNKS 1024

/* ---- geometry ---- */

/* Dimension attr of a reduce op normalised to 0..ndim-1, or -1 for "every dim". */
static int red_dim(const rm_tensor *t, int64_t dim) {
  if (dim == RM_DIM_ALL || t->ndim == 0) return -1;
  return (int)(dim < 0 ? dim + t->ndim : dim);
}

/* A contiguous tensor seen as merged runs of summed / kept dimensions (size-1 dims
 * dropped). Output elements are the kept dims in order, contiguous. */
typedef struct {
  int m;
  int64_t size[RM_MAX_DIM], istride[RM_MAX_DIM];
  bool red[RM_MAX_DIM];
} rgeo;

static void geo_build(rgeo *g, int ndim, const int64_t *shape, const bool *red) {
  int64_t st[RM_MAX_DIM];
  rm_contiguous_strides(ndim, shape, st);
  g->m = 0;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 1) continue;
    int k = g->m;
    if (k > 0 && g->red[k - 1] == red[d]) {
      g->size[k - 1] *= shape[d];
      g->istride[k - 1] = st[d];
    } else {
      g->size[k] = shape[d];
      g->istride[k] = st[d];
      g->red[k] = red[d];
      g->m++;
    }
  }
}

/* Input offset of linear index q over the dims dims[0..nd-1] of g (row-major). */
static int64_t geo_off(const rgeo *g, const int *dims, int nd, int64_t q) {
  int64_t off = 0;
  for (int k = nd - 1; k >= 0; k--) {
    int64_t s = g->size[dims[k]];
    off += (q % s) * g->istride[dims[k]];
    q /= s;
  }
  return off;
}

/* ---- sum engine: out[e] = (sum of the summed dims) / div ---- */

#define DEF_SEGSUM(T)                                                              \
  static double sum4_##T(const T *p, int64_t n) {                                  \
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;                                         \
    int64_t i = 0;                                                                 \
    for (; i + 4 <= n; i += 4) { s0 += p[i]; s1 += p[i + 1]; s2 += p[i + 2]; s3 += p[i + 3]; } \
    for (; i < n; i++) s0 += p[i];                                                 \
    return (s0 + s1) + (s2 + s3);                                                  \
  }                                                                                \
  static double segsum_##T(const T *p, int64_t n) {                                \
    if (n < 2 * SEG_CHUNK || omp_in_parallel()) return sum4_##T(p, n);             \
    int64_t chunk = SEG_CHUNK;                                                     \
    if ((n + chunk - 1) / chunk > SEG_MAXCHUNKS) chunk = (n + SEG_MAXCHUNKS - 1) / SEG_MAXCHUNKS; \
    int64_t nc = (n + chunk - 1) / chunk;                                          \
    double part[SEG_MAXCHUNKS];                                                    \
    _Pragma("omp parallel for")                                                    \
    for (int64_t c = 0; c < nc; c++) {                                             \
      int64_t lo = c * chunk, hi = lo + chunk < n ? lo + chunk : n;                \
      part[c] = sum4_##T(p + lo, hi - lo);                                         \
    }                                                                              \
    double s = 0;                                                                  \
    for (int64_t c = 0; c < nc; c++) s += part[c];                                 \
    return s;                                                                      \
  }
DEF_SEGSUM(float)
DEF_SEGSUM(double)

/* acc[0, jn) += the jn-long rows src + p * stride, p in [0, R), in order (each column's
 * sum in double, row by row: the same bits whatever the vector width). Per ISA, and
 * with the full-width block as its own loop, so that it vectorises: it carries the bias
 * gradients (column sums of a (rows, out) gradient). */
#define DEF_COLSUM(T)                                                                    \
  RM_FM_MULTIVERSION(void, colsum_##T,                                                   \
                     (const T *restrict src, int64_t stride, int64_t R, int64_t jn,      \
                      double *restrict acc),                                             \
                     (src, stride, R, jn, acc), {                                        \
                       if (jn == BLK) {                                                  \
                         for (int64_t p = 0; p < R; p++) {                               \
                           const T *b = src + p * stride;                                \
                           _Pragma("omp simd")                                           \
                           for (int64_t j = 0; j < BLK; j++) acc[j] += b[j];             \
                         }                                                               \
                       } else {                                                          \
                         for (int64_t p = 0; p < R; p++) {                               \
                           const T *b = src + p * stride;                                \
                           _Pragma("omp simd")                                           \
                           for (int64_t j = 0; j < jn; j++) acc[j] += b[j];              \
                         }                                                               \
                       }                                                                 \
                     })
DEF_COLSUM(float)
DEF_COLSUM(double)

#define DEF_SUMENG(T)                                                                    \
  static void sumeng_##T(const T *src, T *dst, int ndim, const int64_t *shape,           \
                         const bool *red, int64_t nin, int64_t nout, double div) {      \
    if (nout == 0) return;                                                               \
    if (nin == 0) { for (int64_t e = 0; e < nout; e++) dst[e] = (T)(0.0 / div); return; } \
    rgeo g;                                                                              \
    geo_build(&g, ndim, shape, red);                                                     \
    int kd[RM_MAX_DIM], rd[RM_MAX_DIM], nk = 0, nr = 0;                                  \
    int64_t R = 1;                                                                       \
    for (int k = 0; k < g.m; k++) {                                                      \
      if (g.red[k]) rd[nr++] = k, R *= g.size[k];                                        \
      else kd[nk++] = k;                                                                 \
    }                                                                                    \
    if (g.m == 0 || nr == 0) { /* nothing summed: a copy */                              \
      for (int64_t e = 0; e < nout; e++) dst[e] = (T)(src[e] / div);                     \
      return;                                                                            \
    }                                                                                    \
    if (!g.red[g.m - 1]) {                                                               \
      /* innermost run kept: accumulate BLK output columns over all summed positions */  \
      int64_t L = g.size[g.m - 1], rows = nout / L, nb = (L + BLK - 1) / BLK;            \
      _Pragma("omp parallel for if (nin > RM_CPU_PAR_MIN)")                              \
      for (int64_t t = 0; t < rows * nb; t++) {                                          \
        int64_t q = t / nb, j0 = (t % nb) * BLK, jn = L - j0 < BLK ? L - j0 : BLK;       \
        int64_t ioff = geo_off(&g, kd, nk - 1, q) + j0;                                  \
        double acc[BLK] = { 0 };                                                         \
        if (nr == 1) /* one summed run: rows a fixed stride apart */                     \
          colsum_##T(src + ioff, g.istride[rd[0]], R, jn, acc);                          \
        else                                                                             \
          for (int64_t p = 0; p < R; p++)                                                \
            colsum_##T(src + ioff + geo_off(&g, rd, nr, p), 0, 1, jn, acc);              \
        for (int64_t j = 0; j < jn; j++) dst[q * L + j0 + j] = (T)(acc[j] / div);        \
      }                                                                                  \
    } else {                                                                             \
      /* innermost run summed: contiguous segments of length L */                        \
      int64_t L = g.size[g.m - 1], R2 = R / L;                                           \
      _Pragma("omp parallel for if (nout > 1 && nin > RM_CPU_PAR_MIN)")                  \
      for (int64_t e = 0; e < nout; e++) {                                               \
        int64_t ioff = geo_off(&g, kd, nk, e);                                           \
        double acc = 0;                                                                  \
        for (int64_t p = 0; p < R2; p++)                                                 \
          acc += segsum_##T(src + ioff + geo_off(&g, rd, nr - 1, p), L);                 \
        dst[e] = (T)(acc / div);                                                         \
      }                                                                                  \
    }                                                                                    \
  }
DEF_SUMENG(float)
DEF_SUMENG(double)

/* Sums in[0] over the dims flagged in red[], dividing by div, into out[0]. */
static int sum_dims(rm_tensor *in, rm_tensor *out, const bool *red, double div) {
  int64_t nin = rm_tensor_numel(in), nout = rm_tensor_numel(out);
  if (in->dtype == RM_F64)
    sumeng_double(rm_tensor_ptr(in), rm_tensor_ptr(out), in->ndim, in->shape, red, nin, nout, div);
  else
    sumeng_float(rm_tensor_ptr(in), rm_tensor_ptr(out), in->ndim, in->shape, red, nin, nout, div);
  return RM_OK;
}

static void dims_of(const rm_tensor *t, int64_t dim, bool *red) {
  int d = red_dim(t, dim);
  for (int k = 0; k < t->ndim; k++) red[k] = d < 0 || k == d;
}

/* Integer sums: exact int64, wrapping around on overflow as PyTorch's do; one output
 * element at a time over its summed positions, in order. */
#define INT_SUM(T)                                                                  \
  do {                                                                              \
    const T *px = rm_tensor_ptr(x);                                                 \
    _Pragma("omp parallel for if (nin > RM_CPU_PAR_MIN)")                           \
    for (int64_t e = 0; e < nout; e++) {                                            \
      int64_t base = geo_off(&g, kd, nk, e);                                        \
      uint64_t acc = 0;                                                             \
      for (int64_t q = 0; q < R; q++) acc += (uint64_t)(int64_t)px[base + geo_off(&g, rd, nr, q)]; \
      po[e] = (int64_t)acc;                                                         \
    }                                                                               \
  } while (0)

static int sum_int(const rm_tensor *x, rm_tensor *out, const bool *red) {
  int64_t nin = rm_tensor_numel(x), nout = rm_tensor_numel(out);
  int64_t *po = rm_tensor_ptr(out);
  rgeo g;
  geo_build(&g, x->ndim, x->shape, red);
  int kd[RM_MAX_DIM], rd[RM_MAX_DIM], nk = 0, nr = 0;
  int64_t R = nin ? 1 : 0;
  for (int k = 0; k < g.m; k++) {
    if (g.red[k]) rd[nr++] = k, R *= g.size[k];
    else kd[nk++] = k;
  }
  if (x->dtype == RM_I32) INT_SUM(int32_t);
  else INT_SUM(int64_t);
  return RM_OK;
}

RM_CPU_KERNEL(sum) {
  bool red[RM_MAX_DIM];
  dims_of(in[0], a->reduce.dim, red);
  if (rm_dtype_is_int(in[0]->dtype)) return sum_int(in[0], out[0], red);
  return sum_dims(in[0], out[0], red, 1.0);
}

RM_CPU_KERNEL(mean) {
  bool red[RM_MAX_DIM];
  dims_of(in[0], a->reduce.dim, red);
  int64_t no = rm_tensor_numel(out[0]);
  double count = no ? (double)rm_tensor_numel(in[0]) / (double)no : 0.0;
  return sum_dims(in[0], out[0], red, count);
}

RM_CPU_KERNEL(sum_to) {
  bool red[RM_MAX_DIM];
  int off = in[0]->ndim - a->ndim;
  for (int d = 0; d < in[0]->ndim; d++)
    red[d] = d < off || (a->shape[d - off] == 1 && in[0]->shape[d] != 1);
  return sum_dims(in[0], out[0], red, 1.0);
}

/* ---- max / argmax: one column (stride s, n >= 1 elements) at a time ---- */

/* outer / n / inner of a reduction over dim d (-1: all). */
static void split3(const rm_tensor *t, int d, int64_t *outer, int64_t *n, int64_t *inner) {
  *outer = 1; *inner = 1; *n = 1;
  if (d < 0) { *n = rm_tensor_numel(t); return; }
  for (int k = 0; k < t->ndim; k++) {
    if (k < d) *outer *= t->shape[k];
    else if (k > d) *inner *= t->shape[k];
  }
  *n = t->shape[d];
}

/* First maximum; a NaN wins over numbers (first NaN), as in PyTorch. Along the last
 * dim a row at a time; along another dim BLK neighbouring columns at a time, so that
 * each step reads contiguous memory. */
#define DEF_MAXCOL(T)                                                               \
  static void maxcols_##T(const T *x, T *val, int64_t *idx, int64_t outer, int64_t n, \
                          int64_t inner) {                                          \
    if (n == 0) return;                                                             \
    int64_t nb = (inner + BLK - 1) / BLK;                                           \
    _Pragma("omp parallel for if (outer * inner * n > RM_CPU_PAR_MIN)")             \
    for (int64_t t = 0; t < outer * nb; t++) {                                      \
      int64_t o = t / nb, j0 = (t % nb) * BLK;                                      \
      int64_t jn = inner - j0 < BLK ? inner - j0 : BLK;                             \
      const T *p = x + o * n * inner + j0;                                          \
      T best[BLK];                                                                  \
      int64_t bi[BLK];                                                              \
      for (int64_t j = 0; j < jn; j++) { best[j] = p[j]; bi[j] = 0; }               \
      for (int64_t k = 1; k < n; k++) {                                             \
        const T *r = p + k * inner;                                                 \
        for (int64_t j = 0; j < jn; j++) {                                          \
          T v = r[j], b = best[j];                                                  \
          if (b == b && (v > b || v != v)) { best[j] = v; bi[j] = k; }              \
        }                                                                           \
      }                                                                             \
      for (int64_t j = 0; j < jn; j++) {                                            \
        if (val) val[o * inner + j0 + j] = best[j];                                 \
        if (idx) idx[o * inner + j0 + j] = bi[j] + 1;                               \
      }                                                                             \
    }                                                                               \
  }
DEF_MAXCOL(float)
DEF_MAXCOL(double)

static int max_run(rm_tensor *x, int64_t dim, rm_tensor *val, rm_tensor *idx) {
  int64_t outer, n, inner;
  split3(x, red_dim(x, dim), &outer, &n, &inner);
  if (x->dtype == RM_F64)
    maxcols_double(rm_tensor_ptr(x), val ? rm_tensor_ptr(val) : NULL, idx ? rm_tensor_ptr(idx) : NULL,
                   outer, n, inner);
  else
    maxcols_float(rm_tensor_ptr(x), val ? rm_tensor_ptr(val) : NULL, idx ? rm_tensor_ptr(idx) : NULL,
                  outer, n, inner);
  return RM_OK;
}

RM_CPU_KERNEL(max) {
  return max_run(in[0], a->reduce.dim, out[0], out[1]);
}

RM_CPU_KERNEL(argmax) {
  return max_run(in[0], a->reduce.dim, NULL, out[0]);
}

/* ---- softmax family: one column (n elements, stride s) per iteration ---- */

/* Runs BODY for every column of the reduction over attr dim of in[0]; inside BODY, the
 * column's offset is `base`, its length `n`, its stride `s`. Threads take contiguous
 * rows (s == 1) in round-robin chunks of about 4 KiB of float32, not one range each:
 * the cost of a causally masked row grows with its index (softmax skips the -inf
 * tail), so one range each would give one thread the long rows. Strided columns
 * (neighbours share cache lines) keep one contiguous range per thread. */
#define FOR_COLUMNS(t, dim, BODY)                                                   \
  do {                                                                              \
    int64_t outer_, n, s;                                                           \
    split3(t, red_dim(t, dim), &outer_, &n, &s);                                    \
    int64_t cols_ = outer_ * s;                                                     \
    int64_t nt_ = omp_get_max_threads();                                            \
    int64_t chunk_ = s != 1 ? (cols_ + nt_ - 1) / nt_ : n >= 1024 ? 1 : 1024 / (n ? n : 1); \
    if (chunk_ < 1) chunk_ = 1;                                                     \
    _Pragma("omp parallel for schedule(static, chunk_) if (cols_ * n > RM_CPU_PAR_MIN)") \
    for (int64_t c_ = 0; c_ < cols_; c_++) {                                        \
      int64_t base = (c_ / s) * n * s + c_ % s;                                     \
      BODY;                                                                         \
    }                                                                               \
  } while (0)

/* One column of (log_)softmax of sc * x whose first `live` entries take part (causal
 * rows: the rest give 0, or -inf in log mode, as causal_mask's -inf would). */
#define SOFTMAX_BODY(T, EXP, LOG, logmode, sc, live)                                \
  {                                                                                 \
    const T *xp = x + base;                                                         \
    T *yp = y + base;                                                               \
    T m = -INFINITY;                                                                \
    for (int64_t k = 0; k < (live); k++) if (xp[k * s] * (sc) > m) m = xp[k * s] * (sc); \
    double sum = 0;                                                                 \
    for (int64_t k = 0; k < (live); k++) {                                          \
      T e = EXP(xp[k * s] * (sc) - m);                                              \
      if (!(logmode)) yp[k * s] = e;                                                \
      sum += e;                                                                     \
    }                                                                               \
    if (logmode) {                                                                  \
      T lse = m + (T)LOG((T)sum);                                                   \
      for (int64_t k = 0; k < (live); k++) yp[k * s] = xp[k * s] * (sc) - lse;      \
      for (int64_t k = (live); k < n; k++) yp[k * s] = (T)-INFINITY - lse;          \
    } else {                                                                        \
      T inv = (T)(1.0 / sum);                                                       \
      for (int64_t k = 0; k < (live); k++) yp[k * s] *= inv;                        \
      for (int64_t k = (live); k < n; k++) yp[k * s] = (T)0 * inv;                  \
    }                                                                               \
  }

/* Rounds a row's live length up to a multiple of 16 within the row (n): the SIMD loops
 * over the prefix then need no scalar remainder (16 floats is one AVX-512 vector, two
 * AVX2 ones); scalar remainders of up to 15 elements a loop were most of a short row's
 * time. */
RM_FM_INLINE int64_t softmax_pad_(int64_t live, int64_t n) {
  int64_t p = (live + 15) & ~(int64_t)15;
  return p < n ? p : n;
}

/* Length of x[0, n) without its trailing run of exact -inf (a causally masked row t of
 * T ends in T-1-t of them), found by a backward scan (bit compares, 32 at a time where
 * it can), then padded (softmax_pad_): the entries added are -inf too. */
RM_FM_INLINE int64_t softmax_live_len_(const float *x, int64_t n) {
  int64_t p = n;
  if (n == 0 || x[n - 1] != -INFINITY) return n;
  while (p >= 32) {
    const float *b = x + p - 32;
    uint32_t d = 0;
    for (int j = 0; j < 32; j++) d |= rm_fm_bits_(b[j]) ^ 0xff800000u;  /* -inf */
    if (d) break;
    p -= 32;
  }
  while (p > 0 && x[p - 1] == -INFINITY) p--;
  return softmax_pad_(p, n);
}

/* The rest of a (log_)softmax row, given its max m over z[0, p): exp and sum on the
 * prefix, then y[0, n) (the entries from p on are -inf: 0 * inv, or -inf - lse in log
 * mode). z may be y itself (a row already written there), hence no restrict. */
RM_FM_INLINE void softmax_prefix_f32_(const float *z, float *y, int64_t n, int64_t p, float m, bool logmode) {
  if (logmode) {
    double sum = 0;
    _Pragma("omp simd reduction(+:sum)")
    for (int64_t k = 0; k < p; k++) sum += rm_expf(z[k] - m);
    float lse = m + logf((float)sum);
    _Pragma("omp simd")
    for (int64_t k = 0; k < p; k++) y[k] = z[k] - lse;
    float tail = -INFINITY - lse;
    _Pragma("omp simd")
    for (int64_t k = p; k < n; k++) y[k] = tail;
    return;
  }
  _Pragma("omp simd")
  for (int64_t k = 0; k < p; k++) y[k] = rm_expf(z[k] - m);
  float inv = (float)(1.0 / rm_lanes_sum(y, p));
  _Pragma("omp simd")
  for (int64_t k = 0; k < p; k++) y[k] *= inv;
  float tail = 0.0f * inv;
  _Pragma("omp simd")
  for (int64_t k = p; k < n; k++) y[k] = tail;
}

/* (log_)softmax of one contiguous float32 row. max, exp and sum run on the prefix
 * before the trailing -inf run only: each exp there is exactly 0 for a finite max,
 * and a NaN or +inf in the prefix makes the sum NaN, so the tail is written as the
 * full loops wrote it (0 * inv, and -inf - lse in log mode: 0 or NaN, -inf or NaN).
 * A row of only -inf has p = 0: max -inf, sum 0, inv inf, so it is NaN (0 * inf, and
 * -inf - -inf in log mode), as the full loops made it (-inf - -inf in every exp). */
RM_FM_INLINE void softmax_row_f32_(const float *restrict x, float *restrict y, int64_t n, bool logmode) {
  int64_t p = softmax_live_len_(x, n), q = p & ~(int64_t)15, k = 0;
  /* a NaN never wins the max: its exp makes the row NaN */
  rm_lf16 mv = rm_lanes_splat(-INFINITY);
  for (; k < q; k += 16) mv = rm_lanes_max(mv, rm_lanes_load(x + k));
  float m = rm_lanes_fold_max(mv);
  for (; k < p; k++) m = x[k] > m ? x[k] : m;
  softmax_prefix_f32_(x, y, n, p, m, logmode);
}

/* softmax_row_f32_ of sc * x with only x[0, live) taking part (a causal row: the
 * rest are masked). The scaled prefix is written to y first (then read from L1),
 * padded (softmax_pad_) with -inf in the same loop (x past live is in the row, read
 * and not used), and the same loops run on it: what mul_scalar, causal_mask and
 * softmax_row_f32_ give, without their two passes over the scores (and the -inf tail
 * is neither written nor scanned). */
RM_FM_INLINE void softmax_row_scaled_f32_(const float *restrict x, float *restrict y, int64_t n,
                                          bool logmode, float sc, int64_t live) {
  int64_t p = softmax_pad_(live, n), q = p & ~(int64_t)15, k = 0;
  rm_lf16 ninf = rm_lanes_splat(-INFINITY), mv = ninf, scv = rm_lanes_splat(sc);
  rm_li16 lane;
  for (int j = 0; j < 16; j++) lane[j] = j;
  for (; k < q; k += 16) {
    rm_lf16 v = rm_lanes_load(x + k) * scv;
    int64_t d = live - k;                                  /* live lanes of this chunk */
    rm_li16 in = lane < (int32_t)(d < 0 ? 0 : d > 16 ? 16 : d);
    v = (rm_lf16)(((rm_li16)v & in) | ((rm_li16)ninf & ~in));
    memcpy(y + k, &v, sizeof v);
    mv = rm_lanes_max(mv, v);
  }
  float m = rm_lanes_fold_max(mv);
  for (; k < p; k++) {
    float v = k < live ? x[k] * sc : -INFINITY;
    y[k] = v;
    m = v > m ? v : m;
  }
  softmax_prefix_f32_(y, y, n, p, m, logmode);
}

/* float32 (log_)softmax of one column x[0, n*s) (stride s) into y: the same steps as
 * SOFTMAX_BODY, with the vectorisable rm_expf; a contiguous column (s == 1, softmax
 * over the last dim) runs as softmax_row_f32_'s SIMD loops. Compiled per ISA
 * (RM_FM_MULTIVERSION: AVX2/AVX-512 where the CPU has them). */
RM_FM_MULTIVERSION_FMA(void, softmax_col_f32,
                   (const float *restrict x, float *restrict y, int64_t n, int64_t s, bool logmode,
                    float sc, int64_t live),
                   (x, y, n, s, logmode, sc, live), {
  if (s == 1) {
    if (sc == 1.0f && live == n) softmax_row_f32_(x, y, n, logmode);
    else softmax_row_scaled_f32_(x, y, n, logmode, sc, live);
    return;
  }
  float m = -INFINITY;
  double sum = 0;
  for (int64_t k = 0; k < n; k++) if (x[k * s] * sc > m) m = x[k * s] * sc;
  for (int64_t k = 0; k < n; k++) {
    float e = rm_expf(x[k * s] * sc - m);
    y[k * s] = e;
    sum += e;
  }
  if (logmode) {
    float lse = m + logf((float)sum);
    _Pragma("omp simd")
    for (int64_t k = 0; k < n; k++) y[k * s] = x[k * s] * sc - lse;
  } else {
    float inv = (float)(1.0 / sum);
    _Pragma("omp simd")
    for (int64_t k = 0; k < n; k++) y[k * s] *= inv;
  }
})

void rm_cpu_softmax_row_f32(const float *x, float *y, int64_t n, float sc, int64_t live) {
  softmax_col_f32(x, y, n, 1, false, sc, live);
}

/* The scale (0, unset, is 1) and, for a causal call, the (T, T) rows' T (else 0); a
 * causal call runs over the last dim, so a column's row index is base / n. */
#define SOFTMAX_ATTRS(a, n)                                                         \
  double sc_ = (a)->softmax.scale != 0 ? (a)->softmax.scale : 1.0;                 \
  int64_t causal_t_ = (a)->softmax.causal ? (n) : 0
#define LIVE(base, n) (causal_t_ ? ((base) / (n)) % causal_t_ + 1 : (n))

static int softmax_run(rm_tensor *xt, rm_tensor *yt, const rm_attrs *a, bool logmode) {
  int64_t last = xt->ndim ? xt->shape[xt->ndim - 1] : 1;
  SOFTMAX_ATTRS(a, last);
  if (xt->dtype == RM_F64) {
    const double *x = rm_tensor_ptr(xt);
    double *y = rm_tensor_ptr(yt);
    FOR_COLUMNS(xt, a->softmax.dim, SOFTMAX_BODY(double, exp, log, logmode, sc_, LIVE(base, n)));
  } else {
    const float *x = rm_tensor_ptr(xt);
    float *y = rm_tensor_ptr(yt);
    float scf = (float)sc_;
    FOR_COLUMNS(xt, a->softmax.dim, softmax_col_f32(x + base, y + base, n, s, logmode, scf, LIVE(base, n)));
  }
  return RM_OK;
}

RM_CPU_KERNEL(softmax) {
  return softmax_run(in[0], out[0], a, false);
}

RM_CPU_KERNEL(log_softmax) {
  return softmax_run(in[0], out[0], a, true);
}

/* softmax: dx = y * (g - sum(g*y)); log_softmax: dx = g - exp(y) * sum(g); times the
 * forward's scale, over the first `live` entries (a causal row's masked entries were
 * constants: their dx is 0 and their g does not enter the sum). */
#define SOFTMAX_BW_BODY(T, EXP, logmode, sc, live)                                  \
  {                                                                                 \
    const T *yp = y + base, *gp = g + base;                                         \
    T *dp = dx + base;                                                              \
    double acc = 0;                                                                 \
    for (int64_t k = 0; k < (live); k++) acc += (logmode) ? gp[k * s] : gp[k * s] * yp[k * s]; \
    T sv = (T)acc;                                                                  \
    if (logmode) {                                                                  \
      _Pragma("omp simd")                                                           \
      for (int64_t k = 0; k < (live); k++) dp[k * s] = (gp[k * s] - EXP(yp[k * s]) * sv) * (sc); \
    } else {                                                                        \
      _Pragma("omp simd")                                                           \
      for (int64_t k = 0; k < (live); k++) dp[k * s] = (yp[k * s] * (gp[k * s] - sv)) * (sc); \
    }                                                                               \
    for (int64_t k = (live); k < n; k++) dp[k * s] = 0;                             \
  }

/* float32 backward of one contiguous row (s == 1), as SOFTMAX_BW_BODY with the sum
 * over vector lanes (lanes.h; still in double, its order fixed per row, so replays
 * match), compiled per ISA; strided columns run SOFTMAX_BW_BODY itself. An unscaled full row
 * skips the multiply. */
RM_FM_MULTIVERSION(void, softmax_bw_row_f32,
                   (const float *restrict y, const float *restrict g, float *restrict dx, int64_t n,
                    bool logmode, float sc, int64_t live),
                   (y, g, dx, n, logmode, sc, live), {
  if (logmode) {
    float sv = (float)rm_lanes_sum(g, live);
    _Pragma("omp simd")
    for (int64_t k = 0; k < live; k++) dx[k] = g[k] - rm_expf(y[k]) * sv;
  } else {
    float sv = (float)rm_lanes_dot(g, y, live);
    _Pragma("omp simd")
    for (int64_t k = 0; k < live; k++) dx[k] = y[k] * (g[k] - sv);
  }
  if (sc != 1.0f) {
    _Pragma("omp simd")
    for (int64_t k = 0; k < live; k++) dx[k] *= sc;
  }
  _Pragma("omp simd")
  for (int64_t k = live; k < n; k++) dx[k] = 0;
})

static int softmax_bw_run(rm_tensor *yt, rm_tensor *gt, rm_tensor *dt, const rm_attrs *a, bool logmode) {
  int64_t last = yt->ndim ? yt->shape[yt->ndim - 1] : 1;
  SOFTMAX_ATTRS(a, last);
  if (yt->dtype == RM_F64) {
    const double *y = rm_tensor_ptr(yt), *g = rm_tensor_ptr(gt);
    double *dx = rm_tensor_ptr(dt);
    FOR_COLUMNS(yt, a->softmax.dim, SOFTMAX_BW_BODY(double, exp, logmode, sc_, LIVE(base, n)));
  } else {
    const float *y = rm_tensor_ptr(yt), *g = rm_tensor_ptr(gt);
    float *dx = rm_tensor_ptr(dt);
    float scf = (float)sc_;
    FOR_COLUMNS(yt, a->softmax.dim,
                if (s == 1) softmax_bw_row_f32(y + base, g + base, dx + base, n, logmode, scf, LIVE(base, n));
                else SOFTMAX_BW_BODY(float, rm_expf, logmode, scf, n));
  }
  return RM_OK;
}

RM_CPU_KERNEL(softmax_backward) {
  return softmax_bw_run(in[0], in[1], out[0], a, false);
}

RM_CPU_KERNEL(log_softmax_backward) {
  return softmax_bw_run(in[0], in[1], out[0], a, true);
}
