/* Losses: cross_entropy (logits (N,C), 1-based labels (N)) and mse, both means. */
#include "ops.h"

rm_tensor *rm_cross_entropy(rm_ctx *ctx, rm_tensor *logits, rm_tensor *labels) {
  rm_tensor *in[2] = { logits, labels };
  return rm_op1(ctx, RM_OP_CROSS_ENTROPY, 2, in, NULL);
}

rm_tensor *rm_mse(rm_ctx *ctx, rm_tensor *pred, rm_tensor *target) {
  rm_tensor *in[2] = { pred, target };
  return rm_op1(ctx, RM_OP_MSE, 2, in, NULL);
}
