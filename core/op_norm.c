/* Normalisation over the last dimension: layernorm and rmsnorm. f[0] = eps.
 * Inputs: x, then weight and bias when given (i[0] = 1 when affine). */
#include "ops.h"

rm_tensor *rm_layernorm(rm_ctx *ctx, rm_tensor *x, rm_tensor *w, rm_tensor *b, double eps) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.f[0] = eps;
  rm_tensor *in[3] = { x, w, b };
  int nin = 1 + (w != NULL) + (b != NULL);
  return rm_op1(ctx, RM_OP_LAYERNORM, nin, in, &at);
}

rm_tensor *rm_rmsnorm(rm_ctx *ctx, rm_tensor *x, rm_tensor *w, double eps) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.f[0] = eps;
  rm_tensor *in[2] = { x, w };
  return rm_op1(ctx, RM_OP_RMSNORM, w ? 2 : 1, in, &at);
}
