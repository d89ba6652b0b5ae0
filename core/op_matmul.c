/* Matrix products: matmul (1-D, 2-D, batched with broadcast batch dims, numpy's 1-D
 * promotion) and linear (x w^T + b, PyTorch's layout). Both kernels take strided
 * inputs, so transposed operands reach BLAS without a copy. matmul's attrs make one
 * square matrix of a product triangular (ops.def): the result (causal attention's
 * scores q k^T, -inf above the diagonal) or an operand read as 0 outside its triangle
 * (the probabilities in p v); the gradients of such a product are triangular products
 * too, so the CPU computes only the triangles' part, forward and backward.
 * linear_gelu(x, w[, b]) = gelu_tanh(x w^T + b) in one op: outputs y, then the extra
 * pre-activation x w^T + b, kept for backward (on CUDA both come from one cublasLt
 * matmul with the GELU epilogue; see kernels/cuda/matmul.cu). */
#include <math.h>
#include <string.h>

#include "ops.h"

rm_tensor *rm_matmul(rm_ctx *ctx, rm_tensor *a, rm_tensor *b) {
  rm_tensor *in[2] = { a, b };
  return rm_op1(ctx, RM_OP_MATMUL, 2, in, NULL);
}

rm_tensor *rm_matmul_tri(rm_ctx *ctx, rm_tensor *a, rm_tensor *b, int tri, bool upper, bool neg_inf) {
  rm_tensor *in[2] = { a, b };
  rm_attrs at;
  rm_attrs_init(&at);
  at.matmul.tri = tri;
  at.matmul.upper = upper;
  at.matmul.neg_inf = neg_inf;
  return rm_op1(ctx, RM_OP_MATMUL, 2, in, &at);
}

rm_tensor *rm_linear(rm_ctx *ctx, rm_tensor *x, rm_tensor *w, rm_tensor *b) {
  rm_tensor *in[3] = { x, w, b };
  return rm_op1(ctx, RM_OP_LINEAR, b ? 3 : 2, in, NULL);
}

rm_tensor *rm_linear_gelu(rm_ctx *ctx, rm_tensor *x, rm_tensor *w, rm_tensor *b) {
  rm_tensor *in[3] = { x, w, b };
  return rm_op1(ctx, RM_OP_LINEAR_GELU, b ? 3 : 2, in, NULL);
}

/* ---- matmul ---- */

/* The triangular attrs against operands of shapes s1 (x) and s2 (y). */
static int check_tri(rm_ctx *ctx, const rm_attrs *at, const rm_tensor *x, const rm_tensor *y,
                     const char *s1, const char *s2) {
  const __typeof__(at->matmul) *t = &at->matmul;
  if (t->tri == RM_TRI_NONE) {
    if (t->upper || t->neg_inf)
      return rm_fail(ctx, RM_ERR_ARG, "matmul: upper and neg_inf describe a triangular product: set tri too");
    return RM_OK;
  }
  if (t->tri < RM_TRI_NONE || t->tri > RM_TRI_B)
    return rm_fail(ctx, RM_ERR_ARG, "matmul: tri must be 0 (none), 1 (the result), 2 (a) or 3 (b), got %lld",
                   (long long)t->tri);
  if (t->neg_inf && t->tri != RM_TRI_OUT)
    return rm_fail(ctx, RM_ERR_ARG, "matmul: neg_inf fills a triangular result (tri = 1), got tri = %lld",
                   (long long)t->tri);
  if (x->ndim < 2 || y->ndim < 2)
    return rm_fail(ctx, RM_ERR_SHAPE, "matmul: a triangular product needs 2-D or batched operands, got shapes %s and %s",
                   s1, s2);
  int64_t M = x->shape[x->ndim - 2], K = x->shape[x->ndim - 1], N = y->shape[y->ndim - 1];
  static const char *const what[] = { "", "the result", "a", "b" };
  int64_t r = t->tri == RM_TRI_B ? K : M, c = t->tri == RM_TRI_A ? K : N;
  if (r != c)
    return rm_fail(ctx, RM_ERR_SHAPE, "matmul: tri = %lld makes %s triangular, which needs it square, got shapes "
                   "%s and %s (%lld x %lld)", (long long)t->tri, what[t->tri], s1, s2, (long long)r, (long long)c);
  return RM_OK;
}

static int matmul_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  if (rm_check_same_device(ctx, "matmul", nin, in) || rm_check_same_dtype(ctx, "matmul", nin, in))
    return ctx->err_code;
  rm_tensor *x = in[0], *y = in[1];
  char s1[96], s2[96];
  rm_tensor_shape_str(x, s1, sizeof s1);
  rm_tensor_shape_str(y, s2, sizeof s2);
  if (x->ndim == 0 || y->ndim == 0)
    return rm_fail(ctx, RM_ERR_SHAPE, "matmul: both operands need at least 1 dimension (got shapes %s and %s)", s1, s2);
  int64_t ka = x->shape[x->ndim - 1], kb = y->shape[y->ndim == 1 ? 0 : y->ndim - 2];
  if (ka != kb)
    return rm_fail(ctx, RM_ERR_SHAPE, "matmul: shapes %s and %s do not match (%lld vs %lld)", s1, s2,
                   (long long)ka, (long long)kb);
  int na = x->ndim > 2 ? x->ndim - 2 : 0, nb = y->ndim > 2 ? y->ndim - 2 : 0, n;
  int64_t bs[RM_MAX_DIM];
  if (rm_broadcast_shape(ctx, "matmul", na, x->shape, nb, y->shape, &n, bs))
    return rm_fail(ctx, RM_ERR_SHAPE, "matmul: batch dimensions of %s and %s cannot be broadcast", s1, s2);
  out[0].dtype = x->dtype;
  out[0].device = x->device;
  memcpy(out[0].shape, bs, sizeof(int64_t) * (size_t)n);
  if (x->ndim >= 2) bs[n++] = x->shape[x->ndim - 2];
  if (y->ndim >= 2) bs[n++] = y->shape[y->ndim - 1];
  if (n > RM_MAX_DIM) return rm_fail(ctx, RM_ERR_SHAPE, "matmul: result has more than %d dimensions", RM_MAX_DIM);
  out[0].ndim = n;
  memcpy(out[0].shape, bs, sizeof(int64_t) * (size_t)n);
  return a ? check_tri(ctx, a, x, y, s1, s2) : RM_OK;
}

/* t viewed with its 1-D promotion undone or applied: a (K) -> (1, K), b (K) -> (K, 1). */
static rm_tensor *promote(rm_ctx *ctx, rm_tensor *t, bool left) {
  if (t->ndim >= 2) { rm_tensor_hold(t); return t; }
  int64_t s[2] = { left ? 1 : t->shape[0], left ? t->shape[0] : 1 };
  return rm_reshape(ctx, t, 2, s);
}

/* Shape of t with its 1-D promotion applied (a: 1 x K, b: K x 1); returns ndim. */
static int promoted_shape(const rm_tensor *t, bool left, int64_t *s) {
  if (t->ndim >= 2) { memcpy(s, t->shape, sizeof(int64_t) * (size_t)t->ndim); return t->ndim; }
  s[0] = left ? 1 : t->shape[0];
  s[1] = left ? t->shape[0] : 1;
  return 2;
}

/* g (shape of a product) reduced over broadcast batch dims to `like`'s promoted shape,
 * then given `like`'s shape. Drops g. */
static rm_tensor *fit(rm_ctx *ctx, rm_tensor *g, rm_tensor *like, bool left) {
  if (!g) return NULL;
  int64_t ps[RM_MAX_DIM];
  int pn = promoted_shape(like, left, ps);
  rm_tensor *s = g;
  bool same = g->ndim == pn;
  for (int d = 0; same && d < pn; d++) same = g->shape[d] == ps[d];
  if (!same) {
    s = rm_sum_to(ctx, g, pn, ps);
    rm_tensor_drop(ctx, g);
    if (!s) return NULL;
  }
  if (like->ndim == s->ndim) return s;
  rm_tensor *r = rm_reshape(ctx, s, like->ndim, like->shape);
  rm_tensor_drop(ctx, s);
  return r;
}

/* The attrs of grad_a = g b^T (ga) and grad_b = a^T g (gb) for a product with t:
 * the result triangular: g read as 0 outside it in both; a triangular: grad_a is a
 * triangular result (0 outside), and a^T the other triangle; b likewise. */
static void grad_tri(const rm_attrs *t, rm_attrs *ga, rm_attrs *gb) {
  rm_attrs_init(ga);
  rm_attrs_init(gb);
  bool u = t->matmul.upper;
  int64_t tri = t->matmul.tri;
  if (tri == RM_TRI_NONE) return;
  ga->matmul.tri = tri == RM_TRI_OUT ? RM_TRI_A : tri == RM_TRI_A ? RM_TRI_OUT : RM_TRI_B;
  ga->matmul.upper = tri == RM_TRI_B ? !u : u;
  gb->matmul.tri = tri == RM_TRI_OUT ? RM_TRI_B : tri == RM_TRI_A ? RM_TRI_A : RM_TRI_OUT;
  gb->matmul.upper = tri == RM_TRI_A ? !u : u;
}

/* grad_a = g b^T, grad_b = a^T g, each summed over the batch dims its operand was
 * broadcast along (with 1-D operands promoted and g shaped to match); a triangular
 * product's are triangular too (grad_tri). */
static int matmul_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *a = n->in[0], *b = n->in[1];
  int64_t gs[RM_MAX_DIM + 2];
  int gn = g[0]->ndim;
  memcpy(gs, g[0]->shape, sizeof(int64_t) * (size_t)gn);
  if (a->ndim == 1) {
    int pos = gn - (b->ndim >= 2 ? 1 : 0);
    memmove(gs + pos + 1, gs + pos, sizeof(int64_t) * (size_t)(gn - pos));
    gs[pos] = 1;
    gn++;
  }
  if (b->ndim == 1) gs[gn++] = 1;
  rm_tensor *gp = rm_reshape(ctx, g[0], gn, gs);
  if (!gp) return ctx->err_code;
  rm_attrs ga, gb;
  grad_tri(&n->attrs, &ga, &gb);
  rm_tensor *pair[2];
  int rc = RM_OK;
  if (rm_node_needs_grad(n, 0)) {
    rm_tensor *bd = rm_node_input(ctx, n, 1);
    rm_tensor *bp = bd ? promote(ctx, bd, false) : NULL;
    rm_tensor *bt = bp ? rm_transpose(ctx, bp, -2, -1) : NULL;
    pair[0] = gp, pair[1] = bt;
    gin[0] = bt ? fit(ctx, rm_op1(ctx, RM_OP_MATMUL, 2, pair, &ga), a, true) : NULL;
    rm_tensor_drop(ctx, bp);
    rm_tensor_drop(ctx, bt);
    if (!gin[0]) rc = ctx->err_code;
  }
  if (rc == RM_OK && rm_node_needs_grad(n, 1)) {
    rm_tensor *ad = rm_node_input(ctx, n, 0);
    rm_tensor *ap = ad ? promote(ctx, ad, true) : NULL;
    rm_tensor *at = ap ? rm_transpose(ctx, ap, -2, -1) : NULL;
    pair[0] = at, pair[1] = gp;
    gin[1] = at ? fit(ctx, rm_op1(ctx, RM_OP_MATMUL, 2, pair, &gb), b, false) : NULL;
    rm_tensor_drop(ctx, ap);
    rm_tensor_drop(ctx, at);
    if (!gin[1]) rc = ctx->err_code;
  }
  rm_tensor_drop(ctx, gp);
  return rc;
}

/* 2 M N K per batch: numel(out) = batch M N; a triangular product's T (T + 1) / 2 of
 * the T x T triangle's pairs. */
static double matmul_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  double f = 2.0 * (double)rm_meta_numel(&out[0]) * (double)in[0]->shape[in[0]->ndim - 1];
  if (a && a->matmul.tri != RM_TRI_NONE && in[0]->ndim >= 2) {
    double T = (double)in[0]->shape[in[0]->ndim - (a->matmul.tri == RM_TRI_A ? 1 : 2)];
    if (a->matmul.tri == RM_TRI_B) T = (double)in[1]->shape[in[1]->ndim - 1];
    if (T > 0) f *= (T + 1) / (2 * T);
  }
  return f;
}

const rm_op_def rm_opdef_matmul = { .name = "matmul", .nin = 2, .nout = 1, .nvis = 1,
  .flags = RM_OPF_STRIDED, .save_in = RM_NTH(0) | RM_NTH(1), .infer = matmul_infer, .backward = matmul_backward,
  .flops = matmul_flops };

/* ---- linear: inputs x (..., in), w (out, in), optional b (out) ---- */

static int check_linear(rm_ctx *ctx, const char *op, int nin, rm_tensor *const *in, rm_meta *out) {
  if (nin < 2 || nin > 3)
    return rm_fail(ctx, RM_ERR_ARG, "%s: takes an input, a weight and an optional bias (got %d tensors)", op, nin);
  if (rm_check_same_device(ctx, op, nin, in) || rm_check_same_dtype(ctx, op, nin, in))
    return ctx->err_code;
  rm_tensor *x = in[0], *w = in[1];
  char s[96];
  if (w->ndim != 2)
    return rm_fail(ctx, RM_ERR_SHAPE, "%s: weight must be 2-D (out x in), got %s", op, rm_tensor_shape_str(w, s, sizeof s));
  if (x->ndim == 0) return rm_fail(ctx, RM_ERR_SHAPE, "%s: input must have at least 1 dimension", op);
  if (x->shape[x->ndim - 1] != w->shape[1])
    return rm_fail(ctx, RM_ERR_SHAPE, "%s: input has %lld features but the weight expects %lld", op,
                   (long long)x->shape[x->ndim - 1], (long long)w->shape[1]);
  if (nin == 3 && (in[2]->ndim != 1 || in[2]->shape[0] != w->shape[0]))
    return rm_fail(ctx, RM_ERR_SHAPE, "%s: bias has shape %s but the weight has %lld outputs", op,
                   rm_tensor_shape_str(in[2], s, sizeof s), (long long)w->shape[0]);
  rm_tensor_meta(x, &out[0]);
  out[0].shape[x->ndim - 1] = w->shape[0];
  return RM_OK;
}

static int linear_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  return check_linear(ctx, "linear", nin, in, out);
}

/* y and the pre-activation: both (..., out). */
static int linear_gelu_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  if (check_linear(ctx, "linear_gelu", nin, in, out)) return ctx->err_code;
  if (out[0].dtype != RM_F32 && out[0].dtype != RM_F64 && out[0].dtype != RM_BF16)
    return rm_fail(ctx, RM_ERR_DTYPE, "linear_gelu: expected float32, float64 or bfloat16, got %s",
                   rm_dtype_name(out[0].dtype));
  out[1] = out[0];
  return RM_OK;
}

/* gx = g w, gw = g^T x (over the flattened leading dims), gb = g summed over them
 * (g: the gradient of x w^T + b). */
static int linear_grads(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *w = n->in[1];
  int64_t fin = w->shape[1], fout = w->shape[0];
  if (rm_node_needs_grad(n, 0)) {
    rm_tensor *wd = rm_node_input(ctx, n, 1);
    gin[0] = wd ? rm_matmul(ctx, g[0], wd) : NULL;
    if (!gin[0]) return ctx->err_code;
  }
  if (rm_node_needs_grad(n, 1)) {
    rm_tensor *xd = rm_node_input(ctx, n, 0);
    if (!xd) return ctx->err_code;
    int64_t R = rm_tensor_numel(g[0]) / (fout ? fout : 1);
    int64_t gsh[2] = { R, fout }, xsh[2] = { R, fin };
    rm_tensor *g2 = rm_reshape(ctx, g[0], 2, gsh);
    rm_tensor *gt = g2 ? rm_transpose(ctx, g2, 0, 1) : NULL;
    rm_tensor *x2 = gt ? rm_reshape(ctx, xd, 2, xsh) : NULL;
    gin[1] = x2 ? rm_matmul(ctx, gt, x2) : NULL;
    rm_tensor_drop(ctx, g2);
    rm_tensor_drop(ctx, gt);
    rm_tensor_drop(ctx, x2);
    if (!gin[1]) return ctx->err_code;
  }
  if (n->nin > 2 && rm_node_needs_grad(n, 2)) {
    if (g[0]->ndim == 1) {
      gin[2] = rm_copy(ctx, g[0]);
    } else {
      int64_t bsh[1] = { fout };
      gin[2] = rm_sum_to(ctx, g[0], 1, bsh);
    }
    if (!gin[2]) return ctx->err_code;
  }
  return RM_OK;
}

static int linear_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  return linear_grads(ctx, n, g, gin);
}

/* dpre = g gelu_tanh'(pre) (the fused gelu_tanh_backward), then linear's gradients. */
static int linear_gelu_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *pre = rm_node_output(ctx, n, 1);
  if (!pre) return ctx->err_code;
  rm_tensor *dpre = rm_binary(ctx, RM_OP_GELU_TANH_BACKWARD, pre, g[0]);
  if (!dpre) return ctx->err_code;
  int rc = linear_grads(ctx, n, &dpre, gin);
  rm_tensor_drop(ctx, dpre);
  return rc;
}

/* 2 R in out for the product, R out more for the bias. */
static double linear_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  double ro = (double)rm_meta_numel(&out[0]);
  return 2.0 * ro * (double)in[1]->shape[1] + (nin > 2 ? ro : 0.0);
}

/* linear's, and the tanh GELU's 16 a output element */
static double linear_gelu_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return linear_flops(nin, in, a, out) + 16.0 * (double)rm_meta_numel(&out[0]);
}

const rm_op_def rm_opdef_linear_gelu = { .name = "linear_gelu", .nin = -1, .nout = 2, .nvis = 1,
  .flags = RM_OPF_STRIDED, .save_in = RM_NTH(0) | RM_NTH(1), .save_out = RM_NTH(1), .infer = linear_gelu_infer,
  .backward = linear_gelu_backward, .flops = linear_gelu_flops };
const rm_op_def rm_opdef_linear = { .name = "linear", .nin = -1, .nout = 1, .nvis = 1,
  .flags = RM_OPF_STRIDED, .save_in = RM_NTH(0) | RM_NTH(1), .infer = linear_infer, .backward = linear_backward,
  .flops = linear_flops };

/* ---- matmul_softmax(a, b) = softmax(matmul(a, b)): internal ----
 * The checkpoint engine replays a dropped softmax whose input is a product nothing else
 * reads (attention's scores q k^T) as this one op, where the backend computes it without
 * storing the product (rm_backend.scores_softmax: the CPU's float32 tiles compute a row
 * tile's scores into a buffer and take its softmax from there). Its result is the two
 * ops' result bit for bit: the same tiles, the same softmax rows. Not differentiable:
 * it only rebuilds a tensor the tape already has. */

static int matmul_softmax_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  rm_attrs mm, sm;
  rm_matmul_softmax_split(a, &mm, &sm);
  if (matmul_infer(ctx, nin, in, &mm, out)) return ctx->err_code;
  int nd = out[0].ndim, d = 0;
  /* as softmax's: -1 is also the dim of a 0-d product (two vectors) */
  if (!(nd == 0 && sm.softmax.dim == -1) && rm_check_dim(ctx, "matmul_softmax", sm.softmax.dim, nd, &d))
    return ctx->err_code;
  if (!isfinite(sm.softmax.scale))
    return rm_fail(ctx, RM_ERR_ARG, "matmul_softmax: scale must be a finite number, got %g", sm.softmax.scale);
  if (sm.softmax.causal && (nd < 2 || out[0].shape[nd - 1] != out[0].shape[nd - 2] || d != nd - 1))
    return rm_fail(ctx, RM_ERR_SHAPE, "matmul_softmax: a causal softmax runs over the last dim of a (..., T, T) "
                   "product, got dim %d of a %d-D product whose last two sizes are %lld and %lld", d, nd,
                   (long long)(nd >= 2 ? out[0].shape[nd - 2] : 1), (long long)(nd >= 1 ? out[0].shape[nd - 1] : 1));
  return RM_OK;
}

/* the product's, and softmax's 4 an element */
static double matmul_softmax_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  rm_attrs mm, sm;
  rm_matmul_softmax_split(a, &mm, &sm);
  return matmul_flops(nin, in, &mm, out) + 4.0 * (double)rm_meta_numel(&out[0]);
}

const rm_op_def rm_opdef_matmul_softmax = { .name = "matmul_softmax", .nin = 2, .nout = 1, .nvis = 1,
  .flags = RM_OPF_STRIDED | RM_OPF_NODIFF | RM_OPF_INTERNAL, .infer = matmul_softmax_infer,
  .flops = matmul_softmax_flops };
