/* Elementwise ops: broadcasting binary ops, scalar ops, unary math and activations,
 * comparisons, where, copy, cast and fill, with their backward rules and costs.
 *
 * Binary ops, comparisons and where broadcast their inputs (numpy rules; the default
 * infer step of core/op.c checks devices, dtypes and shapes and names the op). Scalar
 * ops read scalar.value. Comparisons give 1/0 in the input dtype. Backward rules are
 * written with the wrappers below, so they run on every backend; what each rule reads
 * is declared in its op's save_in/save_out, chosen to keep as little as possible
 * (ops whose derivative is a function of their output keep the output only). */
#include <math.h>
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
  at.scalar.value = s;
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
  at.cast.dtype = dt;
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
  at.fill.value = value;
  at.fill.dtype = dt;
  at.fill.device = dev;
  at.ndim = ndim;
  if (ndim) memcpy(at.shape, shape, sizeof(int64_t) * (size_t)ndim);
  return rm_op1(ctx, RM_OP_FILL, 0, NULL, &at);
}

rm_tensor *rm_full_like(rm_ctx *ctx, rm_tensor *a, double value) {
  return rm_full(ctx, a->dtype, a->device, a->ndim, a->shape, value);
}

/* ---- backward helpers ---- */

/* g reduced to x's shape (undoes broadcasting). */
static rm_tensor *unbroadcast(rm_ctx *ctx, rm_tensor *g, rm_tensor *x) {
  if (rm_same_shape(g, x)) { rm_tensor_hold(g); return g; }
  return rm_sum_to(ctx, g, x->ndim, x->shape);
}

/* Sets gin[i] = unbroadcast(t) and drops t (t NULL: the error of whatever made it). */
static int give(rm_ctx *ctx, rm_node *n, int i, rm_tensor *t, rm_tensor **gin) {
  if (!t) return ctx->err_code;
  gin[i] = unbroadcast(ctx, t, n->in[i]);
  rm_tensor_drop(ctx, t);
  return gin[i] ? RM_OK : ctx->err_code;
}

/* Drops up to four temporaries (NULL is fine). */
static void drop4(rm_ctx *ctx, rm_tensor *a, rm_tensor *b, rm_tensor *c, rm_tensor *d) {
  rm_tensor_drop(ctx, a);
  rm_tensor_drop(ctx, b);
  rm_tensor_drop(ctx, c);
  rm_tensor_drop(ctx, d);
}

/* A 0-d tensor holding v, of t's dtype and device (broadcasts against anything). */
static rm_tensor *scalar_like(rm_ctx *ctx, rm_tensor *t, double v) {
  return rm_full(ctx, t->dtype, t->device, 0, NULL, v);
}

/* g * t for one input's gradient (t dropped); NULL t passes its error on. */
static rm_tensor *times(rm_ctx *ctx, rm_tensor *g, rm_tensor *t) {
  if (!t) return NULL;
  rm_tensor *r = rm_mul(ctx, g, t);
  rm_tensor_drop(ctx, t);
  return r;
}

/* ---- binary rules ---- */

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
    drop4(ctx, q, q2, t, NULL);
    if (give(ctx, n, 1, nt, gin)) return ctx->err_code;
  }
  return RM_OK;
}

/* d(a^b)/da = b a^(b-1); d(a^b)/db = a^b log a, taken as 0 where a^b is 0 (a = 0, b > 0:
 * the limit, where the formula would give 0 * -inf). a^b is recomputed rather than
 * saved: it is one cheap op, and keeping only the inputs halves what the node holds. */
static int pow_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *a = rm_node_input(ctx, n, 0), *b = a ? rm_node_input(ctx, n, 1) : NULL;
  if (!b) return ctx->err_code;
  if (rm_node_needs_grad(n, 0)) {
    rm_tensor *bm1 = rm_scalar_op(ctx, RM_OP_ADD_SCALAR, b, -1.0);
    rm_tensor *p = bm1 ? rm_binary(ctx, RM_OP_POW, a, bm1) : NULL;
    rm_tensor *d = p ? rm_mul(ctx, b, p) : NULL;
    drop4(ctx, bm1, p, NULL, NULL);
    if (give(ctx, n, 0, times(ctx, g[0], d), gin)) return ctx->err_code;
  }
  if (rm_node_needs_grad(n, 1)) {
    rm_tensor *p = rm_binary(ctx, RM_OP_POW, a, b);
    rm_tensor *la = p ? rm_unary(ctx, RM_OP_LOG, a) : NULL;
    rm_tensor *d = la ? rm_mul(ctx, p, la) : NULL;
    rm_tensor *zero = d ? scalar_like(ctx, a, 0.0) : NULL;
    rm_tensor *isz = zero ? rm_binary(ctx, RM_OP_EQ, p, zero) : NULL;
    rm_tensor *dz = isz ? rm_where(ctx, isz, zero, d) : NULL;
    drop4(ctx, p, la, d, zero);
    rm_tensor_drop(ctx, isz);
    if (give(ctx, n, 1, times(ctx, g[0], dz), gin)) return ctx->err_code;
  }
  return RM_OK;
}

/* The gradient goes to the larger input; on a tie it is split evenly (the
 * subgradient that keeps maximum(x, x) = x with gradient 1). */
static int maximum_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *a = rm_node_input(ctx, n, 0), *b = a ? rm_node_input(ctx, n, 1) : NULL;
  if (!b) return ctx->err_code;
  for (int i = 0; i < 2; i++) {
    if (!rm_node_needs_grad(n, i)) continue;
    rm_tensor *x = i ? b : a, *y = i ? a : b;
    rm_tensor *gt = rm_binary(ctx, RM_OP_GT, x, y);
    rm_tensor *eq = gt ? rm_binary(ctx, RM_OP_EQ, x, y) : NULL;
    rm_tensor *half = eq ? rm_scalar_op(ctx, RM_OP_MUL_SCALAR, eq, 0.5) : NULL;
    rm_tensor *w = half ? rm_add(ctx, gt, half) : NULL;
    drop4(ctx, gt, eq, half, NULL);
    if (give(ctx, n, i, times(ctx, g[0], w), gin)) return ctx->err_code;
  }
  return RM_OK;
}

/* where(cond, a, b): the gradient flows to a where cond != 0, to b elsewhere; cond is a
 * selector and gets none. */
static int where_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *cond = rm_node_input(ctx, n, 0);
  if (!cond) return ctx->err_code;
  rm_tensor *zero = scalar_like(ctx, g[0], 0.0);
  if (!zero) return ctx->err_code;
  int rc = RM_OK;
  if (rm_node_needs_grad(n, 1)) rc = give(ctx, n, 1, rm_where(ctx, cond, g[0], zero), gin);
  if (!rc && rm_node_needs_grad(n, 2)) rc = give(ctx, n, 2, rm_where(ctx, cond, zero, g[0]), gin);
  rm_tensor_drop(ctx, zero);
  return rc;
}

/* ---- scalar rules (scalar.value = s) ---- */

static int pass_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor_hold(g[0]);
  gin[0] = g[0];
  return RM_OK;
}

static int mul_scalar_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  gin[0] = rm_scalar_op(ctx, RM_OP_MUL_SCALAR, g[0], n->attrs.scalar.value);
  return gin[0] ? RM_OK : ctx->err_code;
}

/* d(x^s)/dx = s x^(s-1) */
static int pow_scalar_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *x = rm_node_input(ctx, n, 0);
  if (!x) return ctx->err_code;
  double s = n->attrs.scalar.value;
  rm_tensor *p = rm_scalar_op(ctx, RM_OP_POW_SCALAR, x, s - 1.0);
  rm_tensor *d = p ? rm_scalar_op(ctx, RM_OP_MUL_SCALAR, p, s) : NULL;
  rm_tensor_drop(ctx, p);
  gin[0] = times(ctx, g[0], d);
  return gin[0] ? RM_OK : ctx->err_code;
}

/* d(s/x)/dx = -s / x^2 */
static int rdiv_scalar_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *x = rm_node_input(ctx, n, 0);
  if (!x) return ctx->err_code;
  rm_tensor *p = rm_scalar_op(ctx, RM_OP_POW_SCALAR, x, -2.0);
  rm_tensor *d = p ? rm_scalar_op(ctx, RM_OP_MUL_SCALAR, p, -n->attrs.scalar.value) : NULL;
  rm_tensor_drop(ctx, p);
  gin[0] = times(ctx, g[0], d);
  return gin[0] ? RM_OK : ctx->err_code;
}

/* ---- unary rules ---- */

static int neg_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  gin[0] = rm_unary(ctx, RM_OP_NEG, g[0]);
  return gin[0] ? RM_OK : ctx->err_code;
}

/* exp' = exp: reads the output. */
static int exp_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *y = rm_node_output(ctx, n, 0);
  if (!y) return ctx->err_code;
  gin[0] = rm_mul(ctx, g[0], y);
  return gin[0] ? RM_OK : ctx->err_code;
}

static int log_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *x = rm_node_input(ctx, n, 0);
  if (!x) return ctx->err_code;
  gin[0] = rm_div(ctx, g[0], x);
  return gin[0] ? RM_OK : ctx->err_code;
}

/* tanh' = 1 - y^2, as g - g y y. */
static int tanh_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *y = rm_node_output(ctx, n, 0);
  if (!y) return ctx->err_code;
  rm_tensor *gy = rm_mul(ctx, g[0], y);
  rm_tensor *gyy = gy ? rm_mul(ctx, gy, y) : NULL;
  gin[0] = gyy ? rm_sub(ctx, g[0], gyy) : NULL;
  drop4(ctx, gy, gyy, NULL, NULL);
  return gin[0] ? RM_OK : ctx->err_code;
}

/* sqrt' = 1 / (2 y). */
static int sqrt_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *y = rm_node_output(ctx, n, 0);
  if (!y) return ctx->err_code;
  rm_tensor *q = rm_div(ctx, g[0], y);
  gin[0] = q ? rm_scalar_op(ctx, RM_OP_MUL_SCALAR, q, 0.5) : NULL;
  rm_tensor_drop(ctx, q);
  return gin[0] ? RM_OK : ctx->err_code;
}

/* abs' = sign(x), 0 at 0. */
static int abs_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *x = rm_node_input(ctx, n, 0);
  if (!x) return ctx->err_code;
  rm_tensor *zero = scalar_like(ctx, x, 0.0);
  rm_tensor *pos = zero ? rm_binary(ctx, RM_OP_GT, x, zero) : NULL;
  rm_tensor *neg = pos ? rm_binary(ctx, RM_OP_LT, x, zero) : NULL;
  rm_tensor *sign = neg ? rm_sub(ctx, pos, neg) : NULL;
  drop4(ctx, zero, pos, neg, NULL);
  gin[0] = times(ctx, g[0], sign);
  return gin[0] ? RM_OK : ctx->err_code;
}

/* clamp' = [lo <= x <= hi] (the gradient passes at the bounds, as in PyTorch). */
static int clamp_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *x = rm_node_input(ctx, n, 0);
  if (!x) return ctx->err_code;
  rm_tensor *lo = scalar_like(ctx, x, n->attrs.clamp.lo);
  rm_tensor *hi = lo ? scalar_like(ctx, x, n->attrs.clamp.hi) : NULL;
  rm_tensor *above = hi ? rm_binary(ctx, RM_OP_GE, x, lo) : NULL;
  rm_tensor *below = above ? rm_binary(ctx, RM_OP_LE, x, hi) : NULL;
  rm_tensor *mask = below ? rm_mul(ctx, above, below) : NULL;
  drop4(ctx, lo, hi, above, below);
  gin[0] = times(ctx, g[0], mask);
  return gin[0] ? RM_OK : ctx->err_code;
}

static int clamp_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  double lo = a->clamp.lo, hi = a->clamp.hi;
  if (lo != lo || hi != hi || lo > hi)
    return rm_fail(ctx, RM_ERR_ARG, "clamp: the bounds must satisfy min <= max (got %g and %g)", lo, hi);
  rm_tensor_meta(in[0], &out[0]);
  return RM_OK;
}

/* relu' = [y > 0]: the output tells as much as the input. */
static int relu_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *y = rm_node_output(ctx, n, 0);
  if (!y) return ctx->err_code;
  rm_tensor *zero = scalar_like(ctx, y, 0.0);
  rm_tensor *mask = zero ? rm_binary(ctx, RM_OP_GT, y, zero) : NULL;
  rm_tensor_drop(ctx, zero);
  gin[0] = times(ctx, g[0], mask);
  return gin[0] ? RM_OK : ctx->err_code;
}

/* sigmoid' = y (1 - y), as g y - g y y. */
static int sigmoid_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *y = rm_node_output(ctx, n, 0);
  if (!y) return ctx->err_code;
  rm_tensor *gy = rm_mul(ctx, g[0], y);
  rm_tensor *gyy = gy ? rm_mul(ctx, gy, y) : NULL;
  gin[0] = gyy ? rm_sub(ctx, gy, gyy) : NULL;
  drop4(ctx, gy, gyy, NULL, NULL);
  return gin[0] ? RM_OK : ctx->err_code;
}

/* gelu, gelu_tanh and silu: one fused internal op on (x, g). */
static int fused_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin,
                          rm_op_id op) {
  rm_tensor *x = rm_node_input(ctx, n, 0);
  if (!x) return ctx->err_code;
  gin[0] = rm_binary(ctx, op, x, g[0]);
  return gin[0] ? RM_OK : ctx->err_code;
}
static int gelu_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  return fused_backward(ctx, n, g, gin, RM_OP_GELU_BACKWARD);
}
static int silu_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  return fused_backward(ctx, n, g, gin, RM_OP_SILU_BACKWARD);
}
static int gelu_tanh_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  return fused_backward(ctx, n, g, gin, RM_OP_GELU_TANH_BACKWARD);
}

/* ---- copy, cast, fill ---- */

static int cast_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  if (a->cast.dtype < 0 || a->cast.dtype >= RM_DTYPE_COUNT)
    return rm_fail(ctx, RM_ERR_DTYPE, "cast: unknown dtype %lld", (long long)a->cast.dtype);
  rm_tensor_meta(in[0], &out[0]);
  out[0].dtype = (rm_dtype)a->cast.dtype;
  return RM_OK;
}

static int cast_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  gin[0] = rm_cast(ctx, g[0], n->in[0]->dtype);
  return gin[0] ? RM_OK : ctx->err_code;
}

static int fill_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  if (a->fill.dtype < 0 || a->fill.dtype >= RM_DTYPE_COUNT)
    return rm_fail(ctx, RM_ERR_DTYPE, "fill: unknown dtype %lld", (long long)a->fill.dtype);
  if (a->fill.device < 0 || a->fill.device >= RM_DEVICE_COUNT)
    return rm_fail(ctx, RM_ERR_DEVICE, "fill: unknown device %lld", (long long)a->fill.device);
  if (a->ndim < 0 || a->ndim > RM_MAX_DIM)
    return rm_fail(ctx, RM_ERR_ARG, "fill: at most %d dimensions", RM_MAX_DIM);
  int64_t v;
  if (rm_dtype_is_int((rm_dtype)a->fill.dtype) && !rm_float_to_int(a->fill.value, (rm_dtype)a->fill.dtype, &v))
    return rm_fail(ctx, RM_ERR_ARG, "fill: %.17g has no %s value (NaN, infinite or out of range)", a->fill.value,
                   rm_dtype_name((rm_dtype)a->fill.dtype));
  out[0].dtype = (rm_dtype)a->fill.dtype;
  out[0].device = (rm_device)a->fill.device;
  out[0].ndim = a->ndim;
  memcpy(out[0].shape, a->shape, sizeof out[0].shape);
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] < 0)
      return rm_fail(ctx, RM_ERR_ARG, "fill: size %lld of dimension %d is negative", (long long)a->shape[d], d + 1);
  return RM_OK;
}

/* ---- cost models: FLOPs per output element where one is wrong ---- */

#define COST(nm, k) \
  static double nm##_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) { \
    return (k) * (double)rm_meta_numel(&out[0]);                                                    \
  }
COST(pow, 20)
COST(pow_scalar, 20)
COST(exp, 8)
COST(log, 8)
COST(tanh, 10)
COST(sqrt, 4)
COST(gelu, 20)
COST(gelu_tanh, 16)
COST(silu, 12)
COST(sigmoid, 10)
COST(gelu_backward, 25)
COST(silu_backward, 16)
COST(gelu_tanh_backward, 22)
COST(where, 1)
COST(data_movement, 0)
#undef COST

/* ---- definitions ---- */

#define EW_BINARY (RM_OPF_STRIDED | RM_OPF_BROADCAST)
#define BINARY(nm, bw, save, fl) \
  const rm_op_def rm_opdef_##nm = { .name = #nm, .nin = 2, .nout = 1, .nvis = 1, \
    .flags = EW_BINARY, .save_in = save, .backward = bw, .flops = fl };
#define COMPARE(nm) \
  const rm_op_def rm_opdef_##nm = { .name = #nm, .nin = 2, .nout = 1, .nvis = 1, \
    .flags = EW_BINARY | RM_OPF_NODIFF };
#define UNARY(nm, bw, sin, sout, fl) \
  const rm_op_def rm_opdef_##nm = { .name = #nm, .nin = 1, .nout = 1, .nvis = 1, \
    .flags = RM_OPF_STRIDED, .save_in = sin, .save_out = sout, .backward = bw, .flops = fl };

BINARY(add, add_backward, 0, NULL)
BINARY(sub, sub_backward, 0, NULL)
BINARY(mul, mul_backward, RM_NTH(0) | RM_NTH(1), NULL)
BINARY(div, div_backward, RM_NTH(0) | RM_NTH(1), NULL)
BINARY(pow, pow_backward, RM_NTH(0) | RM_NTH(1), pow_flops)
BINARY(maximum, maximum_backward, RM_NTH(0) | RM_NTH(1), NULL)

COMPARE(eq)
COMPARE(ne)
COMPARE(lt)
COMPARE(le)
COMPARE(gt)
COMPARE(ge)

/* add_scalar / mul_scalar on an integer tensor: the scalar must be a whole number in
 * its range (an int64 tensor plus 0.5 has no int64 answer; convert to float first). */
static int int_scalar_infer(rm_ctx *ctx, const char *op, rm_tensor *x, const rm_attrs *a, rm_meta *out) {
  rm_tensor_meta(x, &out[0]);
  int64_t v;
  double s = a->scalar.value;
  if (rm_dtype_is_int(x->dtype) && (!rm_float_to_int(s, x->dtype, &v) || (double)v != s))
    return rm_fail(ctx, RM_ERR_ARG, "%s: %.17g is not a whole number in the range of %s (the tensor's dtype); "
                   "convert the tensor with x:to('float32') first", op, s, rm_dtype_name(x->dtype));
  return RM_OK;
}
static int add_scalar_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  return int_scalar_infer(ctx, "add_scalar", in[0], a, out);
}
static int mul_scalar_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  return int_scalar_infer(ctx, "mul_scalar", in[0], a, out);
}
const rm_op_def rm_opdef_add_scalar = { .name = "add_scalar", .nin = 1, .nout = 1, .nvis = 1,
  .flags = RM_OPF_STRIDED, .infer = add_scalar_infer, .backward = pass_backward };
const rm_op_def rm_opdef_mul_scalar = { .name = "mul_scalar", .nin = 1, .nout = 1, .nvis = 1,
  .flags = RM_OPF_STRIDED, .infer = mul_scalar_infer, .backward = mul_scalar_backward };
UNARY(pow_scalar, pow_scalar_backward, RM_NTH(0), 0, pow_scalar_flops)
UNARY(rdiv_scalar, rdiv_scalar_backward, RM_NTH(0), 0, NULL)

UNARY(neg, neg_backward, 0, 0, NULL)
UNARY(exp, exp_backward, 0, RM_NTH(0), exp_flops)
UNARY(log, log_backward, RM_NTH(0), 0, log_flops)
UNARY(tanh, tanh_backward, 0, RM_NTH(0), tanh_flops)
UNARY(sqrt, sqrt_backward, 0, RM_NTH(0), sqrt_flops)
UNARY(abs, abs_backward, RM_NTH(0), 0, NULL)
UNARY(relu, relu_backward, 0, RM_NTH(0), NULL)
UNARY(gelu, gelu_backward, RM_NTH(0), 0, gelu_flops)
UNARY(gelu_tanh, gelu_tanh_backward, RM_NTH(0), 0, gelu_tanh_flops)
UNARY(silu, silu_backward, RM_NTH(0), 0, silu_flops)
UNARY(sigmoid, sigmoid_backward, 0, RM_NTH(0), sigmoid_flops)
UNARY(copy, pass_backward, 0, 0, data_movement_flops)

/* clamp: lo, hi (-inf / inf: none); NaN stays NaN. */
const rm_op_def rm_opdef_clamp = { .name = "clamp", .nin = 1, .nout = 1, .nvis = 1,
  .flags = RM_OPF_STRIDED, .save_in = RM_NTH(0), .infer = clamp_infer, .backward = clamp_backward };

const rm_op_def rm_opdef_where = { .name = "where", .nin = 3, .nout = 1, .nvis = 1,
  .flags = EW_BINARY, .save_in = RM_NTH(0), .backward = where_backward, .flops = where_flops };

/* gelu_backward(x, g) = g gelu'(x); likewise gelu_tanh_backward and silu_backward. */
const rm_op_def rm_opdef_gelu_backward = { .name = "gelu_backward", .nin = 2, .nout = 1, .nvis = 1,
  .flags = EW_BINARY | RM_OPF_NODIFF | RM_OPF_INTERNAL, .flops = gelu_backward_flops };
const rm_op_def rm_opdef_silu_backward = { .name = "silu_backward", .nin = 2, .nout = 1, .nvis = 1,
  .flags = EW_BINARY | RM_OPF_NODIFF | RM_OPF_INTERNAL, .flops = silu_backward_flops };
const rm_op_def rm_opdef_gelu_tanh_backward = { .name = "gelu_tanh_backward", .nin = 2, .nout = 1, .nvis = 1,
  .flags = EW_BINARY | RM_OPF_NODIFF | RM_OPF_INTERNAL, .flops = gelu_tanh_backward_flops };

/* cast: dtype, the target. fill: value, dtype, device, shape. */
const rm_op_def rm_opdef_cast = { .name = "cast", .nin = 1, .nout = 1, .nvis = 1,
  .flags = RM_OPF_STRIDED, .infer = cast_infer, .backward = cast_backward,
  .flops = data_movement_flops };
const rm_op_def rm_opdef_fill = { .name = "fill", .nin = 0, .nout = 1, .nvis = 1,
  .flags = RM_OPF_NODIFF, .infer = fill_infer, .flops = data_movement_flops };
