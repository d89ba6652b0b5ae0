/* Losses: cross_entropy (logits (N,C), 1-based labels (N)) and mse, both means; their
 * output is a 0-d tensor. An empty batch gives NaN (a mean of nothing), as in PyTorch.
 *
 *   cross_entropy(logits, labels)             mean over rows of -log_softmax(row)[label];
 *                                             saves logits and labels, not probabilities
 *   cross_entropy_backward(logits, labels, g) (softmax(logits) - onehot(labels)) * g / N;
 *                                             g: the 0-d gradient of the loss. Its kernels
 *                                             may write over the logits (each row is read
 *                                             whole before any of it is written)
 *   mse(pred, target)                         mean of (pred - target)^2, same shapes
 *
 * Labels are float32 or float64 whatever the logits' dtype; the kernels check their
 * range (they see the values). */
#include "opcost.h"
#include "ops.h"

rm_tensor *rm_cross_entropy(rm_ctx *ctx, rm_tensor *logits, rm_tensor *labels) {
  rm_tensor *in[2] = { logits, labels };
  return rm_op1(ctx, RM_OP_CROSS_ENTROPY, 2, in, NULL);
}

rm_tensor *rm_mse(rm_ctx *ctx, rm_tensor *pred, rm_tensor *target) {
  rm_tensor *in[2] = { pred, target };
  return rm_op1(ctx, RM_OP_MSE, 2, in, NULL);
}

/* ---- cross_entropy ---- */

static int check_logits_labels(rm_ctx *ctx, const char *op, rm_tensor *logits, rm_tensor *labels) {
  char s1[96], s2[96];
  if (logits->ndim != 2)
    return rm_fail(ctx, RM_ERR_SHAPE, "%s: the logits must be 2-D (N x C), got %s (reshape to N x C first)", op,
                   rm_tensor_shape_str(logits, s1, sizeof s1));
  if (labels->device != logits->device)
    return rm_fail(ctx, RM_ERR_DEVICE, "%s: the labels are on %s but the logits are on %s", op,
                   rm_device_name(labels->device), rm_device_name(logits->device));
  if (rm_check_index_dtype(ctx, op, "the labels", labels)) return ctx->err_code;
  if (labels->ndim != 1 || labels->shape[0] != logits->shape[0])
    return rm_fail(ctx, RM_ERR_SHAPE, "%s: the labels must be 1-D with one label per row of the logits (%s), got %s", op,
                   rm_tensor_shape_str(logits, s1, sizeof s1), rm_tensor_shape_str(labels, s2, sizeof s2));
  return RM_OK;
}

static int cross_entropy_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  if (check_logits_labels(ctx, "cross_entropy", in[0], in[1])) return ctx->err_code;
  out[0] = (rm_meta){ in[0]->dtype, in[0]->device, 0, { 0 } };
  return RM_OK;
}

/* Whether dlogits may be written over the logits: nothing reads these values after this
 * backward. This node's saved slot is their only data user (no Lua handle, no other
 * node saved them, no engine pin: a plan that keeps them holds a use), no other tensor
 * views the storage (a freed (B, T, V) base of an (N, V) view has dropped it), and they
 * are contiguous from its start. Anything else (the caller still holds the logits, the
 * op before the loss saved its output for its own backward) gets a new tensor. */
static bool logits_reusable(const rm_tensor *x) {
  return x->users == 1 && x->pins == 0 && x->storage && x->storage->refcount == 1 && x->offset == 0 &&
         rm_tensor_is_contiguous(x);
}

/* dlogits in place: a new tensor object over the logits' storage, written by the kernel
 * (its version moves on, so a stray reader of the old values errors). */
static rm_tensor *backward_in_place(rm_ctx *ctx, rm_tensor *const *in) {
  rm_tensor *x = in[0];
  rm_tensor *gx = rm_tensor_view_of(ctx, x, x->ndim, x->shape, x->stride, x->offset);
  if (!gx) return NULL;
  double t0 = ctx->op_timing ? rm_opcost_clock() : 0;
  if (rm_op_into(ctx, RM_OP_CROSS_ENTROPY_BACKWARD, 3, in, NULL, 1, &gx)) {
    rm_tensor_drop(ctx, gx);
    return NULL;
  }
  if (ctx->op_timing && !ctx->dry) rm_opcost_record(ctx, RM_OP_CROSS_ENTROPY_BACKWARD, 3, in, NULL, rm_opcost_clock() - t0);
  return gx;
}

static int cross_entropy_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  if (!rm_node_needs_grad(n, 0)) return RM_OK;
  rm_tensor *logits = rm_node_input(ctx, n, 0);
  rm_tensor *labels = logits ? rm_node_input(ctx, n, 1) : NULL;
  if (!labels) return ctx->err_code;
  rm_tensor *in[3] = { logits, labels, g[0] };
  if (logits_reusable(logits)) gin[0] = backward_in_place(ctx, in);
  else gin[0] = rm_op1(ctx, RM_OP_CROSS_ENTROPY_BACKWARD, 3, in, NULL);
  return gin[0] ? RM_OK : ctx->err_code;
}

/* Per row: max, exp-sum, log, pick: about 4 flops per logit. */
static double cross_entropy_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return 4.0 * (double)rm_tensor_numel(in[0]);
}

const rm_op_def rm_opdef_cross_entropy = {
  .name = "cross_entropy", .nin = 2, .nout = 1, .nvis = 1, .save_in = RM_NTH(0) | RM_NTH(1),
  .index_in = RM_NTH(1), .infer = cross_entropy_infer, .backward = cross_entropy_backward, .flops = cross_entropy_flops,
};

static int cross_entropy_backward_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a,
                                        rm_meta *out) {
  const char *op = "cross_entropy_backward";
  if (check_logits_labels(ctx, op, in[0], in[1])) return ctx->err_code;
  rm_tensor *g = in[2];
  char s[96];
  if (rm_tensor_numel(g) != 1)
    return rm_fail(ctx, RM_ERR_SHAPE, "%s: the loss gradient must have one element, got %s", op,
                   rm_tensor_shape_str(g, s, sizeof s));
  if (g->device != in[0]->device || g->dtype != in[0]->dtype)
    return rm_fail(ctx, RM_ERR_DTYPE, "%s: the loss gradient is %s on %s but the logits are %s on %s", op,
                   rm_dtype_name(g->dtype), rm_device_name(g->device), rm_dtype_name(in[0]->dtype),
                   rm_device_name(in[0]->device));
  rm_tensor_meta(in[0], &out[0]);
  return RM_OK;
}

const rm_op_def rm_opdef_cross_entropy_backward = {
  .name = "cross_entropy_backward", .nin = 3, .nout = 1, .nvis = 1,
  .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL, .index_in = RM_NTH(1),
  .infer = cross_entropy_backward_infer, .flops = cross_entropy_flops,
};

/* ---- mse ---- */

static int mse_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  if (rm_check_same_device(ctx, "mse", nin, in) || rm_check_same_dtype(ctx, "mse", nin, in))
    return ctx->err_code;
  if (!rm_same_shape(in[0], in[1])) {
    char s1[96], s2[96];
    return rm_fail(ctx, RM_ERR_SHAPE, "mse: the prediction is %s but the target is %s (shapes must match; no broadcasting)",
                   rm_tensor_shape_str(in[0], s1, sizeof s1), rm_tensor_shape_str(in[1], s2, sizeof s2));
  }
  out[0] = (rm_meta){ in[0]->dtype, in[0]->device, 0, { 0 } };
  return RM_OK;
}

/* d/dpred = 2 (pred - target) g / N; d/dtarget is its negation. */
static int mse_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *pred = rm_node_input(ctx, n, 0);
  rm_tensor *target = pred ? rm_node_input(ctx, n, 1) : NULL;
  if (!target) return ctx->err_code;
  double scale = 2.0 / (double)rm_tensor_numel(pred);
  rm_tensor *diff = rm_sub(ctx, pred, target);
  rm_tensor *dg = diff ? rm_mul(ctx, diff, g[0]) : NULL;
  rm_tensor *gp = dg ? rm_scalar_op(ctx, RM_OP_MUL_SCALAR, dg, scale) : NULL;
  rm_tensor_drop(ctx, diff);
  rm_tensor_drop(ctx, dg);
  if (!gp) return ctx->err_code;
  if (rm_node_needs_grad(n, 1)) {
    gin[1] = rm_unary(ctx, RM_OP_NEG, gp);
    if (!gin[1]) { rm_tensor_drop(ctx, gp); return ctx->err_code; }
  }
  if (rm_node_needs_grad(n, 0)) gin[0] = gp;
  else rm_tensor_drop(ctx, gp);
  return RM_OK;
}

/* Subtract, square, add: 3 flops per element. */
static double mse_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return 3.0 * (double)rm_tensor_numel(in[0]);
}

const rm_op_def rm_opdef_mse = {
  .name = "mse", .nin = 2, .nout = 1, .nvis = 1, .save_in = RM_NTH(0) | RM_NTH(1),
  .infer = mse_infer, .backward = mse_backward, .flops = mse_flops,
};
