/* CUDA kernels for the losses (semantics: core/op_loss.c, kernels/cpu/loss.c):
 *   cross_entropy(logits (N, C), labels (N)) -> mean of lse(row) - row[label]
 *   cross_entropy_backward(logits, labels, g) -> (softmax(row) - onehot) * g / N
 *   mse(pred, target) -> mean of (pred - target)^2
 * Fused: one block per row computes the log-sum-exp (double) and the row's loss or
 * gradient; the probabilities are never stored. Means sum per-row values in a fixed
 * tree (reproducible). Labels are checked on the device like indices (index.cu). */
#include <math.h>

#include "cuda_common.cuh"

__device__ __forceinline__ double lab_val(const void *p, rm_dtype dt, int64_t k) {
  switch (dt) {
  case RM_F64: return ((const double *)p)[k];
  case RM_BF16: return (double)__bfloat162float(((const __nv_bfloat16 *)p)[k]);
  default: return (double)((const float *)p)[k];
  }
}

/* lse of row (every thread gets it). */
template <class T>
__device__ double row_lse(const T *row, int64_t C, double *sh) {
  double m = -INFINITY, s = 0;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    double v = (double)cu_ld(row + j);
    if (v > m) m = v;
  }
  m = cu_block_max(m, sh);
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += exp((double)cu_ld(row + j) - m);
  s = cu_block_sum(s, sh);
  return m + log(s);
}

template <class T>
__global__ void ce_rows_kernel(const T *x, const void *lab, rm_dtype ldt, int64_t C, double *loss) {
  __shared__ double sh[32];
  const T *row = x + blockIdx.x * C;
  double lse = row_lse(row, C, sh);
  if (threadIdx.x == 0) {
    int64_t y = (int64_t)lab_val(lab, ldt, blockIdx.x) - 1;
    loss[blockIdx.x] = lse - (double)cu_ld(row + y);
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
  __shared__ double sh[32];
  const T *row = x + blockIdx.x * C;
  T *orow = o + blockIdx.x * C;
  double lse = row_lse(row, C, sh);
  double scale = (double)cu_ld(g) / (double)rows;
  int64_t y = (int64_t)lab_val(lab, ldt, blockIdx.x) - 1;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
    cu_sv(orow + j, (A)((exp((double)cu_ld(row + j) - lse) - (j == y ? 1.0 : 0.0)) * scale));
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
  int64_t pos;
  double v;
  int rc = cu_first_bad_index(ctx, op, labels, p, classes, &pos, &v);
  if (rc || pos < 0) return rc;
  if (v == floor(v))
    return cu_fail(ctx, RM_ERR_ARG, "%s: label %.17g is out of range 1..%lld (row %lld)", op, v,
                   (long long)classes, (long long)pos + 1);
  return cu_fail(ctx, RM_ERR_ARG, "%s: label %.17g is not a whole number in 1..%lld (row %lld)", op, v,
                 (long long)classes, (long long)pos + 1);
}

RM_CUDA_KERNEL(cross_entropy) {
  (void)nout; (void)a;
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
  (void)nout; (void)a;
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
  (void)nout; (void)a;
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
