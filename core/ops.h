/* C wrappers for running ops (what backward rules, modules and optimizers call).
 * Each returns a new reference (hold: refcount 1, users 1), or NULL with the ctx error
 * set. Dims are 0-based here (negative counts from the end); index *values* inside
 * tensors are 1-based (see op.h). Each is defined in core/op_<family>.c. */
#ifndef REMAT_OPS_H
#define REMAT_OPS_H

#include <string.h>

#include "op.h"

#define RM_DIM_ALL INT64_MIN   /* reduce over every dimension */

/* elementwise (op_elementwise.c) */
rm_tensor *rm_binary(rm_ctx *ctx, rm_op_id op, rm_tensor *a, rm_tensor *b); /* add..ge, maximum */
rm_tensor *rm_add(rm_ctx *ctx, rm_tensor *a, rm_tensor *b);
rm_tensor *rm_sub(rm_ctx *ctx, rm_tensor *a, rm_tensor *b);
rm_tensor *rm_mul(rm_ctx *ctx, rm_tensor *a, rm_tensor *b);
rm_tensor *rm_div(rm_ctx *ctx, rm_tensor *a, rm_tensor *b);
rm_tensor *rm_scalar_op(rm_ctx *ctx, rm_op_id op, rm_tensor *a, double s); /* scalar.value = s */
rm_tensor *rm_unary(rm_ctx *ctx, rm_op_id op, rm_tensor *a);
rm_tensor *rm_where(rm_ctx *ctx, rm_tensor *cond, rm_tensor *a, rm_tensor *b);
rm_tensor *rm_copy(rm_ctx *ctx, rm_tensor *a);             /* always a new contiguous copy */
rm_tensor *rm_contiguous(rm_ctx *ctx, rm_tensor *a);       /* a itself (held) when contiguous */
rm_tensor *rm_cast(rm_ctx *ctx, rm_tensor *a, rm_dtype dt);
rm_tensor *rm_full(rm_ctx *ctx, rm_dtype dt, rm_device dev, int ndim, const int64_t *shape,
                   double value);
rm_tensor *rm_full_like(rm_ctx *ctx, rm_tensor *a, double value);

/* random (op_random.c) */
rm_tensor *rm_rand(rm_ctx *ctx, rm_dtype dt, rm_device dev, int ndim, const int64_t *shape);
rm_tensor *rm_randn(rm_ctx *ctx, rm_dtype dt, rm_device dev, int ndim, const int64_t *shape);
rm_tensor *rm_dropout(rm_ctx *ctx, rm_tensor *x, double p);

/* views (op_view.c): no copy; the result aliases a's storage */
rm_tensor *rm_view(rm_ctx *ctx, rm_tensor *a, int ndim, const int64_t *shape); /* one -1 allowed */
rm_tensor *rm_reshape(rm_ctx *ctx, rm_tensor *a, int ndim, const int64_t *shape);
rm_tensor *rm_transpose(rm_ctx *ctx, rm_tensor *a, int64_t d0, int64_t d1);
rm_tensor *rm_narrow(rm_ctx *ctx, rm_tensor *a, int64_t dim, int64_t start, int64_t len);
rm_tensor *rm_expand(rm_ctx *ctx, rm_tensor *a, int ndim, const int64_t *shape);
rm_tensor *rm_select(rm_ctx *ctx, rm_tensor *a, int64_t dim, int64_t index);
rm_tensor *rm_permute(rm_ctx *ctx, rm_tensor *a, int ndim, const int64_t *perm); /* out dim k = a's perm[k] */
rm_tensor *rm_squeeze(rm_ctx *ctx, rm_tensor *a, int64_t dim);   /* RM_DIM_ALL: every size-1 dim */
rm_tensor *rm_unsqueeze(rm_ctx *ctx, rm_tensor *a, int64_t dim); /* a new size-1 dim at dim (0..ndim) */

/* reductions (op_reduce.c): dim may be RM_DIM_ALL */
rm_tensor *rm_sum(rm_ctx *ctx, rm_tensor *a, int64_t dim, bool keepdim);
rm_tensor *rm_mean(rm_ctx *ctx, rm_tensor *a, int64_t dim, bool keepdim);
/* Max values and (1-based) indices; indices may be NULL when not wanted. */
rm_tensor *rm_max(rm_ctx *ctx, rm_tensor *a, int64_t dim, bool keepdim, rm_tensor **indices);
rm_tensor *rm_argmax(rm_ctx *ctx, rm_tensor *a, int64_t dim, bool keepdim);
/* Sums a over broadcast dimensions down to shape (the adjoint of broadcasting). */
rm_tensor *rm_sum_to(rm_ctx *ctx, rm_tensor *a, int ndim, const int64_t *shape);
rm_tensor *rm_softmax(rm_ctx *ctx, rm_tensor *a, int64_t dim);
rm_tensor *rm_log_softmax(rm_ctx *ctx, rm_tensor *a, int64_t dim);
/* softmax over the last dim of scale * a; causal: a is (..., T, T) and row i sees
 * columns j <= i (causal_mask(scale * a) then softmax, in one pass). */
rm_tensor *rm_softmax_scaled(rm_ctx *ctx, rm_tensor *a, double scale, bool causal);

/* order statistics and scans (op_sort.c) */
rm_tensor *rm_cumsum(rm_ctx *ctx, rm_tensor *a, int64_t dim, bool reverse);

/* sliding windows (op_conv.c): geometry = { kh, kw, sh, sw, ph, pw, dh, dw };
 * (B, C, H, W) -> (B, C*kh*kw, Ho*Wo), pad_value where a window reads padding */
rm_tensor *rm_unfold(rm_ctx *ctx, rm_tensor *x, const int64_t geometry[8], double pad_value);

/* matrix products (op_matmul.c) */
rm_tensor *rm_matmul(rm_ctx *ctx, rm_tensor *a, rm_tensor *b); /* 2-D, batched, broadcast batch */
/* matmul's triangular products (the attrs tri, upper, neg_inf: core/ops.def): which
 * square (..., T, T) matrix is triangular */
enum { RM_TRI_NONE = 0, RM_TRI_OUT = 1, RM_TRI_A = 2, RM_TRI_B = 3 };
/* a b with one matrix triangular (tri: RM_TRI_OUT, _A or _B; upper: the diagonal and
 * above; neg_inf: RM_TRI_OUT's entries outside hold -inf, not 0); the CPU computes only
 * the triangle's part (causal attention's q k^T and p v, and their gradients) */
rm_tensor *rm_matmul_tri(rm_ctx *ctx, rm_tensor *a, rm_tensor *b, int tri, bool upper, bool neg_inf);
/* matmul_softmax's attrs (internal op: softmax(matmul(a, b)), the checkpoint engine's
 * replay of a dropped softmax together with its scores) split into the matmul's (*mm)
 * and the softmax's (*sm), as the two ops take them. */
static inline void rm_matmul_softmax_split(const rm_attrs *a, rm_attrs *mm, rm_attrs *sm) {
  memset(mm, 0, sizeof *mm);
  memset(sm, 0, sizeof *sm);
  mm->matmul.tri = a->matmul_softmax.tri;
  mm->matmul.upper = a->matmul_softmax.upper;
  mm->matmul.neg_inf = a->matmul_softmax.neg_inf;
  sm->softmax.dim = a->matmul_softmax.dim;
  sm->softmax.scale = a->matmul_softmax.scale;
  sm->softmax.causal = a->matmul_softmax.causal;
}
/* The inverse: matmul_softmax's attrs (*a, initialised by the caller) from a matmul's
 * (*mm) and a softmax's (*sm). */
static inline void rm_matmul_softmax_join(const rm_attrs *mm, const rm_attrs *sm, rm_attrs *a) {
  a->matmul_softmax.tri = mm->matmul.tri;
  a->matmul_softmax.upper = mm->matmul.upper;
  a->matmul_softmax.neg_inf = mm->matmul.neg_inf;
  a->matmul_softmax.dim = sm->softmax.dim;
  a->matmul_softmax.scale = sm->softmax.scale;
  a->matmul_softmax.causal = sm->softmax.causal;
}
rm_tensor *rm_linear(rm_ctx *ctx, rm_tensor *x, rm_tensor *w, rm_tensor *b); /* x w^T + b; b may be NULL */
rm_tensor *rm_linear_gelu(rm_ctx *ctx, rm_tensor *x, rm_tensor *w, rm_tensor *b); /* gelu_tanh(x w^T + b) */

/* normalisation (op_norm.c): over the last dimension; w, b may be NULL */
rm_tensor *rm_layernorm(rm_ctx *ctx, rm_tensor *x, rm_tensor *w, rm_tensor *b, double eps);
rm_tensor *rm_rmsnorm(rm_ctx *ctx, rm_tensor *x, rm_tensor *w, double eps);

/* indexing (op_index.c) */
rm_tensor *rm_index_select(rm_ctx *ctx, rm_tensor *a, int64_t dim, rm_tensor *idx);
rm_tensor *rm_gather(rm_ctx *ctx, rm_tensor *a, int64_t dim, rm_tensor *idx);
rm_tensor *rm_concat(rm_ctx *ctx, int n, rm_tensor *const *ts, int64_t dim);
rm_tensor *rm_embedding(rm_ctx *ctx, rm_tensor *weight, rm_tensor *idx);
rm_tensor *rm_causal_mask(rm_ctx *ctx, rm_tensor *scores); /* -inf above the diagonal */

/* fused attention (op_attention.c): softmax(scale q k^T [causal mask]) v without the
 * Tq x Tk matrix; q (..., Tq, hd), k and v (..., Tk, hd); scale 0 means 1/sqrt(hd);
 * causal: query i sees keys j <= i + Tk - Tq. */
rm_tensor *rm_attention(rm_ctx *ctx, rm_tensor *q, rm_tensor *k, rm_tensor *v, bool causal, double scale);
/* The packed form: self-attention on qkv (..., T, 3·heads·D), the output of one
 * projection; returns y (..., T, heads·D). Its backward writes one dqkv. */
rm_tensor *rm_attention_qkv(rm_ctx *ctx, rm_tensor *qkv, int64_t heads, bool causal, double scale);

/* losses (op_loss.c): mean over the batch */
rm_tensor *rm_cross_entropy(rm_ctx *ctx, rm_tensor *logits, rm_tensor *labels);
rm_tensor *rm_mse(rm_ctx *ctx, rm_tensor *pred, rm_tensor *target);

#endif
