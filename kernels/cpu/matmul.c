/* CPU kernels for matmul and linear over the BLAS's GEMM (kernels/cpu/blas.c). Both ops take strided inputs:
 * a matrix whose rows or columns are contiguous (a transpose, a narrow) goes to BLAS as
 * is, with the matching transpose flag and leading dimension; anything else is first
 * copied into a contiguous workspace tensor. */
#include <limits.h>
#include <omp.h>
#include <string.h>

#include "cpu.h"
#include "../blas_layout.h"

typedef rm_blasmat blasmat;

/* FLOPs below which one product of a batch runs on one thread (see matmul's kernel). */
#define SMALL_PRODUCT (32.0 * 1024 * 1024)

/* A contiguous workspace copy of t (new hold), or NULL with the ctx error set. */
static rm_tensor *workspace_copy(rm_ctx *ctx, rm_tensor *t) {
  rm_tensor *c = rm_tensor_new(ctx, t->dtype, t->device, t->ndim, t->shape, RM_CAT_WORKSPACE);
  if (!c) return NULL;
  if (rm_op_into(ctx, RM_OP_COPY, 1, &t, NULL, 1, &c)) { rm_tensor_drop(ctx, c); return NULL; }
  return c;
}

/* C (m x n, ldc) = op(A) op(B) + beta * C, in dt. */
static void gemm(rm_ctx *ctx, rm_dtype dt, blasmat ma, blasmat mb, int64_t m, int64_t n, int64_t k,
                 const void *a, const void *b, double beta, void *c, int64_t ldc) {
  rm_cpu_gemm(ctx, rm_cpu_blas_of(ctx), dt, ma.tr ? RM_BLAS_TRANS : RM_BLAS_NOTRANS,
              mb.tr ? RM_BLAS_TRANS : RM_BLAS_NOTRANS, m, n, k, a, ma.ld, b, mb.ld, beta, c, ldc);
}

/* One operand of matmul seen as a batch of (rows x cols) matrices; 1-D operands are
 * promoted (a: 1 x K, b: K x 1). */
typedef struct {
  rm_tensor *t;       /* the tensor read (maybe a workspace copy) */
  int nbatch;         /* batch dims of t */
  int64_t rows, cols, sr, sc;
  blasmat bm;
} operand;

static void operand_geo(operand *o, rm_tensor *t, bool left) {
  o->t = t;
  if (t->ndim == 1) {
    o->nbatch = 0;
    o->rows = left ? 1 : t->shape[0];
    o->cols = left ? t->shape[0] : 1;
    o->sr = left ? t->shape[0] * t->stride[0] : t->stride[0];
    o->sc = left ? t->stride[0] : 1;
  } else {
    o->nbatch = t->ndim - 2;
    o->rows = t->shape[t->ndim - 2];
    o->cols = t->shape[t->ndim - 1];
    o->sr = t->stride[t->ndim - 2];
    o->sc = t->stride[t->ndim - 1];
  }
}

/* Sets o up for BLAS, copying t into a workspace when its layout does not fit.
 * *copy receives the copy to drop (or NULL). */
static int operand_prepare(rm_ctx *ctx, operand *o, rm_tensor *t, bool left, rm_tensor **copy) {
  *copy = NULL;
  operand_geo(o, t, left);
  if (rm_as_blas(o->rows, o->cols, o->sr, o->sc, &o->bm)) return RM_OK;
  *copy = workspace_copy(ctx, t);
  if (!*copy) return ctx->err_code;
  operand_geo(o, *copy, left);
  rm_as_blas(o->rows, o->cols, o->sr, o->sc, &o->bm);
  return RM_OK;
}

/* Product i of a batched matmul: y[i] = A[i] B[i] with A's and B's batch offsets
 * from the output batch shape (strides 0 broadcast). */
static void batch_gemm(rm_ctx *ctx, rm_dtype dt, const operand *A, const operand *B, int nb, const int64_t *bshape,
                       const int64_t *sa, const int64_t *sb, int64_t i, const char *pa, const char *pb, char *py) {
  const int64_t es = (int64_t)rm_dtype_size(dt), M = A->rows, K = A->cols, N = B->cols;
  int64_t oa, ob;
  rm_batch_offsets(i, nb, bshape, sa, sb, &oa, &ob);
  gemm(ctx, dt, A->bm, B->bm, M, N, K, pa + oa * es, pb + ob * es, 0.0, py + i * M * N * es, N);
}

/* Element strides of o's batch dims aligned to the output batch shape (0: broadcast). */
static void batch_strides(const operand *o, int nb, const int64_t *bshape, int64_t *st) {
  int off = nb - o->nbatch;
  for (int d = 0; d < nb; d++) {
    int k = d - off;
    st[d] = (k < 0 || o->t->shape[k] == 1 || bshape[d] == 1) ? 0 : o->t->stride[k];
  }
}

RM_CPU_KERNEL(matmul) {
  rm_tensor *y = out[0];
  size_t es = rm_dtype_size(y->dtype);
  operand A, B;
  rm_tensor *ca = NULL, *cb = NULL;
  if (operand_prepare(ctx, &A, in[0], true, &ca) || operand_prepare(ctx, &B, in[1], false, &cb)) {
    rm_tensor_drop(ctx, ca);
    return ctx->err_code;
  }
  int64_t M = A.rows, K = A.cols, N = B.cols;
  int rc = RM_OK;
  if (M >= INT_MAX || N >= INT_MAX || K >= INT_MAX) {
    rc = rm_fail(ctx, RM_ERR_SHAPE, "matmul: dimensions beyond BLAS's int range");
    goto done;
  }
  int nb = A.nbatch > B.nbatch ? A.nbatch : B.nbatch;
  int64_t bshape[RM_MAX_DIM], sa[RM_MAX_DIM], sb[RM_MAX_DIM], batch = 1;
  for (int d = 0; d < nb; d++) {
    bshape[d] = y->shape[d];
    batch *= bshape[d];
  }
  batch_strides(&A, nb, bshape, sa);
  batch_strides(&B, nb, bshape, sb);
  if (batch * M * N == 0) goto done;
  if (K == 0) {
    memset(rm_tensor_ptr(y), 0, (size_t)(batch * M * N) * es);
    goto done;
  }
  const char *pa = rm_tensor_ptr(A.t), *pb = rm_tensor_ptr(B.t);
  char *py = rm_tensor_ptr(y);

  /* One call when B is shared by every batch and A's batches stack into rows. */
  if (rm_batch_folds(A.bm.tr, M, A.bm.ld, nb, bshape, sa, sb) && batch * M < INT_MAX) {
    gemm(ctx, y->dtype, A.bm, B.bm, batch * M, N, K, pa, pb, 0.0, py, N);
    goto done;
  }
  /* A batch of products each too small to split well (fewer than 64 rows for
   * rm_cpu_gemm's split, or under SMALL_PRODUCT FLOPs, where the BLAS's own threads
   * scale poorly): the batch is split over the threads instead, each product a
   * single-threaded call on one thread (so every result is the same for any thread
   * count). Left to the BLAS, a CNN's per-image products ran slower on 2 threads than on
   * 1, and attention's (256 x 32) x (32 x 256) products 1.55x slower than split by batch.
   * Otherwise no parallel construct at all: inside even an inactive one (if false),
   * rm_cpu_gemm's own split became a nested team, which cost a linear layer's backward
   * 10% on 2 threads. */
  const double product = 2.0 * (double)M * (double)N * (double)K;
  const bool par = batch > 1 && (M < 64 || product <= SMALL_PRODUCT) &&
                   product * (double)batch > RM_CPU_PAR_MIN && !omp_in_parallel();
  if (par) {
    _Pragma("omp parallel for schedule(static)")
    for (int64_t i = 0; i < batch; i++) batch_gemm(ctx, y->dtype, &A, &B, nb, bshape, sa, sb, i, pa, pb, py);
  } else {
    for (int64_t i = 0; i < batch; i++) batch_gemm(ctx, y->dtype, &A, &B, nb, bshape, sa, sb, i, pa, pb, py);
  }
done:
  rm_tensor_drop(ctx, ca);
  rm_tensor_drop(ctx, cb);
  return rc;
}

/* y (R x out) = x (R x in) w^T (+ b): one GEMM over the flattened leading dims of x; the
 * bias is written into y first and accumulated by the GEMM (beta = 1). */
RM_CPU_KERNEL(linear) {
  rm_tensor *x = in[0], *w = in[1], *b = nin > 2 ? in[2] : NULL, *y = out[0];
  int64_t fin = w->shape[1], fout = w->shape[0];
  if (fout == 0) return RM_OK;
  int64_t R = rm_tensor_numel(y) / fout;
  rm_tensor *cx = NULL, *cw = NULL;
  int rc = RM_OK;
  if (R == 0) return RM_OK;
  if (R >= INT_MAX || fin >= INT_MAX || fout >= INT_MAX)
    return rm_fail(ctx, RM_ERR_SHAPE, "linear: dimensions beyond BLAS's int range");

  /* fill y with the bias (or zeros: the GEMM then uses beta = 1 either way); a
   * contiguous bias row by row with memcpy (the strided loop below does not vectorise) */
  int64_t bs = b ? b->stride[0] : 0;
  size_t es = rm_dtype_size(y->dtype), row = (size_t)fout * es;
  char *yb = rm_tensor_ptr(y);
  if (!b) {
    memset(yb, 0, (size_t)R * row);
  } else if (bs == 1) {
    const char *bb = rm_tensor_ptr(b);
    _Pragma("omp parallel for if (R * fout > RM_CPU_PAR_MIN)")
    for (int64_t r = 0; r < R; r++) memcpy(yb + (size_t)r * row, bb, row);
  } else if (y->dtype == RM_F64) {
    double *py = rm_tensor_ptr(y);
    const double *pb = b ? rm_tensor_ptr(b) : NULL;
    _Pragma("omp parallel for if (R * fout > RM_CPU_PAR_MIN)")
    for (int64_t r = 0; r < R; r++)
      for (int64_t o = 0; o < fout; o++) py[r * fout + o] = pb ? pb[o * bs] : 0.0;
  } else {
    float *py = rm_tensor_ptr(y);
    const float *pb = b ? rm_tensor_ptr(b) : NULL;
    _Pragma("omp parallel for if (R * fout > RM_CPU_PAR_MIN)")
    for (int64_t r = 0; r < R; r++)
      for (int64_t o = 0; o < fout; o++) py[r * fout + o] = pb ? pb[o * bs] : 0.0f;
  }
  if (fin == 0) return RM_OK;

  /* X as R x in: a 1-D or 2-D view as is when BLAS can read it, else contiguous */
  blasmat mx, mw;
  int64_t sr, sc;
  if (x->ndim == 1) { sr = fin * x->stride[0]; sc = x->stride[0]; }
  else if (x->ndim == 2) { sr = x->stride[0]; sc = x->stride[1]; }
  else if (rm_tensor_is_contiguous(x)) { sr = fin; sc = 1; }
  else { sr = 0; sc = 0; }
  if ((x->ndim > 2 && !rm_tensor_is_contiguous(x)) || !rm_as_blas(R, fin, sr, sc, &mx)) {
    if (!(cx = workspace_copy(ctx, x))) return ctx->err_code;
    x = cx;
    rm_as_blas(R, fin, fin, 1, &mx);
  }
  /* W^T as in x out: element (i, o) is w[o, i] */
  if (!rm_as_blas(fin, fout, w->stride[1], w->stride[0], &mw)) {
    if (!(cw = workspace_copy(ctx, w))) { rc = ctx->err_code; goto done; }
    w = cw;
    rm_as_blas(fin, fout, 1, fin, &mw);
  }
  gemm(ctx, y->dtype, mx, mw, R, fout, fin, rm_tensor_ptr(x), rm_tensor_ptr(w), 1.0, rm_tensor_ptr(y), fout);
done:
  rm_tensor_drop(ctx, cx);
  rm_tensor_drop(ctx, cw);
  return rc;
}

RM_CPU_KERNEL(gelu_tanh);

/* linear_gelu: the linear kernel into the pre-activation (out[1]), then the gelu_tanh
 * kernel from it into y (out[0]): the same bits as linear followed by gelu_tanh. */
RM_CPU_KERNEL(linear_gelu) {
  int rc = rm_cpu_linear(ctx, nin, in, 1, &out[1], a);
  return rc ? rc : rm_cpu_gelu_tanh(ctx, 1, &out[1], 1, &out[0], a);
}
