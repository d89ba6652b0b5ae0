/* CUDA kernels for the losses (semantics: core/op_loss.c, kernels/cpu/loss.c):
 *   cross_entropy(logits (N, C), labels (N)) -> mean of lse(row) - row[label]
 *   cross_entropy_backward(logits, labels, g) -> (softmax(row) - onehot) * g / N
 *   mse(pred, target) -> mean of (pred - target)^2
 * Cross-entropy: one block per row finds the log-sum-exp in a single pass over the row
 * (online max and rescaled sum, float32 for float32/bfloat16 as the CPU's float32 path,
 * float64 for float64); the forward reads the logits once, the backward twice (lse, then
 * the gradient row). The probabilities are never stored. Means sum per-row values in a
 * fixed tree (reproducible). Labels are checked on the device like indices, without
 * waiting (a bad label is reported at the next synchronisation; its row's loss is NaN
 * and its gradient row has no -1 term).
 * Estimate (from bytes, not measured) at GPT-2 small (8192 x 50257 bf16 logits, 823 MB)
 * on an H100/H200 at ~3.5 TB/s achieved: forward 1 read ~0.24 ms, backward 2 reads and
 * 1 write ~0.7 ms; before: 5 reads of the logits and 3 float64 exps per element (float64
 * runs at 1/2 to 1/64 the float32 rate), several ms. Writing dlogits from the forward
 * (one pass in all) needs the op to keep them, which it does not (they are as large as
 * the logits).
 * In place: when nothing reads the logits after the loss's backward (core/op_loss.c,
 * logits_reusable: the caller freed its handle, no op saved them, no plan pins them),
 * the backward writes dlogits over them (rm_op_into with the logits' storage as the
 * output). ce_bwd_kernel allows that: a block reads its whole row (the lse pass, which
 * ends in a __syncthreads) before any thread writes, and each thread then reads
 * element j just before writing it. The bytes moved are the same (~0.7 ms at GPT-2
 * small); what goes is the allocation of a second 823 MB buffer at the top of the
 * step's memory (the logits are its largest activation): the step's peak is a logits
 * buffer lower, and the caching allocator holds one segment less. */
#include <math.h>

#include "cuda_common.cuh"

__device__ __forceinline__ float ce_exp(float x) { return expf(x); }
__device__ __forceinline__ double ce_exp(double x) { return exp(x); }
__device__ __forceinline__ float ce_log(float x) { return logf(x); }
__device__ __forceinline__ double ce_log(double x) { return log(x); }

/* Running (max, sum of exp(x - max)) pairs: one element, and two pairs merged. A -inf
 * element adds nothing; a NaN makes the sum NaN. */
template <class A> __device__ __forceinline__ void ms_add(A &m, A &s, A v) {
  if (v == (A)-INFINITY) return;
  if (v > m) { s = s * ce_exp(m - v) + (A)1; m = v; }
  else s += ce_exp(v - m);
}

template <class A> __device__ __forceinline__ void ms_merge(A &m, A &s, A m2, A s2) {
  A mm = m2 > m ? m2 : m;
  if (mm == (A)-INFINITY) return; /* both empty */
  s = (s != (A)0 ? s * ce_exp(m - mm) : (A)0) + (s2 != (A)0 ? s2 * ce_exp(m2 - mm) : (A)0);
  m = mm;
}

/* lse of row (every thread gets it), in one pass. */
template <class T, class A>
__device__ A row_lse(const T *row, int64_t C) {
  __shared__ A shm[32], shs[32];
  A m = -INFINITY, s = 0;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) ms_add<A>(m, s, (A)cu_ld(row + j));
  for (int o = 16; o > 0; o >>= 1) {
    A m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    ms_merge<A>(m, s, m2, s2);
  }
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) shm[w] = m, shs[w] = s;
  __syncthreads();
  m = lane < nw ? shm[lane] : (A)-INFINITY;
  s = lane < nw ? shs[lane] : (A)0;
  for (int o = 16; o > 0; o >>= 1) {
    A m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    ms_merge<A>(m, s, m2, s2);
  }
  return m + ce_log(s);
}

template <class T>
__global__ void ce_rows_kernel(const T *x, const void *lab, rm_dtype ldt, int64_t C, double *loss) {
  typedef typename cu_acc<T>::type A;
  const T *row = x + blockIdx.x * C;
  A lse = row_lse<T, A>(row, C);
  if (threadIdx.x == 0) {
    int64_t y = cu_index_at(lab, ldt, blockIdx.x, C);
    loss[blockIdx.x] = y >= 0 ? (double)(lse - (A)cu_ld(row + y)) : NAN;
  }
}

/* Mean of n doubles in one block (fixed tree), stored as T. */
template <class T>
__global__ void mean_kernel(const double *v, int64_t n, T *out) {
  __shared__ double sh[32];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
  s = cu_block_sum(s, sh);
  if (threadIdx.x == 0) cu_sv(out, (typename cu_acc<T>::type)(s / (double)n));
}

template <class T>
__global__ void ce_bwd_kernel(const T *x, const void *lab, rm_dtype ldt, const T *g, int64_t rows,
                              int64_t C, T *o) {
  typedef typename cu_acc<T>::type A;
  const T *row = x + blockIdx.x * C;
  T *orow = o + blockIdx.x * C;
  A lse = row_lse<T, A>(row, C);
  A scale = (A)((double)cu_ld(g) / (double)rows);
  int64_t y = cu_index_at(lab, ldt, blockIdx.x, C);
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
    cu_sv(orow + j, (ce_exp((A)cu_ld(row + j) - lse) - (j == y ? (A)1 : (A)0)) * scale);
}

template <class T>
__global__ void mse_parts_kernel(const T *p, const T *t, int64_t n, int64_t per, double *part) {
  __shared__ double sh[32];
  int64_t lo = blockIdx.x * per, hi = lo + per < n ? lo + per : n;
  double s = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    double d = (double)cu_ld(p + i) - (double)cu_ld(t + i);
    s += d * d;
  }
  s = cu_block_sum(s, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

template <class T>
__global__ void sum_div_kernel(const double *part, int np, double div, T *out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    double s = 0;
    for (int i = 0; i < np; i++) s += part[i];
    cu_sv(out, (typename cu_acc<T>::type)(s / div));
  }
}

static int check_labels(rm_ctx *ctx, const char *op, const rm_tensor *labels, const void *p,
                        int64_t classes) {
  return cu_check_indices(ctx, op, "label", labels, p, classes, CU_WHERE_ROW);
}

/* Workspace for dry runs: cross_entropy's per-row losses (double), mse's parts. */
size_t cu_loss_workspace(rm_op_id op, int nin, rm_tensor *const *in) {
  if (op == RM_OP_CROSS_ENTROPY && nin == 2 && in[0]->ndim == 2 && in[0]->shape[0] > 0)
    return (size_t)in[0]->shape[0] * sizeof(double);
  if (op == RM_OP_MSE && nin == 2 && cu_numel(in[0]) > 0) {
    int64_t n = cu_numel(in[0]);
    int np = 1;
    while (np < 1024 && n / (np * 2) >= 16384) np *= 2;
    return (size_t)np * sizeof(double);
  }
  return 0;
}

RM_CUDA_KERNEL(cross_entropy) {
  int64_t rows = in[0]->shape[0], classes = in[0]->shape[1];
  rm_tensor *o = out[0];
  cu_inputs ci;
  int rc = cu_inputs_get(ctx, nin, in, &ci);
  if (!rc) rc = check_labels(ctx, "cross_entropy", in[1], ci.p[1], classes);
  cudaStream_t st = cu_st(ctx)->stream;
  double *loss = NULL;
  if (!rc && rows == 0) rc = cu_fill(ctx, cu_ptr(o), o->dtype, 1, NAN);
  else if (!rc && !(loss = (double *)cu_scratch(ctx, (size_t)rows * sizeof(double)))) rc = ctx->err_code;
  if (!rc && loss) {
    CU_DISPATCH(ctx, "cross_entropy", o->dtype, {
      ce_rows_kernel<T><<<(unsigned)rows, cu_row_threads(classes, 512), 0, st>>>(
          (const T *)ci.p[0], ci.p[1], in[1]->dtype, classes, loss);
      mean_kernel<T><<<1, 1024, 0, st>>>(loss, rows, (T *)cu_ptr(o));
    });
    rc = CU_LAUNCHED(ctx, "cross_entropy kernel");
  }
  if (loss) cu_scratch_free(ctx, loss, (size_t)rows * sizeof(double));
  cu_inputs_free(ctx, &ci);
  return rc;
}

RM_CUDA_KERNEL(cross_entropy_backward) {
  int64_t rows = in[0]->shape[0], classes = in[0]->shape[1];
  rm_tensor *o = out[0];
  cu_inputs ci;
  int rc = cu_inputs_get(ctx, nin, in, &ci);
  if (!rc) rc = check_labels(ctx, "cross_entropy_backward", in[1], ci.p[1], classes);
  cudaStream_t st = cu_st(ctx)->stream;
  if (!rc && rows * classes > 0) {
    CU_DISPATCH(ctx, "cross_entropy_backward", o->dtype,
                ce_bwd_kernel<T><<<(unsigned)rows, cu_row_threads(classes, 512), 0, st>>>(
                    (const T *)ci.p[0], ci.p[1], in[1]->dtype, (const T *)ci.p[2], rows, classes,
                    (T *)cu_ptr(o)));
    rc = CU_LAUNCHED(ctx, "cross_entropy_backward kernel");
  }
  cu_inputs_free(ctx, &ci);
  return rc;
}

RM_CUDA_KERNEL(mse) {
  int64_t n = cu_numel(in[0]);
  rm_tensor *o = out[0];
  if (n == 0) return cu_fill(ctx, cu_ptr(o), o->dtype, 1, NAN);
  cu_inputs ci;
  int rc = cu_inputs_get(ctx, nin, in, &ci);
  /* fixed number of parts from the size only */
  int np = 1;
  while (np < 1024 && n / (np * 2) >= 16384) np *= 2;
  int64_t per = (n + np - 1) / np;
  double *part = NULL;
  if (!rc && !(part = (double *)cu_scratch(ctx, (size_t)np * sizeof(double)))) rc = ctx->err_code;
  cudaStream_t st = cu_st(ctx)->stream;
  if (!rc) {
    CU_DISPATCH(ctx, "mse", o->dtype, {
      mse_parts_kernel<T><<<np, 256, 0, st>>>((const T *)ci.p[0], (const T *)ci.p[1], n, per, part);
      sum_div_kernel<T><<<1, 32, 0, st>>>(part, np, (double)n, (T *)cu_ptr(o));
    });
    rc = CU_LAUNCHED(ctx, "mse kernel");
  }
  if (part) cu_scratch_free(ctx, part, (size_t)np * sizeof(double));
  cu_inputs_free(ctx, &ci);
  return rc;
}
