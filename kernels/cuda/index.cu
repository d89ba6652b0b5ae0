/* CUDA kernels for the indexing ops (shapes and attrs: core/op_index.c), with the
 * semantics of kernels/cpu/index.c. Index tensors hold 1-based whole numbers (float32,
 * float64 or bfloat16); every kernel first checks them on the device and reads back
 * the first bad position (one small synchronous copy), so a bad index is the same
 * clear error as on the CPU, never an out-of-bounds access.
 *
 * Accumulating kernels (index_add, scatter_add) give each output element (or output
 * line) to one thread that adds in a fixed order: no atomics, so results are
 * deterministic, as on the CPU. */
#include <math.h>
#include <string.h>

#include "cuda_common.cuh"

__device__ __forceinline__ double ix_val(const void *p, rm_dtype dt, int64_t k) {
  switch (dt) {
  case RM_F64: return ((const double *)p)[k];
  case RM_BF16: return (double)__bfloat162float(((const __nv_bfloat16 *)p)[k]);
  default: return (double)((const float *)p)[k];
  }
}

/* 0-based position held at k (valid once the check passed). */
__device__ __forceinline__ int64_t ix_pos(const void *p, rm_dtype dt, int64_t k) {
  return (int64_t)ix_val(p, dt, k) - 1;
}

__global__ void ix_check_kernel(const void *p, rm_dtype dt, int64_t n, int64_t size,
                                unsigned long long *bad) {
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n;
       k += (int64_t)gridDim.x * blockDim.x) {
    double v = ix_val(p, dt, k);
    if (!(v >= 1 && v <= (double)size && v == floor(v))) atomicMin(bad, (unsigned long long)k);
  }
}

/* Finds the first (row-major) value of idx (contiguous data p) that is not a whole
 * number in 1..size: *pos = its position (-1: none) and *val its value. */
int cu_first_bad_index(rm_ctx *ctx, const char *op, const rm_tensor *idx, const void *p,
                       int64_t size, int64_t *pos, double *val) {
  *pos = -1;
  int64_t n = cu_numel(idx);
  if (n == 0) return RM_OK;
  if (idx->dtype != RM_F32 && idx->dtype != RM_F64 && idx->dtype != RM_BF16)
    return cu_fail(ctx, RM_ERR_DTYPE, "%s: indices must be float32, float64 or bfloat16 (got %s)", op,
                   cu_dname(idx->dtype));
  cudaStream_t st = cu_st(ctx)->stream;
  unsigned long long *bad = (unsigned long long *)cu_scratch(ctx, sizeof *bad);
  if (!bad) return ctx->err_code;
  unsigned long long hbad = ~0ull;
  int rc = CU_CHECK(ctx, cudaMemcpyAsync(bad, &hbad, sizeof hbad, cudaMemcpyHostToDevice, st));
  if (!rc) {
    ix_check_kernel<<<cu_blocks(n), CU_THREADS, 0, st>>>(p, idx->dtype, n, size, bad);
    rc = CU_LAUNCHED(ctx, "index check kernel");
  }
  if (!rc) rc = CU_CHECK(ctx, cudaMemcpyAsync(&hbad, bad, sizeof hbad, cudaMemcpyDeviceToHost, st));
  if (!rc) rc = CU_CHECK(ctx, cudaStreamSynchronize(st));
  cu_scratch_free(ctx, bad, sizeof *bad);
  if (rc || hbad == ~0ull) return rc;
  size_t es = cu_dsize(idx->dtype);
  unsigned char raw[8] = { 0 };
  rc = CU_CHECK(ctx, cudaMemcpyAsync(raw, (const char *)p + hbad * es, es, cudaMemcpyDeviceToHost, st));
  if (!rc) rc = CU_CHECK(ctx, cudaStreamSynchronize(st));
  if (rc) return rc;
  double v;
  if (idx->dtype == RM_F64) { memcpy(&v, raw, 8); }
  else if (idx->dtype == RM_F32) { float f; memcpy(&f, raw, 4); v = f; }
  else { uint32_t u = (uint32_t)(raw[0] | raw[1] << 8) << 16; float f; memcpy(&f, &u, 4); v = f; }
  if (v != v) v = NAN; /* print "nan", not "-nan" */
  *pos = (int64_t)hbad;
  *val = v;
  return RM_OK;
}

/* Checks the indices; the error names the op, the value, the range, the dim (dim >= 0)
 * and the position, as on the CPU. */
static int check_indices(rm_ctx *ctx, const char *op, const rm_tensor *idx, const void *p,
                         int64_t size, int dim) {
  int64_t pos;
  double v;
  int rc = cu_first_bad_index(ctx, op, idx, p, size, &pos, &v);
  if (rc || pos < 0) return rc;
  char where[64];
  if (dim >= 0) snprintf(where, sizeof where, "dimension %d, position %lld", dim + 1, (long long)pos + 1);
  else snprintf(where, sizeof where, "position %lld", (long long)pos + 1);
  if (v == floor(v))
    return cu_fail(ctx, RM_ERR_ARG, "%s: index %.17g is out of range 1..%lld (%s)", op, v, (long long)size, where);
  return cu_fail(ctx, RM_ERR_ARG, "%s: index %.17g is not a whole number in 1..%lld (%s)", op, v,
                 (long long)size, where);
}

static void split(int ndim, const int64_t *shape, int d, int64_t *outer, int64_t *mid, int64_t *inner) {
  *outer = 1;
  *inner = 1;
  for (int k = 0; k < d; k++) *outer *= shape[k];
  for (int k = d + 1; k < ndim; k++) *inner *= shape[k];
  *mid = ndim ? shape[d] : 1;
}

static int norm_dim(int64_t dim, int ndim) { return (int)(dim < 0 ? dim + ndim : dim); }

#define GRID_LOOP(i, n)                                                         \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);     \
       i += (int64_t)gridDim.x * blockDim.x)

/* ---- index_select / embedding: element copies (T = storage unit of the dtype size) ---- */

template <class T>
__global__ void index_select_kernel(const T *x, T *o, const void *ip, rm_dtype idt, int64_t outer,
                                    int64_t len, int64_t size, int64_t inner) {
  int64_t n = outer * len * inner;
  GRID_LOOP(e, n) {
    int64_t i = e % inner, r = e / inner, k = r % len, ou = r / len;
    o[e] = x[(ou * size + ix_pos(ip, idt, k)) * inner + i];
  }
}

/* Raw copies of elements of 2, 4 or 8 bytes. */
#define CU_BY_SIZE(es, ...)                                                     \
  do {                                                                          \
    if ((es) == 8) { typedef uint64_t U; __VA_ARGS__; }                         \
    else if ((es) == 4) { typedef uint32_t U; __VA_ARGS__; }                    \
    else { typedef uint16_t U; __VA_ARGS__; }                                   \
  } while (0)

RM_CUDA_KERNEL(index_select) {
  (void)nout;
  const rm_tensor *x = in[0], *idx = in[1];
  int d = norm_dim(a->i[0], x->ndim);
  cu_inputs ci;
  int rc = cu_inputs_get(ctx, nin, in, &ci);
  int64_t outer, size, inner, len = idx->shape[0];
  split(x->ndim, x->shape, d, &outer, &size, &inner);
  if (!rc) rc = check_indices(ctx, "index_select", idx, ci.p[1], size, d);
  int64_t n = outer * len * inner;
  if (!rc && n) {
    cudaStream_t st = cu_st(ctx)->stream;
    CU_BY_SIZE(cu_dsize(x->dtype),
               index_select_kernel<U><<<cu_blocks(n), CU_THREADS, 0, st>>>(
                   (const U *)ci.p[0], (U *)cu_ptr(out[0]), ci.p[1], idx->dtype, outer, len, size, inner));
    rc = CU_LAUNCHED(ctx, "index_select kernel");
  }
  cu_inputs_free(ctx, &ci);
  return rc;
}

RM_CUDA_KERNEL(embedding) {
  (void)nout; (void)a;
  const rm_tensor *w = in[0], *idx = in[1];
  cu_inputs ci;
  int rc = cu_inputs_get(ctx, nin, in, &ci);
  if (!rc) rc = check_indices(ctx, "embedding", idx, ci.p[1], w->shape[0], -1);
  int64_t count = cu_numel(idx), dim = w->shape[1], n = count * dim;
  if (!rc && n) {
    cudaStream_t st = cu_st(ctx)->stream;
    /* an embedding is index_select along dim 0 of (V, D) */
    CU_BY_SIZE(cu_dsize(w->dtype),
               index_select_kernel<U><<<cu_blocks(n), CU_THREADS, 0, st>>>(
                   (const U *)ci.p[0], (U *)cu_ptr(out[0]), ci.p[1], idx->dtype, 1, count,
                   w->shape[0], dim));
    rc = CU_LAUNCHED(ctx, "embedding kernel");
  }
  cu_inputs_free(ctx, &ci);
  return rc;
}

/* ---- gather / scatter_add ---- */

/* Coordinates of idx element p (contiguous, shape I) mapped into a contiguous tensor of
 * shape X: the offset with the same coordinates except along d, where pos is used. */
typedef struct ix_geo {
  int ndim, d;
  int64_t I[RM_MAX_DIM], X[RM_MAX_DIM];
} ix_geo;

__device__ __forceinline__ int64_t ix_map(const ix_geo &g, int64_t p, int64_t pos) {
  int64_t off = 0, xs = 1;
  for (int k = g.ndim - 1; k >= 0; k--) {
    int64_t c = p % g.I[k];
    p /= g.I[k];
    off += (k == g.d ? pos : c) * xs;
    xs *= g.X[k];
  }
  return off;
}

template <class U>
__global__ void gather_kernel(const U *x, U *o, const void *ip, rm_dtype idt, int64_t n, ix_geo g) {
  GRID_LOOP(p, n) o[p] = x[ix_map(g, p, ix_pos(ip, idt, p))];
}

/* One thread per line along d (the positions that share the other coordinates): its
 * additions land in one output line, in order, without races. */
template <class T>
__global__ void scatter_add_kernel(const T *src, T *o, const void *ip, rm_dtype idt, int64_t groups,
                                   int64_t line, int64_t istride, ix_geo g) {
  typedef typename cu_acc<T>::type A;
  GRID_LOOP(q, groups) {
    /* first element of group q: q enumerates the coordinates other than d */
    int64_t rest = q, ib = 0, is = 1;
    for (int k = g.ndim - 1; k >= 0; k--) {
      if (k != g.d) {
        int64_t c = rest % g.I[k];
        rest /= g.I[k];
        ib += c * is;
      }
      is *= g.I[k];
    }
    for (int64_t t = 0; t < line; t++) {
      int64_t p = ib + t * istride;
      T *dst = o + ix_map(g, p, ix_pos(ip, idt, p));
      cu_sv(dst, cu_ld(dst) + cu_ld(src + p));
    }
  }
}

static ix_geo ix_geo_make(const rm_tensor *idx_like, const rm_tensor *x_like, int d) {
  ix_geo g;
  g.ndim = idx_like->ndim;
  g.d = d;
  for (int k = 0; k < g.ndim; k++) g.I[k] = idx_like->shape[k], g.X[k] = x_like->shape[k];
  return g;
}

RM_CUDA_KERNEL(gather) {
  (void)nout;
  const rm_tensor *x = in[0], *idx = in[1];
  int d = norm_dim(a->i[0], x->ndim);
  cu_inputs ci;
  int rc = cu_inputs_get(ctx, nin, in, &ci);
  if (!rc) rc = check_indices(ctx, "gather", idx, ci.p[1], x->shape[d], d);
  int64_t n = cu_numel(idx);
  if (!rc && n) {
    cudaStream_t st = cu_st(ctx)->stream;
    ix_geo g = ix_geo_make(idx, x, d);
    CU_BY_SIZE(cu_dsize(x->dtype),
               gather_kernel<U><<<cu_blocks(n), CU_THREADS, 0, st>>>(
                   (const U *)ci.p[0], (U *)cu_ptr(out[0]), ci.p[1], idx->dtype, n, g));
    rc = CU_LAUNCHED(ctx, "gather kernel");
  }
  cu_inputs_free(ctx, &ci);
  return rc;
}

RM_CUDA_KERNEL(scatter_add) {
  (void)nout;
  const rm_tensor *src = in[0], *idx = in[1];
  rm_tensor *o = out[0];
  int d = norm_dim(a->i[0], src->ndim);
  cu_inputs ci;
  int rc = cu_inputs_get(ctx, nin, in, &ci);
  if (!rc) rc = check_indices(ctx, "scatter_add", idx, ci.p[1], o->shape[d], d);
  if (!rc) rc = cu_fill(ctx, cu_ptr(o), o->dtype, cu_numel(o), 0.0);
  int64_t n = cu_numel(src);
  if (!rc && n) {
    int64_t line = src->shape[d], groups = n / line, istride = 1;
    for (int k = d + 1; k < src->ndim; k++) istride *= src->shape[k];
    ix_geo g = ix_geo_make(src, o, d);
    cudaStream_t st = cu_st(ctx)->stream;
    CU_DISPATCH(ctx, "scatter_add", o->dtype,
                scatter_add_kernel<T><<<cu_blocks(groups), CU_THREADS, 0, st>>>(
                    (const T *)ci.p[0], (T *)cu_ptr(o), ci.p[1], idx->dtype, groups, line, istride, g));
    rc = CU_LAUNCHED(ctx, "scatter_add kernel");
  }
  cu_inputs_free(ctx, &ci);
  return rc;
}

/* ---- index_add: one thread per (outer, inner) output column, k in order ---- */

template <class T>
__global__ void index_add_kernel(const T *src, T *o, const void *ip, rm_dtype idt, int64_t outer,
                                 int64_t len, int64_t size, int64_t inner) {
  typedef typename cu_acc<T>::type A;
  GRID_LOOP(c, outer * inner) {
    int64_t ou = c / inner, i = c % inner;
    for (int64_t k = 0; k < len; k++) {
      T *dst = o + (ou * size + ix_pos(ip, idt, k)) * inner + i;
      cu_sv(dst, cu_ld(dst) + cu_ld(src + (ou * len + k) * inner + i));
    }
  }
}

RM_CUDA_KERNEL(index_add) {
  (void)nout;
  const rm_tensor *src = in[0], *idx = in[1];
  rm_tensor *o = out[0];
  int d = norm_dim(a->i[0], src->ndim);
  int64_t size = a->i[1];
  cu_inputs ci;
  int rc = cu_inputs_get(ctx, nin, in, &ci);
  if (!rc) rc = check_indices(ctx, "index_add", idx, ci.p[1], size, d);
  if (!rc) rc = cu_fill(ctx, cu_ptr(o), o->dtype, cu_numel(o), 0.0);
  int64_t outer, len, inner;
  split(src->ndim, src->shape, d, &outer, &len, &inner);
  if (!rc && cu_numel(src)) {
    cudaStream_t st = cu_st(ctx)->stream;
    CU_DISPATCH(ctx, "index_add", o->dtype,
                index_add_kernel<T><<<cu_blocks(outer * inner), CU_THREADS, 0, st>>>(
                    (const T *)ci.p[0], (T *)cu_ptr(o), ci.p[1], idx->dtype, outer, len, size, inner));
    rc = CU_LAUNCHED(ctx, "index_add kernel");
  }
  cu_inputs_free(ctx, &ci);
  return rc;
}

/* ---- concat, narrow_backward: 2-D copies ---- */

RM_CUDA_KERNEL(concat) {
  (void)nout;
  rm_tensor *o = out[0];
  int d = norm_dim(a->i[0], o->ndim);
  int64_t outer, total, inner;
  split(o->ndim, o->shape, d, &outer, &total, &inner);
  size_t es = cu_dsize(o->dtype);
  char *po = (char *)cu_ptr(o);
  cudaStream_t st = cu_st(ctx)->stream;
  int64_t start = 0;
  int rc = RM_OK;
  for (int t = 0; t < nin && !rc; t++) {
    int64_t len = in[t]->shape[d];
    size_t block = (size_t)(len * inner) * es;
    if (block && outer) {
      void *scratch = NULL;
      const void *pi = cu_contig_data(ctx, in[t], &scratch);
      if (!pi) return ctx->err_code;
      rc = CU_CHECK(ctx, cudaMemcpy2DAsync(po + (size_t)(start * inner) * es, (size_t)(total * inner) * es,
                                           pi, block, block, (size_t)outer, cudaMemcpyDeviceToDevice, st));
      if (scratch) cu_scratch_free(ctx, scratch, (size_t)cu_numel(in[t]) * es);
    }
    start += len;
  }
  return rc;
}

RM_CUDA_KERNEL(narrow_backward) {
  (void)nin; (void)nout;
  const rm_tensor *g = in[0];
  rm_tensor *o = out[0];
  int d = norm_dim(a->i[0], g->ndim);
  int64_t outer, len, inner, full = a->i[2], start = a->i[1];
  split(g->ndim, g->shape, d, &outer, &len, &inner);
  size_t es = cu_dsize(g->dtype);
  size_t block = (size_t)(len * inner) * es, full_block = (size_t)(full * inner) * es;
  int rc = cu_fill(ctx, cu_ptr(o), o->dtype, cu_numel(o), 0.0);
  if (rc || !block || !outer) return rc;
  void *scratch = NULL;
  const void *pg = cu_contig_data(ctx, g, &scratch);
  if (!pg) return ctx->err_code;
  rc = CU_CHECK(ctx, cudaMemcpy2DAsync((char *)cu_ptr(o) + (size_t)(start * inner) * es, full_block, pg,
                                       block, block, (size_t)outer, cudaMemcpyDeviceToDevice,
                                       cu_st(ctx)->stream));
  if (scratch) cu_scratch_free(ctx, scratch, (size_t)cu_numel(g) * es);
  return rc;
}

/* ---- causal_mask: -inf (i[0] = 0) or 0 (i[0] = 1) above the diagonal ---- */

template <class T>
__global__ void causal_kernel(const T *x, T *o, int64_t n, int64_t len, bool zero) {
  typedef typename cu_acc<T>::type A;
  GRID_LOOP(e, n) {
    int64_t j = e % len, i = (e / len) % len;
    cu_sv(o + e, j <= i ? cu_ld(x + e) : (zero ? (A)0 : (A)-INFINITY));
  }
}

RM_CUDA_KERNEL(causal_mask) {
  (void)nin; (void)nout;
  rm_tensor *o = out[0];
  int64_t len = o->ndim ? o->shape[o->ndim - 1] : 1, n = cu_numel(o);
  if (!n || !len) return RM_OK;
  void *scratch = NULL;
  const void *x = cu_contig_data(ctx, in[0], &scratch);
  if (!x) return ctx->err_code;
  cudaStream_t st = cu_st(ctx)->stream;
  int rc;
  CU_DISPATCH(ctx, "causal_mask", o->dtype,
              causal_kernel<T><<<cu_blocks(n), CU_THREADS, 0, st>>>((const T *)x, (T *)cu_ptr(o), n,
                                                                     len, a->i[0] != 0));
  rc = CU_LAUNCHED(ctx, "causal_mask kernel");
  if (scratch) cu_scratch_free(ctx, scratch, (size_t)n * cu_dsize(o->dtype));
  return rc;
}
