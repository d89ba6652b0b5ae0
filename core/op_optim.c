/* Optimizer steps: fused elementwise updates, meant to run in place with rm_op_into
 * (outputs alias inputs: every element is read before it is written). Internal and
 * not differentiable. Semantics are exactly PyTorch's torch.optim.SGD / Adam / AdamW / RMSprop
 * (single-tensor path, maximize = false).
 *
 * sgd_step(param, grad, buf) -> (param, buf)
 *   sgd {lr, momentum, weight_decay, dampening, nesterov, first (the first step:
 *   buf = d_p instead of the momentum update)}
 *     d_p = grad + weight_decay * param
 *     momentum != 0: buf = first ? d_p : momentum * buf + (1 - dampening) * d_p
 *                    d_p = nesterov ? d_p + momentum * buf : buf
 *     param -= lr * d_p
 *   With momentum 0 the buffer is not used (left as it is; copied to a separate
 *   output tensor when it is not aliased).
 *
 * adamw_step(param, grad, m, v) -> (param, m, v)
 *   adamw {lr, beta1, beta2, eps, weight_decay, step t (>= 1, counting this step),
 *   decoupled (true: AdamW, false: Adam with L2)}
 *     decoupled: param *= 1 - lr * wd;  else: grad += wd * param
 *     m = lerp(m, grad, 1 - beta1);  v = beta2 * v + (1 - beta2) * grad^2
 *     param -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 *
 * adamw_multi_step(param_1, grad_1, m_1, v_1, ..., param_K, grad_K, m_K, v_K)
 *   adamw_step on K tensors in one call (the same attrs, so the same step count; K <= 64),
 *   in place on its inputs (RM_OPF_INPLACE: params, m and v are written; no outputs,
 *   run with rm_op_into and nout 0). Each element gets exactly adamw_step's arithmetic,
 *   so the results are the same bits; on CUDA it is one launch for all K tensors.
 *   The K groups share the device and the param and grad dtypes (a float32 master with
 *   bfloat16 grads, or one dtype).
 *
 * rmsprop_step(param, grad, square_avg, buf, grad_avg) -> (param, square_avg, buf, grad_avg)
 *   rmsprop {lr, alpha, eps, momentum, weight_decay, centered}
 *     grad += wd * param
 *     square_avg = alpha * square_avg + (1 - alpha) * grad^2
 *     centered: grad_avg = lerp(grad_avg, grad, 1 - alpha); avg = sqrt(square_avg - grad_avg^2) + eps
 *     else:     avg = sqrt(square_avg) + eps
 *     momentum != 0: buf = momentum * buf + grad / avg;  param -= lr * buf
 *     else:          param -= lr * (grad / avg)
 *   A state that is not used (buf without momentum, grad_avg when not centered) is left
 *   as it is, as sgd_step's buffer is; the caller may pass param in its place.
 *
 * A float32 param may take a bfloat16 grad (mixed precision: the param is the float32
 * master copy of a bfloat16 weight, the optimizer casts it back into the model).
 *
 * rm_op_into does not run infer, so the kernels run it themselves (through the
 * registry) and check that the outputs match the inputs before touching memory. */
#include <math.h>
#include <string.h>

#include "ops.h"

/* param, grad and state tensors: same shape, dtype and device, except that a float32
 * param (the master copy of a bfloat16 weight, see lua/remat/optim.lua) may take a
 * bfloat16 grad. */
static int check_state(rm_ctx *ctx, const char *op, int nin, rm_tensor *const *in) {
  static const char *const names[] = { "param", "grad", "state 1", "state 2", "state 3" };
  if (rm_check_same_device(ctx, op, nin, in)) return ctx->err_code;
  for (int i = 1; i < nin; i++) {
    bool ok = in[i]->dtype == in[0]->dtype || (i == 1 && in[0]->dtype == RM_F32 && in[i]->dtype == RM_BF16);
    if (!ok)
      return rm_fail(ctx, RM_ERR_DTYPE, "%s: %s is %s but param is %s", op, names[i], rm_dtype_name(in[i]->dtype),
                     rm_dtype_name(in[0]->dtype));
  }
  for (int i = 1; i < nin; i++)
    if (!rm_same_shape(in[i], in[0])) {
      char s1[96], s2[96];
      return rm_fail(ctx, RM_ERR_SHAPE, "%s: %s is %s but param is %s", op, names[i],
                     rm_tensor_shape_str(in[i], s1, sizeof s1), rm_tensor_shape_str(in[0], s2, sizeof s2));
    }
  return RM_OK;
}

static int sgd_step_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  const char *op = "sgd_step";
  if (check_state(ctx, op, nin, in)) return ctx->err_code;
  double lr = a->sgd.lr, momentum = a->sgd.momentum, wd = a->sgd.weight_decay, dampening = a->sgd.dampening;
  if (!(lr >= 0)) return rm_fail(ctx, RM_ERR_ARG, "%s: invalid learning rate %g", op, lr);
  if (!(momentum >= 0)) return rm_fail(ctx, RM_ERR_ARG, "%s: invalid momentum %g", op, momentum);
  if (!(wd >= 0)) return rm_fail(ctx, RM_ERR_ARG, "%s: invalid weight_decay %g", op, wd);
  if (!isfinite(dampening)) return rm_fail(ctx, RM_ERR_ARG, "%s: invalid dampening %g", op, dampening);
  if (a->sgd.nesterov && (momentum <= 0 || dampening != 0))
    return rm_fail(ctx, RM_ERR_ARG, "%s: nesterov momentum requires a momentum and zero dampening", op);
  rm_tensor_meta(in[0], &out[0]);
  out[1] = out[0];
  return RM_OK;
}

static double sgd_step_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return 6.0 * (double)rm_tensor_numel(in[0]);
}

const rm_op_def rm_opdef_sgd_step = {
  .name = "sgd_step", .nin = 3, .nout = 2, .nvis = 2, .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL,
  .infer = sgd_step_infer, .flops = sgd_step_flops,
};

static int adamw_step_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  const char *op = "adamw_step";
  if (check_state(ctx, op, nin, in)) return ctx->err_code;
  double lr = a->adamw.lr, b1 = a->adamw.beta1, b2 = a->adamw.beta2, eps = a->adamw.eps;
  double wd = a->adamw.weight_decay;
  if (!(lr >= 0)) return rm_fail(ctx, RM_ERR_ARG, "%s: invalid learning rate %g", op, lr);
  if (!(b1 >= 0 && b1 < 1)) return rm_fail(ctx, RM_ERR_ARG, "%s: invalid beta1 %g (must be in [0, 1))", op, b1);
  if (!(b2 >= 0 && b2 < 1)) return rm_fail(ctx, RM_ERR_ARG, "%s: invalid beta2 %g (must be in [0, 1))", op, b2);
  if (!(eps >= 0)) return rm_fail(ctx, RM_ERR_ARG, "%s: invalid eps %g", op, eps);
  if (!(wd >= 0))
    return rm_fail(ctx, RM_ERR_ARG, "%s: invalid weight_decay %g", op, wd);
  if (a->adamw.step < 1) return rm_fail(ctx, RM_ERR_ARG, "%s: step %lld must be >= 1", op, (long long)a->adamw.step);
  for (int j = 0; j < 3; j++) rm_tensor_meta(in[0], &out[j]);
  return RM_OK;
}

static double adamw_step_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return 14.0 * (double)rm_tensor_numel(in[0]);
}

const rm_op_def rm_opdef_adamw_step = {
  .name = "adamw_step", .nin = 4, .nout = 3, .nvis = 3, .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL,
  .infer = adamw_step_infer, .flops = adamw_step_flops,
};

static int adamw_multi_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  const char *op = "adamw_multi_step";
  if (nin < 4 || nin % 4)
    return rm_fail(ctx, RM_ERR_ARG, "%s takes (param, grad, m, v) groups: a multiple of 4 inputs (got %d)", op, nin);
  rm_meta m[3];
  for (int k = 0; k < nin; k += 4) {
    if (adamw_step_infer(ctx, 4, in + k, a, m)) return rm_fail_prefix(ctx, op);
    if (in[k]->device != in[0]->device || in[k]->dtype != in[0]->dtype || in[k + 1]->dtype != in[1]->dtype)
      return rm_fail(ctx, RM_ERR_ARG, "%s: tensor %d is %s (grad %s) on %s, tensor 1 %s (grad %s) on %s: one call "
                     "takes one device and one pair of dtypes", op, k / 4 + 1, rm_dtype_name(in[k]->dtype),
                     rm_dtype_name(in[k + 1]->dtype), rm_device_name(in[k]->device), rm_dtype_name(in[0]->dtype),
                     rm_dtype_name(in[1]->dtype), rm_device_name(in[0]->device));
    for (int i = k; i < k + 4; i++)
      if (!rm_tensor_is_contiguous(in[i]))
        return rm_fail(ctx, RM_ERR_LAYOUT, "%s: input %d is not contiguous", op, i + 1);
  }
  return RM_OK;
}

static double adamw_multi_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  double n = 0;
  for (int k = 0; k + 3 < nin; k += 4) n += (double)rm_tensor_numel(in[k]);
  return 14.0 * n;
}

const rm_op_def rm_opdef_adamw_multi_step = {
  .name = "adamw_multi_step", .nin = -1, .nout = 0, .nvis = 0,
  .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL | RM_OPF_INPLACE, .write_in = RM_NTH(0) | RM_NTH(2) | RM_NTH(3),
  .group = 4, .infer = adamw_multi_infer, .flops = adamw_multi_flops,
};

static int rmsprop_step_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  const char *op = "rmsprop_step";
  if (check_state(ctx, op, nin, in)) return ctx->err_code;
  double lr = a->rmsprop.lr, alpha = a->rmsprop.alpha, eps = a->rmsprop.eps, momentum = a->rmsprop.momentum;
  double wd = a->rmsprop.weight_decay;
  if (!(lr >= 0)) return rm_fail(ctx, RM_ERR_ARG, "%s: invalid learning rate %g", op, lr);
  if (!(alpha >= 0 && alpha <= 1)) return rm_fail(ctx, RM_ERR_ARG, "%s: invalid alpha %g (must be in [0, 1])", op, alpha);
  if (!(eps >= 0)) return rm_fail(ctx, RM_ERR_ARG, "%s: invalid eps %g", op, eps);
  if (!(momentum >= 0)) return rm_fail(ctx, RM_ERR_ARG, "%s: invalid momentum %g", op, momentum);
  if (!(wd >= 0))
    return rm_fail(ctx, RM_ERR_ARG, "%s: invalid weight_decay %g", op, wd);
  for (int j = 0; j < 4; j++) rm_tensor_meta(in[0], &out[j]);
  return RM_OK;
}

static double rmsprop_step_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return 12.0 * (double)rm_tensor_numel(in[0]);
}

const rm_op_def rm_opdef_rmsprop_step = {
  .name = "rmsprop_step", .nin = 5, .nout = 4, .nvis = 4, .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL,
  .infer = rmsprop_step_infer, .flops = rmsprop_step_flops,
};
