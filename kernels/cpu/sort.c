/* CPU kernels for min, sort, topk and cumsum (semantics: core/op_sort.c). Inputs are
 * contiguous (core copies strided ones first); each works on columns: x seen as
 * (outer, n, inner), one column of n elements at stride inner per (outer, inner). */
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

typedef struct { int64_t outer, n, inner; } cols;

/* Column geometry of x along attr dim (RM_DIM_ALL or a 0-d x: one column of all). */
static cols columns(const rm_tensor *x, int64_t dim) {
  cols c = { 1, 1, 1 };
  if (dim == INT64_MIN || x->ndim == 0) {
    c.n = rm_tensor_numel(x);
    return c;
  }
  int d = (int)(dim < 0 ? dim + x->ndim : dim);
  for (int k = 0; k < d; k++) c.outer *= x->shape[k];
  c.n = x->shape[d];
  for (int k = d + 1; k < x->ndim; k++) c.inner *= x->shape[k];
  return c;
}

/* ---- min: first minimum; the first NaN wins ---- */

#define DEF_MIN(T)                                                                      \
  static void min_##T(const T *x, T *val, int64_t *idx, cols c) {                        \
    const int64_t m = c.outer * c.inner;                                                \
    _Pragma("omp parallel for if (m * c.n > RM_CPU_PAR_MIN)")                           \
    for (int64_t q = 0; q < m; q++) {                                                   \
      const T *p = x + (q / c.inner) * c.n * c.inner + q % c.inner;                     \
      T best = p[0];                                                                    \
      int64_t bi = 0;                                                                   \
      for (int64_t k = 1; k < c.n && best == best; k++) {                               \
        T v = p[k * c.inner];                                                           \
        if (v < best || v != v) { best = v; bi = k; }                                   \
      }                                                                                 \
      val[q] = best;                                                                    \
      idx[q] = bi + 1;                                                                   \
    }                                                                                   \
  }
DEF_MIN(float)
DEF_MIN(double)

RM_CPU_KERNEL(min) {
  cols c = columns(in[0], a->reduce.dim);
  if (c.outer * c.inner == 0 || c.n == 0) return RM_OK;
  if (in[0]->dtype == RM_F64) min_double(rm_tensor_ptr(in[0]), rm_tensor_ptr(out[0]), rm_tensor_ptr(out[1]), c);
  else if (in[0]->dtype == RM_F32) min_float(rm_tensor_ptr(in[0]), rm_tensor_ptr(out[0]), rm_tensor_ptr(out[1]), c);
  else return rm_fail(ctx, RM_ERR_DTYPE, "min: cpu does not support %s", rm_dtype_name(in[0]->dtype));
  return RM_OK;
}

/* ---- sort / topk: a stable merge sort of each column's positions ---- */

/* Does element (a, i) come before (b, j)? NaN ranks above every number; ties by position. */
#define BEFORE(a, i, b, j, desc)                                                        \
  ((a) != (a) ? ((b) != (b) ? (i) < (j) : (desc))                                       \
              : (b) != (b) ? !(desc)                                                    \
                           : (desc) ? ((a) > (b) || ((a) == (b) && (i) < (j)))          \
                                    : ((a) < (b) || ((a) == (b) && (i) < (j))))

#define DEF_SORT(T)                                                                     \
  static void msort_##T(const T *v, int64_t *p, int64_t *tmp, int64_t n, int desc) {    \
    for (int64_t w = 1; w < n; w *= 2) {                                                \
      for (int64_t lo = 0; lo < n; lo += 2 * w) {                                       \
        int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;    \
        int64_t i = lo, j = mid, o = lo;                                                \
        while (i < mid && j < hi) {                                                     \
          int64_t pi = p[i], pj = p[j];                                                 \
          if (BEFORE(v[pj], pj, v[pi], pi, desc)) tmp[o++] = p[j++];                    \
          else tmp[o++] = p[i++];                                                       \
        }                                                                               \
        while (i < mid) tmp[o++] = p[i++];                                              \
        while (j < hi) tmp[o++] = p[j++];                                               \
      }                                                                                 \
      memcpy(p, tmp, sizeof(int64_t) * (size_t)n);                                      \
    }                                                                                   \
  }                                                                                     \
  /* the first k of each column in order: values and 1-based positions */               \
  static int sort_##T(rm_ctx *ctx, const T *x, T *val, int64_t *idx, cols c, int64_t k, int desc) { \
    const int64_t m = c.outer * c.inner;                                                \
    int fail = 0;                                                                       \
    _Pragma("omp parallel if (m * c.n > RM_CPU_PAR_MIN && m > 1)")                      \
    {                                                                                   \
      T *v = malloc(sizeof(T) * (size_t)(c.n ? c.n : 1));                               \
      int64_t *p = malloc(sizeof(int64_t) * (size_t)(c.n ? c.n : 1));                   \
      int64_t *tmp = malloc(sizeof(int64_t) * (size_t)(c.n ? c.n : 1));                 \
      if (!v || !p || !tmp) {                                                           \
        _Pragma("omp atomic write")                                                     \
        fail = 1;                                                                       \
      } else {                                                                          \
        _Pragma("omp for")                                                              \
        for (int64_t q = 0; q < m; q++) {                                               \
          int64_t o = q / c.inner, in_ = q % c.inner;                                   \
          const T *src = x + o * c.n * c.inner + in_;                                   \
          for (int64_t e = 0; e < c.n; e++) { v[e] = src[e * c.inner]; p[e] = e; }      \
          msort_##T(v, p, tmp, c.n, desc);                                              \
          T *dv = val + o * k * c.inner + in_; int64_t *di = idx + o * k * c.inner + in_;     \
          for (int64_t r = 0; r < k; r++) {                                             \
            dv[r * c.inner] = v[p[r]];                                                  \
            di[r * c.inner] = p[r] + 1;                                                      \
          }                                                                             \
        }                                                                               \
      }                                                                                 \
      free(v); free(p); free(tmp);                                                      \
    }                                                                                   \
    return fail ? rm_fail(ctx, RM_ERR_OOM, "sort: out of host memory for a column of %lld", \
                          (long long)c.n) : RM_OK;                                      \
  }
DEF_SORT(float)
DEF_SORT(double)

static int sort_run(rm_ctx *ctx, const char *op, rm_tensor *const *in, rm_tensor *const *out,
                    int64_t dim, int64_t k, int desc) {
  cols c = columns(in[0], dim);
  if (c.outer * c.inner == 0 || k == 0) return RM_OK;
  if (in[0]->dtype == RM_F64)
    return sort_double(ctx, rm_tensor_ptr(in[0]), rm_tensor_ptr(out[0]), rm_tensor_ptr(out[1]), c, k, desc);
  if (in[0]->dtype == RM_F32)
    return sort_float(ctx, rm_tensor_ptr(in[0]), rm_tensor_ptr(out[0]), rm_tensor_ptr(out[1]), c, k, desc);
  return rm_fail(ctx, RM_ERR_DTYPE, "%s: cpu does not support %s", op, rm_dtype_name(in[0]->dtype));
}

RM_CPU_KERNEL(sort) {
  return sort_run(ctx, "sort", in, out, a->sort.dim, columns(in[0], a->sort.dim).n, a->sort.descending);
}

RM_CPU_KERNEL(topk) {
  return sort_run(ctx, "topk", in, out, a->topk.dim, a->topk.k, a->topk.largest);
}

/* ---- cumsum: a float64 running sum, rounded to T at each step ---- */

#define DEF_CUMSUM(T)                                                                   \
  static void cumsum_##T(const T *x, T *y, cols c, int rev) {                           \
    const int64_t m = c.outer * c.inner;                                                \
    _Pragma("omp parallel for if (m * c.n > RM_CPU_PAR_MIN && m > 1)")                  \
    for (int64_t q = 0; q < m; q++) {                                                   \
      int64_t base = (q / c.inner) * c.n * c.inner + q % c.inner;                       \
      double s = 0;                                                                     \
      for (int64_t e = 0; e < c.n; e++) {                                               \
        int64_t k = (rev ? c.n - 1 - e : e) * c.inner + base;                           \
        s += (double)x[k];                                                              \
        y[k] = (T)s;                                                                    \
      }                                                                                 \
    }                                                                                   \
  }
DEF_CUMSUM(float)
DEF_CUMSUM(double)

RM_CPU_KERNEL(cumsum) {
  cols c = columns(in[0], a->cumsum.dim);
  if (in[0]->dtype == RM_F64) cumsum_double(rm_tensor_ptr(in[0]), rm_tensor_ptr(out[0]), c, a->cumsum.reverse);
  else if (in[0]->dtype == RM_F32) cumsum_float(rm_tensor_ptr(in[0]), rm_tensor_ptr(out[0]), c, a->cumsum.reverse);
  else return rm_fail(ctx, RM_ERR_DTYPE, "cumsum: cpu does not support %s", rm_dtype_name(in[0]->dtype));
  return RM_OK;
}
