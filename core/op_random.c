/* Random ops over the counter-based generator (core/philox.h): rand, randn, dropout.
 * rand/randn attrs: i[0] dtype, i[1] device, shape. dropout: f[0] = p. Seed and offset
 * are drawn by rm_op_run and recorded, so a replay gives the same bits. */
#include <string.h>

#include "ops.h"

static rm_tensor *draw(rm_ctx *ctx, rm_op_id op, rm_dtype dt, rm_device dev, int ndim,
                       const int64_t *shape) {
  rm_attrs at;
  rm_attrs_init(&at);
  if (ndim < 0 || ndim > RM_MAX_DIM) {
    rm_fail(ctx, RM_ERR_ARG, "%s: at most %d dimensions", rm_op_name(op), RM_MAX_DIM);
    return NULL;
  }
  at.i[0] = dt;
  at.i[1] = dev;
  at.ndim = ndim;
  memcpy(at.shape, shape, sizeof(int64_t) * (size_t)ndim);
  return rm_op1(ctx, op, 0, NULL, &at);
}

rm_tensor *rm_rand(rm_ctx *ctx, rm_dtype dt, rm_device dev, int ndim, const int64_t *shape) {
  return draw(ctx, RM_OP_RAND, dt, dev, ndim, shape);
}

rm_tensor *rm_randn(rm_ctx *ctx, rm_dtype dt, rm_device dev, int ndim, const int64_t *shape) {
  return draw(ctx, RM_OP_RANDN, dt, dev, ndim, shape);
}

rm_tensor *rm_dropout(rm_ctx *ctx, rm_tensor *x, double p) {
  return rm_scalar_op(ctx, RM_OP_DROPOUT, x, p);
}
