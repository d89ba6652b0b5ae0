/* CUDA kernels for the indexing ops (shapes and attrs: core/op_index.c), with the
 * semantics of kernels/cpu/index.c. Index tensors hold 1-based whole numbers (float32,
 * float64 or bfloat16). Every kernel queues a check of its indices on the device
 * (cu_check_indices, backend.cu) and does not wait for it: a bad index is reported, with
 * the CPU's wording, at the next synchronisation (or at the op under REMAT_CUDA_SYNC=1);
 * meanwhile the kernels skip bad values (reads give 0, additions are dropped), so a bad
 * index is never an out-of-bounds access.
 *
 * Accumulating kernels are deterministic (no floating-point atomics) and accumulate in
 * float32 (float64 for float64), rounding to bfloat16 once per output element:
 * - index_add (the backward of embedding and index_select): the positions are sorted by
 *   target with a stable radix sort (CUB), so each target row's contributions form one
 *   run in source order; a block per run sums it column by column (threads over the
 *   columns, coalesced) and writes the row once.
 *   Estimate (from bytes, not measured) for the GPT-2 small embedding backward (8192
 *   tokens x 768, bf16, V = 50257) on an H100/H200: the sort of 8192 keys ~20 us, the
 *   gradient read once (12.6 MB) and the 77 MB table zeroed and written once, ~30 us;
 *   before, 768 threads each walked all 8192 tokens (~8192 dependent loads deep), ~2 ms.
 * - scatter_add: a thread per line along the dim, adding in order into a float32
 *   copy of the output for bfloat16 (float64 and float32 add in place). */
#include <math.h>
#include <string.h>

#include <cub/device/device_radix_sort.cuh>

#include "cuda_common.cuh"

/* 0-based position held at k, or -1 for a bad value (the queued check reports it). */
__device__ __forceinline__ int64_t ix_pos(const void *p, rm_dtype dt, int64_t k, int64_t size) {
  return cu_index_at(p, dt, k, size);
}

static int check_indices(rm_ctx *ctx, const char *op, const rm_tensor *idx, const void *p,
                         int64_t size, int dim) {
  return cu_check_indices(ctx, op, "index", idx, p, size, dim);
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
    int64_t pos = ix_pos(ip, idt, k, size);
    o[e] = pos < 0 ? (T)0 : x[(ou * size + pos) * inner + i];
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
  const rm_tensor *x = in[0], *idx = in[1];
  int d = norm_dim(a->axis.dim, x->ndim);
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
  const rm_tensor *w = in[0], *idx = in[1];
  cu_inputs ci;
  int rc = cu_inputs_get(ctx, nin, in, &ci);
  if (!rc) rc = check_indices(ctx, "embedding", idx, ci.p[1], w->shape[0], CU_WHERE_POSITION);
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
  GRID_LOOP(p, n) {
    int64_t pos = ix_pos(ip, idt, p, g.X[g.d]);
    o[p] = pos < 0 ? (U)0 : x[ix_map(g, p, pos)];
  }
}

/* One thread per line along d (the positions that share the other coordinates): its
 * additions land in one output line, in order, without races. O: the accumulator
 * (float for bfloat16 sources: a float32 copy of the output). */
template <class T, class O>
__global__ void scatter_add_kernel(const T *src, O *o, const void *ip, rm_dtype idt, int64_t groups,
                                   int64_t line, int64_t istride, ix_geo g) {
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
      int64_t pos = ix_pos(ip, idt, p, g.X[g.d]);
      if (pos < 0) continue;
      O *dst = o + ix_map(g, p, pos);
      *dst += (O)cu_ld(src + p);
    }
  }
}

__global__ void f32_to_bf16_kernel(const float *a, __nv_bfloat16 *o, int64_t n) {
  GRID_LOOP(i, n) o[i] = __float2bfloat16(a[i]);
}

static ix_geo ix_geo_make(const rm_tensor *idx_like, const rm_tensor *x_like, int d) {
  ix_geo g;
  g.ndim = idx_like->ndim;
  g.d = d;
  for (int k = 0; k < g.ndim; k++) g.I[k] = idx_like->shape[k], g.X[k] = x_like->shape[k];
  return g;
}

RM_CUDA_KERNEL(gather) {
  const rm_tensor *x = in[0], *idx = in[1];
  int d = norm_dim(a->axis.dim, x->ndim);
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
  const rm_tensor *src = in[0], *idx = in[1];
  rm_tensor *o = out[0];
  int d = norm_dim(a->scatter_add.dim, src->ndim);
  cu_inputs ci;
  int rc = cu_inputs_get(ctx, nin, in, &ci);
  if (!rc) rc = check_indices(ctx, "scatter_add", idx, ci.p[1], o->shape[d], d);
  int64_t n = cu_numel(src), no = cu_numel(o);
  float *acc = NULL;
  cudaStream_t st = cu_st(ctx)->stream;
  if (!rc && o->dtype == RM_BF16 && no && !(acc = (float *)cu_scratch(ctx, (size_t)no * sizeof(float))))
    rc = ctx->err_code;
  if (!rc) rc = acc ? CU_CHECK(ctx, cudaMemsetAsync(acc, 0, (size_t)no * sizeof(float), st))
                    : cu_fill(ctx, cu_ptr(o), o->dtype, no, 0.0);
  if (!rc && n) {
    int64_t line = src->shape[d], groups = n / line, istride = 1;
    for (int k = d + 1; k < src->ndim; k++) istride *= src->shape[k];
    ix_geo g = ix_geo_make(src, o, d);
    switch (o->dtype) {
    case RM_F32:
      scatter_add_kernel<float, float><<<cu_blocks(groups), CU_THREADS, 0, st>>>(
          (const float *)ci.p[0], (float *)cu_ptr(o), ci.p[1], idx->dtype, groups, line, istride, g);
      break;
    case RM_F64:
      scatter_add_kernel<double, double><<<cu_blocks(groups), CU_THREADS, 0, st>>>(
          (const double *)ci.p[0], (double *)cu_ptr(o), ci.p[1], idx->dtype, groups, line, istride, g);
      break;
    case RM_BF16:
      scatter_add_kernel<__nv_bfloat16, float><<<cu_blocks(groups), CU_THREADS, 0, st>>>(
          (const __nv_bfloat16 *)ci.p[0], acc, ci.p[1], idx->dtype, groups, line, istride, g);
      break;
    default: rc = cu_bad_dtype(ctx, "scatter_add", o->dtype);
    }
    if (!rc) rc = CU_LAUNCHED(ctx, "scatter_add kernel");
  }
  if (!rc && acc) {
    f32_to_bf16_kernel<<<cu_blocks(no), CU_THREADS, 0, st>>>(acc, (__nv_bfloat16 *)cu_ptr(o), no);
    rc = CU_LAUNCHED(ctx, "scatter_add (rounding to bfloat16)");
  }
  if (acc) cu_scratch_free(ctx, acc, (size_t)no * sizeof(float));
  cu_inputs_free(ctx, &ci);
  return rc;
}

/* ---- index_add: stable sort by target, a block per run of equal targets ---- */

/* key[k] = target row of position k (size for a bad index: sorted last, skipped), val[k] = k. */
__global__ void ix_keys_kernel(const void *ip, rm_dtype idt, int64_t len, int64_t size, unsigned *key,
                               unsigned *val) {
  GRID_LOOP(k, len) {
    int64_t pos = ix_pos(ip, idt, k, size);
    key[k] = (unsigned)(pos < 0 ? size : pos);
    val[k] = (unsigned)k;
  }
}

/* Block r handles the run that starts at sorted position r (other blocks return): for
 * every outer slice and column i, o[ou, v, i] = sum over the run (in source order) of
 * src[ou, k, i], accumulated in A and stored once. */
template <class T>
__global__ void ix_add_runs_kernel(const T *src, T *o, const unsigned *key, const unsigned *val, int64_t outer,
                                   int64_t len, int64_t size, int64_t inner) {
  typedef typename cu_acc<T>::type A;
  for (int64_t r = blockIdx.x; r < len; r += gridDim.x) {
    unsigned v = key[r];
    if (v >= (unsigned)size || (r > 0 && key[r - 1] == v)) continue;
    int64_t end = r + 1;
    while (end < len && key[end] == v) end++;
    for (int64_t ou = 0; ou < outer; ou++)
      for (int64_t i = threadIdx.x; i < inner; i += blockDim.x) {
        A s = 0;
        for (int64_t q = r; q < end; q++) s += (A)cu_ld(src + (ou * len + val[q]) * inner + i);
        cu_sv(o + (ou * size + v) * inner + i, s);
      }
  }
}

static int bits_for(int64_t size) {
  int b = 1;
  while (b < 32 && ((int64_t)1 << b) <= size) b++;
  return b;
}

RM_CUDA_KERNEL(index_add) {
  const rm_tensor *src = in[0], *idx = in[1];
  rm_tensor *o = out[0];
  int d = norm_dim(a->index_add.dim, src->ndim);
  int64_t size = a->index_add.size;
  cu_inputs ci;
  int rc = cu_inputs_get(ctx, nin, in, &ci);
  if (!rc) rc = check_indices(ctx, "index_add", idx, ci.p[1], size, d);
  if (!rc) rc = cu_fill(ctx, cu_ptr(o), o->dtype, cu_numel(o), 0.0);
  int64_t outer, len, inner;
  split(src->ndim, src->shape, d, &outer, &len, &inner);
  if (!rc && len >= (int64_t)1 << 31)
    rc = cu_fail(ctx, RM_ERR_SHAPE, "index_add: more than 2^31 indices is not supported on cuda");
  if (rc || !cu_numel(src)) {
    cu_inputs_free(ctx, &ci);
    return rc;
  }
  cudaStream_t st = cu_st(ctx)->stream;
  size_t kb = (size_t)len * sizeof(unsigned), tmp = 0;
  unsigned *buf = NULL;
  void *temp = NULL;
  int nbits = bits_for(size);
  rc = CU_CHECK(ctx, cub::DeviceRadixSort::SortPairs(NULL, tmp, (const unsigned *)NULL, (unsigned *)NULL,
                                                     (const unsigned *)NULL, (unsigned *)NULL, (int)len, 0, nbits,
                                                     st));
  if (!rc && !(buf = (unsigned *)cu_scratch(ctx, 4 * kb))) rc = ctx->err_code;
  if (!rc && !(temp = cu_scratch(ctx, tmp ? tmp : 1))) rc = ctx->err_code;
  if (!rc) {
    unsigned *k0 = buf, *v0 = buf + len, *k1 = buf + 2 * len, *v1 = buf + 3 * len;
    ix_keys_kernel<<<cu_blocks(len), CU_THREADS, 0, st>>>(ci.p[1], idx->dtype, len, size, k0, v0);
    rc = CU_LAUNCHED(ctx, "index_add keys kernel");
    if (!rc)
      rc = CU_CHECK(ctx, cub::DeviceRadixSort::SortPairs(temp, tmp, k0, k1, v0, v1, (int)len, 0, nbits, st));
    if (!rc) {
      int threads = cu_row_threads(inner, 256);
      unsigned blocks = (unsigned)(len < 65535 ? len : 65535);
      CU_DISPATCH(ctx, "index_add", o->dtype,
                  ix_add_runs_kernel<T><<<blocks, threads, 0, st>>>((const T *)ci.p[0], (T *)cu_ptr(o), k1, v1,
                                                                    outer, len, size, inner));
      rc = CU_LAUNCHED(ctx, "index_add kernel");
    }
  }
  if (temp) cu_scratch_free(ctx, temp, tmp ? tmp : 1);
  if (buf) cu_scratch_free(ctx, buf, 4 * kb);
  cu_inputs_free(ctx, &ci);
  return rc;
}

/* ---- concat, narrow_backward: 2-D copies ---- */

RM_CUDA_KERNEL(concat) {
  rm_tensor *o = out[0];
  int d = norm_dim(a->axis.dim, o->ndim);
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
  const rm_tensor *g = in[0];
  rm_tensor *o = out[0];
  int d = norm_dim(a->narrow_backward.dim, g->ndim);
  int64_t outer, len, inner, full = a->narrow_backward.size, start = a->narrow_backward.start;
  split(g->ndim, g->shape, d, &outer, &len, &inner);
  size_t es = cu_dsize(g->dtype);
  size_t block = (size_t)(len * inner) * es, full_block = (size_t)(full * inner) * es;
  /* zero only what the slice does not cover: each element is written once */
  cudaStream_t st = cu_st(ctx)->stream;
  size_t before = (size_t)(start * inner) * es, after = full_block - before - block;
  int rc = RM_OK;
  if (outer && before)
    rc = CU_CHECK(ctx, cudaMemset2DAsync(cu_ptr(o), full_block, 0, before, (size_t)outer, st));
  if (!rc && outer && after)
    rc = CU_CHECK(ctx, cudaMemset2DAsync((char *)cu_ptr(o) + before + block, full_block, 0, after, (size_t)outer, st));
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
                                                                     len, a->causal_mask.zeros));
  rc = CU_LAUNCHED(ctx, "causal_mask kernel");
  if (scratch) cu_scratch_free(ctx, scratch, (size_t)n * cu_dsize(o->dtype));
  return rc;
}
