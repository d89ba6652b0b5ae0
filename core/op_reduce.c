/* Reductions (sum, mean, max, argmax, sum_to) and softmax / log_softmax.
 * Attrs: i[0] dim (0-based, normalised by infer; RM_DIM_ALL: every dim), i[1] keepdim. */
#include <string.h>

#include "ops.h"

static rm_tensor *reduce(rm_ctx *ctx, rm_op_id op, rm_tensor *a, int64_t dim, bool keepdim) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.i[0] = dim;
  at.i[1] = keepdim;
  return rm_op1(ctx, op, 1, &a, &at);
}

rm_tensor *rm_sum(rm_ctx *ctx, rm_tensor *a, int64_t dim, bool keepdim) { return reduce(ctx, RM_OP_SUM, a, dim, keepdim); }
rm_tensor *rm_mean(rm_ctx *ctx, rm_tensor *a, int64_t dim, bool keepdim) { return reduce(ctx, RM_OP_MEAN, a, dim, keepdim); }
rm_tensor *rm_argmax(rm_ctx *ctx, rm_tensor *a, int64_t dim, bool keepdim) { return reduce(ctx, RM_OP_ARGMAX, a, dim, keepdim); }

rm_tensor *rm_max(rm_ctx *ctx, rm_tensor *a, int64_t dim, bool keepdim, rm_tensor **indices) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.i[0] = dim;
  at.i[1] = keepdim;
  rm_tensor *out[2] = { 0 };
  if (rm_op_run(ctx, RM_OP_MAX, 1, &a, &at, out) != RM_OK) return NULL;
  if (indices) *indices = out[1];
  else rm_tensor_drop(ctx, out[1]);
  return out[0];
}

rm_tensor *rm_sum_to(rm_ctx *ctx, rm_tensor *a, int ndim, const int64_t *shape) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.ndim = ndim;
  memcpy(at.shape, shape, sizeof(int64_t) * (size_t)ndim);
  return rm_op1(ctx, RM_OP_SUM_TO, 1, &a, &at);
}

rm_tensor *rm_softmax(rm_ctx *ctx, rm_tensor *a, int64_t dim) { return reduce(ctx, RM_OP_SOFTMAX, a, dim, false); }
rm_tensor *rm_log_softmax(rm_ctx *ctx, rm_tensor *a, int64_t dim) { return reduce(ctx, RM_OP_LOG_SOFTMAX, a, dim, false); }
