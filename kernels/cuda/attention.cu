/* Fused scaled-dot-product attention (flash-attention style) for the ops attention and
 * attention_backward (core/op_attention.c has the definitions, kernels/cpu/attention.c
 * the CPU kernels); backend.cu picks these up by name (cuk_attention, ...).
 *
 * Semantics:
 *   attention(q, k, v) -> y, lse          (nout 2, nvis 1: lse is kept for backward)
 *     q (..., Tq, hd), k and v (..., Tk, hd), same leading dims, contiguous;
 *     i[0] = 1: causal, aligned at the bottom right: query i sees keys
 *     j <= i + (Tk - Tq) (the op requires Tq <= Tk); f[0] = scale (0: 1/sqrt(hd)).
 *     y = softmax(scale q k^T [+ mask]) v, shape of q, dtype of q (0 when Tk = 0);
 *     lse (..., Tq) float32: the log-sum-exp of each score row.
 *   attention_backward(q, k, v, y, lse, gy) -> gq, gk, gv   (same attrs)
 * The T x T score matrix is never stored: the forward streams key tiles through shared
 * memory with an online softmax; the backward recomputes probabilities from lse, one
 * kernel for dq (a thread per query row) and one for dk, dv (a thread per key row), so
 * there are no atomics and results are deterministic. float32 and bfloat16 (float32
 * arithmetic); head dims up to 128. */
#include "cuda_common.cuh"

#define ATT_ROWS 64 /* threads (rows) per block, and key/query tile length */

/* Dynamic shared memory above 48 KiB must be asked for per kernel. */
template <class K>
static int att_smem(rm_ctx *ctx, K kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return RM_OK;
  return CU_CHECK(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <class T, int HD>
__global__ void __launch_bounds__(ATT_ROWS)
att_fwd_kernel(const T *q, const T *k, const T *v, T *y, float *lse, int64_t Tq, int64_t Tk, int hd,
               float scale, bool causal) {
  extern __shared__ float sm[];
  float *Ks = sm, *Vs = sm + ATT_ROWS * HD;
  int64_t bh = blockIdx.y, r = blockIdx.x * (int64_t)ATT_ROWS + threadIdx.x;
  const T *qb = q + bh * Tq * hd, *kb = k + bh * Tk * hd, *vb = v + bh * Tk * hd;
  bool valid = r < Tq;
  float qr[HD], o[HD];
#pragma unroll
  for (int d = 0; d < HD; d++) {
    qr[d] = (valid && d < hd) ? cu_ld(qb + r * hd + d) * scale : 0.f;
    o[d] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  int64_t off = Tk - Tq; /* causal: query r sees keys j <= r + off */
  int64_t last = blockIdx.x * (int64_t)ATT_ROWS + ATT_ROWS - 1; /* last row of the block */
  int64_t kend = causal ? (last + off + 1 < Tk ? last + off + 1 : Tk) : Tk;
  for (int64_t k0 = 0; k0 < kend; k0 += ATT_ROWS) {
    __syncthreads();
    for (int e = threadIdx.x; e < ATT_ROWS * HD; e += ATT_ROWS) {
      int j = e / HD, d = e % HD;
      bool in = k0 + j < Tk && d < hd;
      Ks[e] = in ? cu_ld(kb + (k0 + j) * hd + d) : 0.f;
      Vs[e] = in ? cu_ld(vb + (k0 + j) * hd + d) : 0.f;
    }
    __syncthreads();
    if (!valid) continue;
    int jn = (int)(Tk - k0 < ATT_ROWS ? Tk - k0 : ATT_ROWS);
    if (causal && r + off - k0 + 1 < jn) jn = (int)(r + off - k0 + 1);
    for (int j = 0; j < jn; j++) {
      float s = 0.f;
#pragma unroll
      for (int d = 0; d < HD; d++) s += qr[d] * Ks[j * HD + d];
      if (s > m) {
        float alpha = __expf(m - s);
        l *= alpha;
#pragma unroll
        for (int d = 0; d < HD; d++) o[d] *= alpha;
        m = s;
      }
      float p = __expf(s - m);
      l += p;
#pragma unroll
      for (int d = 0; d < HD; d++) o[d] += p * Vs[j * HD + d];
    }
  }
  if (valid) {
    float inv = l > 0.f ? 1.f / l : 0.f; /* no key (Tk = 0): y = 0 */
#pragma unroll
    for (int d = 0; d < HD; d++)
      if (d < hd) cu_sv(y + (bh * Tq + r) * hd + d, o[d] * inv);
    lse[bh * Tq + r] = m + logf(l);
  }
}

/* D_i = sum_d gy_i[d] y_i[d] (the softmax-backward row term). */
template <class T>
__global__ void att_rowdot_kernel(const T *y, const T *gy, float *D, int64_t rows, int hd) {
  for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows;
       r += (int64_t)gridDim.x * blockDim.x) {
    float s = 0.f;
    for (int d = 0; d < hd; d++) s += cu_ld(y + r * hd + d) * cu_ld(gy + r * hd + d);
    D[r] = s;
  }
}

/* dq_i = scale sum_j p_ij (dp_ij - D_i) k_j, p_ij = exp(scale q_i k_j - lse_i),
 * dp_ij = gy_i . v_j. A thread per query row; key tiles in shared memory. */
template <class T, int HD>
__global__ void __launch_bounds__(ATT_ROWS)
att_dq_kernel(const T *q, const T *k, const T *v, const float *lse, const float *D, const T *gy, T *gq,
              int64_t Tq, int64_t Tk, int hd, float scale, bool causal) {
  extern __shared__ float sm[];
  float *Ks = sm, *Vs = sm + ATT_ROWS * HD;
  float *Qo = Vs + ATT_ROWS * HD, *Go = Qo + ATT_ROWS * (HD + 1); /* own rows, padded */
  int64_t bh = blockIdx.y, r = blockIdx.x * (int64_t)ATT_ROWS + threadIdx.x;
  const T *kb = k + bh * Tk * hd, *vb = v + bh * Tk * hd;
  bool valid = r < Tq;
  float *qo = Qo + threadIdx.x * (HD + 1), *go = Go + threadIdx.x * (HD + 1);
  for (int d = 0; d < HD; d++) {
    qo[d] = (valid && d < hd) ? cu_ld(q + (bh * Tq + r) * hd + d) * scale : 0.f;
    go[d] = (valid && d < hd) ? cu_ld(gy + (bh * Tq + r) * hd + d) : 0.f;
  }
  float L = valid ? lse[bh * Tq + r] : 0.f, Dr = valid ? D[bh * Tq + r] : 0.f;
  float dq[HD];
#pragma unroll
  for (int d = 0; d < HD; d++) dq[d] = 0.f;
  int64_t off = Tk - Tq;
  int64_t last = blockIdx.x * (int64_t)ATT_ROWS + ATT_ROWS - 1;
  int64_t kend = causal ? (last + off + 1 < Tk ? last + off + 1 : Tk) : Tk;
  for (int64_t k0 = 0; k0 < kend; k0 += ATT_ROWS) {
    __syncthreads();
    for (int e = threadIdx.x; e < ATT_ROWS * HD; e += ATT_ROWS) {
      int j = e / HD, d = e % HD;
      bool in = k0 + j < Tk && d < hd;
      Ks[e] = in ? cu_ld(kb + (k0 + j) * hd + d) : 0.f;
      Vs[e] = in ? cu_ld(vb + (k0 + j) * hd + d) : 0.f;
    }
    __syncthreads();
    if (!valid) continue;
    int jn = (int)(Tk - k0 < ATT_ROWS ? Tk - k0 : ATT_ROWS);
    if (causal && r + off - k0 + 1 < jn) jn = (int)(r + off - k0 + 1);
    for (int j = 0; j < jn; j++) {
      float s = 0.f, dp = 0.f;
#pragma unroll
      for (int d = 0; d < HD; d++) {
        s += qo[d] * Ks[j * HD + d];
        dp += go[d] * Vs[j * HD + d];
      }
      float ds = __expf(s - L) * (dp - Dr);
#pragma unroll
      for (int d = 0; d < HD; d++) dq[d] += ds * Ks[j * HD + d];
    }
  }
  if (valid) {
#pragma unroll
    for (int d = 0; d < HD; d++)
      if (d < hd) cu_sv(gq + (bh * Tq + r) * hd + d, dq[d] * scale);
  }
}

/* dv_j = sum_i p_ij gy_i;  dk_j = scale sum_i p_ij (dp_ij - D_i) q_i. A thread per key
 * row; query tiles (q, gy, lse, D) in shared memory. */
template <class T, int HD>
__global__ void __launch_bounds__(ATT_ROWS)
att_dkv_kernel(const T *q, const T *k, const T *v, const float *lse, const float *D, const T *gy, T *gk,
               T *gv, int64_t Tq, int64_t Tk, int hd, float scale, bool causal) {
  extern __shared__ float sm[];
  float *Qs = sm, *Gs = sm + ATT_ROWS * HD, *Ls = Gs + ATT_ROWS * HD, *Ds = Ls + ATT_ROWS;
  float *Ko = Ds + ATT_ROWS, *Vo = Ko + ATT_ROWS * (HD + 1);
  int64_t bh = blockIdx.y, c = blockIdx.x * (int64_t)ATT_ROWS + threadIdx.x;
  const T *qb = q + bh * Tq * hd, *gb = gy + bh * Tq * hd;
  bool valid = c < Tk;
  float *ko = Ko + threadIdx.x * (HD + 1), *vo = Vo + threadIdx.x * (HD + 1);
  for (int d = 0; d < HD; d++) {
    ko[d] = (valid && d < hd) ? cu_ld(k + (bh * Tk + c) * hd + d) : 0.f;
    vo[d] = (valid && d < hd) ? cu_ld(v + (bh * Tk + c) * hd + d) : 0.f;
  }
  float dk[HD], dv[HD];
#pragma unroll
  for (int d = 0; d < HD; d++) dk[d] = dv[d] = 0.f;
  int64_t off = Tk - Tq; /* causal: key c is seen by queries i >= c - off */
  int64_t first = blockIdx.x * (int64_t)ATT_ROWS; /* first key of the block */
  int64_t q0s = causal && first > off ? (first - off) / ATT_ROWS * ATT_ROWS : 0;
  for (int64_t q0 = q0s; q0 < Tq; q0 += ATT_ROWS) {
    __syncthreads();
    for (int e = threadIdx.x; e < ATT_ROWS * HD; e += ATT_ROWS) {
      int i = e / HD, d = e % HD;
      bool in = q0 + i < Tq && d < hd;
      Qs[e] = in ? cu_ld(qb + (q0 + i) * hd + d) * scale : 0.f;
      Gs[e] = in ? cu_ld(gb + (q0 + i) * hd + d) : 0.f;
    }
    if (q0 + threadIdx.x < Tq) {
      Ls[threadIdx.x] = lse[bh * Tq + q0 + threadIdx.x];
      Ds[threadIdx.x] = D[bh * Tq + q0 + threadIdx.x];
    }
    __syncthreads();
    if (!valid) continue;
    int in_ = (int)(Tq - q0 < ATT_ROWS ? Tq - q0 : ATT_ROWS);
    int64_t ifirst = c - off - q0;
    int i0 = (causal && ifirst > 0) ? (int)(ifirst < ATT_ROWS ? ifirst : ATT_ROWS) : 0;
    for (int i = i0; i < in_; i++) {
      float s = 0.f, dp = 0.f;
#pragma unroll
      for (int d = 0; d < HD; d++) {
        s += Qs[i * HD + d] * ko[d];
        dp += Gs[i * HD + d] * vo[d];
      }
      float p = __expf(s - Ls[i]);
      float ds = p * (dp - Ds[i]);
#pragma unroll
      for (int d = 0; d < HD; d++) {
        dv[d] += p * Gs[i * HD + d];
        dk[d] += ds * Qs[i * HD + d]; /* Qs holds scale q: dk gets its scale here */
      }
    }
  }
  if (valid) {
#pragma unroll
    for (int d = 0; d < HD; d++)
      if (d < hd) {
        cu_sv(gk + (bh * Tk + c) * hd + d, dk[d]);
        cu_sv(gv + (bh * Tk + c) * hd + d, dv[d]);
      }
  }
}

typedef struct att_geo {
  int64_t bh, Tq, Tk;
  int hd;
  float scale;
  bool causal;
} att_geo;

static int att_geometry(rm_ctx *ctx, const char *op, rm_tensor *const *in, const rm_attrs *a, att_geo *g) {
  const rm_tensor *q = in[0], *k = in[1];
  if (q->ndim < 2 || k->ndim != q->ndim)
    return cu_fail(ctx, RM_ERR_SHAPE, "%s: q, k, v must be (..., T, head_dim) with the same rank", op);
  g->hd = (int)q->shape[q->ndim - 1];
  g->Tq = q->shape[q->ndim - 2];
  g->Tk = k->shape[k->ndim - 2];
  g->bh = 1;
  for (int d = 0; d < q->ndim - 2; d++) g->bh *= q->shape[d];
  g->causal = a->i[0] != 0;
  g->scale = (float)(a->f[0] != 0 ? a->f[0] : 1.0 / sqrt((double)(g->hd ? g->hd : 1)));
  if (g->hd > 128) return cu_fail(ctx, RM_ERR_SHAPE, "%s: head dim %d is larger than 128 (cuda)", op, g->hd);
  if (q->dtype != RM_F32 && q->dtype != RM_BF16) return cu_bad_dtype(ctx, op, q->dtype);
  return RM_OK;
}

template <class T, int HD>
static int att_fwd_launch(rm_ctx *ctx, const att_geo &g, const cu_inputs &ci, T *y, float *lse) {
  size_t smem = (size_t)2 * ATT_ROWS * HD * sizeof(float);
  int rc = att_smem(ctx, att_fwd_kernel<T, HD>, smem);
  if (rc) return rc;
  dim3 grid((unsigned)((g.Tq + ATT_ROWS - 1) / ATT_ROWS), (unsigned)g.bh);
  att_fwd_kernel<T, HD><<<grid, ATT_ROWS, smem, cu_st(ctx)->stream>>>(
      (const T *)ci.p[0], (const T *)ci.p[1], (const T *)ci.p[2], y, lse, g.Tq, g.Tk, g.hd, g.scale, g.causal);
  return CU_LAUNCHED(ctx, "attention kernel");
}

RM_CUDA_KERNEL(attention) {
  (void)nout;
  att_geo g;
  if (att_geometry(ctx, "attention", in, a, &g)) return ctx->err_code;
  if (g.bh * g.Tq == 0) return RM_OK;
  cu_inputs ci;
  int rc = cu_inputs_get(ctx, nin, in, &ci);
  float *lse = (float *)cu_ptr(out[1]);
  if (!rc) {
    if (in[0]->dtype == RM_F32)
      rc = g.hd <= 64 ? att_fwd_launch<float, 64>(ctx, g, ci, (float *)cu_ptr(out[0]), lse)
                      : att_fwd_launch<float, 128>(ctx, g, ci, (float *)cu_ptr(out[0]), lse);
    else
      rc = g.hd <= 64 ? att_fwd_launch<__nv_bfloat16, 64>(ctx, g, ci, (__nv_bfloat16 *)cu_ptr(out[0]), lse)
                      : att_fwd_launch<__nv_bfloat16, 128>(ctx, g, ci, (__nv_bfloat16 *)cu_ptr(out[0]), lse);
  }
  cu_inputs_free(ctx, &ci);
  return rc;
}

/* Inputs q, k, v, y, lse, gy; outputs gq, gk, gv. */
template <class T, int HD>
static int att_bwd_launch(rm_ctx *ctx, const att_geo &g, const cu_inputs &ci, rm_tensor *const *out) {
  cudaStream_t st = cu_st(ctx)->stream;
  size_t dbytes = (size_t)g.bh * g.Tq * sizeof(float);
  float *D = dbytes ? (float *)cu_scratch(ctx, dbytes) : NULL;
  if (dbytes && !D) return ctx->err_code;
  const T *q = (const T *)ci.p[0], *k = (const T *)ci.p[1], *v = (const T *)ci.p[2];
  const T *y = (const T *)ci.p[3], *gy = (const T *)ci.p[5];
  const float *lse = (const float *)ci.p[4];
  int rc = RM_OK;
  if (dbytes) {
    att_rowdot_kernel<T><<<cu_blocks(g.bh * g.Tq), CU_THREADS, 0, st>>>(y, gy, D, g.bh * g.Tq, g.hd);
    rc = CU_LAUNCHED(ctx, "attention backward (row dots)");
  }
  size_t smem_q = (size_t)(2 * ATT_ROWS * HD + 2 * ATT_ROWS * (HD + 1)) * sizeof(float);
  size_t smem_k = (size_t)(2 * ATT_ROWS * HD + 2 * ATT_ROWS + 2 * ATT_ROWS * (HD + 1)) * sizeof(float);
  if (!rc) rc = att_smem(ctx, att_dq_kernel<T, HD>, smem_q);
  if (!rc) rc = att_smem(ctx, att_dkv_kernel<T, HD>, smem_k);
  if (!rc && g.Tq) {
    dim3 grid((unsigned)((g.Tq + ATT_ROWS - 1) / ATT_ROWS), (unsigned)g.bh);
    att_dq_kernel<T, HD><<<grid, ATT_ROWS, smem_q, st>>>(q, k, v, lse, D, gy, (T *)cu_ptr(out[0]), g.Tq, g.Tk,
                                                         g.hd, g.scale, g.causal);
    rc = CU_LAUNCHED(ctx, "attention backward (dq)");
  }
  if (!rc && g.Tk) {
    dim3 grid((unsigned)((g.Tk + ATT_ROWS - 1) / ATT_ROWS), (unsigned)g.bh);
    att_dkv_kernel<T, HD><<<grid, ATT_ROWS, smem_k, st>>>(q, k, v, lse, D, gy, (T *)cu_ptr(out[1]),
                                                          (T *)cu_ptr(out[2]), g.Tq, g.Tk, g.hd, g.scale,
                                                          g.causal);
    rc = CU_LAUNCHED(ctx, "attention backward (dk, dv)");
  }
  if (D) cu_scratch_free(ctx, D, dbytes);
  return rc;
}

RM_CUDA_KERNEL(attention_backward) {
  (void)nout;
  att_geo g;
  if (att_geometry(ctx, "attention_backward", in, a, &g)) return ctx->err_code;
  if (nin != 6) return cu_fail(ctx, RM_ERR_ARG, "attention_backward: takes q, k, v, y, lse, gy");
  if (g.bh == 0) return RM_OK;
  cu_inputs ci;
  int rc = cu_inputs_get(ctx, nin, in, &ci);
  if (!rc) {
    if (in[0]->dtype == RM_F32)
      rc = g.hd <= 64 ? att_bwd_launch<float, 64>(ctx, g, ci, out) : att_bwd_launch<float, 128>(ctx, g, ci, out);
    else
      rc = g.hd <= 64 ? att_bwd_launch<__nv_bfloat16, 64>(ctx, g, ci, out)
                      : att_bwd_launch<__nv_bfloat16, 128>(ctx, g, ci, out);
  }
  cu_inputs_free(ctx, &ci);
  return rc;
}
