/* CUDA kernels for unfold (im2col), fold (col2im) and max pooling; semantics of kernels/cpu/conv.c
 * (core/op_conv.c). One thread per output element; fold gathers in the CPU's window
 * order with the same accumulator type, so both backends add the same terms in turn. */
#include "cuda_common.cuh"

typedef struct { int64_t kh, kw, sh, sw, ph, pw, dh, dw; } cu_cgeo;

static cu_cgeo cgeo_of(const rm_attrs *a) {
  cu_cgeo g = { a->window.kh, a->window.kw, a->window.stride_h, a->window.stride_w,
                a->window.pad_h, a->window.pad_w, a->window.dilation_h, a->window.dilation_w };
  return g;
}

/* out (B*C, kh*kw, Ho*Wo) element t <- x (B*C, H, W) */
template <class T>
__global__ void unfold_kernel(const T *x, T *o, int64_t total, int64_t H, int64_t W, int64_t Ho,
                              int64_t Wo, cu_cgeo g, double pad) {
  typedef typename cu_acc<T>::type A;
  const int64_t L = Ho * Wo, K = g.kh * g.kw;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    int64_t l = t % L, k = (t / L) % K, p = t / (L * K);
    int64_t i = k / g.kw, j = k % g.kw, oh = l / Wo, ow = l % Wo;
    int64_t h = oh * g.sh - g.ph + i * g.dh, w = ow * g.sw - g.pw + j * g.dw;
    A v = (h >= 0 && h < H && w >= 0 && w < W) ? cu_ld(x + p * H * W + h * W + w) : (A)pad;
    cu_sv(o + t, v);
  }
}

RM_CUDA_KERNEL(unfold) {
  cu_cgeo g = cgeo_of(a);
  const int64_t H = in[0]->shape[2], W = in[0]->shape[3];
  const int64_t Wo = (W + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1, Ho = out[0]->shape[2] / Wo;
  int64_t total = cu_numel(out[0]);
  if (total == 0) return RM_OK;
  cudaStream_t st = cu_st(ctx)->stream;
  CU_DISPATCH(ctx, "unfold", out[0]->dtype,
              unfold_kernel<T><<<cu_blocks(total), CU_THREADS, 0, st>>>((const T *)cu_ptr(in[0]), (T *)cu_ptr(out[0]),
                                                                       total, H, W, Ho, Wo, g, a->window.pad_value));
  return CU_LAUNCHED(ctx, "unfold kernel");
}

/* x (B*C, H, W) element t <- sum of the columns that read it */
template <class T>
__global__ void fold_kernel(const T *c, T *x, int64_t total, int64_t H, int64_t W, int64_t Ho,
                            int64_t Wo, cu_cgeo g) {
  typedef typename cu_acc<T>::type A;
  const int64_t L = Ho * Wo, K = g.kh * g.kw;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    int64_t w = t % W, h = (t / W) % H, p = t / (W * H);
    const T *cp = c + p * K * L;
    A s = 0;
    for (int64_t i = 0; i < g.kh; i++) {
      int64_t th = h + g.ph - i * g.dh;
      if (th < 0 || th % g.sh) continue;
      int64_t oh = th / g.sh;
      if (oh >= Ho) continue;
      for (int64_t j = 0; j < g.kw; j++) {
        int64_t tw = w + g.pw - j * g.dw;
        if (tw < 0 || tw % g.sw) continue;
        int64_t ow = tw / g.sw;
        if (ow >= Wo) continue;
        s += cu_ld(cp + (i * g.kw + j) * L + oh * Wo + ow);
      }
    }
    cu_sv(x + t, s);
  }
}

RM_CUDA_KERNEL(fold) {
  cu_cgeo g = cgeo_of(a);
  const int64_t H = out[0]->shape[2], W = out[0]->shape[3];
  const int64_t Wo = (W + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1;
  const int64_t Ho = (H + 2 * g.ph - g.dh * (g.kh - 1) - 1) / g.sh + 1;
  int64_t total = cu_numel(out[0]);
  if (total == 0) return RM_OK;
  cudaStream_t st = cu_st(ctx)->stream;
  CU_DISPATCH(ctx, "fold", out[0]->dtype,
              fold_kernel<T><<<cu_blocks(total), CU_THREADS, 0, st>>>((const T *)cu_ptr(in[0]), (T *)cu_ptr(out[0]),
                                                                     total, H, W, Ho, Wo, g));
  return CU_LAUNCHED(ctx, "fold kernel");
}

/* ---- max pooling (kernels/cpu/conv.c's semantics: first maximum in window order,
 * padding reads -inf, a NaN wins) ---- */

/* Plane offset of the window (oh, ow)'s maximum (-1: padding), its value in *v. */
template <class T>
__device__ int64_t pool_arg(const T *xp, int64_t H, int64_t W, const cu_cgeo &g, int64_t oh, int64_t ow,
                            typename cu_acc<T>::type *v) {
  typedef typename cu_acc<T>::type A;
  int64_t at = -1;
  A best = 0;
  bool any = false;
  for (int64_t i = 0; i < g.kh; i++) {
    int64_t h = oh * g.sh - g.ph + i * g.dh;
    for (int64_t j = 0; j < g.kw; j++) {
      int64_t w = ow * g.sw - g.pw + j * g.dw;
      bool in = h >= 0 && h < H && w >= 0 && w < W;
      A x = in ? cu_ld(xp + h * W + w) : (A)-INFINITY;
      if (!any || (best == best && (x > best || x != x))) {
        best = x;
        at = in ? h * W + w : -1;
        any = true;
      }
    }
  }
  *v = best;
  return at;
}

/* y element t (plane p, oh, ow) <- its window's maximum */
template <class T>
__global__ void maxpool2d_kernel(const T *x, T *y, int64_t total, int64_t H, int64_t W, int64_t Ho,
                                 int64_t Wo, cu_cgeo g) {
  typedef typename cu_acc<T>::type A;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    int64_t ow = t % Wo, oh = (t / Wo) % Ho, p = t / (Wo * Ho);
    A v;
    pool_arg(x + p * H * W, H, W, g, oh, ow, &v);
    cu_sv(y + t, v);
  }
}

RM_CUDA_KERNEL(maxpool2d) {
  cu_cgeo g = cgeo_of(a);
  const int64_t H = in[0]->shape[2], W = in[0]->shape[3], Ho = out[0]->shape[2], Wo = out[0]->shape[3];
  int64_t total = cu_numel(out[0]);
  if (total == 0) return RM_OK;
  cudaStream_t st = cu_st(ctx)->stream;
  CU_DISPATCH(ctx, "maxpool2d", out[0]->dtype,
              maxpool2d_kernel<T><<<cu_blocks(total), CU_THREADS, 0, st>>>((const T *)cu_ptr(in[0]), (T *)cu_ptr(out[0]),
                                                                          total, H, W, Ho, Wo, g));
  return CU_LAUNCHED(ctx, "maxpool2d kernel");
}

/* gx element t (plane p, h, w) <- the gy of every window whose maximum is this pixel,
 * gathered in output order (oh, then ow ascending: i and j walk down) as the CPU adds
 * them, so there are no write races. */
template <class T>
__global__ void maxpool2d_backward_kernel(const T *x, const T *gy, T *gx, int64_t total, int64_t H, int64_t W,
                                          int64_t Ho, int64_t Wo, cu_cgeo g) {
  typedef typename cu_acc<T>::type A;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    int64_t w = t % W, h = (t / W) % H, p = t / (W * H);
    const T *xp = x + p * H * W, *gp = gy + p * Ho * Wo;
    A s = 0;
    for (int64_t i = g.kh - 1; i >= 0; i--) {
      int64_t th = h + g.ph - i * g.dh;
      if (th < 0 || th % g.sh) continue;
      int64_t oh = th / g.sh;
      if (oh >= Ho) continue;
      for (int64_t j = g.kw - 1; j >= 0; j--) {
        int64_t tw = w + g.pw - j * g.dw;
        if (tw < 0 || tw % g.sw) continue;
        int64_t ow = tw / g.sw;
        if (ow >= Wo) continue;
        A v;
        if (pool_arg(xp, H, W, g, oh, ow, &v) == h * W + w) s += cu_ld(gp + oh * Wo + ow);
      }
    }
    cu_sv(gx + t, s);
  }
}

RM_CUDA_KERNEL(maxpool2d_backward) {
  cu_cgeo g = cgeo_of(a);
  const int64_t H = in[0]->shape[2], W = in[0]->shape[3], Ho = in[1]->shape[2], Wo = in[1]->shape[3];
  int64_t total = cu_numel(out[0]);
  if (total == 0) return RM_OK;
  cudaStream_t st = cu_st(ctx)->stream;
  CU_DISPATCH(ctx, "maxpool2d_backward", out[0]->dtype,
              maxpool2d_backward_kernel<T><<<cu_blocks(total), CU_THREADS, 0, st>>>(
                  (const T *)cu_ptr(in[0]), (const T *)cu_ptr(in[1]), (T *)cu_ptr(out[0]), total, H, W, Ho, Wo, g));
  return CU_LAUNCHED(ctx, "maxpool2d_backward kernel");
}
