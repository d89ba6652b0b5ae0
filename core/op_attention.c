/* Fused scaled-dot-product attention: y = softmax(scale q k^T [causal mask]) v, without
 * ever storing the Tq x Tk score matrix (kernels stream it a block of rows at a time).
 *
 * attention(q, k, v) -> y, then the extra lse
 *   q (..., Tq, hd); k and v (..., Tk, hd); the same leading dims, dtype and device.
 *   Attrs {causal, scale, heads}. causal: aligned at the bottom right: query i sees keys
 *   j <= i + (Tk - Tq) (so Tq <= Tk is required; Tq = Tk is the usual mask). scale: 0
 *   means 1/sqrt(hd). heads: 0 (the heads are a leading dim of q, k and v).
 *   y has q's shape and dtype. lse (..., Tq) is the log-sum-exp of each scaled, masked
 *   score row, float64 for float64 inputs and float32 otherwise.
 *   A query with no key (Tk = 0) gets y = 0 and lse = -inf.
 *   Saved for backward: q, k, v, y and lse; never the probabilities.
 * attention(qkv) -> y, lse: the packed form, self-attention on a projection's output
 *   qkv (..., T, 3·H·D) with heads = H: q, k and v are its three (..., T, H·D) parts,
 *   split into H heads of D; y is (..., T, H·D) (the heads side by side, as the output
 *   projection reads them), lse (..., H, T). The same numbers as the three-input form on
 *   the (..., H, T, D) views of the parts, bit for bit: the kernels run the same code on
 *   those views (core/attention_views.h). Its backward is one op,
 * attention_qkv_backward(qkv, y, lse, gy) -> dqkv (internal): gq, gk and gv written
 *   into the three parts of one (..., T, 3·H·D) gradient, the layout of qkv, so the
 *   projection's backward reads it as it is (the three-input form's gradients reach a
 *   packed projection through three select backwards, each a zero-filled full-size
 *   tensor, and two full-size adds).
 * attention_backward(q, k, v, y, lse, gy) -> gq, gk, gv (internal, not differentiable;
 *   the attrs of the forward): recomputes the probabilities blockwise from q, k and lse.
 *
 * The ops take strided inputs (RM_OPF_STRIDED): the kernels read rows in place (the CPU
 * kernels copy what the BLAS cannot read).
 *
 * Both forms are the op "attention", so that checkpoint policies name either. */
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

rm_tensor *rm_attention_qkv(rm_ctx *ctx, rm_tensor *qkv, int64_t heads, bool causal, double scale) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.attention.causal = causal;
  at.attention.scale = scale;
  at.attention.heads = heads;
  return rm_op1(ctx, RM_OP_ATTENTION, 1, &qkv, &at);
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

/* Checks the packed form's qkv (..., T, 3·H·D) and heads; fills y's and lse's metas. */
static int check_packed(rm_ctx *ctx, const char *op, const rm_tensor *qkv, const rm_attrs *a, rm_meta *y,
                        rm_meta *lse) {
  char s1[96];
  int n = qkv->ndim;
  int64_t H = a->attention.heads, W = n >= 1 ? qkv->shape[n - 1] : 0;
  if (!isfinite(a->attention.scale))
    return rm_fail(ctx, RM_ERR_ARG, "%s: scale must be finite (got %g)", op, a->attention.scale);
  if (H < 1)
    return rm_fail(ctx, RM_ERR_ARG, "%s: the packed form attention(qkv) needs heads >= 1 (got %lld)", op, (long long)H);
  if (n < 2 || n >= RM_MAX_DIM || W % (3 * H))
    return rm_fail(ctx, RM_ERR_SHAPE, "%s: qkv must be (..., T, 3 x heads x head_dim) with at most %d dims, "
                   "got %s with heads = %lld", op, RM_MAX_DIM - 1, rm_tensor_shape_str(qkv, s1, sizeof s1),
                   (long long)H);
  rm_tensor_meta(qkv, y);
  y->shape[n - 1] = W / 3;
  rm_tensor_meta(qkv, lse);
  lse->shape[n - 2] = H;
  lse->shape[n - 1] = qkv->shape[n - 2];
  lse->dtype = lse_dtype(qkv->dtype);
  return RM_OK;
}

static int attention_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  if (nin == 1) return check_packed(ctx, "attention", in[0], a, &out[0], &out[1]);
  if (nin != 3)
    return rm_fail(ctx, RM_ERR_ARG, "attention takes q, k, v or one packed qkv (got %d inputs)", nin);
  if (a->attention.heads != 0)
    return rm_fail(ctx, RM_ERR_ARG, "attention: heads (%lld) is for the packed form attention(qkv); q, k and v "
                   "carry their heads as a leading dim", (long long)a->attention.heads);
  return check_qkv(ctx, "attention", in, a, &out[0], &out[1]);
}

/* y, lse, gy (in[first..first+2]) against the forward's metas. */
static int check_saved(rm_ctx *ctx, const char *op, rm_tensor *const *in, int first, const rm_meta *y,
                       const rm_meta *lse) {
  static const char *const names[3] = { "y", "lse", "gy" };
  for (int i = 0; i < 3; i++) {
    const rm_meta *m = i == 1 ? lse : y;
    if (rm_check_shape(ctx, op, names[i], in[first + i], m->ndim, m->shape)) return ctx->err_code;
    if (in[first + i]->dtype != m->dtype)
      return rm_fail(ctx, RM_ERR_DTYPE, "%s: %s is %s, expected %s", op, names[i], rm_dtype_name(in[first + i]->dtype),
                     rm_dtype_name(m->dtype));
  }
  return RM_OK;
}

static int attention_bw_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  const char *op = "attention_backward";
  rm_meta y, lse;
  if (check_qkv(ctx, op, in, a, &y, &lse)) return ctx->err_code;
  if (rm_check_same_device(ctx, op, 6, in)) return ctx->err_code;
  /* y, lse, gy are in[3..5] */
  if (check_saved(ctx, op, in, 3, &y, &lse)) return ctx->err_code;
  for (int j = 0; j < 3; j++) rm_tensor_meta(in[j], &out[j]);
  return RM_OK;
}

static int attention_qkv_bw_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  const char *op = "attention_qkv_backward";
  rm_meta y, lse;
  if (check_packed(ctx, op, in[0], a, &y, &lse) || rm_check_same_device(ctx, op, 4, in)) return ctx->err_code;
  if (check_saved(ctx, op, in, 1, &y, &lse)) return ctx->err_code;
  rm_tensor_meta(in[0], &out[0]);
  return RM_OK;
}

/* ---- backward rule ---- */

static int attention_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *args[6];
  if (n->nin == 1) { /* packed: one dqkv gradient */
    if (!(args[0] = rm_node_input(ctx, n, 0)) || !(args[1] = rm_node_output(ctx, n, 0)) ||
        !(args[2] = rm_node_output(ctx, n, 1)))
      return ctx->err_code;
    args[3] = g[0];
    return rm_op_run(ctx, RM_OP_ATTENTION_QKV_BACKWARD, 4, args, &n->attrs, &gin[0]);
  }
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
static double pair_work(int nin, rm_tensor *const *in, const rm_attrs *a) {
  const rm_tensor *q = in[0];
  int n = q->ndim;
  if (nin == 1 || nin == 4) { /* packed: T x T pairs per (leading index, head), head dim W / 3H */
    int64_t H = a->attention.heads;
    if (n < 2 || H < 1) return 0;
    double T = (double)q->shape[n - 2], hd = (double)(q->shape[n - 1] / (3 * H)), bh = (double)H;
    for (int d = 0; d < n - 2; d++) bh *= (double)q->shape[d];
    return bh * (a->attention.causal ? T * T - T * (T - 1) / 2 : T * T) * hd;
  }
  const rm_tensor *k = in[1]; /* only the three-input forms have a separate k */
  if (n < 2 || k->ndim != n) return 0;
  double Tq = (double)q->shape[n - 2], Tk = (double)k->shape[n - 2], hd = (double)q->shape[n - 1];
  double bh = 1;
  for (int d = 0; d < n - 2; d++) bh *= (double)q->shape[d];
  double pairs = a->attention.causal ? Tq * Tk - Tq * (Tq - 1) / 2 : Tq * Tk;
  return bh * pairs * hd;
}

/* Two products of 2 flops per pair and head-dim element (q k^T, p v). */
static double attention_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return 4.0 * pair_work(nin, in, a);
}

/* Five such products (s, dp, dq, dk, dv): 2.5x the forward. */
static double attention_bw_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return 10.0 * pair_work(nin, in, a);
}

/* ---- definitions ---- */

/* nin -1: three inputs (q, k, v) or one (the packed qkv); attention_infer checks */
const rm_op_def rm_opdef_attention = { .name = "attention", .nin = -1, .nout = 2, .nvis = 1,
  .flags = RM_OPF_STRIDED, .save_in = RM_NTH(0) | RM_NTH(1) | RM_NTH(2), .save_out = RM_NTH(0) | RM_NTH(1), .infer = attention_infer, .backward = attention_backward,
  .flops = attention_flops };
const rm_op_def rm_opdef_attention_backward = { .name = "attention_backward", .nin = 6, .nout = 3,
  .nvis = 3, .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL | RM_OPF_STRIDED, .infer = attention_bw_infer,
  .flops = attention_bw_flops };
const rm_op_def rm_opdef_attention_qkv_backward = { .name = "attention_qkv_backward", .nin = 4, .nout = 1,
  .nvis = 1, .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL | RM_OPF_STRIDED, .infer = attention_qkv_bw_infer,
  .flops = attention_bw_flops };
