/* CUDA kernels for batchnorm and its backward helper; semantics of kernels/cpu/batchnorm.c
 * (core/op_batchnorm.c). One block per channel walks the channel's N*S values (x is
 * contiguous (N, C, S)); sums accumulate in double through a fixed block tree, so runs
 * are reproducible; statistics are float32 for bfloat16 (cu_acc).
 * Design and expected time: three passes forward (sum, centred squares, write) and two
 * backward (sums, write), each reading the activation once; with a small C (a CNN's 16-512
 * channels) only C blocks run, under one wave on 132 SMs, so for a (128, 64, 56, 56)
 * activation (25.7M values, 103 MB in float32) expect about 0.2 ms forward and 0.15 ms
 * backward at ~1.5 TB/s rather than the 3.3 TB/s peak. (Estimates, not measured: no GPU
 * has run this.) */
#include "cuda_common.cuh"

template <class T>
__global__ void bn_fwd_kernel(const T *x, const T *w, const T *b, T *y, typename cu_acc<T>::type *mo,
                              typename cu_acc<T>::type *vo, int64_t N, int64_t C, int64_t S, double eps) {
  typedef typename cu_acc<T>::type A;
  __shared__ double sh[32];
  const int64_t c = blockIdx.x, M = N * S;
  double s1 = 0;
  for (int64_t e = threadIdx.x; e < M; e += blockDim.x) s1 += (double)cu_ld(x + ((e / S) * C + c) * S + e % S);
  const double m = cu_block_sum(s1, sh) / (double)M;
  double s2 = 0;
  for (int64_t e = threadIdx.x; e < M; e += blockDim.x) {
    double d = (double)cu_ld(x + ((e / S) * C + c) * S + e % S) - m;
    s2 += d * d;
  }
  const double v = cu_block_sum(s2, sh) / (double)M;
  const A mt = (A)m, rt = (A)(1.0 / sqrt(v + eps));
  const A scale = w ? rt * cu_ld(w + c) : rt, shift = b ? cu_ld(b + c) : (A)0;
  for (int64_t e = threadIdx.x; e < M; e += blockDim.x) {
    const int64_t k = ((e / S) * C + c) * S + e % S;
    cu_sv(y + k, (cu_ld(x + k) - mt) * scale + shift);
  }
  if (threadIdx.x == 0) {
    mo[c] = mt;
    vo[c] = (A)v;
  }
}

template <class T>
__global__ void bn_bwd_kernel(const T *x, const typename cu_acc<T>::type *mean, const typename cu_acc<T>::type *var,
                              const T *g, const T *w, T *gx, T *gw, T *gb, int64_t N, int64_t C, int64_t S,
                              double eps, bool want_x) {
  typedef typename cu_acc<T>::type A;
  __shared__ double sh[32];
  const int64_t c = blockIdx.x, M = N * S;
  const A mt = mean[c], rt = (A)(1.0 / sqrt((double)var[c] + eps));
  double sa = 0, sb = 0;
  for (int64_t e = threadIdx.x; e < M; e += blockDim.x) {
    const int64_t k = ((e / S) * C + c) * S + e % S;
    const A gv = cu_ld(g + k);
    sa += gv;
    sb += (double)gv * (double)((cu_ld(x + k) - mt) * rt);
  }
  sa = cu_block_sum(sa, sh);
  sb = cu_block_sum(sb, sh);
  if (threadIdx.x == 0) {
    cu_sv(gb + c, (A)sa);
    cu_sv(gw + c, (A)sb);
  }
  const A kf = w ? rt * cu_ld(w + c) : rt, ma = (A)(sa / (double)M), mb = (A)(sb / (double)M);
  for (int64_t e = threadIdx.x; e < M; e += blockDim.x) {
    const int64_t k = ((e / S) * C + c) * S + e % S;
    cu_sv(gx + k, want_x ? kf * (cu_ld(g + k) - ma - (cu_ld(x + k) - mt) * rt * mb) : (A)0);
  }
}

static void bn_dims(const rm_tensor *x, int64_t *N, int64_t *C, int64_t *S) {
  *N = x->shape[0];
  *C = x->shape[1];
  *S = 1;
  for (int d = 2; d < x->ndim; d++) *S *= x->shape[d];
}

/* Launches the forward (bwd false) or the backward helper, one block per channel, on
 * contiguous copies of strided inputs. */
static int bn_launch(rm_ctx *ctx, int nin, rm_tensor *const *in, rm_tensor *const *out, const rm_attrs *a, bool bwd) {
  const char *name = bwd ? "batchnorm_backward" : "batchnorm";
  int64_t N, C, S;
  bn_dims(in[0], &N, &C, &S);
  if (N * C * S == 0) return RM_OK;
  rm_dtype dt = out[0]->dtype;
  if (dt != RM_F32 && dt != RM_F64 && dt != RM_BF16) return cu_bad_dtype(ctx, name, dt); /* before the copies */
  cu_inputs ci;
  int rc = cu_inputs_get(ctx, nin, in, &ci);
  cudaStream_t st = cu_st(ctx)->stream;
  if (rc) return rc;
  if (bwd) {
    CU_DISPATCH(ctx, name, dt,
                bn_bwd_kernel<T><<<(unsigned)C, 256, 0, st>>>(
                    (const T *)ci.p[0], (const typename cu_acc<T>::type *)ci.p[1],
                    (const typename cu_acc<T>::type *)ci.p[2], (const T *)ci.p[3],
                    nin > 4 ? (const T *)ci.p[4] : NULL, (T *)cu_ptr(out[0]), (T *)cu_ptr(out[1]),
                    (T *)cu_ptr(out[2]), N, C, S, a->batchnorm_backward.eps,
                    (a->batchnorm_backward.want & 1) != 0));
  } else {
    CU_DISPATCH(ctx, name, dt,
                bn_fwd_kernel<T><<<(unsigned)C, 256, 0, st>>>(
                    (const T *)ci.p[0], nin > 1 ? (const T *)ci.p[1] : NULL, nin > 2 ? (const T *)ci.p[2] : NULL,
                    (T *)cu_ptr(out[0]), (typename cu_acc<T>::type *)cu_ptr(out[1]),
                    (typename cu_acc<T>::type *)cu_ptr(out[2]), N, C, S, a->norm.eps));
  }
  rc = CU_LAUNCHED(ctx, name);
  cu_inputs_free(ctx, &ci);
  return rc;
}

RM_CUDA_KERNEL(batchnorm) { return bn_launch(ctx, nin, in, out, a, false); }

RM_CUDA_KERNEL(batchnorm_backward) { return bn_launch(ctx, nin, in, out, a, true); }
