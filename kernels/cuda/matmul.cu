/* CUDA kernels for matmul and linear through cuBLAS (cublasGemmStridedBatchedEx), with
 * the semantics of kernels/cpu/matmul.c: strided inputs, numpy's 1-D promotion,
 * broadcast batch dims. A matrix whose rows or columns are contiguous goes to cuBLAS as
 * is (transpose flag + leading dim); anything else is copied to a contiguous scratch.
 *
 * float32 runs in true float32 (CUBLAS_COMPUTE_32F, no TF32, so results stay close to
 * the CPU's); bfloat16 uses tensor cores with float32 accumulation; float64 in float64.
 * cuBLAS is column-major: the row-major product C = op(A) op(B) is computed as the
 * column-major C^T = op(B)^T op(A)^T, i.e. the operands swapped. */
#include <limits.h>

#include "cuda_common.cuh"

typedef struct {
  bool tr;       /* row-major view: transposed */
  int64_t ld;
} blasmat;

/* Whether a rows x cols matrix with strides (sr, sc) can be given to cuBLAS directly. */
static bool as_blas(int64_t rows, int64_t cols, int64_t sr, int64_t sc, blasmat *m) {
  if ((cols == 1 || sc == 1) && (rows == 1 || sr >= cols)) {
    m->tr = false;
    m->ld = rows == 1 ? (cols > 1 ? cols : 1) : sr;
    return m->ld < INT_MAX;
  }
  if ((rows == 1 || sr == 1) && (cols == 1 || sc >= rows)) {
    m->tr = true;
    m->ld = cols == 1 ? (rows > 1 ? rows : 1) : sc;
    return m->ld < INT_MAX;
  }
  return false;
}

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
  if (as_blas(o->rows, o->cols, o->sr, o->sc, &o->bm)) return RM_OK;
  const void *p = cu_contig_data(ctx, t, copy);
  if (!p) return ctx->err_code;
  int64_t st[RM_MAX_DIM], s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) st[d] = s, s *= t->shape[d];
  operand_geo(o, t, st, left);
  o->p = (const char *)p;
  as_blas(o->rows, o->cols, o->sr, o->sc, &o->bm);
  return RM_OK;
}

static void batch_strides(const operand *o, int nb, const int64_t *bshape, int64_t *st) {
  int off = nb - o->nbatch;
  for (int d = 0; d < nb; d++) {
    int k = d - off;
    st[d] = (k < 0 || o->shape[k] == 1 || bshape[d] == 1) ? 0 : o->stride[k];
  }
}

RM_CUDA_KERNEL(matmul) {
  (void)nin; (void)nout; (void)a;
  rm_tensor *y = out[0];
  size_t es = cu_dsize(y->dtype);
  operand A, B;
  void *ca = NULL, *cb = NULL;
  int rc = operand_prepare(ctx, &A, in[0], true, &ca);
  if (!rc) rc = operand_prepare(ctx, &B, in[1], false, &cb);
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
    bool fold = !A.bm.tr;
    int64_t expect = M * A.bm.ld;
    for (int d = nb - 1; d >= 0 && fold; d--) {
      if (bshape[d] == 1) continue;
      if (sb[d] != 0 || sa[d] != expect) fold = false;
      expect *= bshape[d];
    }
    if (fold && batch * M < INT_MAX) {
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
      int64_t oa = 0, ob = 0, q = i;
      for (int d = inner - 1; d >= 0; d--) {
        int64_t k = q % bshape[d];
        q /= bshape[d];
        oa += k * sa[d];
        ob += k * sb[d];
      }
      rc = gemm(ctx, y->dtype, A.bm, B.bm, M, N, K, A.p + oa * (int64_t)es, stA,
                B.p + ob * (int64_t)es, stB, 0.0, py + i * cnt * M * N * (int64_t)es, N, M * N, cnt);
    }
  }
done:
  if (ca) cu_scratch_free(ctx, ca, (size_t)cu_numel(in[0]) * es);
  if (cb) cu_scratch_free(ctx, cb, (size_t)cu_numel(in[1]) * es);
  return rc;
}

/* y rows = bias (or 0), before the GEMM accumulates into them (beta = 1). */
template <class T>
__global__ void bias_rows_kernel(T *y, const T *b, int64_t bs, int64_t rows, int64_t cols) {
  typedef typename cu_acc<T>::type A;
  int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    cu_sv(y + i, b ? cu_ld(b + (i % cols) * bs) : (A)0);
}

/* y (R x out) = x (R x in) w^T (+ b): one GEMM over the flattened leading dims of x. */
RM_CUDA_KERNEL(linear) {
  (void)nout; (void)a;
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
  CU_DISPATCH(ctx, "linear", y->dtype,
              bias_rows_kernel<T><<<cu_blocks(R * fout), CU_THREADS, 0, st>>>(
                  (T *)cu_ptr(y), b ? (const T *)cu_ptr(b) : (const T *)NULL, bs, R, fout));
  int rc = CU_LAUNCHED(ctx, "linear bias kernel");
  if (rc || fin == 0) return rc;

  blasmat mx = { false, 0 }, mw = { false, 0 };
  int64_t sr, sc;
  void *cx = NULL, *cw = NULL;
  const void *px = cu_ptr(x), *pw = cu_ptr(w);
  bool xc = cu_contig(x);
  if (x->ndim == 1) { sr = fin * x->stride[0]; sc = x->stride[0]; }
  else if (x->ndim == 2) { sr = x->stride[0]; sc = x->stride[1]; }
  else if (xc) { sr = fin; sc = 1; }
  else { sr = 0; sc = 0; }
  if ((x->ndim > 2 && !xc) || !as_blas(R, fin, sr, sc, &mx)) {
    if (!(px = cu_contig_data(ctx, x, &cx))) return ctx->err_code;
    as_blas(R, fin, fin, 1, &mx);
  }
  /* W^T as in x out: element (i, o) is w[o, i] */
  if (!as_blas(fin, fout, w->stride[1], w->stride[0], &mw)) {
    if (!(pw = cu_contig_data(ctx, w, &cw))) rc = ctx->err_code;
    else as_blas(fin, fout, 1, fin, &mw);
  }
  if (!rc) rc = gemm(ctx, y->dtype, mx, mw, R, fout, fin, px, 0, pw, 0, 1.0, cu_ptr(y), fout, 0, 1);
  size_t es = cu_dsize(y->dtype);
  if (cx) cu_scratch_free(ctx, cx, (size_t)cu_numel(x) * es);
  if (cw) cu_scratch_free(ctx, cw, (size_t)cu_numel(w) * es);
  return rc;
}
