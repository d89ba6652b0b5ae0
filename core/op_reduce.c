/* Reductions (sum, mean, max, argmax, sum_to) and softmax / log_softmax.
 * Attrs (core/ops.def): reduce {dim, keepdim} (dim 0-based, negatives count from the
 * end; RM_DIM_ALL: every dim); sum_to: shape; the softmax family: softmax {dim, scale,
 * causal} (of scale * x; causal: over the last dim of (..., T, T), row i seeing columns
 * j <= i, as causal_mask(scale * x) does in two more passes over the scores).
 * Internal helpers: softmax_backward(y, g) and log_softmax_backward(y, g), with the
 * forward's attrs (the gradient of x: scale times the usual one, 0 where masked). */

#include <math.h>
#include <string.h>

#include "ops.h"

static rm_tensor *reduce(rm_ctx *ctx, rm_op_id op, rm_tensor *a, int64_t dim, bool keepdim) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.reduce.dim = dim;
  at.reduce.keepdim = keepdim;
  return rm_op1(ctx, op, 1, &a, &at);
}

rm_tensor *rm_sum(rm_ctx *ctx, rm_tensor *a, int64_t dim, bool keepdim) { return reduce(ctx, RM_OP_SUM, a, dim, keepdim); }
rm_tensor *rm_mean(rm_ctx *ctx, rm_tensor *a, int64_t dim, bool keepdim) { return reduce(ctx, RM_OP_MEAN, a, dim, keepdim); }
rm_tensor *rm_argmax(rm_ctx *ctx, rm_tensor *a, int64_t dim, bool keepdim) { return reduce(ctx, RM_OP_ARGMAX, a, dim, keepdim); }

rm_tensor *rm_max(rm_ctx *ctx, rm_tensor *a, int64_t dim, bool keepdim, rm_tensor **indices) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.reduce.dim = dim;
  at.reduce.keepdim = keepdim;
  rm_tensor *out[2] = { 0 };
  if (rm_op_run(ctx, RM_OP_MAX, 1, &a, &at, out) != RM_OK) return NULL;
  if (indices) *indices = out[1];
  else rm_tensor_drop(ctx, out[1]);
  return out[0];
}

rm_tensor *rm_sum_to(rm_ctx *ctx, rm_tensor *a, int ndim, const int64_t *shape) {
  rm_attrs at;
  rm_attrs_init(&at);
  if (ndim < 0 || ndim > RM_MAX_DIM) {
    rm_fail(ctx, RM_ERR_ARG, "sum_to: at most %d dimensions", RM_MAX_DIM);
    return NULL;
  }
  at.ndim = ndim;
  memcpy(at.shape, shape, sizeof(int64_t) * (size_t)ndim);
  return rm_op1(ctx, RM_OP_SUM_TO, 1, &a, &at);
}

static rm_tensor *softmax_op(rm_ctx *ctx, rm_op_id op, rm_tensor *a, int64_t dim, double scale, bool causal) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.softmax.dim = dim;
  at.softmax.scale = scale;
  at.softmax.causal = causal;
  return rm_op1(ctx, op, 1, &a, &at);
}

rm_tensor *rm_softmax(rm_ctx *ctx, rm_tensor *a, int64_t dim) { return softmax_op(ctx, RM_OP_SOFTMAX, a, dim, 1, false); }
rm_tensor *rm_log_softmax(rm_ctx *ctx, rm_tensor *a, int64_t dim) { return softmax_op(ctx, RM_OP_LOG_SOFTMAX, a, dim, 1, false); }
rm_tensor *rm_softmax_scaled(rm_ctx *ctx, rm_tensor *a, double scale, bool causal) {
  return softmax_op(ctx, RM_OP_SOFTMAX, a, -1, scale, causal);
}

/* ---- shapes ---- */

/* rm_check_dim, also accepting -1 for a 0-d tensor (as 0 is): PyTorch's convention. */
static int check_dim(rm_ctx *ctx, const char *op, int64_t dim, int ndim, int *d) {
  if (ndim == 0 && dim == -1) { *d = 0; return RM_OK; }
  return rm_check_dim(ctx, op, dim, ndim, d);
}

/* Output meta of reducing `in` over a->reduce.dim (keepdim too); *d receives
 * the normalised dim (-1: every dim). Raises on a dim out of range. */
static int reduced_meta(rm_ctx *ctx, const char *op, rm_tensor *in, const rm_attrs *a,
                        rm_meta *out, int *d) {
  rm_tensor_meta(in, out);
  bool keep = a->reduce.keepdim;
  int64_t dim = a->reduce.dim;
  if (dim == RM_DIM_ALL || in->ndim == 0) {
    if (in->ndim == 0 && dim != RM_DIM_ALL && check_dim(ctx, op, dim, 0, d)) return ctx->err_code;
    *d = -1;
    if (keep) for (int k = 0; k < in->ndim; k++) out->shape[k] = 1;
    else out->ndim = 0;
    return RM_OK;
  }
  if (check_dim(ctx, op, dim, in->ndim, d)) return ctx->err_code;
  if (keep) {
    out->shape[*d] = 1;
  } else {
    for (int k = *d; k < in->ndim - 1; k++) out->shape[k] = out->shape[k + 1];
    out->ndim--;
  }
  return RM_OK;
}

/* The reduced shape with the reduced dims kept as size 1 (for broadcasting back). */
static void keepdim_shape(rm_tensor *in, int d, int64_t *shape) {
  for (int k = 0; k < in->ndim; k++) shape[k] = (d < 0 || k == d) ? 1 : in->shape[k];
}

static int sum_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  int d;
  if (reduced_meta(ctx, "sum", in[0], a, &out[0], &d)) return ctx->err_code;
  if (rm_dtype_is_int(in[0]->dtype)) out[0].dtype = RM_I64; /* integer sums are int64, as in PyTorch */
  return RM_OK;
}

static int mean_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  int d;
  return reduced_meta(ctx, "mean", in[0], a, &out[0], &d);
}

/* max / argmax: a max over nothing has no value (as in PyTorch, an error). */
static int max_meta(rm_ctx *ctx, const char *op, rm_tensor *in, const rm_attrs *a, rm_meta *out) {
  int d;
  if (reduced_meta(ctx, op, in, a, out, &d)) return ctx->err_code;
  int64_t n = d < 0 ? rm_tensor_numel(in) : in->shape[d];
  if (n == 0 && (d < 0 || rm_meta_numel(out) > 0)) {
    char s[96];
    return rm_fail(ctx, RM_ERR_SHAPE, "%s: cannot reduce over an empty dimension (input %s)", op,
                   rm_tensor_shape_str(in, s, sizeof s));
  }
  return RM_OK;
}


static int max_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  if (max_meta(ctx, "max", in[0], a, &out[0])) return ctx->err_code;
  out[1] = out[0];
  out[1].dtype = RM_I64; /* 1-based indices */
  return RM_OK;
}

static int argmax_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  if (max_meta(ctx, "argmax", in[0], a, &out[0])) return ctx->err_code;
  out[0].dtype = RM_I64;
  return RM_OK;
}

static int sum_to_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  rm_tensor *x = in[0];
  int off = x->ndim - a->ndim;
  bool ok = a->ndim >= 0 && off >= 0;
  for (int d = 0; ok && d < a->ndim; d++)
    ok = a->shape[d] >= 0 && (a->shape[d] == x->shape[d + off] || a->shape[d] == 1);
  if (!ok) {
    char s1[96], s2[96];
    return rm_fail(ctx, RM_ERR_SHAPE, "sum_to: cannot sum %s down to %s (not a broadcast of it)",
                   rm_tensor_shape_str(x, s1, sizeof s1), rm_shape_str(a->ndim, a->shape, s2, sizeof s2));
  }
  out[0].dtype = x->dtype;
  out[0].device = x->device;
  out[0].ndim = a->ndim;
  memcpy(out[0].shape, a->shape, sizeof out[0].shape);
  return RM_OK;
}

static int softmax_infer_named(rm_ctx *ctx, const char *op, rm_tensor *x, const rm_attrs *a, rm_meta *out) {
  int d;
  if (check_dim(ctx, op, a->softmax.dim, x->ndim, &d)) return ctx->err_code;
  if (!isfinite(a->softmax.scale))
    return rm_fail(ctx, RM_ERR_ARG, "%s: scale must be a finite number, got %g", op, a->softmax.scale);
  if (a->softmax.causal) {
    char s[96];
    if (x->ndim < 2 || x->shape[x->ndim - 1] != x->shape[x->ndim - 2])
      return rm_fail(ctx, RM_ERR_SHAPE, "%s: causal scores must be (..., T, T), got %s", op,
                     rm_tensor_shape_str(x, s, sizeof s));
    if (d != x->ndim - 1)
      return rm_fail(ctx, RM_ERR_ARG, "%s: causal masking runs over the last dim, not dim %d of %d",
                     op, d, x->ndim);
  }
  rm_tensor_meta(x, &out[0]);
  return RM_OK;
}

static int softmax_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  return softmax_infer_named(ctx, "softmax", in[0], a, out);
}

static int log_softmax_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  return softmax_infer_named(ctx, "log_softmax", in[0], a, out);
}

/* (y, g) of the same shape, dtype and device. */
static int softmax_bw_check(rm_ctx *ctx, const char *op, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  if (rm_check_same_device(ctx, op, 2, in) || rm_check_same_dtype(ctx, op, 2, in)) return ctx->err_code;
  if (!rm_same_shape(in[0], in[1]) || in[0]->ndim != in[1]->ndim) {
    char s1[96], s2[96];
    return rm_fail(ctx, RM_ERR_SHAPE, "%s: output %s and gradient %s differ in shape", op,
                   rm_tensor_shape_str(in[0], s1, sizeof s1), rm_tensor_shape_str(in[1], s2, sizeof s2));
  }
  return softmax_infer_named(ctx, op, in[0], a, out);
}

static int softmax_bw_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  return softmax_bw_check(ctx, "softmax_backward", in, a, out);
}

static int log_softmax_bw_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  return softmax_bw_check(ctx, "log_softmax_backward", in, a, out);
}

/* ---- backward rules ---- */

/* g (a reduction result) broadcast back to x's shape as a new contiguous tensor;
 * kshape is the reduced shape with size-1 dims kept. */
static rm_tensor *spread(rm_ctx *ctx, rm_tensor *g, rm_tensor *x, const int64_t *kshape) {
  rm_tensor *r = rm_reshape(ctx, g, x->ndim, kshape);
  rm_tensor *e = r ? rm_expand(ctx, r, x->ndim, x->shape) : NULL;
  rm_tensor *c = e ? rm_copy(ctx, e) : NULL;
  rm_tensor_drop(ctx, r);
  rm_tensor_drop(ctx, e);
  return c;
}

static int norm_dim(rm_ctx *ctx, const rm_node *n) {
  rm_tensor *x = n->in[0];
  if (n->attrs.reduce.dim == RM_DIM_ALL || x->ndim == 0) return -1;
  int d = -1;
  rm_check_dim(ctx, rm_op_name(n->op), n->attrs.reduce.dim, x->ndim, &d);
  return d;
}

static int sum_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  int64_t ks[RM_MAX_DIM];
  keepdim_shape(n->in[0], norm_dim(ctx, n), ks);
  gin[0] = spread(ctx, g[0], n->in[0], ks);
  return gin[0] ? RM_OK : ctx->err_code;
}

static int mean_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  int64_t ks[RM_MAX_DIM];
  keepdim_shape(n->in[0], norm_dim(ctx, n), ks);
  int64_t nx = rm_tensor_numel(n->in[0]), ng = rm_tensor_numel(g[0]);
  double scale = nx && ng ? (double)ng / (double)nx : 0.0;
  rm_tensor *s = rm_scalar_op(ctx, RM_OP_MUL_SCALAR, g[0], scale);
  if (!s) return ctx->err_code;
  gin[0] = spread(ctx, s, n->in[0], ks);
  rm_tensor_drop(ctx, s);
  return gin[0] ? RM_OK : ctx->err_code;
}

static int sum_to_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *x = n->in[0];
  rm_tensor *e = rm_expand(ctx, g[0], x->ndim, x->shape);
  gin[0] = e ? rm_copy(ctx, e) : NULL;
  rm_tensor_drop(ctx, e);
  return gin[0] ? RM_OK : ctx->err_code;
}

/* The gradient goes to the first maximum: g scattered at the saved (1-based) indices
 * into zeros of x's shape, along the reduced dim (over every dim: on the flat view). */
static int max_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *x = n->in[0];
  rm_tensor *idx = rm_node_output(ctx, n, 1);
  if (!idx) return ctx->err_code;
  int d = norm_dim(ctx, n);
  rm_attrs at;
  rm_attrs_init(&at);
  int64_t ks[RM_MAX_DIM];
  int kn;
  if (d < 0) {
    kn = 1;
    ks[0] = 1;
    at.scatter_add.dim = 0;
    at.ndim = 1;
    at.shape[0] = rm_tensor_numel(x);
  } else {
    kn = x->ndim;
    keepdim_shape(x, d, ks);
    at.scatter_add.dim = d;
    at.ndim = x->ndim;
    memcpy(at.shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
  }
  rm_tensor *gk = rm_reshape(ctx, g[0], kn, ks);
  rm_tensor *ik = gk ? rm_reshape(ctx, idx, kn, ks) : NULL;
  rm_tensor *in[2] = { gk, ik };
  rm_tensor *s = ik ? rm_op1(ctx, RM_OP_SCATTER_ADD, 2, in, &at) : NULL;
  rm_tensor_drop(ctx, gk);
  rm_tensor_drop(ctx, ik);
  if (!s) return ctx->err_code;
  if (d >= 0) { gin[0] = s; return RM_OK; }
  gin[0] = rm_reshape(ctx, s, x->ndim, x->shape);
  rm_tensor_drop(ctx, s);
  return gin[0] ? RM_OK : ctx->err_code;
}

static int softmax_like_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin,
                                 rm_op_id bw) {
  rm_tensor *y = rm_node_output(ctx, n, 0);
  if (!y) return ctx->err_code;
  rm_tensor *in[2] = { y, g[0] };
  gin[0] = rm_op1(ctx, bw, 2, in, &n->attrs);
  return gin[0] ? RM_OK : ctx->err_code;
}

static int softmax_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  return softmax_like_backward(ctx, n, g, gin, RM_OP_SOFTMAX_BACKWARD);
}

static int log_softmax_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  return softmax_like_backward(ctx, n, g, gin, RM_OP_LOG_SOFTMAX_BACKWARD);
}

/* ---- cost models ---- */

static double in_numel_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return (double)rm_tensor_numel(in[0]);
}

/* max, exp, sum, scale per element. */
static double softmax_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return 4.0 * (double)rm_tensor_numel(in[0]);
}

/* ---- definitions ---- */

const rm_op_def rm_opdef_sum = { .name = "sum", .nin = 1, .nout = 1, .nvis = 1,
  .infer = sum_infer, .backward = sum_backward, .flops = in_numel_flops };
const rm_op_def rm_opdef_mean = { .name = "mean", .nin = 1, .nout = 1, .nvis = 1,
  .infer = mean_infer, .backward = mean_backward, .flops = in_numel_flops };
const rm_op_def rm_opdef_max = { .name = "max", .nin = 1, .nout = 2, .nvis = 2,
  .save_out = RM_NTH(1), .nodiff_out = RM_NTH(1), .index_out = RM_NTH(1),
  .infer = max_infer, .backward = max_backward, .flops = in_numel_flops };
const rm_op_def rm_opdef_argmax = { .name = "argmax", .nin = 1, .nout = 1, .nvis = 1,
  .flags = RM_OPF_NODIFF, .index_out = RM_NTH(0), .infer = argmax_infer, .flops = in_numel_flops };
const rm_op_def rm_opdef_sum_to = { .name = "sum_to", .nin = 1, .nout = 1, .nvis = 1,
  .infer = sum_to_infer, .backward = sum_to_backward, .flops = in_numel_flops };
const rm_op_def rm_opdef_softmax = { .name = "softmax", .nin = 1, .nout = 1, .nvis = 1,
  .save_out = RM_NTH(0), .infer = softmax_infer, .backward = softmax_backward, .flops = softmax_flops };
const rm_op_def rm_opdef_log_softmax = { .name = "log_softmax", .nin = 1, .nout = 1, .nvis = 1,
  .save_out = RM_NTH(0), .infer = log_softmax_infer, .backward = log_softmax_backward, .flops = softmax_flops };
const rm_op_def rm_opdef_softmax_backward = { .name = "softmax_backward", .nin = 2, .nout = 1,
  .nvis = 1, .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL, .infer = softmax_bw_infer, .flops = softmax_flops };
const rm_op_def rm_opdef_log_softmax_backward = { .name = "log_softmax_backward", .nin = 2,
  .nout = 1, .nvis = 1, .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL, .infer = log_softmax_bw_infer,
  .flops = softmax_flops };
