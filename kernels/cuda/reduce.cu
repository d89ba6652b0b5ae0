/* CUDA kernels for reductions (sum, mean, sum_to, max, argmax) and softmax /
 * log_softmax with their backward helpers; semantics of kernels/cpu/reduce.c (attrs:
 * i[0] dim as given by the user, negatives from the end, RM_DIM_ALL every dim).
 *
 * Sums accumulate in double and split work at boundaries that depend only on the
 * shape (never on the device), with a fixed reduction tree: results are reproducible
 * run to run. max/argmax: the first maximum, and the first NaN wins over numbers; their
 * indices are float32 (float64 for float64), never bfloat16 (exact only up to 256).
 *
 * Column sums (the kept dims innermost, e.g. sum_to for a linear layer's bias gradient,
 * (B T, C) -> (C)): a block is a 32 x 8 tile, 32 neighbouring outputs (coalesced reads)
 * by 8 row lanes, over one of nsplit fixed row chunks; the 8 lanes meet in shared memory
 * in a fixed order and the chunks' partial sums are added in order by a second kernel.
 * Estimate (from bytes, not measured) for GPT-2 small (B T = 8192 rows; bias widths
 * 2304, 768, 3072, 768 per layer, bf16) on an H100/H200: 113 MB read per layer, 1.4 GB
 * per step, ~0.4 ms at ~3.5 TB/s. Before: a thread per column walking all 8192 rows
 * (6 to 24 blocks on 132 SMs), tens of ms per step. */
#include "cuda_common.cuh"

/* Dimension attr normalised to 0..ndim-1, or -1 for "every dim". */
static int red_dim(const rm_tensor *t, int64_t dim) {
  if (dim == RM_DIM_ALL || t->ndim == 0) return -1;
  return (int)(dim < 0 ? dim + t->ndim : dim);
}

/* outer / n / inner of a reduction over dim d (-1: all). */
static void split3(const rm_tensor *t, int d, int64_t *outer, int64_t *n, int64_t *inner) {
  *outer = 1; *inner = 1; *n = 1;
  if (d < 0) { *n = cu_numel(t); return; }
  for (int k = 0; k < t->ndim; k++) {
    if (k < d) *outer *= t->shape[k];
    else if (k > d) *inner *= t->shape[k];
  }
  *n = t->shape[d];
}

/* ---- sum engine over an arbitrary set of dims of a contiguous input ---- */

/* Kept dims (output order) and summed dims, merged, with their input strides. */
typedef struct sum_geo {
  cu_geo kept, red;
  int64_t R;          /* summed elements per output */
  bool rows;          /* innermost run summed: reads along the reduction are contiguous */
} sum_geo;

static sum_geo sum_geo_build(int ndim, const int64_t *shape, const bool *red) {
  int64_t st[RM_MAX_DIM], s = 1;
  for (int d = ndim - 1; d >= 0; d--) st[d] = s, s *= shape[d];
  sum_geo g;
  g.kept.ndim = g.red.ndim = 0;
  g.R = 1;
  int last = -1; /* 0 kept, 1 summed */
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 1) continue;
    cu_geo *t = red[d] ? &g.red : &g.kept;
    if (red[d]) g.R *= shape[d];
    if (last == (int)red[d] && t->ndim > 0) {
      t->shape[t->ndim - 1] *= shape[d];
      t->stride[t->ndim - 1] = st[d];
    } else {
      t->shape[t->ndim] = shape[d];
      t->stride[t->ndim] = st[d];
      t->ndim++;
    }
    last = red[d];
  }
  g.rows = last == 1;
  return g;
}

/* Rows: one block per (output, part); parts split the summed range in fixed chunks. */
template <class T>
__global__ void sum_rows_kernel(const T *x, sum_geo g, int64_t chunk, int nsplit, double *part,
                                T *out, double div) {
  __shared__ double sh[32];
  int64_t e = blockIdx.x / nsplit;
  int pi = blockIdx.x % nsplit;
  int64_t base = cu_offset(g.kept, e);
  int64_t lo = pi * chunk, hi = lo + chunk < g.R ? lo + chunk : g.R;
  double acc = 0;
  for (int64_t p = lo + threadIdx.x; p < hi; p += blockDim.x) acc += (double)cu_ld(x + base + cu_offset(g.red, p));
  acc = cu_block_sum(acc, sh);
  if (threadIdx.x == 0) {
    if (part) part[e * nsplit + pi] = acc;
    else cu_sv(out + e, (typename cu_acc<T>::type)(acc / div));
  }
}

/* Columns: a 32 x 8 block sums 32 neighbouring outputs over rows [lo, hi) of chunk
 * blockIdx.y, 8 row lanes each, then adds the lanes in a fixed order. */
#define COL_TILE 32
#define COL_LANES 8
template <class T>
__global__ void __launch_bounds__(COL_TILE * COL_LANES)
sum_cols_kernel(const T *x, sum_geo g, int64_t nout, int64_t chunk, int nsplit, double *part, T *out,
                double div) {
  __shared__ double sh[COL_LANES][COL_TILE];
  int64_t e = blockIdx.x * (int64_t)COL_TILE + threadIdx.x;
  int pi = blockIdx.y;
  double acc = 0;
  if (e < nout) {
    int64_t base = cu_offset(g.kept, e);
    int64_t lo = pi * chunk, hi = lo + chunk < g.R ? lo + chunk : g.R;
    for (int64_t p = lo + threadIdx.y; p < hi; p += COL_LANES) acc += (double)cu_ld(x + base + cu_offset(g.red, p));
  }
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || e >= nout) return;
  for (int l = 1; l < COL_LANES; l++) acc += sh[l][threadIdx.x];
  if (part) part[e * nsplit + pi] = acc;
  else cu_sv(out + e, (typename cu_acc<T>::type)(acc / div));
}

template <class T>
__global__ void sum_parts_kernel(const double *part, int nsplit, int64_t nout, T *out, double div) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < nout;
       e += (int64_t)gridDim.x * blockDim.x) {
    double acc = 0;
    for (int j = 0; j < nsplit; j++) acc += part[e * nsplit + j];
    cu_sv(out + e, (typename cu_acc<T>::type)(acc / div));
  }
}

template <class T>
static int sum_launch(rm_ctx *ctx, const T *x, T *out, const sum_geo &g, int64_t nout, double div) {
  cudaStream_t st = cu_st(ctx)->stream;
  /* Split long reductions when there are too few outputs to fill the device. The
   * split depends on the sizes only, so results do not change between devices. */
  int64_t work_per_out = g.R;
  int nsplit = 1;
  const int64_t target = g.rows ? 2048 : 1024; /* blocks wanted */
  const int64_t min_chunk = g.rows ? 4096 : 64; /* summed elements per part, at least */
  int64_t have = g.rows ? nout : (nout + COL_TILE - 1) / COL_TILE;
  while (nsplit < 1024 && have * nsplit < target && work_per_out / (nsplit * 2) >= min_chunk) nsplit *= 2;
  int64_t chunk = (g.R + nsplit - 1) / nsplit;
  double *part = NULL;
  size_t pbytes = (size_t)nout * nsplit * sizeof(double);
  if (nsplit > 1 && !(part = (double *)cu_scratch(ctx, pbytes))) return ctx->err_code;
  if (g.rows) {
    int threads = cu_row_threads(chunk);
    sum_rows_kernel<T><<<(unsigned)(nout * nsplit), threads, 0, st>>>(x, g, chunk, nsplit, part, out, div);
  } else {
    dim3 grid((unsigned)((nout + COL_TILE - 1) / COL_TILE), (unsigned)nsplit);
    sum_cols_kernel<T><<<grid, dim3(COL_TILE, COL_LANES), 0, st>>>(x, g, nout, chunk, nsplit, part, out, div);
  }
  int rc = CU_LAUNCHED(ctx, "sum kernel");
  if (!rc && part) {
    sum_parts_kernel<T><<<cu_blocks(nout), CU_THREADS, 0, st>>>(part, nsplit, nout, out, div);
    rc = CU_LAUNCHED(ctx, "sum kernel (parts)");
  }
  if (part) cu_scratch_free(ctx, part, pbytes);
  return rc;
}

/* Sums in over the dims flagged in red[], dividing by div, into out. */
static int sum_dims(rm_ctx *ctx, const rm_tensor *in, rm_tensor *out, const bool *red, double div) {
  int64_t nin = cu_numel(in), nout = cu_numel(out);
  if (nout == 0) return RM_OK;
  if (nin == 0) return cu_fill(ctx, cu_ptr(out), out->dtype, nout, 0.0 / div);
  void *scratch = NULL;
  const void *x = cu_contig_data(ctx, in, &scratch);
  if (!x) return ctx->err_code;
  sum_geo g = sum_geo_build(in->ndim, in->shape, red);
  int rc = RM_OK;
  switch (out->dtype) {
  case RM_F32: rc = sum_launch<float>(ctx, (const float *)x, (float *)cu_ptr(out), g, nout, div); break;
  case RM_F64: rc = sum_launch<double>(ctx, (const double *)x, (double *)cu_ptr(out), g, nout, div); break;
  case RM_BF16:
    rc = sum_launch<__nv_bfloat16>(ctx, (const __nv_bfloat16 *)x, (__nv_bfloat16 *)cu_ptr(out), g, nout, div);
    break;
  default: rc = cu_bad_dtype(ctx, "sum", out->dtype);
  }
  if (scratch) cu_scratch_free(ctx, scratch, (size_t)nin * cu_dsize(in->dtype));
  return rc;
}

static void dims_of(const rm_tensor *t, int64_t dim, bool *red) {
  int d = red_dim(t, dim);
  for (int k = 0; k < t->ndim; k++) red[k] = d < 0 || k == d;
}

/* Integer sums: one thread per output element over its summed positions, in order, in
 * int64 wrapping around on overflow (as the CPU does); x contiguous, seen as (outer, n,
 * inner) around the summed dims (all dims: outer = inner = 1). */
template <class T>
__global__ void sum_int_kernel(const T *x, int64_t *o, int64_t nout, int64_t n, int64_t inner) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < nout; e += (int64_t)gridDim.x * blockDim.x) {
    const T *p = x + (e / inner) * n * inner + e % inner;
    uint64_t acc = 0;
    for (int64_t k = 0; k < n; k++) acc += (uint64_t)(int64_t)p[k * inner];
    o[e] = (int64_t)acc;
  }
}

static int sum_int(rm_ctx *ctx, const rm_tensor *in, rm_tensor *out, int64_t dim) {
  int64_t nout = cu_numel(out), n = cu_numel(in), inner = 1;
  if (nout == 0) return RM_OK;
  int d = red_dim(in, dim);
  if (d >= 0) {
    n = in->shape[d];
    for (int k = d + 1; k < in->ndim; k++) inner *= in->shape[k];
  }
  void *scratch = NULL;
  const void *x = cu_contig_data(ctx, in, &scratch);
  if (!x && n > 0) return ctx->err_code;
  cudaStream_t st = cu_st(ctx)->stream;
  if (in->dtype == RM_I32)
    sum_int_kernel<int32_t><<<cu_blocks(nout), CU_THREADS, 0, st>>>((const int32_t *)x, (int64_t *)cu_ptr(out), nout, n, inner);
  else
    sum_int_kernel<int64_t><<<cu_blocks(nout), CU_THREADS, 0, st>>>((const int64_t *)x, (int64_t *)cu_ptr(out), nout, n, inner);
  int rc = CU_LAUNCHED(ctx, "integer sum kernel");
  if (scratch) cu_scratch_free(ctx, scratch, (size_t)cu_numel(in) * cu_dsize(in->dtype));
  return rc;
}

RM_CUDA_KERNEL(sum) {
  if (in[0]->dtype == RM_I32 || in[0]->dtype == RM_I64) return sum_int(ctx, in[0], out[0], a->reduce.dim);
  bool red[RM_MAX_DIM];
  dims_of(in[0], a->reduce.dim, red);
  return sum_dims(ctx, in[0], out[0], red, 1.0);
}

RM_CUDA_KERNEL(mean) {
  bool red[RM_MAX_DIM];
  dims_of(in[0], a->reduce.dim, red);
  int64_t no = cu_numel(out[0]);
  double count = no ? (double)cu_numel(in[0]) / (double)no : 0.0;
  return sum_dims(ctx, in[0], out[0], red, count);
}

RM_CUDA_KERNEL(sum_to) {
  bool red[RM_MAX_DIM];
  int off = in[0]->ndim - a->ndim;
  for (int d = 0; d < in[0]->ndim; d++)
    red[d] = d < off || (a->shape[d - off] == 1 && in[0]->shape[d] != 1);
  return sum_dims(ctx, in[0], out[0], red, 1.0);
}

/* ---- max / argmax ---- */

/* (value, index) of the better of two candidates: a NaN beats numbers, a larger value
 * beats a smaller one, and ties go to the smaller index. */
template <class A>
__device__ __forceinline__ void max_pick(A &v, int64_t &i, A v2, int64_t i2) {
  bool n1 = v != v, n2 = v2 != v2;
  bool take;
  if (n1 || n2) take = n2 && (!n1 || i2 < i);
  else take = v2 > v || (v2 == v && i2 < i);
  if (take) v = v2, i = i2;
}

/* One block per column when inner == 1 (rows), else one thread per column. */
template <class T>
__global__ void max_rows_kernel(const T *x, int64_t n, T *val, int64_t *idx) {
  typedef typename cu_acc<T>::type A;
  __shared__ A shv[32];
  __shared__ int64_t shi[32];
  const T *p = x + blockIdx.x * n;
  A best = cu_ld(p);
  int64_t bi = 0;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) max_pick<A>(best, bi, cu_ld(p + k), k);
  for (int o = 16; o > 0; o >>= 1) {
    A v2 = __shfl_xor_sync(0xffffffffu, best, o);
    int64_t i2 = __shfl_xor_sync(0xffffffffu, bi, o);
    max_pick<A>(best, bi, v2, i2);
  }
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) shv[w] = best, shi[w] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int j = 1; j < nw; j++) max_pick<A>(best, bi, shv[j], shi[j]);
    if (val) cu_sv(val + blockIdx.x, best);
    if (idx) idx[blockIdx.x] = bi + 1;
  }
}

template <class T>
__global__ void max_cols_kernel(const T *x, int64_t outer, int64_t n, int64_t inner, T *val,
                                int64_t *idx) {
  typedef typename cu_acc<T>::type A;
  int64_t cols = outer * inner;
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cols;
       c += (int64_t)gridDim.x * blockDim.x) {
    const T *p = x + (c / inner) * n * inner + c % inner;
    A best = cu_ld(p);
    int64_t bi = 0;
    if (best == best)
      for (int64_t k = 1; k < n; k++) {
        A v = cu_ld(p + k * inner);
        if (v > best) { best = v; bi = k; }
        else if (v != v) { best = v; bi = k; break; }
      }
    if (val) cu_sv(val + c, best);
    if (idx) idx[c] = bi + 1;
  }
}

template <class T>
static int max_launch(rm_ctx *ctx, const T *x, int64_t outer, int64_t n, int64_t inner, T *val,
                      int64_t *idx) {
  cudaStream_t st = cu_st(ctx)->stream;
  if (inner == 1)
    max_rows_kernel<T><<<(unsigned)outer, cu_row_threads(n), 0, st>>>(x, n, val, idx);
  else
    max_cols_kernel<T><<<cu_blocks(outer * inner), CU_THREADS, 0, st>>>(x, outer, n, inner, val, idx);
  return CU_LAUNCHED(ctx, "max kernel");
}

static int max_run(rm_ctx *ctx, rm_tensor *xt, int64_t dim, rm_tensor *val, rm_tensor *idx) {
  int64_t outer, n, inner;
  split3(xt, red_dim(xt, dim), &outer, &n, &inner);
  if (n == 0 || outer * inner == 0) return RM_OK;
  void *scratch = NULL;
  const void *x = cu_contig_data(ctx, xt, &scratch);
  if (!x) return ctx->err_code;
  int rc;
  CU_DISPATCH(ctx, "max", xt->dtype,
              rc = max_launch<T>(ctx, (const T *)x, outer, n, inner, val ? (T *)cu_ptr(val) : NULL,
                                 idx ? (int64_t *)cu_ptr(idx) : NULL));
  if (scratch) cu_scratch_free(ctx, scratch, (size_t)cu_numel(xt) * cu_dsize(xt->dtype));
  return rc;
}

RM_CUDA_KERNEL(max) {
  return max_run(ctx, in[0], a->reduce.dim, out[0], out[1]);
}

RM_CUDA_KERNEL(argmax) {
  return max_run(ctx, in[0], a->reduce.dim, NULL, out[0]);
}

/* ---- softmax family ---- */

/* Fused softmax / log_softmax of sc * x over contiguous rows (inner == 1): one block
 * per row, max, sum of exponentials (double), then the outputs; the row stays in
 * L1/L2. causal_t > 0: the rows are (T, T) scores and row i (of each T) sees columns
 * j <= i; the rest give 0 (-inf in log mode), as causal_mask's -inf would. */
template <class T>
__global__ void softmax_rows_kernel(const T *x, T *y, int64_t n, bool logmode, double scd, int64_t causal_t) {
  typedef typename cu_acc<T>::type A;
  __shared__ A shm[32];
  __shared__ double shs[32];
  const A sc = (A)scd;
  const T *xp = x + blockIdx.x * n;
  T *yp = y + blockIdx.x * n;
  const int64_t live = causal_t ? (int64_t)blockIdx.x % causal_t + 1 : n;
  A m = -INFINITY;
  for (int64_t k = threadIdx.x; k < live; k += blockDim.x) {
    A v = cu_ld(xp + k) * sc;
    if (v > m) m = v;
  }
  m = cu_block_max(m, shm);
  double s = 0;
  for (int64_t k = threadIdx.x; k < live; k += blockDim.x) s += (double)exp(cu_ld(xp + k) * sc - m);
  s = cu_block_sum(s, shs);
  if (logmode) {
    A lse = m + (A)log((A)s);
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x)
      cu_sv(yp + k, k < live ? cu_ld(xp + k) * sc - lse : (A)-INFINITY - lse);
  } else {
    A inv = (A)(1.0 / s);
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x)
      cu_sv(yp + k, k < live ? (A)exp(cu_ld(xp + k) * sc - m) * inv : (A)0 * inv);
  }
}

/* Strided columns (softmax over a dim that is not the last, never causal): one thread
 * per column. */
template <class T>
__global__ void softmax_cols_kernel(const T *x, T *y, int64_t outer, int64_t n, int64_t s, bool logmode,
                                    double scd) {
  typedef typename cu_acc<T>::type A;
  const A sc = (A)scd;
  int64_t cols = outer * s;
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cols;
       c += (int64_t)gridDim.x * blockDim.x) {
    int64_t base = (c / s) * n * s + c % s;
    const T *xp = x + base;
    T *yp = y + base;
    A m = -INFINITY;
    for (int64_t k = 0; k < n; k++) { A v = cu_ld(xp + k * s) * sc; if (v > m) m = v; }
    double sum = 0;
    for (int64_t k = 0; k < n; k++) sum += (double)exp(cu_ld(xp + k * s) * sc - m);
    if (logmode) {
      A lse = m + (A)log((A)sum);
      for (int64_t k = 0; k < n; k++) cu_sv(yp + k * s, cu_ld(xp + k * s) * sc - lse);
    } else {
      A inv = (A)(1.0 / sum);
      for (int64_t k = 0; k < n; k++) cu_sv(yp + k * s, (A)exp(cu_ld(xp + k * s) * sc - m) * inv);
    }
  }
}

/* softmax: dx = y (g - sum(g y)); log_softmax: dx = g - exp(y) sum(g); times sc, over
 * a causal row's first i + 1 entries (the masked ones get 0 and stay out of the sum). */
template <class T>
__global__ void softmax_bw_rows_kernel(const T *y, const T *g, T *dx, int64_t n, bool logmode, double scd,
                                       int64_t causal_t) {
  typedef typename cu_acc<T>::type A;
  __shared__ double shs[32];
  const A sc = (A)scd;
  const T *yp = y + blockIdx.x * n, *gp = g + blockIdx.x * n;
  T *dp = dx + blockIdx.x * n;
  const int64_t live = causal_t ? (int64_t)blockIdx.x % causal_t + 1 : n;
  double acc = 0;
  for (int64_t k = threadIdx.x; k < live; k += blockDim.x)
    acc += logmode ? (double)cu_ld(gp + k) : (double)(cu_ld(gp + k) * cu_ld(yp + k));
  A sv = (A)cu_block_sum(acc, shs);
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    A yv = cu_ld(yp + k), gv = cu_ld(gp + k);
    cu_sv(dp + k, k < live ? (logmode ? gv - (A)exp(yv) * sv : yv * (gv - sv)) * sc : (A)0);
  }
}

template <class T>
__global__ void softmax_bw_cols_kernel(const T *y, const T *g, T *dx, int64_t outer, int64_t n,
                                       int64_t s, bool logmode, double scd) {
  typedef typename cu_acc<T>::type A;
  const A sc = (A)scd;
  int64_t cols = outer * s;
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cols;
       c += (int64_t)gridDim.x * blockDim.x) {
    int64_t base = (c / s) * n * s + c % s;
    double acc = 0;
    for (int64_t k = 0; k < n; k++) {
      int64_t o = base + k * s;
      acc += logmode ? (double)cu_ld(g + o) : (double)(cu_ld(g + o) * cu_ld(y + o));
    }
    A sv = (A)acc;
    for (int64_t k = 0; k < n; k++) {
      int64_t o = base + k * s;
      A yv = cu_ld(y + o), gv = cu_ld(g + o);
      cu_sv(dx + o, (logmode ? gv - (A)exp(yv) * sv : yv * (gv - sv)) * sc);
    }
  }
}

/* The scale (0, unset, is 1) and a causal call's T (else 0) of the softmax attrs. */
static double softmax_scale(const rm_attrs *a) { return a->softmax.scale != 0 ? a->softmax.scale : 1.0; }
static int64_t softmax_causal_t(const rm_attrs *a, const rm_tensor *t) {
  return a->softmax.causal && t->ndim ? t->shape[t->ndim - 1] : 0;
}

static int softmax_run(rm_ctx *ctx, rm_tensor *xt, rm_tensor *yt, const rm_attrs *a, bool logmode) {
  int64_t outer, n, s;
  split3(xt, red_dim(xt, a->softmax.dim), &outer, &n, &s);
  if (outer * n * s == 0) return RM_OK;
  void *scratch = NULL;
  const void *x = cu_contig_data(ctx, xt, &scratch);
  if (!x) return ctx->err_code;
  cudaStream_t st = cu_st(ctx)->stream;
  double sc = softmax_scale(a);
  int64_t ct = softmax_causal_t(a, xt);
  CU_DISPATCH(ctx, logmode ? "log_softmax" : "softmax", xt->dtype, {
    if (s == 1)
      softmax_rows_kernel<T><<<(unsigned)outer, cu_row_threads(n, 512), 0, st>>>(
          (const T *)x, (T *)cu_ptr(yt), n, logmode, sc, ct);
    else
      softmax_cols_kernel<T><<<cu_blocks(outer * s), CU_THREADS, 0, st>>>(
          (const T *)x, (T *)cu_ptr(yt), outer, n, s, logmode, sc);
  });
  int rc = CU_LAUNCHED(ctx, "softmax kernel");
  if (scratch) cu_scratch_free(ctx, scratch, (size_t)cu_numel(xt) * cu_dsize(xt->dtype));
  return rc;
}

static int softmax_bw_run(rm_ctx *ctx, rm_tensor *yt, rm_tensor *gt, rm_tensor *dt, const rm_attrs *a,
                          bool logmode) {
  int64_t outer, n, s;
  split3(yt, red_dim(yt, a->softmax.dim), &outer, &n, &s);
  if (outer * n * s == 0) return RM_OK;
  void *s1 = NULL, *s2 = NULL;
  const void *y = cu_contig_data(ctx, yt, &s1);
  const void *g = y ? cu_contig_data(ctx, gt, &s2) : NULL;
  int rc = RM_OK;
  if (!g) rc = ctx->err_code;
  cudaStream_t st = cu_st(ctx)->stream;
  double sc = softmax_scale(a);
  int64_t ct = softmax_causal_t(a, yt);
  if (!rc) {
    CU_DISPATCH(ctx, logmode ? "log_softmax_backward" : "softmax_backward", yt->dtype, {
      if (s == 1)
        softmax_bw_rows_kernel<T><<<(unsigned)outer, cu_row_threads(n, 512), 0, st>>>(
            (const T *)y, (const T *)g, (T *)cu_ptr(dt), n, logmode, sc, ct);
      else
        softmax_bw_cols_kernel<T><<<cu_blocks(outer * s), CU_THREADS, 0, st>>>(
            (const T *)y, (const T *)g, (T *)cu_ptr(dt), outer, n, s, logmode, sc);
    });
    rc = CU_LAUNCHED(ctx, "softmax backward kernel");
  }
  size_t bytes = (size_t)cu_numel(yt) * cu_dsize(yt->dtype);
  if (s1) cu_scratch_free(ctx, s1, bytes);
  if (s2) cu_scratch_free(ctx, s2, bytes);
  return rc;
}

RM_CUDA_KERNEL(softmax) {
  return softmax_run(ctx, in[0], out[0], a, false);
}

RM_CUDA_KERNEL(log_softmax) {
  return softmax_run(ctx, in[0], out[0], a, true);
}

RM_CUDA_KERNEL(softmax_backward) {
  return softmax_bw_run(ctx, in[0], in[1], out[0], a, false);
}

RM_CUDA_KERNEL(log_softmax_backward) {
  return softmax_bw_run(ctx, in[0], in[1], out[0], a, true);
}
