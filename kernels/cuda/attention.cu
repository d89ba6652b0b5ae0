/* Scaled-dot-product attention for the ops attention and attention_backward
 * (core/op_attention.c has the definitions, kernels/cpu/attention.c the CPU twins);
 * backend.cu picks these up by name (cuk_attention, ...).
 *
 * Semantics:
 *   attention(q, k, v) -> y, lse          (nout 2, nvis 1: lse is kept for backward)
 *     q (..., Tq, hd), k and v (..., Tk, hd), same leading dims, any strides (the op is
 *     RM_OPF_STRIDED: q, k, v are usually (B, H, T, D) views of a linear layer's
 *     (B, T, 3, H, D) output and are read in place, never copied);
 *     i[0] = 1: causal, aligned at the bottom right: query i sees keys
 *     j <= i + (Tk - Tq) (the op requires Tq <= Tk); f[0] = scale (0: 1/sqrt(hd)).
 *     y = softmax(scale q k^T [+ mask]) v, contiguous, shape and dtype of q (0 when
 *     Tk = 0); lse (..., Tq): the log-sum-exp of each score row, float32 (float64 for
 *     float64 inputs).
 *   attention_backward(q, k, v, y, lse, gy) -> gq, gk, gv   (same attrs)
 *   attention(qkv) -> y, lse and attention_qkv_backward(qkv, y, lse, gy) -> dqkv: the
 *     packed form (heads = H): qkv (..., T, 3 H D), y (..., T, H D), lse (..., H, T).
 *     The kernels below run on (..., H, T, D) views (core/attention_views.h): q, k, v
 *     read inside qkv (rows 3 H D apart), y written as the output projection reads it,
 *     gq, gk, gv written into the three parts of one dqkv (each element once; when row
 *     blocks accumulate, the whole dqkv is cleared first). This saves, per layer of
 *     GPT-2 small (B 8, T 1024, C 768, bf16: a (B, T, C) tensor is 12.6 MB): y's
 *     transpose copy (2 x 12.6 MB moved), and in backward three zero-filled (B, T, 3C)
 *     select gradients and two (B, T, 3C) adds (3 x 37.7 + 2 x 113 MB, ~340 MB moved,
 *     ~0.1 ms at ~3.5 TB/s): about 0.11 ms per layer, ~1.3 ms per step (estimates from
 *     bytes, not measured).
 * float32, float64 and bfloat16; any head dim.
 *
 * Design: tensor-core GEMMs (cuBLAS strided-batched; bf16 in, float32 accumulate) with
 * a fused softmax between them, over blocks of heads (and of query rows for very long
 * sequences) so that the score blocks fit a fixed workspace (ATT_WORKSPACE):
 *   forward   S = scale Q K^T (float32) -> P = softmax(S) (bf16), lse -> Y = P V
 *   backward  S = scale Q K^T -> P = exp(S - lse) -> dV = P^T dY, dP = dY V^T
 *             -> dS = P (dP - D), D = rowsum(dY Y) -> dQ = scale dS K, dK = scale dS^T Q
 * Every score block is recomputed in backward from q, k and lse, as in the fused CPU
 * kernel; nothing T x T outlives a call. Leading dims whose strides chain (for every
 * operand) are merged, the last one is the GEMM batch, the others loop on the host
 * (for (B, H, T, D) views of a (B, T, 3, H, D) tensor: B host steps of H heads); the
 * grids have at most 2^31 - 1 blocks in x and 1 in y, so B H is not limited by
 * gridDim.y (the old kernels' 65535). cuBLAS is deterministic for a given problem, and
 * the softmax kernels reduce in a fixed tree, so results are reproducible.
 * With a single row block (every sequence up to ~5k tokens at 12 heads), gk and gv are
 * written once; longer ones accumulate the row blocks into gk and gv (beta = 1), in
 * the output dtype.
 *
 * Cost: the causal mask is applied in the softmax, so the GEMMs compute the full
 * T x T blocks (2x the FLOPs of the causal triangle), and the scores make a round trip
 * through memory (a flash-attention kernel keeps them on chip). Estimate (from FLOPs
 * and bytes, not measured) at GPT-2 small (B = 8, H = 12, T = 1024, hd = 64, bf16) on an
 * H100/H200, per layer: forward GEMMs 2 x 2 x 96 x 1024^2 x 64 = 26 GFLOP (~0.05 ms at
 * ~500 TFLOP/s) and ~1.2 GB of score traffic (S written and read in float32, P written
 * and read in bf16: ~0.35 ms at ~3.5 TB/s); backward 5 GEMMs (~0.13 ms) and ~2.8 GB
 * (~0.8 ms). About 1.3 ms per layer, ~16 ms per step for 12 layers: still the largest
 * item of the step, against 30-60 ms for the old CUDA-core kernels (fp32 FMA, a thread
 * per row, 255 registers with spills), and ~2-3 ms for a flash-attention kernel, which
 * is the next step (cuDNN 9's fused attention is installed beside the toolkit). */
#include <limits.h>

#include "cuda_common.cuh"
#include "../../core/attention_views.h"

#define ATT_WORKSPACE ((size_t)256 << 20) /* bytes for the score blocks of one step */

/* One (..., T, hd) operand: data, row stride, strides of the leading dims (elements).
 * Columns are contiguous (a copy is made when they are not). */
typedef struct att_mat {
  char *p;
  int64_t ld;
  int64_t lst[RM_MAX_DIM];
  void *scratch;   /* contiguous copy, if one was made */
  size_t bytes;
} att_mat;

typedef struct att_geo {
  int nl;                        /* leading dims after merging */
  int64_t lshape[RM_MAX_DIM];
  int64_t Tq, Tk, hd, off;       /* off = Tk - Tq: causal query i sees keys j <= i + off */
  double scale;
  bool causal;
  rm_dtype dt;
} att_geo;

/* m's geometry (no data): t's strides when its rows can be read in place, else those
 * of the contiguous copy att_mat_of makes, whose bytes it returns (0: no copy). */
static size_t att_mat_geo(const rm_tensor *t, att_mat *m) {
  memset(m, 0, sizeof *m);
  int n = t->ndim;
  int64_t rows = t->shape[n - 2], cols = t->shape[n - 1];
  bool ok = (cols <= 1 || t->stride[n - 1] == 1) && (rows <= 1 || t->stride[n - 2] >= cols);
  int64_t st[RM_MAX_DIM] = { 0 };
  if (ok) {
    for (int d = 0; d < n; d++) st[d] = t->stride[d];
  } else {
    int64_t s = 1;
    for (int d = n - 1; d >= 0; d--) st[d] = s, s *= t->shape[d];
  }
  m->ld = rows <= 1 ? (cols > 1 ? cols : 1) : st[n - 2];
  if (m->ld < 1) m->ld = 1;
  for (int d = 0; d < n - 2; d++) m->lst[d] = st[d];
  return ok ? 0 : (size_t)cu_numel(t) * cu_dsize(t->dtype);
}

static int att_mat_of(rm_ctx *ctx, const rm_tensor *t, att_mat *m) {
  size_t copy = att_mat_geo(t, m);
  if (!copy) {
    m->p = (char *)cu_ptr(t);
    return RM_OK;
  }
  const void *p = cu_contig_data(ctx, t, &m->scratch);
  if (!p) return ctx->err_code;
  m->p = (char *)p;
  m->bytes = copy;
  return RM_OK;
}

static void att_mat_free(rm_ctx *ctx, att_mat *m) {
  if (m->scratch) cu_scratch_free(ctx, m->scratch, m->bytes);
  m->scratch = NULL;
}

/* Leading dims of q's shape, merged where every operand's strides chain; size-1 dims
 * dropped. */
static void att_collapse(att_geo *g, const rm_tensor *q, att_mat *const *mats, int nm) {
  int n = q->ndim - 2;
  g->nl = 0;
  for (int d = 0; d < n; d++) {
    if (q->shape[d] == 1) continue;
    int k = g->nl;
    bool merge = k > 0;
    for (int i = 0; merge && i < nm; i++) merge = mats[i]->lst[k - 1] == mats[i]->lst[d] * q->shape[d];
    if (merge) {
      g->lshape[k - 1] *= q->shape[d];
      for (int i = 0; i < nm; i++) mats[i]->lst[k - 1] = mats[i]->lst[d];
    } else {
      g->lshape[k] = q->shape[d];
      for (int i = 0; i < nm; i++) mats[i]->lst[k] = mats[i]->lst[d];
      g->nl++;
    }
  }
  if (g->nl == 0) { /* one matrix: a batch of 1 */
    g->nl = 1;
    g->lshape[0] = 1;
    for (int i = 0; i < nm; i++) mats[i]->lst[0] = 0;
  }
}

static int att_geometry(rm_ctx *ctx, const char *op, const rm_tensor *const *in, const rm_attrs *a, att_geo *g) {
  const rm_tensor *q = in[0], *k = in[1];
  if (q->ndim < 2 || k->ndim != q->ndim)
    return cu_fail(ctx, RM_ERR_SHAPE, "%s: q, k, v must be (..., T, head_dim) with the same rank", op);
  g->hd = q->shape[q->ndim - 1];
  g->Tq = q->shape[q->ndim - 2];
  g->Tk = k->shape[k->ndim - 2];
  g->off = g->Tk - g->Tq;
  g->causal = a->attention.causal;
  g->scale = a->attention.scale != 0 ? a->attention.scale : 1.0 / sqrt((double)(g->hd ? g->hd : 1));
  g->dt = q->dtype;
  if (g->dt != RM_F32 && g->dt != RM_BF16 && g->dt != RM_F64) return cu_bad_dtype(ctx, op, g->dt);
  if (g->Tq >= INT_MAX || g->Tk >= INT_MAX || g->hd >= INT_MAX)
    return cu_fail(ctx, RM_ERR_SHAPE, "%s: dimensions beyond cuBLAS's int range", op);
  return RM_OK;
}

/* ---- GEMMs: row-major C_i = alpha op(A_i) op(B_i) + beta C_i (see matmul.cu) ---- */

typedef struct att_types {
  cudaDataType_t io, acc; /* operand type (the tensors) and score type */
  cublasComputeType_t ct;
  size_t es, as;          /* their sizes */
} att_types;

static att_types att_types_of(rm_dtype dt) {
  att_types t;
  if (dt == RM_F64) { t.io = t.acc = CUDA_R_64F; t.ct = CUBLAS_COMPUTE_64F; t.es = t.as = 8; }
  else if (dt == RM_BF16) { t.io = CUDA_R_16BF; t.acc = CUDA_R_32F; t.ct = CUBLAS_COMPUTE_32F; t.es = 2; t.as = 4; }
  else { t.io = t.acc = CUDA_R_32F; t.ct = CUBLAS_COMPUTE_32F; t.es = t.as = 4; }
  return t;
}

static int att_gemm(rm_ctx *ctx, const att_types &ty, cudaDataType_t at, cudaDataType_t bt, cudaDataType_t ctp,
                    bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A, int64_t lda,
                    int64_t sA, const void *B, int64_t ldb, int64_t sB, double beta, void *C, int64_t ldc,
                    int64_t sC, int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return RM_OK;
  float af = (float)alpha, bf = (float)beta;
  const void *pa = &af, *pb = &bf;
  if (ty.ct == CUBLAS_COMPUTE_64F) pa = &alpha, pb = &beta;
  if (lda >= INT_MAX || ldb >= INT_MAX || ldc >= INT_MAX)
    return cu_fail(ctx, RM_ERR_SHAPE, "attention: a row stride beyond cuBLAS's int range");
  return CUBLAS_CHECK(ctx, cublasGemmStridedBatchedEx(
      cu_st(ctx)->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M, (int)K, pa,
      B, bt, (int)ldb, (long long)sB, A, at, (int)lda, (long long)sA, pb, C, ctp, (int)ldc, (long long)sC,
      (int)batch, ty.ct, CUBLAS_GEMM_DEFAULT));
}

/* ---- softmax kernels: one block per score row ---- */

__device__ __forceinline__ float att_exp(float x) { return expf(x); }
__device__ __forceinline__ double att_exp(double x) { return exp(x); }
__device__ __forceinline__ float att_log(float x) { return logf(x); }
__device__ __forceinline__ double att_log(double x) { return log(x); }

/* Keys row i (of the block, query r0 + i) sees among the kn computed: [0, lim). */
__device__ __forceinline__ int64_t att_lim(int64_t r, int64_t off, int64_t kn, bool causal) {
  if (!causal) return kn;
  int64_t l = r + off + 1;
  return l < kn ? l : kn;
}

/* Forward: S (rows of kn, type A) -> P = softmax (type T, may alias S), lse. Row rr of
 * the block is head rr / rows, local row rr % rows; lse of (head h, local row i) at
 * lse[h * lse_h + i]. */
template <class T, class A>
__global__ void att_softmax_fwd(const A *S, T *P, A *lse, int64_t lse_h, int64_t nrows, int64_t rows, int64_t kn,
                                int64_t r0, int64_t off, bool causal) {
  __shared__ A sh[32];
  for (int64_t rr = blockIdx.x; rr < nrows; rr += gridDim.x) {
    int64_t h = rr / rows, i = rr % rows;
    int64_t lim = att_lim(r0 + i, off, kn, causal);
    const A *s = S + rr * kn;
    A m = -INFINITY;
    for (int64_t j = threadIdx.x; j < lim; j += blockDim.x) m = s[j] > m ? s[j] : m;
    m = cu_block_max(m, sh);
    A sum = 0;
    for (int64_t j = threadIdx.x; j < lim; j += blockDim.x) sum += att_exp(s[j] - m);
    sum = cu_block_sum(sum, sh);
    A l = m + att_log(sum);
    T *p = P + rr * kn;
    for (int64_t j = threadIdx.x; j < kn; j += blockDim.x) cu_sv(p + j, j < lim ? att_exp(s[j] - l) : (A)0);
    if (threadIdx.x == 0) lse[h * lse_h + i] = l;
    __syncthreads(); /* sh is reused by the next row */
  }
}

/* Backward: P = exp(S - lse) (masked: 0), type T (may alias S). */
template <class T, class A>
__global__ void att_probs_bwd(const A *S, T *P, const A *lse, int64_t lse_h, int64_t nrows, int64_t rows,
                              int64_t kn, int64_t r0, int64_t off, bool causal) {
  for (int64_t rr = blockIdx.x; rr < nrows; rr += gridDim.x) {
    int64_t h = rr / rows, i = rr % rows;
    int64_t lim = att_lim(r0 + i, off, kn, causal);
    A l = lse[h * lse_h + i];
    const A *s = S + rr * kn;
    T *p = P + rr * kn;
    for (int64_t j = threadIdx.x; j < kn; j += blockDim.x) cu_sv(p + j, j < lim ? att_exp(s[j] - l) : (A)0);
  }
}

/* Backward: dS = P (dP - D) in place of P (P of type T, dP of type A). */
template <class T, class A>
__global__ void att_dscores_bwd(T *P, const A *dP, const A *D, int64_t nrows, int64_t kn) {
  for (int64_t rr = blockIdx.x; rr < nrows; rr += gridDim.x) {
    A d = D[rr];
    T *p = P + rr * kn;
    const A *dp = dP + rr * kn;
    for (int64_t j = threadIdx.x; j < kn; j += blockDim.x) cu_sv(p + j, (A)cu_ld(p + j) * (dp[j] - d));
  }
}

/* D[h * rows + i] = sum_d gy[h, i, d] y[h, i, d] (the softmax-backward row term). */
template <class T, class A>
__global__ void att_rowdot(const T *y, int64_t ys, int64_t ldy, const T *gy, int64_t gs, int64_t ldg, int64_t nrows,
                           int64_t rows, int64_t hd, A *D) {
  __shared__ A sh[32];
  for (int64_t rr = blockIdx.x; rr < nrows; rr += gridDim.x) {
    int64_t h = rr / rows, i = rr % rows;
    const T *yr = y + h * ys + i * ldy, *gr = gy + h * gs + i * ldg;
    A s = 0;
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) s += (A)cu_ld(yr + d) * (A)cu_ld(gr + d);
    s = cu_block_sum(s, sh);
    if (threadIdx.x == 0) D[rr] = s;
    __syncthreads();
  }
}

template <class A>
__global__ void att_fill(A *p, int64_t n, A v) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = v;
}

static unsigned att_grid(int64_t rows) { return (unsigned)(rows < (1 << 20) ? (rows > 0 ? rows : 1) : (1 << 20)); }

/* ---- blocking ---- */

/* Heads per block (nb) and query rows per block (rows) so that the score buffers fit
 * ATT_WORKSPACE: bytes_per_score per (head, row, key). */
static void att_blocks(const att_geo &g, size_t bytes_per_score, int64_t *nb, int64_t *rows) {
  int64_t Lh = g.lshape[g.nl - 1];
  double per_head = (double)g.Tq * (double)g.Tk * (double)bytes_per_score;
  if (per_head <= (double)ATT_WORKSPACE) {
    int64_t h = per_head > 0 ? (int64_t)((double)ATT_WORKSPACE / per_head) : Lh;
    if (h > Lh) h = Lh;
    if (h > 65535) h = 65535;
    *nb = h < 1 ? 1 : h;
    *rows = g.Tq;
  } else {
    *nb = 1;
    int64_t r = (int64_t)((double)ATT_WORKSPACE / ((double)g.Tk * (double)bytes_per_score));
    *rows = r < 1 ? 1 : r;
  }
}

/* Element offset of outer index o (all merged leading dims but the last) in m. */
static int64_t att_outer_off(const att_geo &g, const att_mat &m, int64_t o) {
  int64_t off = 0;
  for (int d = g.nl - 2; d >= 0; d--) {
    off += (o % g.lshape[d]) * m.lst[d];
    o /= g.lshape[d];
  }
  return off;
}

static int64_t att_outer_count(const att_geo &g) {
  int64_t n = 1;
  for (int d = 0; d < g.nl - 1; d++) n *= g.lshape[d];
  return n;
}

/* ---- workspace, for dry runs (rm_backend.workspace) ----
 * What att_fwd / att_bwd borrow at their peak: the copies of operands that cannot be
 * read in place (and lse's), then the score blocks sized by att_blocks. The outputs
 * are contiguous (the packed form's, views of contiguous tensors), so their geometry is
 * made up from the inputs' shapes. */

/* A contiguous tensor of shape (lead..., rows, cols), lead and dtype from t. */
static void att_fake(const rm_tensor *t, int n, int64_t rows, int64_t cols, rm_tensor *f) {
  memset(f, 0, sizeof *f);
  f->dtype = t->dtype;
  f->device = t->device;
  f->ndim = n;
  for (int d = 0; d < n - 2; d++) f->shape[d] = t->shape[d];
  f->shape[n - 2] = rows;
  f->shape[n - 1] = cols;
  int64_t st = 1;
  for (int d = n - 1; d >= 0; d--) f->stride[d] = st, st *= f->shape[d];
}

/* ops[0..nops-1]: the operands read (copied when not readable), outs: the outputs'
 * geometry; fwd: att_fwd's buffers, else att_bwd's. */
static size_t att_workspace(rm_ctx *ctx, const rm_tensor *const *ops, int nops, const rm_tensor *const *outs,
                            int nouts, const rm_attrs *a, bool fwd) {
  const rm_tensor *q = ops[0], *k = ops[1];
  rm_dtype dt = q->dtype;
  if (q->ndim < 2 || k->ndim != q->ndim || (dt != RM_F32 && dt != RM_BF16 && dt != RM_F64) ||
      q->shape[q->ndim - 2] >= INT_MAX || k->shape[k->ndim - 2] >= INT_MAX || q->shape[q->ndim - 1] >= INT_MAX)
    return 0; /* the kernel refuses these (att_geometry) */
  att_geo g;
  if (att_geometry(ctx, "attention", ops, a, &g)) return 0;
  int64_t nrows = 1;
  for (int d = 0; d < ops[0]->ndim - 1; d++) nrows *= ops[0]->shape[d];
  if (nrows == 0 || g.Tk == 0) return 0;
  att_mat m[9];
  att_mat *ms[9];
  size_t bytes = 0;
  for (int i = 0; i < nops; i++) bytes += att_mat_geo(ops[i], &m[i]), ms[i] = &m[i];
  for (int j = 0; j < nouts; j++) att_mat_geo(outs[j], &m[nops + j]), ms[nops + j] = &m[nops + j];
  att_collapse(&g, ops[0], ms, nops + nouts);
  att_types ty = att_types_of(g.dt);
  bool alias = ty.es == ty.as;
  int64_t nb, rows;
  att_blocks(g, (fwd ? 1 : 2) * ty.as + (alias ? 0 : ty.es), &nb, &rows);
  size_t sbytes = (size_t)nb * rows * g.Tk * ty.as, pbytes = alias ? 0 : (size_t)nb * rows * g.Tk * ty.es;
  if (fwd) return bytes + (sbytes ? sbytes : 1) + (alias ? 0 : (pbytes ? pbytes : 1));
  size_t dbytes = (size_t)nb * rows * ty.as;
  return bytes + 2 * (sbytes ? sbytes : 1) + (dbytes ? dbytes : 1) + (alias ? 0 : (pbytes ? pbytes : 1));
}

size_t cu_attention_workspace(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a) {
  int64_t H = a->attention.heads;
  rm_tensor v[8], f[2];
  if (op == RM_OP_ATTENTION && nin == 3) { /* y: q's shape */
    const rm_tensor *ops[3] = { in[0], in[1], in[2] }, *outs[1] = { &f[0] };
    att_fake(in[0], in[0]->ndim, in[0]->shape[in[0]->ndim - 2], in[0]->shape[in[0]->ndim - 1], &f[0]);
    return att_workspace(ctx, ops, 3, outs, 1, a, true);
  }
  if (op == RM_OP_ATTENTION_BACKWARD && nin == 6) { /* the lse copy is not counted: lse is contiguous */
    const rm_tensor *ops[6] = { in[0], in[1], in[2], in[3], in[4], in[5] };
    const rm_tensor *outs[3] = { in[0], in[1], in[2] };
    rm_tensor c[3];
    for (int j = 0; j < 3; j++) {
      int n = in[j]->ndim;
      att_fake(in[j], n, in[j]->shape[n - 2], in[j]->shape[n - 1], &c[j]);
      outs[j] = &c[j];
    }
    const rm_tensor *rd[5] = { ops[0], ops[1], ops[2], ops[3], ops[5] };
    return att_workspace(ctx, rd, 5, outs, 3, a, false);
  }
  if ((op == RM_OP_ATTENTION && nin == 1) || (op == RM_OP_ATTENTION_QKV_BACKWARD && nin == 4)) {
    const rm_tensor *qkv = in[0];
    int n = qkv->ndim;
    int64_t T = qkv->shape[n - 2], W = qkv->shape[n - 1];
    if (H < 1) return 0;
    att_fake(qkv, n, T, W / 3, &f[0]); /* y */
    att_fake(qkv, n, T, W, &f[1]);     /* dqkv */
    for (int i = 0; i < 3; i++) rm_attention_part(qkv, H, i, 3, &v[i]);
    if (op == RM_OP_ATTENTION) {
      rm_attention_part(&f[0], H, 0, 1, &v[3]);
      const rm_tensor *ops[3] = { &v[0], &v[1], &v[2] }, *outs[1] = { &v[3] };
      return att_workspace(ctx, ops, 3, outs, 1, a, true);
    }
    rm_attention_part(in[1], H, 0, 1, &v[3]);
    rm_attention_part(in[3], H, 0, 1, &v[4]);
    for (int i = 0; i < 3; i++) rm_attention_part(&f[1], H, i, 3, &v[5 + i]);
    const rm_tensor *ops[5] = { &v[0], &v[1], &v[2], &v[3], &v[4] }, *outs[3] = { &v[5], &v[6], &v[7] };
    return att_workspace(ctx, ops, 5, outs, 3, a, false);
  }
  return 0;
}

/* ---- forward ---- */

template <class T, class A>
static int att_fwd(rm_ctx *ctx, const att_geo &g, att_mat *q, att_mat *k, att_mat *v, att_mat *y, A *lse) {
  att_types ty = att_types_of(g.dt);
  cudaStream_t st = cu_st(ctx)->stream;
  bool alias = sizeof(T) == sizeof(A); /* P written over S */
  int64_t nb, rows;
  att_blocks(g, ty.as + (alias ? 0 : ty.es), &nb, &rows);
  int64_t Lh = g.lshape[g.nl - 1], outer = att_outer_count(g), lh = Lh * g.Tq; /* lse per outer index */
  size_t sbytes = (size_t)nb * rows * g.Tk * ty.as, pbytes = alias ? 0 : (size_t)nb * rows * g.Tk * ty.es;
  A *S = (A *)cu_scratch(ctx, sbytes ? sbytes : 1);
  if (!S) return ctx->err_code;
  T *P = alias ? (T *)S : (T *)cu_scratch(ctx, pbytes ? pbytes : 1);
  int rc = P ? RM_OK : ctx->err_code;
  int threads = cu_row_threads(g.Tk, 256);
  size_t es = ty.es;
  for (int64_t o = 0; o < outer && !rc; o++) {
    int64_t oq = att_outer_off(g, *q, o), ok = att_outer_off(g, *k, o), ov = att_outer_off(g, *v, o);
    int64_t oy = att_outer_off(g, *y, o);
    int64_t hq = q->lst[g.nl - 1], hk = k->lst[g.nl - 1], hv = v->lst[g.nl - 1], hy = y->lst[g.nl - 1];
    for (int64_t h0 = 0; h0 < Lh && !rc; h0 += nb) {
      int64_t n = Lh - h0 < nb ? Lh - h0 : nb;
      for (int64_t r0 = 0; r0 < g.Tq && !rc; r0 += rows) {
        int64_t nr = g.Tq - r0 < rows ? g.Tq - r0 : rows;
        int64_t kn = g.causal ? (r0 + nr + g.off < g.Tk ? r0 + nr + g.off : g.Tk) : g.Tk;
        const char *pq = q->p + (size_t)(oq + h0 * hq + r0 * q->ld) * es;
        const char *pk = k->p + (size_t)(ok + h0 * hk) * es, *pv = v->p + (size_t)(ov + h0 * hv) * es;
        char *py = y->p + (size_t)(oy + h0 * hy + r0 * y->ld) * es;
        if (g.hd == 0) /* every score is 0 */
          rc = CU_CHECK(ctx, cudaMemsetAsync(S, 0, (size_t)n * nr * kn * ty.as, st));
        else
          rc = att_gemm(ctx, ty, ty.io, ty.io, ty.acc, false, true, nr, kn, g.hd, g.scale, pq, q->ld, hq, pk, k->ld,
                        hk, 0.0, S, kn, nr * kn, n);
        if (rc) break;
        att_softmax_fwd<T, A><<<att_grid(n * nr), threads, 0, st>>>(S, P, lse + o * lh + h0 * g.Tq + r0, g.Tq,
                                                                     n * nr, nr, kn, r0, g.off, g.causal);
        if ((rc = CU_LAUNCHED(ctx, "attention softmax kernel"))) break;
        rc = att_gemm(ctx, ty, ty.io, ty.io, ty.io, false, false, nr, g.hd, kn, 1.0, P, kn, nr * kn, pv, v->ld, hv,
                      0.0, py, y->ld, hy, n);
      }
    }
  }
  if (P && !alias) cu_scratch_free(ctx, P, pbytes ? pbytes : 1);
  cu_scratch_free(ctx, S, sbytes ? sbytes : 1);
  return rc;
}

/* in: q, k, v; y (rows may be apart: the packed form) and lse written. */
static int att_forward(rm_ctx *ctx, const rm_tensor *const *in, const rm_tensor *yt, rm_tensor *lset,
                       const rm_attrs *a) {
  att_geo g;
  if (att_geometry(ctx, "attention", in, a, &g)) return ctx->err_code;
  int64_t nlse = cu_numel(lset);
  if (nlse == 0) return RM_OK; /* no query rows */
  cudaStream_t st = cu_st(ctx)->stream;
  if (g.Tk == 0) { /* no keys (only the three-input form: y is contiguous): y = 0, lse = -inf */
    int rc = cu_fill(ctx, cu_ptr(yt), yt->dtype, cu_numel(yt), 0.0);
    if (rc) return rc;
    if (g.dt == RM_F64)
      att_fill<double><<<cu_blocks(nlse), CU_THREADS, 0, st>>>((double *)cu_ptr(lset), nlse, -INFINITY);
    else
      att_fill<float><<<cu_blocks(nlse), CU_THREADS, 0, st>>>((float *)cu_ptr(lset), nlse, -INFINITY);
    return CU_LAUNCHED(ctx, "attention fill kernel");
  }
  att_mat q, k, v, y;
  int rc = att_mat_of(ctx, in[0], &q);
  memset(&k, 0, sizeof k), memset(&v, 0, sizeof v), memset(&y, 0, sizeof y);
  if (!rc) rc = att_mat_of(ctx, in[1], &k);
  if (!rc) rc = att_mat_of(ctx, in[2], &v);
  if (!rc) rc = att_mat_of(ctx, yt, &y); /* an output: always row-readable, never copied */
  if (!rc) {
    att_mat *ms[4] = { &q, &k, &v, &y };
    att_collapse(&g, in[0], ms, 4);
    switch (g.dt) {
    case RM_F32: rc = att_fwd<float, float>(ctx, g, &q, &k, &v, &y, (float *)cu_ptr(lset)); break;
    case RM_F64: rc = att_fwd<double, double>(ctx, g, &q, &k, &v, &y, (double *)cu_ptr(lset)); break;
    default: rc = att_fwd<__nv_bfloat16, float>(ctx, g, &q, &k, &v, &y, (float *)cu_ptr(lset)); break;
    }
  }
  att_mat_free(ctx, &q);
  att_mat_free(ctx, &k);
  att_mat_free(ctx, &v);
  return rc;
}

RM_CUDA_KERNEL(attention) {
  if (nin == 3) return att_forward(ctx, (const rm_tensor *const *)in, out[0], out[1], a);
  if (nin != 1) return cu_fail(ctx, RM_ERR_ARG, "attention: takes q, k, v or one packed qkv");
  /* packed: the three parts of qkv and y as (..., H, T, D) views */
  rm_tensor v[4];
  for (int i = 0; i < 3; i++) rm_attention_part(in[0], a->attention.heads, i, 3, &v[i]);
  rm_attention_part(out[0], a->attention.heads, 0, 1, &v[3]);
  const rm_tensor *qkv[3] = { &v[0], &v[1], &v[2] };
  return att_forward(ctx, qkv, &v[3], out[1], a);
}

/* ---- backward ---- */

/* m[0..5] = q, k, v, y, gy, (lse unused here), m[6..8] = gq, gk, gv. When row blocks
 * accumulate into gk and gv, zero (zero_bytes) is cleared first: gk and gv's storage, or
 * the whole dqkv of the packed form (gq's rows are then written over). */
template <class T, class A>
static int att_bwd(rm_ctx *ctx, const att_geo &g, att_mat *const *m, const A *lse, char *zero, size_t zero_bytes) {
  att_types ty = att_types_of(g.dt);
  cudaStream_t st = cu_st(ctx)->stream;
  att_mat *q = m[0], *k = m[1], *v = m[2], *y = m[3], *gy = m[4], *gq = m[6], *gk = m[7], *gv = m[8];
  bool alias = sizeof(T) == sizeof(A);
  int64_t nb, rows;
  att_blocks(g, 2 * ty.as + (alias ? 0 : ty.es), &nb, &rows);
  int64_t Lh = g.lshape[g.nl - 1], outer = att_outer_count(g), lh = Lh * g.Tq;
  bool accumulate = rows < g.Tq; /* several row blocks add into gk, gv */
  size_t sbytes = (size_t)nb * rows * g.Tk * ty.as, pbytes = alias ? 0 : (size_t)nb * rows * g.Tk * ty.es;
  size_t dbytes = (size_t)nb * rows * ty.as;
  A *S = (A *)cu_scratch(ctx, sbytes ? sbytes : 1);
  A *dP = S ? (A *)cu_scratch(ctx, sbytes ? sbytes : 1) : NULL;
  A *D = dP ? (A *)cu_scratch(ctx, dbytes ? dbytes : 1) : NULL;
  T *P = !D ? NULL : alias ? (T *)S : (T *)cu_scratch(ctx, pbytes ? pbytes : 1);
  int rc = P ? RM_OK : ctx->err_code;
  size_t es = ty.es;
  int threads = cu_row_threads(g.Tk, 256);
  if (!rc && accumulate) {
    if (zero) rc = CU_CHECK(ctx, cudaMemsetAsync(zero, 0, zero_bytes, st));
    else { /* the three-input form: gk, gv are contiguous outputs */
      rc = CU_CHECK(ctx, cudaMemsetAsync(gk->p, 0, (size_t)outer * Lh * g.Tk * g.hd * es, st));
      if (!rc) rc = CU_CHECK(ctx, cudaMemsetAsync(gv->p, 0, (size_t)outer * Lh * g.Tk * g.hd * es, st));
    }
  }
  for (int64_t o = 0; o < outer && !rc; o++) {
    int64_t oq = att_outer_off(g, *q, o), ok = att_outer_off(g, *k, o), ov = att_outer_off(g, *v, o);
    int64_t oy = att_outer_off(g, *y, o), og = att_outer_off(g, *gy, o);
    int64_t ogq = att_outer_off(g, *gq, o), ogk = att_outer_off(g, *gk, o), ogv = att_outer_off(g, *gv, o);
    int L = g.nl - 1;
    int64_t hq = q->lst[L], hk = k->lst[L], hv = v->lst[L], hy = y->lst[L], hg = gy->lst[L];
    int64_t hgq = gq->lst[L], hgk = gk->lst[L], hgv = gv->lst[L];
    for (int64_t h0 = 0; h0 < Lh && !rc; h0 += nb) {
      int64_t n = Lh - h0 < nb ? Lh - h0 : nb;
      for (int64_t r0 = 0; r0 < g.Tq && !rc; r0 += rows) {
        int64_t nr = g.Tq - r0 < rows ? g.Tq - r0 : rows;
        int64_t kn = g.causal ? (r0 + nr + g.off < g.Tk ? r0 + nr + g.off : g.Tk) : g.Tk;
        double beta = accumulate ? 1.0 : 0.0;
        const char *pq = q->p + (size_t)(oq + h0 * hq + r0 * q->ld) * es;
        const char *pk = k->p + (size_t)(ok + h0 * hk) * es, *pv = v->p + (size_t)(ov + h0 * hv) * es;
        const char *py = y->p + (size_t)(oy + h0 * hy + r0 * y->ld) * es;
        const char *pg = gy->p + (size_t)(og + h0 * hg + r0 * gy->ld) * es;
        char *pgq = gq->p + (size_t)(ogq + h0 * hgq + r0 * gq->ld) * es;
        char *pgk = gk->p + (size_t)(ogk + h0 * hgk) * es, *pgv = gv->p + (size_t)(ogv + h0 * hgv) * es;
        /* D = rowsum(gy y) */
        att_rowdot<T, A><<<att_grid(n * nr), 64, 0, st>>>((const T *)py, hy, y->ld, (const T *)pg, hg, gy->ld, n * nr,
                                                          nr, g.hd, D);
        if ((rc = CU_LAUNCHED(ctx, "attention backward row dots"))) break;
        /* S = scale q k^T, P = exp(S - lse) */
        if (g.hd == 0)
          rc = CU_CHECK(ctx, cudaMemsetAsync(S, 0, (size_t)n * nr * kn * ty.as, st));
        else
          rc = att_gemm(ctx, ty, ty.io, ty.io, ty.acc, false, true, nr, kn, g.hd, g.scale, pq, q->ld, hq, pk, k->ld,
                        hk, 0.0, S, kn, nr * kn, n);
        if (rc) break;
        att_probs_bwd<T, A><<<att_grid(n * nr), threads, 0, st>>>(S, P, lse + o * lh + h0 * g.Tq + r0, g.Tq, n * nr,
                                                                   nr, kn, r0, g.off, g.causal);
        if ((rc = CU_LAUNCHED(ctx, "attention backward probabilities"))) break;
        /* dV (+)= P^T gy */
        rc = att_gemm(ctx, ty, ty.io, ty.io, ty.io, true, false, kn, g.hd, nr, 1.0, P, kn, nr * kn, pg, gy->ld, hg,
                      beta, pgv, gv->ld, hgv, n);
        /* dP = gy v^T */
        if (!rc)
          rc = att_gemm(ctx, ty, ty.io, ty.io, ty.acc, false, true, nr, kn, g.hd, 1.0, pg, gy->ld, hg, pv, v->ld, hv,
                        0.0, dP, kn, nr * kn, n);
        if (!rc && g.hd == 0) rc = CU_CHECK(ctx, cudaMemsetAsync(dP, 0, (size_t)n * nr * kn * ty.as, st));
        if (rc) break;
        /* dS = P (dP - D), over P */
        att_dscores_bwd<T, A><<<att_grid(n * nr), threads, 0, st>>>(P, dP, D, n * nr, kn);
        if ((rc = CU_LAUNCHED(ctx, "attention backward score gradients"))) break;
        /* dQ = scale dS k;  dK (+)= scale dS^T q */
        rc = att_gemm(ctx, ty, ty.io, ty.io, ty.io, false, false, nr, g.hd, kn, g.scale, P, kn, nr * kn, pk, k->ld,
                      hk, 0.0, pgq, gq->ld, hgq, n);
        if (!rc)
          rc = att_gemm(ctx, ty, ty.io, ty.io, ty.io, true, false, kn, g.hd, nr, g.scale, P, kn, nr * kn, pq, q->ld,
                        hq, beta, pgk, gk->ld, hgk, n);
      }
    }
  }
  if (P && !alias) cu_scratch_free(ctx, P, pbytes ? pbytes : 1);
  if (D) cu_scratch_free(ctx, D, dbytes ? dbytes : 1);
  if (dP) cu_scratch_free(ctx, dP, sbytes ? sbytes : 1);
  if (S) cu_scratch_free(ctx, S, sbytes ? sbytes : 1);
  return rc;
}

/* in: q, k, v, y, lse, gy; g3: gq, gk, gv (rows may be apart: the packed form, whose
 * dqkv is zero, zero_bytes; NULL for the three-input form). */
static int att_backward(rm_ctx *ctx, const rm_tensor *const *in, const rm_tensor *const *g3, const rm_attrs *a,
                        char *zero, size_t zero_bytes) {
  att_geo g;
  if (att_geometry(ctx, "attention_backward", in, a, &g)) return ctx->err_code;
  int64_t nqrows = cu_numel(in[4]);
  if (nqrows == 0 || g.Tk == 0) { /* no query rows (gk = gv = 0) or no keys (gq = 0) */
    if (zero) return zero_bytes ? CU_CHECK(ctx, cudaMemsetAsync(zero, 0, zero_bytes, cu_st(ctx)->stream)) : RM_OK;
    int rc = RM_OK;
    for (int j = 0; j < 3 && !rc; j++)
      if (cu_numel(g3[j])) rc = cu_fill(ctx, cu_ptr(g3[j]), g3[j]->dtype, cu_numel(g3[j]), 0.0);
    return rc;
  }
  att_mat m[9];
  memset(m, 0, sizeof m);
  int rc = RM_OK;
  for (int i = 0; i < 6 && !rc; i++)
    if (i != 4) rc = att_mat_of(ctx, in[i], &m[i]);
  for (int j = 0; j < 3 && !rc; j++) rc = att_mat_of(ctx, g3[j], &m[6 + j]); /* outputs: never copied */
  if (!rc) {
    att_mat *ms[8] = { &m[0], &m[1], &m[2], &m[3], &m[5], &m[6], &m[7], &m[8] };
    att_collapse(&g, in[0], ms, 8);
    att_mat *mm[9] = { &m[0], &m[1], &m[2], &m[3], &m[5], NULL, &m[6], &m[7], &m[8] };
    const void *lse = cu_ptr(in[4]);
    void *lse_copy = NULL;
    if (!cu_contig(in[4]) && !(lse = cu_contig_data(ctx, in[4], &lse_copy))) rc = ctx->err_code;
    if (!rc) switch (g.dt) {
    case RM_F32: rc = att_bwd<float, float>(ctx, g, mm, (const float *)lse, zero, zero_bytes); break;
    case RM_F64: rc = att_bwd<double, double>(ctx, g, mm, (const double *)lse, zero, zero_bytes); break;
    default: rc = att_bwd<__nv_bfloat16, float>(ctx, g, mm, (const float *)lse, zero, zero_bytes); break;
    }
    if (lse_copy) cu_scratch_free(ctx, lse_copy, (size_t)nqrows * cu_dsize(in[4]->dtype));
  }
  for (int i = 0; i < 9; i++) att_mat_free(ctx, &m[i]);
  return rc;
}

/* Inputs q, k, v, y, lse, gy; outputs gq, gk, gv. */
RM_CUDA_KERNEL(attention_backward) {
  if (nin != 6) return cu_fail(ctx, RM_ERR_ARG, "attention_backward: takes q, k, v, y, lse, gy");
  return att_backward(ctx, (const rm_tensor *const *)in, (const rm_tensor *const *)out, a, NULL, 0);
}

/* Inputs qkv, y, lse, gy; output dqkv: gq, gk, gv written into its three parts. */
RM_CUDA_KERNEL(attention_qkv_backward) {
  if (nin != 4) return cu_fail(ctx, RM_ERR_ARG, "attention_qkv_backward: takes qkv, y, lse, gy");
  int64_t H = a->attention.heads;
  rm_tensor v[5], g[3];
  const rm_tensor *args[6];
  rm_attention_qkv_backward_args(in, H, v, args);
  for (int i = 0; i < 3; i++) rm_attention_part(out[0], H, i, 3, &g[i]);
  const rm_tensor *g3[3] = { &g[0], &g[1], &g[2] };
  return att_backward(ctx, args, g3, a, (char *)cu_ptr(out[0]), (size_t)cu_numel(out[0]) * cu_dsize(out[0]->dtype));
}
