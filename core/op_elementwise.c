/* Elementwise ops: broadcasting binary ops, scalar ops, unary math and activations,
 * comparisons, where, copy, cast and fill, with their backward rules. */
#include <string.h>

#include "ops.h"

/* ---- wrappers ---- */

rm_tensor *rm_binary(rm_ctx *ctx, rm_op_id op, rm_tensor *a, rm_tensor *b) {
  rm_tensor *in[2] = { a, b };
  return rm_op1(ctx, op, 2, in, NULL);
}
rm_tensor *rm_add(rm_ctx *ctx, rm_tensor *a, rm_tensor *b) { return rm_binary(ctx, RM_OP_ADD, a, b); }
rm_tensor *rm_sub(rm_ctx *ctx, rm_tensor *a, rm_tensor *b) { return rm_binary(ctx, RM_OP_SUB, a, b); }
rm_tensor *rm_mul(rm_ctx *ctx, rm_tensor *a, rm_tensor *b) { return rm_binary(ctx, RM_OP_MUL, a, b); }
rm_tensor *rm_div(rm_ctx *ctx, rm_tensor *a, rm_tensor *b) { return rm_binary(ctx, RM_OP_DIV, a, b); }

rm_tensor *rm_scalar_op(rm_ctx *ctx, rm_op_id op, rm_tensor *a, double s) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.f[0] = s;
  return rm_op1(ctx, op, 1, &a, &at);
}

rm_tensor *rm_unary(rm_ctx *ctx, rm_op_id op, rm_tensor *a) { return rm_op1(ctx, op, 1, &a, NULL); }

rm_tensor *rm_where(rm_ctx *ctx, rm_tensor *cond, rm_tensor *a, rm_tensor *b) {
  rm_tensor *in[3] = { cond, a, b };
  return rm_op1(ctx, RM_OP_WHERE, 3, in, NULL);
}

rm_tensor *rm_copy(rm_ctx *ctx, rm_tensor *a) { return rm_op1(ctx, RM_OP_COPY, 1, &a, NULL); }

rm_tensor *rm_contiguous(rm_ctx *ctx, rm_tensor *a) {
  if (rm_tensor_is_contiguous(a)) {
    if (rm_tensor_data_ready(ctx, a)) return NULL;
    rm_tensor_hold(a);
    return a;
  }
  return rm_copy(ctx, a);
}

rm_tensor *rm_cast(rm_ctx *ctx, rm_tensor *a, rm_dtype dt) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.i[0] = dt;
  return rm_op1(ctx, RM_OP_CAST, 1, &a, &at);
}

rm_tensor *rm_full(rm_ctx *ctx, rm_dtype dt, rm_device dev, int ndim, const int64_t *shape,
                   double value) {
  rm_attrs at;
  rm_attrs_init(&at);
  if (ndim < 0 || ndim > RM_MAX_DIM) {
    rm_fail(ctx, RM_ERR_ARG, "full: at most %d dimensions", RM_MAX_DIM);
    return NULL;
  }
  at.f[0] = value;
  at.i[0] = dt;
  at.i[1] = dev;
  at.ndim = ndim;
  memcpy(at.shape, shape, sizeof(int64_t) * (size_t)ndim);
  return rm_op1(ctx, RM_OP_FILL, 0, NULL, &at);
}

rm_tensor *rm_full_like(rm_ctx *ctx, rm_tensor *a, double value) {
  return rm_full(ctx, a->dtype, a->device, a->ndim, a->shape, value);
}

/* ---- backward rules ---- */

/* g reduced to x's shape (undoes broadcasting). */
static rm_tensor *unbroadcast(rm_ctx *ctx, rm_tensor *g, rm_tensor *x) {
  if (rm_same_shape(g, x)) { rm_tensor_hold(g); return g; }
  return rm_sum_to(ctx, g, x->ndim, x->shape);
}

/* Sets gin[i] = unbroadcast(t) and drops t. */
static int give(rm_ctx *ctx, rm_node *n, int i, rm_tensor *t, rm_tensor **gin) {
  if (!t) return ctx->err_code;
  gin[i] = unbroadcast(ctx, t, n->in[i]);
  rm_tensor_drop(ctx, t);
  return gin[i] ? RM_OK : ctx->err_code;
}

static int add_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  for (int i = 0; i < 2; i++)
    if (rm_node_needs_grad(n, i)) {
      rm_tensor_hold(g[0]);
      if (give(ctx, n, i, g[0], gin)) return ctx->err_code;
    }
  return RM_OK;
}

static int sub_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  if (rm_node_needs_grad(n, 0)) {
    rm_tensor_hold(g[0]);
    if (give(ctx, n, 0, g[0], gin)) return ctx->err_code;
  }
  if (rm_node_needs_grad(n, 1) && give(ctx, n, 1, rm_unary(ctx, RM_OP_NEG, g[0]), gin))
    return ctx->err_code;
  return RM_OK;
}

static int mul_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  for (int i = 0; i < 2; i++) {
    if (!rm_node_needs_grad(n, i)) continue;
    rm_tensor *other = rm_node_input(ctx, n, 1 - i);
    if (!other || give(ctx, n, i, rm_mul(ctx, g[0], other), gin)) return ctx->err_code;
  }
  return RM_OK;
}

static int div_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *b = rm_node_input(ctx, n, 1);
  if (!b) return ctx->err_code;
  if (rm_node_needs_grad(n, 0) && give(ctx, n, 0, rm_div(ctx, g[0], b), gin)) return ctx->err_code;
  if (rm_node_needs_grad(n, 1)) {
    /* d(a/b)/db = -a / b^2 */
    rm_tensor *a = rm_node_input(ctx, n, 0);
    if (!a) return ctx->err_code;
    rm_tensor *q = rm_div(ctx, a, b);
    rm_tensor *q2 = q ? rm_div(ctx, q, b) : NULL;
    rm_tensor *t = q2 ? rm_mul(ctx, g[0], q2) : NULL;
    rm_tensor *nt = t ? rm_unary(ctx, RM_OP_NEG, t) : NULL;
    rm_tensor_drop(ctx, q);
    rm_tensor_drop(ctx, q2);
    rm_tensor_drop(ctx, t);
    if (give(ctx, n, 1, nt, gin)) return ctx->err_code;
  }
  return RM_OK;
}

static int neg_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  (void)n;
  gin[0] = rm_unary(ctx, RM_OP_NEG, g[0]);
  return gin[0] ? RM_OK : ctx->err_code;
}

static int add_scalar_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  (void)ctx; (void)n;
  rm_tensor_hold(g[0]);
  gin[0] = g[0];
  return RM_OK;
}

static int mul_scalar_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  gin[0] = rm_scalar_op(ctx, RM_OP_MUL_SCALAR, g[0], n->attrs.f[0]);
  return gin[0] ? RM_OK : ctx->err_code;
}

static int copy_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  (void)ctx; (void)n;
  rm_tensor_hold(g[0]);
  gin[0] = g[0];
  return RM_OK;
}

static int cast_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  (void)nin;
  if (a->i[0] < 0 || a->i[0] >= RM_DTYPE_COUNT) return rm_fail(ctx, RM_ERR_DTYPE, "cast: unknown dtype");
  rm_tensor_meta(in[0], &out[0]);
  out[0].dtype = (rm_dtype)a->i[0];
  return RM_OK;
}

static int cast_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  gin[0] = rm_cast(ctx, g[0], n->in[0]->dtype);
  return gin[0] ? RM_OK : ctx->err_code;
}

static int fill_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  (void)nin; (void)in;
  if (a->i[0] < 0 || a->i[0] >= RM_DTYPE_COUNT) return rm_fail(ctx, RM_ERR_DTYPE, "fill: unknown dtype");
  if (a->i[1] < 0 || a->i[1] >= RM_DEVICE_COUNT) return rm_fail(ctx, RM_ERR_DEVICE, "fill: unknown device");
  out[0].dtype = (rm_dtype)a->i[0];
  out[0].device = (rm_device)a->i[1];
  out[0].ndim = a->ndim;
  memcpy(out[0].shape, a->shape, sizeof out[0].shape);
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] < 0)
      return rm_fail(ctx, RM_ERR_ARG, "fill: size %lld of dimension %d is negative", (long long)a->shape[d], d + 1);
  return RM_OK;
}

/* ---- definitions ---- */

#define BINARY(nm, bw, save) \
  const rm_op_def rm_opdef_##nm = { .name = #nm, .nin = 2, .nout = 1, .nvis = 1, \
    .flags = RM_OPF_STRIDED | RM_OPF_BROADCAST, .save_in = save, .backward = bw };
#define UNARY(nm, bw, sin, sout) \
  const rm_op_def rm_opdef_##nm = { .name = #nm, .nin = 1, .nout = 1, .nvis = 1, \
    .flags = RM_OPF_STRIDED, .save_in = sin, .save_out = sout, .backward = bw };

BINARY(add, add_backward, 0)
BINARY(sub, sub_backward, 0)
BINARY(mul, mul_backward, 3)
BINARY(div, div_backward, 3)
UNARY(neg, neg_backward, 0, 0)
UNARY(add_scalar, add_scalar_backward, 0, 0)
UNARY(mul_scalar, mul_scalar_backward, 0, 0)
UNARY(copy, copy_backward, 0, 0)

const rm_op_def rm_opdef_cast = { .name = "cast", .nin = 1, .nout = 1, .nvis = 1,
  .flags = RM_OPF_STRIDED, .infer = cast_infer, .backward = cast_backward };
const rm_op_def rm_opdef_fill = { .name = "fill", .nin = 0, .nout = 1, .nvis = 1,
  .flags = RM_OPF_NODIFF, .infer = fill_infer };
