/* CUDA kernels for matmul and linear through cuBLAS (cublasGemmStridedBatchedEx), with
 * the semantics of kernels/cpu/matmul.c: strided inputs, numpy's 1-D promotion,
 * broadcast batch dims. A matrix whose rows or columns are contiguous goes to cuBLAS as
 * is (transpose flag + leading dim); anything else is copied to a contiguous scratch.
 *
 * float32 runs in true float32 (CUBLAS_COMPUTE_32F, no TF32, so results stay close to
 * the CPU's); bfloat16 uses tensor cores with float32 accumulation; float64 in float64.
 * cuBLAS is column-major: the row-major product C = op(A) op(B) is computed as the
 * column-major C^T = op(B)^T op(A)^T, i.e. the operands swapped.
 *
 * linear: y = x w^T (+ b) is one cublasLt matmul with the bias added in its epilogue
 * (CUBLASLT_EPILOGUE_BIAS): y is written once, never pre-filled and read back. Without
 * a bias it is a plain beta = 0 GEMM. Where cublasLt has no algorithm for the case
 * (float64, an unaligned or strided bias) the GEMM runs with beta = 0 and one pass adds
 * the bias.
 * Estimate (from FLOPs and bytes, not measured) at GPT-2 small, B = 8, T = 1024, bf16
 * on an H100/H200: the linears hold ~124M weights (85M in the blocks, 38.6M in the LM
 * head), 6 x 124M x 8192 tokens = 6.1 TFLOP per step; at the ~600 TFLOP/s cuBLAS reaches
 * on these shapes, ~3.4 ms forward + ~6.8 ms backward. The old bias pre-fill and beta = 1
 * read-back moved ~2.5 GB per step (the bias-free LM head's 823 MB output written as
 * zeros and read back, plus every block's linear outputs), ~0.6 ms at ~4 TB/s: gone.
 *
 * linear_gelu (x w^T + b, then the tanh-approximate GELU, GPT-2's): one cublasLt matmul
 * with CUBLASLT_EPILOGUE_GELU_AUX_BIAS (GELU_AUX without a bias) writes y and, through
 * the aux pointer (ld = out, which cublasLt wants a multiple of 8), the pre-activation
 * that backward needs. cublasLt's GELU epilogue is the tanh form (PyTorch uses it only
 * for gelu(approximate = "tanh")), so it is fused only for that op, never for remat's
 * exact (erf) gelu. Where the epilogue cannot run (float64, out not a multiple of 8, an
 * operand cublasLt cannot read as is, a strided bias, no algorithm) the op is the linear
 * kernel then the gelu_tanh kernel, the CPU's path. Backward is unfused: dpre = gy
 * gelu_tanh'(pre) (one elementwise pass), then linear's two GEMMs and bias reduction.
 * Expected time (estimate from bytes, not measured) at GPT-2 small, B = 8, T = 1024,
 * bf16, ~4 TB/s: the (8192 x 3072) hidden activations are 50 MB. Unfused, the forward
 * writes pre, reads it back and writes y (150 MB); fused it writes pre and y (100 MB):
 * ~12 us and one launch a layer, ~0.2 ms a step of 12 layers (~1% of a ~16 ms step).
 * Backward is the same either way (read gy and pre, write dpre). A DGELU epilogue on
 * fc2's input-gradient GEMM would save that pass too (~150 MB, ~0.45 ms a step); not done.
 *
 * Triangular products (matmul's tri attrs, core/ops.def) are the plain cuBLAS product:
 * a triangular operand through a contiguous scratch copy zeroed outside its triangle,
 * a triangular result filled outside it afterwards (tri_fill_kernel). cuBLAS has no
 * batched triangular GEMM with these semantics; skipping the zero blocks (the CPU's
 * tiles) is not done here. */
#include <limits.h>
#include <cublasLt.h>

#include "cuda_common.cuh"

#include "../blas_layout.h"

typedef rm_blasmat blasmat;

/* Row-major batched GEMM: C_i (m x n, ldc) = op(A_i) op(B_i) + beta C_i, i < batch. */
static int gemm(rm_ctx *ctx, rm_dtype dt, blasmat ma, blasmat mb, int64_t m, int64_t n, int64_t k,
                const void *a, int64_t sa, const void *b, int64_t sb, double beta, void *c,
                int64_t ldc, int64_t sc, int64_t batch) {
  cublasHandle_t h = cu_st(ctx)->blas;
  cudaDataType_t ty;
  cublasComputeType_t ct;
  float af = 1.0f, bf = (float)beta;
  double ad = 1.0, bd = beta;
  const void *alpha = &af, *betap = &bf;
  switch (dt) {
  case RM_F32: ty = CUDA_R_32F; ct = CUBLAS_COMPUTE_32F; break;
  case RM_BF16: ty = CUDA_R_16BF; ct = CUBLAS_COMPUTE_32F; break;
  case RM_F64: ty = CUDA_R_64F; ct = CUBLAS_COMPUTE_64F; alpha = &ad; betap = &bd; break;
  default: return cu_bad_dtype(ctx, "matmul", dt);
  }
  cublasOperation_t ta = ma.tr ? CUBLAS_OP_T : CUBLAS_OP_N, tb = mb.tr ? CUBLAS_OP_T : CUBLAS_OP_N;
  for (int64_t done = 0; done < batch;) {
    int64_t nb = batch - done < 65535 ? batch - done : 65535;
    size_t es = cu_dsize(dt);
    const char *pa = (const char *)a + (size_t)(done * sa) * es;
    const char *pb = (const char *)b + (size_t)(done * sb) * es;
    char *pc = (char *)c + (size_t)(done * sc) * es;
    int rc = CUBLAS_CHECK(ctx, cublasGemmStridedBatchedEx(
                                   h, tb, ta, (int)n, (int)m, (int)k, alpha, pb, ty, (int)mb.ld,
                                   (long long)sb, pa, ty, (int)ma.ld, (long long)sa, betap, pc, ty,
                                   (int)ldc, (long long)sc, (int)nb, ct, CUBLAS_GEMM_DEFAULT));
    if (rc) return rc;
    done += nb;
  }
  return RM_OK;
}

/* One matmul operand seen as a batch of rows x cols matrices (1-D promoted). */
typedef struct {
  const rm_tensor *t;
  const char *p;     /* data (maybe a scratch copy, then contiguous) */
  int nbatch;
  int64_t shape[RM_MAX_DIM], stride[RM_MAX_DIM];
  int64_t rows, cols, sr, sc;
  blasmat bm;
} operand;

static void operand_geo(operand *o, const rm_tensor *t, const int64_t *stride, bool left) {
  o->t = t;
  for (int d = 0; d < t->ndim; d++) o->shape[d] = t->shape[d], o->stride[d] = stride[d];
  if (t->ndim == 1) {
    o->nbatch = 0;
    o->rows = left ? 1 : t->shape[0];
    o->cols = left ? t->shape[0] : 1;
    o->sr = left ? t->shape[0] * stride[0] : stride[0];
    o->sc = left ? stride[0] : 1;
  } else {
    o->nbatch = t->ndim - 2;
    o->rows = t->shape[t->ndim - 2];
    o->cols = t->shape[t->ndim - 1];
    o->sr = stride[t->ndim - 2];
    o->sc = stride[t->ndim - 1];
  }
}

/* Sets o up for cuBLAS, copying t to scratch when its layout does not fit. */
static int operand_prepare(rm_ctx *ctx, operand *o, const rm_tensor *t, bool left, void **copy) {
  *copy = NULL;
  operand_geo(o, t, t->stride, left);
  o->p = (const char *)cu_ptr(t);
  if (rm_as_blas(o->rows, o->cols, o->sr, o->sc, &o->bm)) return RM_OK;
  const void *p = cu_contig_data(ctx, t, copy);
  if (!p) return ctx->err_code;
  int64_t st[RM_MAX_DIM], s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) st[d] = s, s *= t->shape[d];
  operand_geo(o, t, st, left);
  o->p = (const char *)p;
  rm_as_blas(o->rows, o->cols, o->sr, o->sc, &o->bm);
  return RM_OK;
}

static void batch_strides(const operand *o, int nb, const int64_t *bshape, int64_t *st) {
  int off = nb - o->nbatch;
  for (int d = 0; d < nb; d++) {
    int k = d - off;
    st[d] = (k < 0 || o->shape[k] == 1 || bshape[d] == 1) ? 0 : o->stride[k];
  }
}

/* Entries outside the triangle (those with j > i; j < i with upper) of n / (len x len)
 * contiguous matrices set to fill. */
template <class T>
__global__ void tri_fill_kernel(T *p, int64_t n, int64_t len, bool upper, float fill) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
    int64_t j = e % len, i = (e / len) % len;
    if (upper ? j < i : j > i) cu_sv(p + e, fill);
  }
}

static int tri_fill(rm_ctx *ctx, void *p, rm_dtype dt, int64_t n, int64_t len, bool upper, float fill) {
  if (!n || !len) return RM_OK;
  cudaStream_t st = cu_st(ctx)->stream;
  CU_DISPATCH(ctx, "matmul", dt, tri_fill_kernel<T><<<cu_blocks(n), CU_THREADS, 0, st>>>((T *)p, n, len, upper, fill));
  return CU_LAUNCHED(ctx, "matmul's triangle fill");
}

/* o, the triangular operand t of a product, read from a contiguous scratch copy zeroed
 * outside its triangle (*copy, of *bytes, to free). */
static int tri_operand(rm_ctx *ctx, operand *o, const rm_tensor *t, bool left, bool upper, void **copy,
                       size_t *bytes) {
  *bytes = (size_t)cu_numel(t) * cu_dsize(t->dtype);
  const void *p = cu_contig_data(ctx, t, copy);
  if (!p) return ctx->err_code;
  if (!*copy) {   /* t is contiguous: a copy to mask */
    if (!(*copy = cu_scratch(ctx, *bytes))) return ctx->err_code;
    int rc = CU_CHECK(ctx, cudaMemcpyAsync(*copy, p, *bytes, cudaMemcpyDeviceToDevice, cu_st(ctx)->stream));
    if (rc) return rc;
  }
  int64_t st[RM_MAX_DIM], s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) st[d] = s, s *= t->shape[d];
  operand_geo(o, t, st, left);
  o->p = (const char *)*copy;
  rm_as_blas(o->rows, o->cols, o->sr, o->sc, &o->bm);
  return tri_fill(ctx, *copy, t->dtype, cu_numel(t), o->cols, upper, 0.0f);
}

RM_CUDA_KERNEL(matmul) {
  rm_tensor *y = out[0];
  size_t es = cu_dsize(y->dtype);
  const int tri = a ? (int)a->matmul.tri : RM_TRI_NONE;
  const bool upper = a && a->matmul.upper;
  operand A, B;
  void *ca = NULL, *cb = NULL, *cm = NULL;
  size_t cm_bytes = 0;
  /* a triangular operand is read from its masked copy (contiguous), the other as usual */
  int rc = tri == RM_TRI_A ? tri_operand(ctx, &A, in[0], true, upper, &cm, &cm_bytes)
                           : operand_prepare(ctx, &A, in[0], true, &ca);
  if (!rc) rc = tri == RM_TRI_B ? tri_operand(ctx, &B, in[1], false, upper, &cm, &cm_bytes)
                                : operand_prepare(ctx, &B, in[1], false, &cb);
  int64_t M = A.rows, K = A.cols, N = B.cols;
  int nb = A.nbatch > B.nbatch ? A.nbatch : B.nbatch;
  int64_t bshape[RM_MAX_DIM], sa[RM_MAX_DIM], sb[RM_MAX_DIM], batch = 1;
  if (rc) goto done;
  if (M >= INT_MAX || N >= INT_MAX || K >= INT_MAX) {
    rc = cu_fail(ctx, RM_ERR_SHAPE, "matmul: dimensions beyond cuBLAS's int range");
    goto done;
  }
  for (int d = 0; d < nb; d++) bshape[d] = y->shape[d], batch *= bshape[d];
  batch_strides(&A, nb, bshape, sa);
  batch_strides(&B, nb, bshape, sb);
  if (batch * M * N == 0) goto done;
  if (K == 0) {
    rc = cu_fill(ctx, cu_ptr(y), y->dtype, batch * M * N, 0.0);
    goto done;
  }
  {
    char *py = (char *)cu_ptr(y);
    /* One GEMM when B is shared by every batch and A's batches stack into rows. */
    if (rm_batch_folds(A.bm.tr, M, A.bm.ld, nb, bshape, sa, sb) && batch * M < INT_MAX) {
      rc = gemm(ctx, y->dtype, A.bm, B.bm, batch * M, N, K, A.p, 0, B.p, 0, 0.0, py, N, 0, 1);
      goto done;
    }
    /* The innermost batch dims whose strides chain (one stride each for A, B, C) go in
     * one strided-batched call; the outer ones loop on the host. */
    int inner = nb;
    int64_t cnt = 1, stA = 0, stB = 0;
    bool first = true;
    for (int d = nb - 1; d >= 0; d--) {
      if (bshape[d] == 1) { inner = d; continue; }
      if (first) {
        stA = sa[d]; stB = sb[d]; cnt = bshape[d]; first = false; inner = d;
      } else if (sa[d] == stA * cnt && sb[d] == stB * cnt) {
        cnt *= bshape[d]; inner = d;
      } else {
        break;
      }
    }
    int64_t outer = batch / cnt;
    for (int64_t i = 0; i < outer && !rc; i++) {
      int64_t oa, ob;
      rm_batch_offsets(i, inner, bshape, sa, sb, &oa, &ob);
      rc = gemm(ctx, y->dtype, A.bm, B.bm, M, N, K, A.p + oa * (int64_t)es, stA,
                B.p + ob * (int64_t)es, stB, 0.0, py + i * cnt * M * N * (int64_t)es, N, M * N, cnt);
    }
  }
done:
  if (!rc && tri == RM_TRI_OUT && batch * M * N != 0)
    rc = tri_fill(ctx, cu_ptr(y), y->dtype, batch * M * N, N, upper, a->matmul.neg_inf ? -INFINITY : 0.0f);
  if (ca) cu_scratch_free(ctx, ca, (size_t)cu_numel(in[0]) * es);
  if (cb) cu_scratch_free(ctx, cb, (size_t)cu_numel(in[1]) * es);
  if (cm) cu_scratch_free(ctx, cm, cm_bytes);
  return rc;
}

/* y rows += bias (after a beta = 0 GEMM, where cublasLt's epilogue was not used). */
template <class T>
__global__ void bias_add_kernel(T *y, const T *b, int64_t bs, int64_t rows, int64_t cols) {
  int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    cu_sv(y + i, cu_ld(y + i) + cu_ld(b + (i % cols) * bs));
}

/* ---- cublasLt (handle and workspace live in cu_state) ---- */

#define LT_WORKSPACE ((size_t)32 << 20)

int cu_lt_init(rm_ctx *ctx, cu_state *st) {
  cublasLtHandle_t h;
  int rc = CUBLAS_CHECK(ctx, cublasLtCreate(&h));
  if (rc) return rc;
  st->lt = h;
  rc = CU_CHECK(ctx, cudaMalloc(&st->lt_ws, LT_WORKSPACE));
  if (rc) return rc;
  st->lt_ws_bytes = LT_WORKSPACE;
  return RM_OK;
}

void cu_lt_shutdown(cu_state *st) {
  if (st->lt_ws) cudaFree(st->lt_ws);
  if (st->lt) cublasLtDestroy((cublasLtHandle_t)st->lt);
  st->lt_ws = NULL;
  st->lt = NULL;
}

static uint32_t align_of(const void *p) {
  uintptr_t u = (uintptr_t)p;
  uint32_t a = 256;
  while (a > 1 && (u & (a - 1))) a >>= 1;
  return a;
}

/* y (M x N, ldc N) = op(A) op(B) + bias (length N, contiguous) with cublasLt's bias
 * epilogue (row-major view; see gemm for the operand swap). With aux (M x N, ld N):
 * aux = op(A) op(B) (+ bias) and y = gelu_tanh(aux), the GELU_AUX(_BIAS) epilogue;
 * bias may then be NULL. Returns 1 when cublasLt has no algorithm for it (nothing
 * written), RM_OK when done, or an error. */
static int lt_linear(rm_ctx *ctx, rm_dtype dt, blasmat ma, blasmat mb, int64_t M, int64_t N, int64_t K,
                     const void *a, const void *b, const void *bias, void *c, void *aux) {
  cu_state *st = cu_st(ctx);
  cudaDataType_t ty = dt == RM_BF16 ? CUDA_R_16BF : CUDA_R_32F;
  if (dt != RM_BF16 && dt != RM_F32) return 1;
  /* cublasLt wants the aux leading dim a multiple of 8 and the aux aligned */
  if (aux && (N % 8 != 0 || align_of(aux) < 16)) return 1;
  int64_t aux_ld = N;
  cublasLtMatmulDesc_t op = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  cublasOperation_t ta = mb.tr ? CUBLAS_OP_T : CUBLAS_OP_N, tb = ma.tr ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtEpilogue_t epi = !aux ? CUBLASLT_EPILOGUE_BIAS
                           : bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  uint32_t al[4] = { align_of(b), align_of(a), align_of(c), align_of(c) };
  size_t ws = st->lt_ws_bytes;
  float one = 1.0f, zero = 0.0f;
  cublasLtMatmulHeuristicResult_t res;
  int nres = 0, rc = 1;
  /* column-major: D (N x M) = op(B') op(A') with B' = our B (N-side), A' = our A */
  bool ok = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) == CUBLAS_STATUS_SUCCESS &&
    (!bias || cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) ==
                  CUBLAS_STATUS_SUCCESS) &&
    (!aux || (cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux) ==
                  CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld) ==
                  CUBLAS_STATUS_SUCCESS)) &&
    cublasLtMatrixLayoutCreate(&la, ty, mb.tr ? K : N, mb.tr ? N : K, mb.ld) == CUBLAS_STATUS_SUCCESS &&
    cublasLtMatrixLayoutCreate(&lb, ty, ma.tr ? M : K, ma.tr ? K : M, ma.ld) == CUBLAS_STATUS_SUCCESS &&
    cublasLtMatrixLayoutCreate(&lc, ty, N, M, N) == CUBLAS_STATUS_SUCCESS &&
    cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) == CUBLAS_STATUS_SUCCESS &&
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], 4) == CUBLAS_STATUS_SUCCESS &&
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], 4) == CUBLAS_STATUS_SUCCESS &&
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], 4) == CUBLAS_STATUS_SUCCESS &&
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3], 4) == CUBLAS_STATUS_SUCCESS &&
    cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)st->lt, op, la, lb, lc, lc, pref, 1, &res, &nres) ==
        CUBLAS_STATUS_SUCCESS && nres > 0;
  if (ok)
    rc = CUBLAS_CHECK(ctx, cublasLtMatmul((cublasLtHandle_t)st->lt, op, &one, b, la, a, lb, &zero, c, lc, c, lc,
                                          &res.algo, st->lt_ws, ws, st->stream));
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (op) cublasLtMatmulDescDestroy(op);
  return rc;
}

/* y (R x out) = x (R x in) w^T (+ b): one GEMM over the flattened leading dims of x. */
RM_CUDA_KERNEL(linear) {
  const rm_tensor *x = in[0], *w = in[1], *b = nin > 2 ? in[2] : NULL;
  rm_tensor *y = out[0];
  int64_t fin = w->shape[1], fout = w->shape[0];
  if (fout == 0) return RM_OK;
  int64_t R = cu_numel(y) / fout;
  if (R == 0) return RM_OK;
  if (R >= INT_MAX || fin >= INT_MAX || fout >= INT_MAX)
    return cu_fail(ctx, RM_ERR_SHAPE, "linear: dimensions beyond cuBLAS's int range");
  cudaStream_t st = cu_st(ctx)->stream;
  int64_t bs = b ? b->stride[0] : 0;
  int rc = RM_OK;
  if (fin == 0) { /* an empty product: y = bias (or 0) */
    if ((rc = cu_fill(ctx, cu_ptr(y), y->dtype, R * fout, 0.0)) || !b) return rc;
    CU_DISPATCH(ctx, "linear", y->dtype,
                bias_add_kernel<T><<<cu_blocks(R * fout), CU_THREADS, 0, st>>>(
                    (T *)cu_ptr(y), (const T *)cu_ptr(b), bs, R, fout));
    return CU_LAUNCHED(ctx, "linear bias kernel");
  }
  blasmat mx = { false, 0 }, mw = { false, 0 };
  int64_t sr, sc;
  void *cx = NULL, *cw = NULL;
  const void *px = cu_ptr(x), *pw = cu_ptr(w);
  bool xc = cu_contig(x);
  if (x->ndim == 1) { sr = fin * x->stride[0]; sc = x->stride[0]; }
  else if (x->ndim == 2) { sr = x->stride[0]; sc = x->stride[1]; }
  else if (xc) { sr = fin; sc = 1; }
  else { sr = 0; sc = 0; }
  if ((x->ndim > 2 && !xc) || !rm_as_blas(R, fin, sr, sc, &mx)) {
    if (!(px = cu_contig_data(ctx, x, &cx))) return ctx->err_code;
    rm_as_blas(R, fin, fin, 1, &mx);
  }
  /* W^T as in x out: element (i, o) is w[o, i] */
  if (!rm_as_blas(fin, fout, w->stride[1], w->stride[0], &mw)) {
    if (!(pw = cu_contig_data(ctx, w, &cw))) rc = ctx->err_code;
    else rm_as_blas(fin, fout, 1, fin, &mw);
  }
  if (!rc && b && bs == 1)
    rc = lt_linear(ctx, y->dtype, mx, mw, R, fout, fin, px, pw, cu_ptr(b), cu_ptr(y), NULL);
  else if (!rc)
    rc = 1;
  if (rc == 1) { /* plain GEMM, then one pass for the bias */
    rc = gemm(ctx, y->dtype, mx, mw, R, fout, fin, px, 0, pw, 0, 0.0, cu_ptr(y), fout, 0, 1);
    if (!rc && b) {
      CU_DISPATCH(ctx, "linear", y->dtype,
                  bias_add_kernel<T><<<cu_blocks(R * fout), CU_THREADS, 0, st>>>(
                      (T *)cu_ptr(y), (const T *)cu_ptr(b), bs, R, fout));
      rc = CU_LAUNCHED(ctx, "linear bias kernel");
    }
  }
  size_t es = cu_dsize(y->dtype);
  if (cx) cu_scratch_free(ctx, cx, (size_t)cu_numel(x) * es);
  if (cw) cu_scratch_free(ctx, cw, (size_t)cu_numel(w) * es);
  return rc;
}

RM_CUDA_KERNEL(gelu_tanh);

/* linear_gelu: y = gelu_tanh(pre), pre = x w^T (+ b) (out[1], kept for backward). One
 * cublasLt matmul with the GELU_AUX(_BIAS) epilogue writes both where it can (float32
 * or bfloat16, x and w readable as they are, out a multiple of 8, a contiguous bias);
 * otherwise the linear kernel then the gelu_tanh kernel, as the CPU does. */
RM_CUDA_KERNEL(linear_gelu) {
  const rm_tensor *x = in[0], *w = in[1], *b = nin > 2 ? in[2] : NULL;
  rm_tensor *y = out[0], *pre = out[1];
  int64_t fin = w->shape[1], fout = w->shape[0];
  int64_t R = fout ? cu_numel(y) / fout : 0;
  blasmat mx = { false, 0 }, mw = { false, 0 };
  int rc = 1;
  bool xok = x->ndim == 1 ? rm_as_blas(R, fin, fin * x->stride[0], x->stride[0], &mx)
           : x->ndim == 2 ? rm_as_blas(R, fin, x->stride[0], x->stride[1], &mx)
                          : cu_contig(x) && rm_as_blas(R, fin, fin, 1, &mx);
  if (R > 0 && fin > 0 && R < INT_MAX && fin < INT_MAX && fout < INT_MAX && xok && (!b || b->stride[0] == 1) &&
      rm_as_blas(fin, fout, w->stride[1], w->stride[0], &mw))
    rc = lt_linear(ctx, y->dtype, mx, mw, R, fout, fin, cu_ptr(x), cu_ptr(w), b ? cu_ptr(b) : NULL, cu_ptr(y),
                   cu_ptr(pre));
  if (rc != 1) return rc;
  rc = cuk_linear(ctx, nin, in, 1, &out[1], a);
  return rc ? rc : cuk_gelu_tanh(ctx, 1, &out[1], 1, &out[0], a);
}

/* ---- matmul_softmax: softmax(matmul(a, b)), internal ----
 * The two kernels in turn, the product in a workspace: what the two ops give. The
 * checkpoint engine takes this op only where a backend computes it without storing the
 * product (rm_backend.scores_softmax, which CUDA leaves unset); it runs here for the ops'
 * specs. */
RM_CUDA_KERNEL(softmax);

RM_CUDA_KERNEL(matmul_softmax) {
  rm_tensor *y = out[0];
  rm_attrs mm, sm;
  rm_matmul_softmax_split(a, &mm, &sm);
  size_t bytes = (size_t)cu_numel(y) * cu_dsize(y->dtype);
  if (bytes == 0) return RM_OK;   /* an empty result (the workspace predicted is 0) */
  void *p = cu_scratch(ctx, bytes);
  if (!p) return ctx->err_code;
  /* the product: y's geometry over the workspace */
  rm_storage st;
  memset(&st, 0, sizeof st);
  st.refcount = 1;
  st.device = RM_CUDA;
  st.category = RM_CAT_WORKSPACE;
  st.bytes = bytes;
  st.data = p;
  rm_tensor s = *y;
  s.storage = &st;
  s.offset = 0;
  rm_tensor *sp = &s;
  int rc = cuk_matmul(ctx, 2, in, 1, &sp, &mm);
  if (!rc) rc = cuk_softmax(ctx, 1, &sp, 1, out, &sm);
  cu_scratch_free(ctx, p, bytes);
  return rc;
}

/* Its workspace, for dry runs: the product, batch dims broadcast (a 1-D operand has
 * none, and no row or column). */
size_t cu_matmul_softmax_workspace(int nin, rm_tensor *const *in) {
  if (nin != 2) return 0;
  const rm_tensor *x = in[0], *b = in[1];
  int na = x->ndim > 2 ? x->ndim - 2 : 0, nb = b->ndim > 2 ? b->ndim - 2 : 0, n = na > nb ? na : nb;
  int64_t numel = (x->ndim >= 2 ? x->shape[x->ndim - 2] : 1) * (b->ndim >= 2 ? b->shape[b->ndim - 1] : 1);
  for (int d = 0; d < n; d++) {
    int64_t sx = d < n - na ? 1 : x->shape[d - (n - na)], sb = d < n - nb ? 1 : b->shape[d - (n - nb)];
    numel *= sx == 1 ? sb : sx;
  }
  return (size_t)numel * cu_dsize(x->dtype);
}
