/* CPU kernels for the indexing ops (see core/op_index.c for shapes and attrs). Inputs
 * are contiguous. Index tensors hold 1-based whole numbers as float32 or float64; each
 * kernel checks them all (rm_cpu_check_indices, serially, before any parallel work) so
 * a bad index is a clear error, never an out-of-bounds access. Accumulating kernels
 * (index_add, scatter_add) give each output element to one thread and add in a fixed
 * order, so results are bit-identical whatever the thread count. */
#include <string.h>

#include "cpu.h"

/* Index values for dimension dim (-1: none named) of a tensor of that size. */
static int check_indices(rm_ctx *ctx, const char *op, const rm_tensor *idx, int64_t size, int dim) {
  return rm_cpu_check_indices(ctx, op, "index", idx, size, dim, "position");
}

/* Sizes before, at and after dimension d of a shape. */
static void split(int ndim, const int64_t *shape, int d, int64_t *outer, int64_t *mid, int64_t *inner) {
  *outer = 1;
  *inner = 1;
  for (int k = 0; k < d; k++) *outer *= shape[k];
  for (int k = d + 1; k < ndim; k++) *inner *= shape[k];
  *mid = shape[d];
}

static int norm_dim(int64_t dim, int ndim) { return (int)(dim < 0 ? dim + ndim : dim); }

RM_CPU_KERNEL(index_select) {
  const rm_tensor *x = in[0], *idx = in[1];
  int d = norm_dim(a->axis.dim, x->ndim);
  if (check_indices(ctx, "index_select", idx, x->shape[d], d)) return ctx->err_code;
  int64_t outer, size, inner, len = idx->shape[0];
  split(x->ndim, x->shape, d, &outer, &size, &inner);
  size_t es = rm_dtype_size(x->dtype), row = (size_t)inner * es;
  const char *px = rm_tensor_ptr(x);
  char *po = rm_tensor_ptr(out[0]);
  rm_cpu_indices ip = rm_cpu_indices_of(idx);
  int64_t rows = outer * len;
  #pragma omp parallel for if (rows * inner > RM_CPU_PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    int64_t o = r / len, k = r % len;
    memcpy(po + (size_t)r * row, px + (size_t)(o * size + rm_cpu_index_at(ip, k)) * row, row);
  }
  return RM_OK;
}

/* Walks idx (shape I, contiguous) in groups: one group per position of the dims other
 * than d, each a line of I[d] elements along d. For group g, *ibase is the offset of
 * the line's first element in idx and *xbase the offset of the same coordinates (with
 * 0 along d) in a contiguous tensor of shape X. */
static void group_base(int ndim, const int64_t *I, const int64_t *X, int d, int64_t g,
                       int64_t *ibase, int64_t *xbase) {
  int64_t ib = 0, xb = 0, is = 1, xs = 1;
  for (int k = ndim - 1; k >= 0; k--) {
    if (k != d) {
      int64_t c = g % I[k];
      g /= I[k];
      ib += c * is;
      xb += c * xs;
    }
    is *= I[k];
    xs *= X[k];
  }
  *ibase = ib;
  *xbase = xb;
}

static int64_t stride_of(int ndim, const int64_t *shape, int d) {
  int64_t s = 1;
  for (int k = d + 1; k < ndim; k++) s *= shape[k];
  return s;
}

#define GATHER_LOOP(T)                                                                       \
  do {                                                                                       \
    const T *px = rm_tensor_ptr(x);                                                          \
    T *po = rm_tensor_ptr(out[0]);                                                           \
    _Pragma("omp parallel for if (n > RM_CPU_PAR_MIN)")                                      \
    for (int64_t g = 0; g < groups; g++) {                                                   \
      int64_t ib, xb;                                                                        \
      group_base(x->ndim, idx->shape, x->shape, d, g, &ib, &xb);                             \
      for (int64_t t = 0; t < line; t++) {                                                   \
        int64_t p = ib + t * istride;                                                        \
        po[p] = px[xb + rm_cpu_index_at(ip, p) * xstride];                                            \
      }                                                                                      \
    }                                                                                        \
  } while (0)

RM_CPU_KERNEL(gather) {
  const rm_tensor *x = in[0], *idx = in[1];
  int d = norm_dim(a->axis.dim, x->ndim);
  if (check_indices(ctx, "gather", idx, x->shape[d], d)) return ctx->err_code;
  int64_t n = rm_tensor_numel(idx), line = idx->shape[d];
  if (n == 0) return RM_OK;
  int64_t groups = n / line;
  int64_t istride = stride_of(idx->ndim, idx->shape, d), xstride = stride_of(x->ndim, x->shape, d);
  rm_cpu_indices ip = rm_cpu_indices_of(idx);
  if (x->dtype == RM_F64) GATHER_LOOP(double);
  else GATHER_LOOP(float);
  return RM_OK;
}

#define SCATTER_ADD_LOOP(T)                                                                  \
  do {                                                                                       \
    const T *ps = rm_tensor_ptr(src);                                                        \
    T *po = rm_tensor_ptr(out[0]);                                                           \
    _Pragma("omp parallel for if (n > RM_CPU_PAR_MIN)")                                      \
    for (int64_t g = 0; g < groups; g++) {                                                   \
      int64_t ib, ob;                                                                        \
      group_base(src->ndim, src->shape, out[0]->shape, d, g, &ib, &ob);                      \
      for (int64_t t = 0; t < line; t++) {                                                   \
        int64_t p = ib + t * istride;                                                        \
        po[ob + rm_cpu_index_at(ip, p) * ostride] += ps[p];                                           \
      }                                                                                      \
    }                                                                                        \
  } while (0)

RM_CPU_KERNEL(scatter_add) {
  const rm_tensor *src = in[0], *idx = in[1];
  int d = norm_dim(a->scatter_add.dim, src->ndim);
  if (check_indices(ctx, "scatter_add", idx, out[0]->shape[d], d)) return ctx->err_code;
  memset(rm_tensor_ptr(out[0]), 0, rm_tensor_nbytes(out[0]));
  int64_t n = rm_tensor_numel(src), line = src->shape[d];
  if (n == 0) return RM_OK;
  int64_t groups = n / line;
  int64_t istride = stride_of(src->ndim, src->shape, d);
  int64_t ostride = stride_of(out[0]->ndim, out[0]->shape, d);
  rm_cpu_indices ip = rm_cpu_indices_of(idx);
  if (src->dtype == RM_F64) SCATTER_ADD_LOOP(double);
  else SCATTER_ADD_LOOP(float);
  return RM_OK;
}

/* Output elements are split in (outer, chunk of inner) tiles, one thread per tile. */
#define INDEX_ADD_CHUNK 64
#define INDEX_ADD_LOOP(T)                                                                    \
  do {                                                                                       \
    const T *ps = rm_tensor_ptr(src);                                                        \
    T *po = rm_tensor_ptr(out[0]);                                                           \
    _Pragma("omp parallel for if (n > RM_CPU_PAR_MIN)")                                      \
    for (int64_t tile = 0; tile < tiles; tile++) {                                           \
      int64_t o = tile / chunks, i0 = (tile % chunks) * INDEX_ADD_CHUNK;                     \
      int64_t i1 = i0 + INDEX_ADD_CHUNK < inner ? i0 + INDEX_ADD_CHUNK : inner;              \
      for (int64_t k = 0; k < len; k++) {                                                    \
        T *dst = po + (o * size + rm_cpu_index_at(ip, k)) * inner;                                    \
        const T *s = ps + (o * len + k) * inner;                                             \
        for (int64_t i = i0; i < i1; i++) dst[i] += s[i];                                    \
      }                                                                                      \
    }                                                                                        \
  } while (0)

RM_CPU_KERNEL(index_add) {
  const rm_tensor *src = in[0], *idx = in[1];
  int d = norm_dim(a->index_add.dim, src->ndim);
  int64_t size = a->index_add.size;
  if (check_indices(ctx, "index_add", idx, size, d)) return ctx->err_code;
  memset(rm_tensor_ptr(out[0]), 0, rm_tensor_nbytes(out[0]));
  int64_t outer, len, inner;
  split(src->ndim, src->shape, d, &outer, &len, &inner);
  int64_t n = rm_tensor_numel(src);
  if (n == 0) return RM_OK;
  int64_t chunks = (inner + INDEX_ADD_CHUNK - 1) / INDEX_ADD_CHUNK, tiles = outer * chunks;
  rm_cpu_indices ip = rm_cpu_indices_of(idx);
  if (src->dtype == RM_F64) INDEX_ADD_LOOP(double);
  else INDEX_ADD_LOOP(float);
  return RM_OK;
}

RM_CPU_KERNEL(concat) {
  int d = norm_dim(a->axis.dim, out[0]->ndim);
  int64_t outer, total, inner;
  split(out[0]->ndim, out[0]->shape, d, &outer, &total, &inner);
  size_t es = rm_dtype_size(out[0]->dtype);
  char *po = rm_tensor_ptr(out[0]);
  int64_t start = 0;
  for (int t = 0; t < nin; t++) {
    int64_t len = in[t]->shape[d];
    size_t block = (size_t)(len * inner) * es;
    const char *pi = rm_tensor_ptr(in[t]);
    if (block) {
      #pragma omp parallel for if (outer * len * inner > RM_CPU_PAR_MIN)
      for (int64_t o = 0; o < outer; o++)
        memcpy(po + (size_t)((o * total + start) * inner) * es, pi + (size_t)o * block, block);
    }
    start += len;
  }
  return RM_OK;
}

RM_CPU_KERNEL(embedding) {
  const rm_tensor *w = in[0], *idx = in[1];
  if (check_indices(ctx, "embedding", idx, w->shape[0], -1)) return ctx->err_code;
  int64_t count = rm_tensor_numel(idx), dim = w->shape[1];
  size_t row = (size_t)dim * rm_dtype_size(w->dtype);
  const char *pw = rm_tensor_ptr(w);
  char *po = rm_tensor_ptr(out[0]);
  rm_cpu_indices ip = rm_cpu_indices_of(idx);
  if (row == 0) return RM_OK;
  #pragma omp parallel for if (count * dim > RM_CPU_PAR_MIN)
  for (int64_t k = 0; k < count; k++) memcpy(po + (size_t)k * row, pw + (size_t)rm_cpu_index_at(ip, k) * row, row);
  return RM_OK;
}

#define CAUSAL_LOOP(T)                                                                       \
  do {                                                                                       \
    const T *px = rm_tensor_ptr(in[0]);                                                      \
    T *po = rm_tensor_ptr(out[0]);                                                           \
    const T fill = a->causal_mask.zeros ? (T)0 : (T)-INFINITY;                               \
    _Pragma("omp parallel for if (rows * len > RM_CPU_PAR_MIN)")                             \
    for (int64_t r = 0; r < rows; r++) {                                                     \
      int64_t i = r % len;                                                                   \
      const T *s = px + r * len;                                                             \
      T *o = po + r * len;                                                                   \
      if (o != s) memcpy(o, s, (size_t)(i + 1) * sizeof(T));                                 \
      _Pragma("omp simd")                                                                    \
      for (int64_t j = i + 1; j < len; j++) o[j] = fill;                                     \
    }                                                                                        \
  } while (0)

RM_CPU_KERNEL(causal_mask) {
  int64_t len = out[0]->shape[out[0]->ndim - 1];
  int64_t rows = len ? rm_tensor_numel(out[0]) / len : 0;
  if (out[0]->dtype == RM_F64) CAUSAL_LOOP(double);
  else CAUSAL_LOOP(float);
  return RM_OK;
}

RM_CPU_KERNEL(narrow_backward) {
  const rm_tensor *g = in[0];
  int d = norm_dim(a->narrow_backward.dim, g->ndim);
  int64_t outer, len, inner, full = a->narrow_backward.size, start = a->narrow_backward.start;
  split(g->ndim, g->shape, d, &outer, &len, &inner);
  size_t es = rm_dtype_size(g->dtype);
  size_t block = (size_t)(len * inner) * es, full_block = (size_t)(full * inner) * es;
  const char *pg = rm_tensor_ptr(g);
  char *po = rm_tensor_ptr(out[0]);
  if (!full_block) return RM_OK;
  #pragma omp parallel for if (outer * full * inner > RM_CPU_PAR_MIN)
  for (int64_t o = 0; o < outer; o++) {
    char *dst = po + (size_t)o * full_block;
    size_t before = (size_t)(start * inner) * es;
    memset(dst, 0, before);
    if (block) memcpy(dst + before, pg + (size_t)o * block, block);
    memset(dst + before + block, 0, full_block - before - block);
  }
  return RM_OK;
}
