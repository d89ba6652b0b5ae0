/* CUDA kernels for min, sort, topk and cumsum; semantics of kernels/cpu/sort.c (and
 * core/op_sort.c). Inputs are contiguous; x is seen as (outer, n, inner) columns.
 *
 * sort/topk rank every element of a column by counting the elements that come before
 * it (one thread per element, O(n) each): the result equals the CPU's stable merge
 * sort exactly, ties and NaN included, and needs no scratch memory. Columns of many
 * thousands of elements are slow this way; a radix sort would be the next step. */
#include "cuda_common.cuh"

typedef struct { int64_t outer, n, inner; } cu_cols;

static cu_cols cu_columns(const rm_tensor *x, int64_t dim) {
  cu_cols c = { 1, 1, 1 };
  if (dim == INT64_MIN || x->ndim == 0) {
    c.n = cu_numel(x);
    return c;
  }
  int d = (int)(dim < 0 ? dim + x->ndim : dim);
  for (int k = 0; k < d; k++) c.outer *= x->shape[k];
  c.n = x->shape[d];
  for (int k = d + 1; k < x->ndim; k++) c.inner *= x->shape[k];
  return c;
}

/* ---- min: first minimum; the first NaN wins (one thread per column) ---- */

template <class T>
__global__ void min_kernel(const T *x, T *val, int64_t *idx, cu_cols c) {
  typedef typename cu_acc<T>::type A;
  int64_t m = c.outer * c.inner;
  for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < m;
       q += (int64_t)gridDim.x * blockDim.x) {
    const T *p = x + (q / c.inner) * c.n * c.inner + q % c.inner;
    A best = cu_ld(p);
    int64_t bi = 0;
    for (int64_t k = 1; k < c.n && best == best; k++) {
      A v = cu_ld(p + k * c.inner);
      if (v < best || v != v) { best = v; bi = k; }
    }
    cu_sv(val + q, best);
    idx[q] = bi + 1;
  }
}

RM_CUDA_KERNEL(min) {
  cu_cols c = cu_columns(in[0], a->reduce.dim);
  int64_t m = c.outer * c.inner;
  if (m == 0 || c.n == 0) return RM_OK;
  cudaStream_t st = cu_st(ctx)->stream;
  CU_DISPATCH(ctx, "min", in[0]->dtype,
              min_kernel<T><<<cu_blocks(m), CU_THREADS, 0, st>>>((const T *)cu_ptr(in[0]), (T *)cu_ptr(out[0]),
                                                                (int64_t *)cu_ptr(out[1]), c));
  return CU_LAUNCHED(ctx, "min kernel");
}

/* ---- sort / topk ---- */

/* Does (a, i) come before (b, j)? NaN ranks above every number; ties by position. */
template <class A>
__device__ __forceinline__ bool sort_before(A a, int64_t i, A b, int64_t j, bool desc) {
  bool na = a != a, nb = b != b;
  if (na || nb) return na && nb ? i < j : na ? desc : !desc;
  if (a == b) return i < j;
  return desc ? a > b : a < b;
}

/* One thread per element: its rank r in its column; it lands at r when r < k. */
template <class T>
__global__ void rank_kernel(const T *x, T *val, int64_t *idx, cu_cols c, int64_t k, bool desc) {
  typedef typename cu_acc<T>::type A;
  int64_t total = c.outer * c.n * c.inner;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    int64_t in_ = t % c.inner, e = (t / c.inner) % c.n, o = t / (c.inner * c.n);
    const T *col = x + o * c.n * c.inner + in_;
    A v = cu_ld(col + e * c.inner);
    int64_t r = 0;
    for (int64_t j = 0; j < c.n; j++)
      if (j != e && sort_before<A>(cu_ld(col + j * c.inner), j, v, e, desc)) r++;
    if (r < k) {
      int64_t off = o * k * c.inner + r * c.inner + in_;
      cu_sv(val + off, v);
      idx[off] = e + 1;
    }
  }
}

static int sort_run(rm_ctx *ctx, const char *op, rm_tensor *const *in, rm_tensor *const *out,
                    int64_t dim, int64_t k, bool desc) {
  cu_cols c = cu_columns(in[0], dim);
  int64_t total = c.outer * c.n * c.inner;
  if (total == 0 || k == 0) return RM_OK;
  cudaStream_t st = cu_st(ctx)->stream;
  CU_DISPATCH(ctx, op, in[0]->dtype,
              rank_kernel<T><<<cu_blocks(total), CU_THREADS, 0, st>>>(
                  (const T *)cu_ptr(in[0]), (T *)cu_ptr(out[0]), (int64_t *)cu_ptr(out[1]), c, k, desc));
  return CU_LAUNCHED(ctx, "sort kernel");
}

RM_CUDA_KERNEL(sort) {
  return sort_run(ctx, "sort", in, out, a->sort.dim, cu_columns(in[0], a->sort.dim).n, a->sort.descending);
}

RM_CUDA_KERNEL(topk) {
  return sort_run(ctx, "topk", in, out, a->topk.dim, a->topk.k, a->topk.largest);
}

/* ---- cumsum: a float64 running sum per column, rounded to T at each step ---- */

template <class T>
__global__ void cumsum_kernel(const T *x, T *y, cu_cols c, bool rev) {
  int64_t m = c.outer * c.inner;
  for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < m;
       q += (int64_t)gridDim.x * blockDim.x) {
    int64_t base = (q / c.inner) * c.n * c.inner + q % c.inner;
    double s = 0;
    for (int64_t e = 0; e < c.n; e++) {
      int64_t k = (rev ? c.n - 1 - e : e) * c.inner + base;
      s += (double)cu_ld(x + k);
      cu_sv(y + k, (typename cu_acc<T>::type)s);
    }
  }
}

RM_CUDA_KERNEL(cumsum) {
  cu_cols c = cu_columns(in[0], a->cumsum.dim);
  int64_t m = c.outer * c.inner;
  if (m == 0 || c.n == 0) return RM_OK;
  cudaStream_t st = cu_st(ctx)->stream;
  CU_DISPATCH(ctx, "cumsum", in[0]->dtype,
              cumsum_kernel<T><<<cu_blocks(m), CU_THREADS, 0, st>>>((const T *)cu_ptr(in[0]),
                                                                   (T *)cu_ptr(out[0]), c, a->cumsum.reverse));
  return CU_LAUNCHED(ctx, "cumsum kernel");
}
