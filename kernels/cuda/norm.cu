/* CUDA kernels for layernorm and rmsnorm over the last dimension and their backward
 * helpers, with the layout of kernels/cpu/norm.c (see core/op_norm.c):
 *   layernorm(x[, w[, b]]) -> y, mean, rstd            f[0] eps
 *   layernorm_backward(x, mean, rstd, g[, w]) -> gx, gw, gb   i[0] bits: gx, gw, gb
 *   rmsnorm(x[, w]) -> y, rstd
 *   rmsnorm_backward(x, rstd, g[, w]) -> gx, gw               i[0] bits: gx, gw
 * The statistics (mean, rstd) are float32 for float32 and bfloat16 inputs (float64 for
 * float64): a bfloat16 mean or rstd would lose 8 bits before the row uses it.
 * Fused: one block per row computes the statistics (double accumulation) and writes
 * the row (backward keeps the row's g w and x - mean in shared memory for rows up to
 * 32 KiB of them, so x and g are read once by the row kernel and once more by the
 * column sums, instead of three times); weight/bias gradients are column sums over rows, split into fixed row
 * chunks (partials in double, summed in order), so results are reproducible. */
#include "cuda_common.cuh"

static void rows_cols(const rm_tensor *x, int64_t *R, int64_t *C) {
  *C = x->ndim ? x->shape[x->ndim - 1] : 1;
  *R = 1;
  for (int d = 0; d < x->ndim - 1; d++) *R *= x->shape[d];
}

template <class T>
__global__ void ln_fwd_kernel(const T *x, const T *w, const T *b, T *y, typename cu_acc<T>::type *mu,
                              typename cu_acc<T>::type *rs, int64_t C, double eps, bool rms) {
  typedef typename cu_acc<T>::type A;
  __shared__ double sh[32];
  const T *xr = x + blockIdx.x * C;
  T *yr = y + blockIdx.x * C;
  double m = 0;
  if (!rms) {
    double s = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += (double)cu_ld(xr + j);
    m = cu_block_sum(s, sh) / (double)C;
  }
  double v = 0;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    double d = (double)cu_ld(xr + j) - m;
    v += d * d;
  }
  v = cu_block_sum(v, sh);
  /* stored as computed (acc type), so backward sees what forward used */
  A mt = (A)m, rt = (A)(1.0 / sqrt(v / (double)C + eps));
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    A xv = cu_ld(xr + j);
    if (rms) {
      A h = xv * rt;
      cu_sv(yr + j, w ? h * cu_ld(w + j) : h);
    } else {
      A h = (xv - mt) * rt;
      cu_sv(yr + j, (w ? h * cu_ld(w + j) : h) + (b ? cu_ld(b + j) : (A)0));
    }
  }
  if (threadIdx.x == 0) {
    if (mu) mu[blockIdx.x] = mt;
    rs[blockIdx.x] = rt;
  }
}

/* gx of one row: layernorm dx = rstd (gy - mean(gy) - xhat mean(gy xhat)), gy = g w;
 * rmsnorm: the same without the mean terms on x (mu = NULL). */
template <class T>
__global__ void ln_bwd_rows_kernel(const T *x, const typename cu_acc<T>::type *mu,
                                   const typename cu_acc<T>::type *rs, const T *g, const T *w, T *gx, int64_t C,
                                   bool cached) {
  typedef typename cu_acc<T>::type A;
  __shared__ double sh[32];
  /* cached: the row's g w and x - mean kept in shared memory (2 C values), so x, g and w
   * are read once here instead of twice */
  extern __shared__ __align__(16) unsigned char ln_smem[];
  A *cg = (A *)ln_smem, *cd = cg + C;
  const T *xr = x + blockIdx.x * C, *gr = g + blockIdx.x * C;
  T *dr = gx + blockIdx.x * C;
  A m = mu ? mu[blockIdx.x] : (A)0, rstd = rs[blockIdx.x];
  double sa = 0, sb = 0;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    A gy = w ? cu_ld(gr + j) * cu_ld(w + j) : cu_ld(gr + j);
    A d = cu_ld(xr + j) - m;
    if (cached) cg[j] = gy, cd[j] = d;
    sa += (double)gy;
    sb += (double)(gy * d * rstd);
  }
  A ma = mu ? (A)(cu_block_sum(sa, sh) / (double)C) : (A)0;
  A mb = (A)(cu_block_sum(sb, sh) / (double)C);
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    A gy, d;
    if (cached) gy = cg[j], d = cd[j]; /* each thread reads back only what it wrote */
    else gy = w ? cu_ld(gr + j) * cu_ld(w + j) : cu_ld(gr + j), d = cu_ld(xr + j) - m;
    cu_sv(dr + j, rstd * (gy - ma - d * rstd * mb));
  }
}

/* Partial column sums over rows [lo, hi) of chunk blockIdx.y: aw += g xhat, ab += g. */
template <class T>
__global__ void ln_bwd_cols_kernel(const T *x, const typename cu_acc<T>::type *mu,
                                   const typename cu_acc<T>::type *rs, const T *g, int64_t R, int64_t C,
                                   int64_t chunk, double *pw, double *pb) {
  typedef typename cu_acc<T>::type A;
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= C) return;
  int64_t lo = blockIdx.y * chunk, hi = lo + chunk < R ? lo + chunk : R;
  double aw = 0, ab = 0;
  for (int64_t r = lo; r < hi; r++) {
    A gv = cu_ld(g + r * C + j);
    A m = mu ? mu[r] : (A)0;
    aw += (double)(gv * ((cu_ld(x + r * C + j) - m) * rs[r]));
    ab += (double)gv;
  }
  pw[blockIdx.y * C + j] = aw;
  if (pb) pb[blockIdx.y * C + j] = ab;
}

template <class T>
__global__ void cols_finish_kernel(const double *part, int nsplit, int64_t C, T *out, bool want) {
  typedef typename cu_acc<T>::type A;
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < C;
       j += (int64_t)gridDim.x * blockDim.x) {
    double s = 0;
    if (want)
      for (int k = 0; k < nsplit; k++) s += part[k * C + j];
    cu_sv(out + j, (A)s);
  }
}

static int norm_fwd(rm_ctx *ctx, int nin, rm_tensor *const *in, rm_tensor *const *out,
                    const rm_attrs *a, bool rms) {
  const char *name = rms ? "rmsnorm" : "layernorm";
  int64_t R, C;
  rows_cols(in[0], &R, &C);
  if (R == 0 || C == 0) return RM_OK;
  cu_inputs ci;
  int rc = cu_inputs_get(ctx, nin, in, &ci);
  cudaStream_t st = cu_st(ctx)->stream;
  if (!rc) {
    CU_DISPATCH(ctx, name, out[0]->dtype,
                ln_fwd_kernel<T><<<(unsigned)R, cu_row_threads(C, 512), 0, st>>>(
                    (const T *)ci.p[0], nin > 1 ? (const T *)ci.p[1] : NULL,
                    (!rms && nin > 2) ? (const T *)ci.p[2] : NULL, (T *)cu_ptr(out[0]),
                    rms ? NULL : (typename cu_acc<T>::type *)cu_ptr(out[1]),
                    (typename cu_acc<T>::type *)cu_ptr(out[rms ? 1 : 2]), C, a->norm.eps, rms));
    rc = CU_LAUNCHED(ctx, name);
  }
  cu_inputs_free(ctx, &ci);
  return rc;
}

/* Backward: rms selects the layout (x, rstd, g[, w] vs x, mean, rstd, g[, w]). */
static int norm_bwd(rm_ctx *ctx, int nin, rm_tensor *const *in, rm_tensor *const *out,
                    const rm_attrs *a, bool rms) {
  const char *name = rms ? "rmsnorm_backward" : "layernorm_backward";
  int64_t R, C;
  rows_cols(in[0], &R, &C);
  int64_t want = a->norm_backward.want;
  int ig = rms ? 2 : 3, iw = ig + 1;
  cu_inputs ci;
  int rc = cu_inputs_get(ctx, nin, in, &ci);
  cudaStream_t st = cu_st(ctx)->stream;
  rm_dtype dt = out[0]->dtype;
  const void *x = ci.p[0], *mu = rms ? NULL : ci.p[1], *rs = ci.p[rms ? 1 : 2], *g = ci.p[ig];
  const void *w = nin > iw ? ci.p[iw] : NULL;
  int nsplit = 1;
  while (nsplit < 64 && R / (nsplit * 2) >= 128) nsplit *= 2;
  int64_t chunk = (R + nsplit - 1) / nsplit;
  double *part = NULL;
  size_t pbytes = (size_t)2 * nsplit * (C ? C : 1) * sizeof(double);
  if (rc) goto done;
  if (R * C == 0) {
    /* no rows: gw (and gb) are sums over nothing */
    for (int j = 1; j < (rms ? 2 : 3) && !rc; j++) rc = cu_fill(ctx, cu_ptr(out[j]), dt, C, 0.0);
    if (!rc && cu_numel(out[0])) rc = cu_fill(ctx, cu_ptr(out[0]), dt, cu_numel(out[0]), 0.0);
    goto done;
  }
  if (want & 1) {
    CU_DISPATCH(ctx, name, dt,
                {
                  size_t cache = (size_t)2 * C * sizeof(typename cu_acc<T>::type);
                  bool cached = cache <= 32 * 1024;
                  ln_bwd_rows_kernel<T><<<(unsigned)R, cu_row_threads(C, 512), cached ? cache : 0, st>>>(
                      (const T *)x, (const typename cu_acc<T>::type *)mu, (const typename cu_acc<T>::type *)rs,
                      (const T *)g, (const T *)w, (T *)cu_ptr(out[0]), C, cached);
                });
    if ((rc = CU_LAUNCHED(ctx, name))) goto done;
  } else if ((rc = cu_fill(ctx, cu_ptr(out[0]), dt, R * C, 0.0))) {
    goto done;
  }
  if (!(part = (double *)cu_scratch(ctx, pbytes))) { rc = ctx->err_code; goto done; }
  {
    double *pw = part, *pb = rms ? NULL : part + (size_t)nsplit * C;
    dim3 grid((unsigned)((C + 255) / 256), (unsigned)nsplit);
    bool need = rms ? (want & 2) : (want & 6);
    if (need) {
      CU_DISPATCH(ctx, name, dt,
                  ln_bwd_cols_kernel<T><<<grid, 256, 0, st>>>(
                      (const T *)x, (const typename cu_acc<T>::type *)mu, (const typename cu_acc<T>::type *)rs,
                      (const T *)g, R, C, chunk, pw, pb));
      if ((rc = CU_LAUNCHED(ctx, name))) goto done;
    }
    CU_DISPATCH(ctx, name, dt, {
      cols_finish_kernel<T><<<cu_blocks(C), CU_THREADS, 0, st>>>(pw, nsplit, C, (T *)cu_ptr(out[1]),
                                                                (want & 2) != 0);
      if (!rms)
        cols_finish_kernel<T><<<cu_blocks(C), CU_THREADS, 0, st>>>(pb, nsplit, C,
                                                                  (T *)cu_ptr(out[2]), (want & 4) != 0);
    });
    rc = CU_LAUNCHED(ctx, name);
  }
done:
  if (part) cu_scratch_free(ctx, part, pbytes);
  cu_inputs_free(ctx, &ci);
  return rc;
}

RM_CUDA_KERNEL(layernorm) {
  return norm_fwd(ctx, nin, in, out, a, false);
}

RM_CUDA_KERNEL(rmsnorm) {
  return norm_fwd(ctx, nin, in, out, a, true);
}

RM_CUDA_KERNEL(layernorm_backward) {
  return norm_bwd(ctx, nin, in, out, a, false);
}

RM_CUDA_KERNEL(rmsnorm_backward) {
  return norm_bwd(ctx, nin, in, out, a, true);
}
