/* Normalisation over the last dimension: layernorm and rmsnorm. Attrs: norm {eps}.
 * layernorm(x[, w[, b]]): outputs y, then extras mean and rstd (x's leading dims),
 *   kept for backward with x and w.
 * rmsnorm(x[, w]): outputs y, then the extra rstd.
 * Internal helpers (not differentiable):
 *   layernorm_backward(x, mean, rstd, g[, w]) -> gx, gw, gb; norm_backward {want}: which
 *     (bit 0 gx, bit 1 gw, bit 2 gb; the others come back as zeros). gw/gb have shape
 *     (C) even without affine parameters.
 *   rmsnorm_backward(x, rstd, g[, w]) -> gx, gw; want: bit 0 gx, bit 1 gw. */
#include "ops.h"

rm_tensor *rm_layernorm(rm_ctx *ctx, rm_tensor *x, rm_tensor *w, rm_tensor *b, double eps) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.norm.eps = eps;
  rm_tensor *in[3] = { x, w, b };
  int nin = 1 + (w != NULL) + (b != NULL);
  return rm_op1(ctx, RM_OP_LAYERNORM, nin, in, &at);
}

rm_tensor *rm_rmsnorm(rm_ctx *ctx, rm_tensor *x, rm_tensor *w, double eps) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.norm.eps = eps;
  rm_tensor *in[2] = { x, w };
  return rm_op1(ctx, RM_OP_RMSNORM, w ? 2 : 1, in, &at);
}

/* ---- shapes ---- */

/* The statistics' dtype: float64 for float64, float32 otherwise (a bfloat16 mean or
 * rstd would lose 8 bits before the row uses it). */
static rm_dtype stats_dtype(rm_dtype dt) { return dt == RM_F64 ? RM_F64 : RM_F32; }

/* x's shape without its last dim (the per-row statistics). */
static void stats_meta(rm_tensor *x, rm_meta *m) {
  rm_tensor_meta(x, m);
  m->ndim = x->ndim - 1;
  m->dtype = stats_dtype(x->dtype);
}

/* Checks the common inputs: nin in [lo, hi], same dtype/device, x at least 1-D,
 * the parameters in[first..] of shape (C). */
static int check_norm(rm_ctx *ctx, const char *op, int nin, rm_tensor *const *in, int lo, int hi,
                      int first, const char *const *pname) {
  if (nin < lo || nin > hi)
    return rm_fail(ctx, RM_ERR_ARG, "%s: takes %d to %d tensors (got %d)", op, lo, hi, nin);
  if (rm_check_same_device(ctx, op, nin, in) || rm_check_same_dtype(ctx, op, nin, in))
    return ctx->err_code;
  rm_tensor *x = in[0];
  if (x->ndim == 0) return rm_fail(ctx, RM_ERR_SHAPE, "%s: input must have at least 1 dimension", op);
  int64_t C = x->shape[x->ndim - 1];
  for (int i = first; i < nin; i++)
    if (in[i]->ndim != 1 || in[i]->shape[0] != C) {
      char s1[96], s2[96];
      return rm_fail(ctx, RM_ERR_SHAPE, "%s: %s has shape %s but the input %s has %lld features",
                     op, pname[i - first], rm_tensor_shape_str(in[i], s1, sizeof s1),
                     rm_tensor_shape_str(x, s2, sizeof s2), (long long)C);
    }
  return RM_OK;
}

static const char *const affine_names[] = { "weight", "bias" };

static int layernorm_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  if (check_norm(ctx, "layernorm", nin, in, 1, 3, 1, affine_names)) return ctx->err_code;
  rm_tensor_meta(in[0], &out[0]);
  stats_meta(in[0], &out[1]);
  out[2] = out[1];
  return RM_OK;
}

static int rmsnorm_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  if (check_norm(ctx, "rmsnorm", nin, in, 1, 2, 1, affine_names)) return ctx->err_code;
  rm_tensor_meta(in[0], &out[0]);
  stats_meta(in[0], &out[1]);
  return RM_OK;
}

/* Backward helpers: x, nstats statistics of x's leading shape, g like x, optional w. */
static int norm_bw_infer(rm_ctx *ctx, const char *op, int nin, rm_tensor *const *in, int nstats,
                         int nout, rm_meta *out) {
  static const char *const wname[] = { "weight" };
  int ng = 1 + nstats;
  if (nin < ng + 1 || nin > ng + 2)
    return rm_fail(ctx, RM_ERR_ARG, "%s: takes %d or %d tensors (got %d)", op, ng + 1, ng + 2, nin);
  if (rm_check_same_device(ctx, op, nin, in)) return ctx->err_code;
  rm_tensor *x = in[0];
  for (int i = 1; i < nin; i++) {
    rm_dtype want = i <= nstats ? stats_dtype(x->dtype) : x->dtype;
    if (in[i]->dtype != want)
      return rm_fail(ctx, RM_ERR_DTYPE, "%s: %s is %s, expected %s", op, i <= nstats ? "a statistic" : "a tensor",
                     rm_dtype_name(in[i]->dtype), rm_dtype_name(want));
  }
  if (x->ndim == 0) return rm_fail(ctx, RM_ERR_SHAPE, "%s: input must have at least 1 dimension", op);
  for (int i = 1; i <= nstats; i++)
    if (rm_check_shape(ctx, op, "a statistic", in[i], x->ndim - 1, x->shape)) return ctx->err_code;
  if (rm_check_shape(ctx, op, "the gradient", in[ng], x->ndim, x->shape)) return ctx->err_code;
  if (nin > ng + 1) {
    rm_tensor *w = in[ng + 1];
    int64_t C = x->shape[x->ndim - 1];
    if (rm_check_shape(ctx, op, wname[0], w, 1, &C)) return ctx->err_code;
  }
  rm_tensor_meta(x, &out[0]);
  for (int j = 1; j < nout; j++) {
    rm_tensor_meta(x, &out[j]);
    out[j].ndim = 1;
    out[j].shape[0] = x->shape[x->ndim - 1];
  }
  return RM_OK;
}

static int layernorm_bw_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  return norm_bw_infer(ctx, "layernorm_backward", nin, in, 2, 3, out);
}

static int rmsnorm_bw_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  return norm_bw_infer(ctx, "rmsnorm_backward", nin, in, 1, 2, out);
}

/* ---- backward rules ---- */

/* Runs the helper op bw on (x, stats..., g[, w]) and hands out the wanted gradients:
 * helper output j goes to input j (x, w, b order matches). */
static int norm_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin,
                         rm_op_id bw, int nstats, int nout) {
  rm_tensor *args[5];
  int k = 0;
  if (!(args[k++] = rm_node_input(ctx, n, 0))) return ctx->err_code;
  for (int j = 1; j <= nstats; j++)
    if (!(args[k++] = rm_node_output(ctx, n, j))) return ctx->err_code;
  args[k++] = g[0];
  if (n->nin > 1 && !(args[k++] = rm_node_input(ctx, n, 1))) return ctx->err_code;
  rm_attrs at;
  rm_attrs_init(&at);
  for (int i = 0; i < n->nin; i++)
    if (rm_node_needs_grad(n, i)) at.norm_backward.want |= 1 << i;
  rm_tensor *outs[3] = { 0 };
  if (rm_op_run(ctx, bw, k, args, &at, outs)) return ctx->err_code;
  for (int j = 0; j < nout; j++) {
    if (j < n->nin && rm_node_needs_grad(n, j)) gin[j] = outs[j];
    else rm_tensor_drop(ctx, outs[j]);
  }
  return RM_OK;
}

static int layernorm_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  return norm_backward(ctx, n, g, gin, RM_OP_LAYERNORM_BACKWARD, 2, 3);
}

static int rmsnorm_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  return norm_backward(ctx, n, g, gin, RM_OP_RMSNORM_BACKWARD, 1, 2);
}

/* ---- cost models (per element of x) ---- */

static double layernorm_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return (5.0 + 2.0 * (nin > 1) + (nin > 2)) * (double)rm_tensor_numel(in[0]);
}

static double rmsnorm_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return (3.0 + (nin > 1)) * (double)rm_tensor_numel(in[0]);
}

static double norm_bw_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return 12.0 * (double)rm_tensor_numel(in[0]);
}

/* ---- definitions ---- */

const rm_op_def rm_opdef_layernorm = { .name = "layernorm", .nin = -1, .nout = 3, .nvis = 1,
  .save_in = RM_NTH(0) | RM_NTH(1), .save_out = RM_NTH(1) | RM_NTH(2), .infer = layernorm_infer, .backward = layernorm_backward,
  .flops = layernorm_flops };
const rm_op_def rm_opdef_layernorm_backward = { .name = "layernorm_backward", .nin = -1,
  .nout = 3, .nvis = 3, .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL, .infer = layernorm_bw_infer,
  .flops = norm_bw_flops };
const rm_op_def rm_opdef_rmsnorm = { .name = "rmsnorm", .nin = -1, .nout = 2, .nvis = 1,
  .save_in = RM_NTH(0) | RM_NTH(1), .save_out = RM_NTH(1), .infer = rmsnorm_infer, .backward = rmsnorm_backward,
  .flops = rmsnorm_flops };
const rm_op_def rm_opdef_rmsnorm_backward = { .name = "rmsnorm_backward", .nin = -1,
  .nout = 2, .nvis = 2, .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL, .infer = rmsnorm_bw_infer,
  .flops = norm_bw_flops };
