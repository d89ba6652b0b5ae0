/* Batch normalisation in training mode: statistics per channel (dim 1) over every
 * other dim. Attrs: norm {eps}.
 *   batchnorm(x[, w[, b]])  x (N, C, *), w and b (C) -> y like x, mean (C), var (C):
 *     y = (x - mean) / sqrt(var + eps) [* w] [+ b], with the batch's mean and biased
 *     variance; mean and var are visible but not differentiable (nn.BatchNorm moves its
 *     running statistics with them, outside the tape) and are kept for backward with x
 *     and w. Statistics are float32 for bfloat16 inputs.
 *   batchnorm_backward(x, mean, var, g[, w])  (internal) -> gx, gw, gb (gw, gb (C));
 *     attrs batchnorm_backward {eps, want}: gx when want has bit 0 (else zeros); gw and gb,
 *     per-channel sums the input gradient needs anyway, always.
 * One fused op instead of BatchNorm written with ops (mean, sub, mul, pow, add and their
 * backwards: about 15 passes over the activation, half of a small CNN's step). */
#include "ops.h"

static rm_dtype stats_dtype(rm_dtype dt) { return dt == RM_F64 ? RM_F64 : RM_F32; }

static const char *const bn_names[] = { "weight", "bias" };

static int batchnorm_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  if (nin < 1 || nin > 3) return rm_fail(ctx, RM_ERR_ARG, "batchnorm: takes 1 to 3 tensors (got %d)", nin);
  if (rm_check_same_device(ctx, "batchnorm", nin, in) || rm_check_same_dtype(ctx, "batchnorm", nin, in))
    return ctx->err_code;
  rm_tensor *x = in[0];
  char s[96];
  if (x->ndim < 2)
    return rm_fail(ctx, RM_ERR_SHAPE, "batchnorm: expected (N, C, ...) with at least 2 dims, got %s",
                   rm_tensor_shape_str(x, s, sizeof s));
  if (!(a->norm.eps > 0)) return rm_fail(ctx, RM_ERR_ARG, "batchnorm: eps must be > 0 (got %g)", a->norm.eps);
  int64_t C = x->shape[1];
  for (int i = 1; i < nin; i++)
    if (rm_check_shape(ctx, "batchnorm", bn_names[i - 1], in[i], 1, &C)) return ctx->err_code;
  rm_tensor_meta(x, &out[0]);
  for (int j = 1; j < 3; j++) {
    rm_tensor_meta(x, &out[j]);
    out[j].ndim = 1;
    out[j].shape[0] = C;
    out[j].dtype = stats_dtype(x->dtype);
  }
  return RM_OK;
}

static int batchnorm_bw_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  const char *op = "batchnorm_backward";
  if (nin < 4 || nin > 5) return rm_fail(ctx, RM_ERR_ARG, "%s: takes 4 or 5 tensors (got %d)", op, nin);
  if (rm_check_same_device(ctx, op, nin, in)) return ctx->err_code;
  rm_tensor *x = in[0];
  if (x->ndim < 2) return rm_fail(ctx, RM_ERR_SHAPE, "%s: expected (N, C, ...) with at least 2 dims", op);
  int64_t C = x->shape[1];
  for (int i = 1; i < nin; i++) {
    rm_dtype want = i <= 2 ? stats_dtype(x->dtype) : x->dtype;
    if (in[i]->dtype != want)
      return rm_fail(ctx, RM_ERR_DTYPE, "%s: %s is %s, expected %s", op, i <= 2 ? "a statistic" : "a tensor",
                     rm_dtype_name(in[i]->dtype), rm_dtype_name(want));
  }
  if (rm_check_shape(ctx, op, "a statistic", in[1], 1, &C) || rm_check_shape(ctx, op, "a statistic", in[2], 1, &C) ||
      rm_check_shape(ctx, op, "the gradient", in[3], x->ndim, x->shape) ||
      (nin > 4 && rm_check_shape(ctx, op, "weight", in[4], 1, &C)))
    return ctx->err_code;
  rm_tensor_meta(x, &out[0]);
  for (int j = 1; j < 3; j++) {
    rm_tensor_meta(x, &out[j]);
    out[j].ndim = 1;
    out[j].shape[0] = C;
  }
  return RM_OK;
}

/* (x, mean, var, g[, w]) -> the wanted gradients of x, w, b. */
static int batchnorm_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *args[5];
  int k = 0;
  if (!(args[k++] = rm_node_input(ctx, n, 0)) || !(args[k++] = rm_node_output(ctx, n, 1)) ||
      !(args[k++] = rm_node_output(ctx, n, 2)))
    return ctx->err_code;
  args[k++] = g[0];
  if (n->nin > 1 && !(args[k++] = rm_node_input(ctx, n, 1))) return ctx->err_code;
  rm_attrs at;
  rm_attrs_init(&at);
  at.batchnorm_backward.eps = n->attrs.norm.eps;
  for (int i = 0; i < n->nin; i++)
    if (rm_node_needs_grad(n, i)) at.batchnorm_backward.want |= 1 << i;
  rm_tensor *outs[3] = { 0 };
  if (rm_op_run(ctx, RM_OP_BATCHNORM_BACKWARD, k, args, &at, outs)) return ctx->err_code;
  for (int j = 0; j < 3; j++) {
    if (j < n->nin && rm_node_needs_grad(n, j)) gin[j] = outs[j];
    else rm_tensor_drop(ctx, outs[j]);
  }
  return RM_OK;
}

static double batchnorm_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return (5.0 + 2.0 * (nin > 1) + (nin > 2)) * (double)rm_tensor_numel(in[0]);
}

static double batchnorm_bw_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return 8.0 * (double)rm_tensor_numel(in[0]);
}

const rm_op_def rm_opdef_batchnorm = { .name = "batchnorm", .nin = -1, .nout = 3, .nvis = 3,
  .save_in = RM_NTH(0) | RM_NTH(1), .save_out = RM_NTH(1) | RM_NTH(2), .nodiff_out = RM_NTH(1) | RM_NTH(2),
  .infer = batchnorm_infer, .backward = batchnorm_backward, .flops = batchnorm_flops };
const rm_op_def rm_opdef_batchnorm_backward = { .name = "batchnorm_backward", .nin = -1, .nout = 3, .nvis = 3,
  .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL, .infer = batchnorm_bw_infer, .flops = batchnorm_bw_flops };
