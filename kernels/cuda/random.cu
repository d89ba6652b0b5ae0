/* CUDA kernels for the random ops, on core/philox.h like the CPU (kernels/cpu/random.c):
 * element e of an op at (seed, offset) uses counter offset/4 + e/4, lane e%4
 * (normals: offset/4 + e/2, lanes 2(e%2), 2(e%2)+1). One thread per Philox call.
 * Uniforms are exact integer-to-double maps, so rand and the dropout masks are the
 * same bits as on the CPU; randn goes through the device's double log/cos, which may
 * differ from the host libm in the last bit of a float64 (float32 values agree). */
#include "cuda_common.cuh"

template <class T>
__global__ void rand_kernel(T *po, int64_t n, uint64_t seed, uint64_t offset) {
  typedef typename cu_acc<T>::type A;
  const int64_t ng = (n + 3) / 4;
  for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < ng;
       q += (int64_t)gridDim.x * blockDim.x) {
    uint32_t r[4];
    rm_philox(offset / 4 + (uint64_t)q, seed, r);
    for (int l = 0; l < 4 && 4 * q + l < n; l++)
      cu_sv(po + 4 * q + l, (A)(((double)r[l] + 1.0) * (1.0 / 4294967296.0)));
  }
}

template <class T>
__global__ void randn_kernel(T *po, int64_t n, uint64_t seed, uint64_t offset) {
  typedef typename cu_acc<T>::type A;
  const int64_t ng = (n + 1) / 2;
  for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < ng;
       q += (int64_t)gridDim.x * blockDim.x) {
    uint32_t r[4];
    rm_philox(offset / 4 + (uint64_t)q, seed, r);
    for (int h = 0; h < 2 && 2 * q + h < n; h++) {
      double u1 = ((double)r[2 * h] + 1.0) * (1.0 / 4294967296.0);
      double u2 = (double)r[2 * h + 1] * (1.0 / 4294967296.0);
      cu_sv(po + 2 * q + h, (A)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2)));
    }
  }
}

/* y = x * (u > p ? 1/(1-p) : 0), the scale rounded to the storage type first as the
 * CPU does (bfloat16: the float32 scale). */
template <class T>
__global__ void dropout_kernel(const T *px, T *po, int64_t n, double p, uint64_t seed,
                               uint64_t offset) {
  typedef typename cu_acc<T>::type A;
  const A scale = (A)(1.0 / (1.0 - p));
  const int64_t ng = (n + 3) / 4;
  for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < ng;
       q += (int64_t)gridDim.x * blockDim.x) {
    uint32_t r[4];
    rm_philox(offset / 4 + (uint64_t)q, seed, r);
    for (int l = 0; l < 4 && 4 * q + l < n; l++) {
      double u = ((double)r[l] + 1.0) * (1.0 / 4294967296.0);
      cu_sv(po + 4 * q + l, cu_ld(px + 4 * q + l) * (u > p ? scale : (A)0));
    }
  }
}

RM_CUDA_KERNEL(rand) {
  int64_t n = cu_numel(out[0]);
  if (!n) return RM_OK;
  cudaStream_t st = cu_st(ctx)->stream;
  CU_DISPATCH(ctx, "rand", out[0]->dtype,
              rand_kernel<T><<<cu_blocks((n + 3) / 4), CU_THREADS, 0, st>>>(
                  (T *)cu_ptr(out[0]), n, a->seed, a->offset));
  return CU_LAUNCHED(ctx, "rand kernel");
}

RM_CUDA_KERNEL(randn) {
  int64_t n = cu_numel(out[0]);
  if (!n) return RM_OK;
  cudaStream_t st = cu_st(ctx)->stream;
  CU_DISPATCH(ctx, "randn", out[0]->dtype,
              randn_kernel<T><<<cu_blocks((n + 1) / 2), CU_THREADS, 0, st>>>(
                  (T *)cu_ptr(out[0]), n, a->seed, a->offset));
  return CU_LAUNCHED(ctx, "randn kernel");
}

/* dropout and dropout_backward are the same map; the backward gets the forward's
 * seed and offset in its attrs. */
static int dropout_run(rm_ctx *ctx, rm_tensor *const *in, rm_tensor *const *out,
                       const rm_attrs *a, const char *name) {
  int64_t n = cu_numel(out[0]);
  if (!n) return RM_OK;
  void *scratch = NULL;
  const void *x = cu_contig_data(ctx, in[0], &scratch);
  if (!x) return ctx->err_code;
  cudaStream_t st = cu_st(ctx)->stream;
  int rc = RM_OK;
  switch (out[0]->dtype) {
  case RM_F32:
    dropout_kernel<float><<<cu_blocks((n + 3) / 4), CU_THREADS, 0, st>>>(
        (const float *)x, (float *)cu_ptr(out[0]), n, a->dropout.p, a->seed, a->offset);
    break;
  case RM_F64:
    dropout_kernel<double><<<cu_blocks((n + 3) / 4), CU_THREADS, 0, st>>>(
        (const double *)x, (double *)cu_ptr(out[0]), n, a->dropout.p, a->seed, a->offset);
    break;
  case RM_BF16:
    dropout_kernel<__nv_bfloat16><<<cu_blocks((n + 3) / 4), CU_THREADS, 0, st>>>(
        (const __nv_bfloat16 *)x, (__nv_bfloat16 *)cu_ptr(out[0]), n, a->dropout.p, a->seed, a->offset);
    break;
  default: rc = cu_bad_dtype(ctx, name, out[0]->dtype);
  }
  if (!rc) rc = CU_LAUNCHED(ctx, name);
  if (scratch) cu_scratch_free(ctx, scratch, (size_t)n * cu_dsize(in[0]->dtype));
  return rc;
}

RM_CUDA_KERNEL(dropout) {
  return dropout_run(ctx, in, out, a, "dropout");
}

RM_CUDA_KERNEL(dropout_backward) {
  return dropout_run(ctx, in, out, a, "dropout_backward");
}
