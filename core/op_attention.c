/* Fused scaled-dot-product attention: y = softmax(scale q k^T [causal mask]) v, without
 * ever storing the Tq x Tk score matrix (kernels stream it a block of rows at a time).
 *
 * attention(q, k, v) -> y, then the extra lse
 *   q (..., Tq, hd); k and v (..., Tk, hd); the same leading dims, dtype and device.
 *   Attrs {causal, scale}. causal: aligned at the bottom right: query i sees keys
 *   j <= i + (Tk - Tq) (so Tq <= Tk is required; Tq = Tk is the usual mask). scale: 0
 *   means 1/sqrt(hd).
 *   y has q's shape and dtype. lse (..., Tq) is the log-sum-exp of each scaled, masked
 *   score row, float64 for float64 inputs and float32 otherwise.
 *   A query with no key (Tk = 0) gets y = 0 and lse = -inf.
 *   Saved for backward: q, k, v, y and lse; never the probabilities.
 * attention_backward(q, k, v, y, lse, gy) -> gq, gk, gv (internal, not differentiable;
 *   the attrs of the forward): recomputes the probabilities blockwise from q, k and lse.
 *
 * Both ops take strided q, k, v, y, gy (RM_OPF_STRIDED): the usual q, k, v are
 * (B, H, T, D) views of one (B, T, 3, H, D) projection, which the CUDA kernels read in
 * place (the CPU kernels copy what is not contiguous).
 *
 * The op keeps the name "attention" so that checkpoint policies can name it. */
#include <math.h>

#include "ops.h"

rm_tensor *rm_attention(rm_ctx *ctx, rm_tensor *q, rm_tensor *k, rm_tensor *v, bool causal, double scale) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.attention.causal = causal;
  at.attention.scale = scale;
  rm_tensor *in[3] = { q, k, v };
  return rm_op1(ctx, RM_OP_ATTENTION, 3, in, &at);
}

/* ---- shapes ---- */

static rm_dtype lse_dtype(rm_dtype dt) { return dt == RM_F64 ? RM_F64 : RM_F32; }

/* Checks q, k, v (in[0..2]) and the attrs; fills y's and lse's metas. */
static int check_qkv(rm_ctx *ctx, const char *op, rm_tensor *const *in, const rm_attrs *a, rm_meta *y,
                     rm_meta *lse) {
  if (rm_check_same_device(ctx, op, 3, in) || rm_check_same_dtype(ctx, op, 3, in)) return ctx->err_code;
  rm_tensor *q = in[0], *k = in[1], *v = in[2];
  char s1[96], s2[96];
  if (q->ndim < 2)
    return rm_fail(ctx, RM_ERR_SHAPE, "%s: q must be (..., T, head_dim), got %s", op,
                   rm_tensor_shape_str(q, s1, sizeof s1));
  int n = q->ndim;
  bool ok = k->ndim == n && k->shape[n - 1] == q->shape[n - 1];
  for (int d = 0; ok && d < n - 2; d++) ok = k->shape[d] == q->shape[d];
  if (!ok)
    return rm_fail(ctx, RM_ERR_SHAPE, "%s: k has shape %s but q has shape %s (k must be (..., Tk, %lld) "
                   "with q's leading dims)", op, rm_tensor_shape_str(k, s1, sizeof s1),
                   rm_tensor_shape_str(q, s2, sizeof s2), (long long)q->shape[n - 1]);
  if (rm_check_shape(ctx, op, "v", v, n, k->shape)) return ctx->err_code;
  if (!isfinite(a->attention.scale))
    return rm_fail(ctx, RM_ERR_ARG, "%s: scale must be finite (got %g)", op, a->attention.scale);
  int64_t Tq = q->shape[n - 2], Tk = k->shape[n - 2];
  if (a->attention.causal && Tq > Tk)
    return rm_fail(ctx, RM_ERR_SHAPE, "%s: causal attention needs at least as many keys as queries "
                   "(%lld queries, %lld keys)", op, (long long)Tq, (long long)Tk);
  rm_tensor_meta(q, y);
  rm_tensor_meta(q, lse);
  lse->ndim = n - 1;
  lse->dtype = lse_dtype(q->dtype);
  return RM_OK;
}

static int attention_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  return check_qkv(ctx, "attention", in, a, &out[0], &out[1]);
}

static int attention_bw_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  const char *op = "attention_backward";
  rm_meta y, lse;
  if (check_qkv(ctx, op, in, a, &y, &lse)) return ctx->err_code;
  if (rm_check_same_device(ctx, op, 6, in)) return ctx->err_code;
  rm_tensor *q = in[0];
  if (rm_check_shape(ctx, op, "y", in[3], y.ndim, y.shape) ||
      rm_check_shape(ctx, op, "gy", in[5], y.ndim, y.shape) ||
      rm_check_shape(ctx, op, "lse", in[4], lse.ndim, lse.shape))
    return ctx->err_code;
  for (int i = 3; i < 6; i++) {
    rm_dtype want = i == 4 ? lse.dtype : q->dtype;
    if (in[i]->dtype != want)
      return rm_fail(ctx, RM_ERR_DTYPE, "%s: %s is %s, expected %s", op, i == 3 ? "y" : i == 4 ? "lse" : "gy",
                     rm_dtype_name(in[i]->dtype), rm_dtype_name(want));
  }
  for (int j = 0; j < 3; j++) rm_tensor_meta(in[j], &out[j]);
  return RM_OK;
}

/* ---- backward rule ---- */

static int attention_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *args[6];
  for (int i = 0; i < 3; i++)
    if (!(args[i] = rm_node_input(ctx, n, i))) return ctx->err_code;
  if (!(args[3] = rm_node_output(ctx, n, 0)) || !(args[4] = rm_node_output(ctx, n, 1))) return ctx->err_code;
  args[5] = g[0];
  rm_tensor *outs[3] = { 0 };
  if (rm_op_run(ctx, RM_OP_ATTENTION_BACKWARD, 6, args, &n->attrs, outs)) return ctx->err_code;
  for (int i = 0; i < 3; i++) {
    if (rm_node_needs_grad(n, i)) gin[i] = outs[i];
    else rm_tensor_drop(ctx, outs[i]);
  }
  return RM_OK;
}

/* ---- cost models ---- */

/* Query-key pairs that take part (per leading index) times the head dim and the
 * number of leading indices. Causal rows see i + (Tk - Tq) + 1 keys. */
static double pair_work(rm_tensor *const *in, const rm_attrs *a) {
  const rm_tensor *q = in[0], *k = in[1];
  int n = q->ndim;
  if (n < 2 || k->ndim != n) return 0;
  double Tq = (double)q->shape[n - 2], Tk = (double)k->shape[n - 2], hd = (double)q->shape[n - 1];
  double bh = 1;
  for (int d = 0; d < n - 2; d++) bh *= (double)q->shape[d];
  double pairs = a->attention.causal ? Tq * Tk - Tq * (Tq - 1) / 2 : Tq * Tk;
  return bh * pairs * hd;
}

/* Two products of 2 flops per pair and head-dim element (q k^T, p v). */
static double attention_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return 4.0 * pair_work(in, a);
}

/* Five such products (s, dp, dq, dk, dv): 2.5x the forward. */
static double attention_bw_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return 10.0 * pair_work(in, a);
}

/* ---- definitions ---- */

const rm_op_def rm_opdef_attention = { .name = "attention", .nin = 3, .nout = 2, .nvis = 1,
  .flags = RM_OPF_STRIDED, .save_in = RM_NTH(0) | RM_NTH(1) | RM_NTH(2), .save_out = RM_NTH(0) | RM_NTH(1), .infer = attention_infer, .backward = attention_backward,
  .flops = attention_flops };
const rm_op_def rm_opdef_attention_backward = { .name = "attention_backward", .nin = 6, .nout = 3,
  .nvis = 3, .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL | RM_OPF_STRIDED, .infer = attention_bw_infer,
  .flops = attention_bw_flops };
