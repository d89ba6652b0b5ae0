/* Random ops over the counter-based generator (core/philox.h): rand, randn, dropout.
 * rand/randn attrs: draw {dtype, device, shape}. dropout: {p}. Seed and offset
 * are drawn by rm_op_run and recorded, so a replay gives the same bits.
 *
 * dropout(x) = x * keep / (1 - p), keep = rm_rand_uniform(seed, offset, e) > p for the
 * output element e (row-major). It saves nothing for backward: dropout_backward(g) gets
 * the node's attrs (same seed and offset) and regenerates the mask, which costs a few
 * FLOPs per element instead of a mask's worth of memory. */
#include <math.h>
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
  at.draw.dtype = dt;
  at.draw.device = dev;
  at.ndim = ndim;
  memcpy(at.shape, shape, sizeof(int64_t) * (size_t)ndim);
  return rm_op1(ctx, op, 0, NULL, &at);
}

/* rm_rand: uniform in (0, 1]. Returns a new hold or NULL with the error set. */
rm_tensor *rm_rand(rm_ctx *ctx, rm_dtype dt, rm_device dev, int ndim, const int64_t *shape) {
  return draw(ctx, RM_OP_RAND, dt, dev, ndim, shape);
}

/* rm_randn: standard normal. Returns a new hold or NULL with the error set. */
rm_tensor *rm_randn(rm_ctx *ctx, rm_dtype dt, rm_device dev, int ndim, const int64_t *shape) {
  return draw(ctx, RM_OP_RANDN, dt, dev, ndim, shape);
}

/* rm_dropout: x with each element zeroed with probability p, the rest scaled by
 * 1/(1-p). Fails (RM_ERR_ARG) unless 0 <= p < 1. Always drops: the train/eval switch
 * belongs to the module. */
rm_tensor *rm_dropout(rm_ctx *ctx, rm_tensor *x, double p) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.dropout.p = p;
  return rm_op1(ctx, RM_OP_DROPOUT, 1, &x, &at);
}

/* ---- infer ---- */

static int draw_infer(rm_ctx *ctx, const char *op, const rm_attrs *a, rm_meta *out) {
  if (a->draw.dtype < 0 || a->draw.dtype >= RM_DTYPE_COUNT)
    return rm_fail(ctx, RM_ERR_DTYPE, "%s: unknown dtype %lld", op, (long long)a->draw.dtype);
  if (a->draw.device < 0 || a->draw.device >= RM_DEVICE_COUNT)
    return rm_fail(ctx, RM_ERR_DEVICE, "%s: unknown device %lld", op, (long long)a->draw.device);
  if (a->ndim < 0 || a->ndim > RM_MAX_DIM)
    return rm_fail(ctx, RM_ERR_ARG, "%s: at most %d dimensions", op, RM_MAX_DIM);
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] < 0)
      return rm_fail(ctx, RM_ERR_ARG, "%s: size %lld of dimension %d is negative", op,
                     (long long)a->shape[d], d + 1);
  out[0].dtype = (rm_dtype)a->draw.dtype;
  out[0].device = (rm_device)a->draw.device;
  out[0].ndim = a->ndim;
  memcpy(out[0].shape, a->shape, sizeof out[0].shape);
  return RM_OK;
}

static int rand_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  return draw_infer(ctx, "rand", a, out);
}

static int randn_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  return draw_infer(ctx, "randn", a, out);
}

static int check_p(rm_ctx *ctx, const char *op, double p) {
  if (!(p >= 0.0 && p < 1.0))
    return rm_fail(ctx, RM_ERR_ARG, "%s: p must be in [0, 1) (got %g)", op, p);
  return RM_OK;
}

static int dropout_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  if (check_p(ctx, "dropout", a->dropout.p)) return ctx->err_code;
  rm_tensor_meta(in[0], &out[0]);
  return RM_OK;
}

static int dropout_backward_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a,
                                  rm_meta *out) {
  if (check_p(ctx, "dropout_backward", a->dropout.p)) return ctx->err_code;
  rm_tensor_meta(in[0], &out[0]);
  return RM_OK;
}

/* ---- backward: the same mask, regenerated from the recorded seed and offset ---- */

static int dropout_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  gin[0] = rm_op1(ctx, RM_OP_DROPOUT_BACKWARD, 1, g, &n->attrs);
  return gin[0] ? RM_OK : ctx->err_code;
}

/* ---- costs: a Philox call (10 rounds) serves 4 uniforms or 2 normals ---- */

static double rand_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return 20.0 * (double)rm_meta_numel(&out[0]);
}

static double randn_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return 60.0 * (double)rm_meta_numel(&out[0]);
}

static double dropout_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return 22.0 * (double)rm_meta_numel(&out[0]);
}

/* ---- definitions ---- */

const rm_op_def rm_opdef_rand = { .name = "rand", .nin = 0, .nout = 1, .nvis = 1,
  .flags = RM_OPF_RANDOM | RM_OPF_NODIFF, .infer = rand_infer, .flops = rand_flops };
const rm_op_def rm_opdef_randn = { .name = "randn", .nin = 0, .nout = 1, .nvis = 1,
  .flags = RM_OPF_RANDOM | RM_OPF_NODIFF, .infer = randn_infer, .flops = randn_flops };
/* Inputs are made contiguous by core (the mask is indexed by output element anyway). */
const rm_op_def rm_opdef_dropout = { .name = "dropout", .nin = 1, .nout = 1, .nvis = 1,
  .flags = RM_OPF_RANDOM, .infer = dropout_infer, .backward = dropout_backward,
  .flops = dropout_flops };
/* Not RANDOM: it must use the seed/offset it is given, not draw new ones. */
const rm_op_def rm_opdef_dropout_backward = { .name = "dropout_backward", .nin = 1, .nout = 1,
  .nvis = 1, .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL, .infer = dropout_backward_infer,
  .flops = dropout_flops };
