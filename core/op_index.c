/* Indexing: index_select, gather, concat, embedding, causal_mask, and the backward
 * helpers index_add, scatter_add, narrow_backward. i[0] = dim (0-based). Index
 * tensors hold 1-based float values. */
#include "ops.h"

static rm_tensor *with_dim(rm_ctx *ctx, rm_op_id op, rm_tensor *a, int64_t dim, rm_tensor *idx) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.i[0] = dim;
  rm_tensor *in[2] = { a, idx };
  return rm_op1(ctx, op, 2, in, &at);
}

rm_tensor *rm_index_select(rm_ctx *ctx, rm_tensor *a, int64_t dim, rm_tensor *idx) {
  return with_dim(ctx, RM_OP_INDEX_SELECT, a, dim, idx);
}

rm_tensor *rm_gather(rm_ctx *ctx, rm_tensor *a, int64_t dim, rm_tensor *idx) {
  return with_dim(ctx, RM_OP_GATHER, a, dim, idx);
}

rm_tensor *rm_concat(rm_ctx *ctx, int n, rm_tensor *const *ts, int64_t dim) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.i[0] = dim;
  return rm_op1(ctx, RM_OP_CONCAT, n, ts, &at);
}

rm_tensor *rm_embedding(rm_ctx *ctx, rm_tensor *weight, rm_tensor *idx) {
  rm_tensor *in[2] = { weight, idx };
  return rm_op1(ctx, RM_OP_EMBEDDING, 2, in, NULL);
}

rm_tensor *rm_causal_mask(rm_ctx *ctx, rm_tensor *scores) {
  return rm_op1(ctx, RM_OP_CAUSAL_MASK, 1, &scores, NULL);
}
