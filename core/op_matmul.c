/* Matrix products: matmul (2-D, batched with broadcast batch dims) and linear. */
#include "ops.h"

rm_tensor *rm_matmul(rm_ctx *ctx, rm_tensor *a, rm_tensor *b) {
  rm_tensor *in[2] = { a, b };
  return rm_op1(ctx, RM_OP_MATMUL, 2, in, NULL);
}

rm_tensor *rm_linear(rm_ctx *ctx, rm_tensor *x, rm_tensor *w, rm_tensor *b) {
  rm_tensor *in[3] = { x, w, b };
  return rm_op1(ctx, RM_OP_LINEAR, b ? 3 : 2, in, NULL);
}
