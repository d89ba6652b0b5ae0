/* Sliding windows over images: unfold (im2col), its adjoint fold (col2im), and max
 * pooling. Conv2d and AvgPool2d (lua/remat/layers.lua) are built from unfold and a GEMM
 * or a mean; MaxPool2d has its own op, since unfold + max + their backwards (a scatter
 * into the window columns, then fold) moved every value four times.
 *
 * Attrs of both: window { kh, kw, stride_h, stride_w, pad_h, pad_w, dilation_h,
 * dilation_w, pad_value, height, width } (sh, ph, dh below: stride, pad, dilation)
 *   unfold(x)   x (B, C, H, W) -> (B, C*kh*kw, Ho*Wo); row c*kh*kw + i*kw + j holds
 *               x[b, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw] (pad_value where that falls
 *               in the padding: 0 for convolutions, -inf for max pooling)
 *               Ho = (H + 2 ph - dh (kh - 1) - 1) / sh + 1, likewise Wo
 *   fold(cols)  (internal) cols (B, C*kh*kw, Ho*Wo) -> (B, C, H, W), H = height, W = width:
 *               each input pixel sums the window entries that read it (padding drops)
 *   maxpool2d(x)  x (B, C, H, W) -> (B, C, Ho, Wo): the first maximum of each window in
 *               window order (i, then j; padding reads -inf; a NaN wins, the first one)
 *   maxpool2d_backward(x, gy)  (internal) -> gx (B, C, H, W): each gy goes to the pixel
 *               that window's maximum came from (none when that is padding), windows
 *               added in output order (oh, then ow) where they overlap */
#include <string.h>

#include "ops.h"

typedef struct { int64_t kh, kw, sh, sw, ph, pw, dh, dw; } geo;

static int read_geo(rm_ctx *ctx, const char *op, const rm_attrs *a, geo *g) {
  *g = (geo){ a->window.kh, a->window.kw, a->window.stride_h, a->window.stride_w,
              a->window.pad_h, a->window.pad_w, a->window.dilation_h, a->window.dilation_w };
  if (g->kh < 1 || g->kw < 1 || g->sh < 1 || g->sw < 1 || g->dh < 1 || g->dw < 1 || g->ph < 0 || g->pw < 0)
    return rm_fail(ctx, RM_ERR_ARG, "%s: kernel %lldx%lld, stride %lldx%lld and dilation %lldx%lld must be >= 1, padding %lldx%lld >= 0",
                   op, (long long)g->kh, (long long)g->kw, (long long)g->sh, (long long)g->sw,
                   (long long)g->dh, (long long)g->dw, (long long)g->ph, (long long)g->pw);
  return RM_OK;
}

/* Output size of one spatial dim; < 1 when the window does not fit. */
static int64_t out_size(int64_t n, int64_t k, int64_t s, int64_t p, int64_t d) {
  int64_t span = n + 2 * p - d * (k - 1) - 1;
  return span < 0 ? 0 : span / s + 1;
}

/* The output size (*ho, *wo) of op's window over x (B, C, H, W); raises on a bad
 * geometry, a non-4-d x, or a window that does not fit. */
static int window_out(rm_ctx *ctx, const char *op, rm_tensor *x, const rm_attrs *a, int64_t *ho, int64_t *wo) {
  geo g;
  if (read_geo(ctx, op, a, &g)) return ctx->err_code;
  char s[96];
  if (x->ndim != 4)
    return rm_fail(ctx, RM_ERR_SHAPE, "%s: expected a 4-d input (batch, channels, height, width), got %s",
                   op, rm_tensor_shape_str(x, s, sizeof s));
  *ho = out_size(x->shape[2], g.kh, g.sh, g.ph, g.dh);
  *wo = out_size(x->shape[3], g.kw, g.sw, g.pw, g.dw);
  if (*ho < 1 || *wo < 1)
    return rm_fail(ctx, RM_ERR_SHAPE, "%s: a %lldx%lld window (dilation %lldx%lld, padding %lldx%lld) does not fit in a %lldx%lld image",
                   op, (long long)g.kh, (long long)g.kw, (long long)g.dh, (long long)g.dw, (long long)g.ph,
                   (long long)g.pw, (long long)x->shape[2], (long long)x->shape[3]);
  return RM_OK;
}

static int unfold_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  rm_tensor *x = in[0];
  int64_t ho, wo;
  if (window_out(ctx, "unfold", x, a, &ho, &wo)) return ctx->err_code;
  out[0].dtype = x->dtype;
  out[0].device = x->device;
  out[0].ndim = 3;
  out[0].shape[0] = x->shape[0];
  out[0].shape[1] = x->shape[1] * a->window.kh * a->window.kw;
  out[0].shape[2] = ho * wo;
  return RM_OK;
}

static int fold_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  rm_tensor *c = in[0];
  geo g;
  if (read_geo(ctx, "fold", a, &g)) return ctx->err_code;
  int64_t h = a->window.height, w = a->window.width, k = g.kh * g.kw;
  int64_t ho = out_size(h, g.kh, g.sh, g.ph, g.dh), wo = out_size(w, g.kw, g.sw, g.pw, g.dw);
  char s[96];
  if (c->ndim != 3 || c->shape[1] % k || c->shape[2] != ho * wo || h < 1 || w < 1)
    return rm_fail(ctx, RM_ERR_SHAPE, "fold: columns of size %s do not match a %lldx%lld image and a %lldx%lld window",
                   rm_tensor_shape_str(c, s, sizeof s), (long long)h, (long long)w, (long long)g.kh, (long long)g.kw);
  out[0].dtype = c->dtype;
  out[0].device = c->device;
  out[0].ndim = 4;
  out[0].shape[0] = c->shape[0];
  out[0].shape[1] = c->shape[1] / k;
  out[0].shape[2] = h;
  out[0].shape[3] = w;
  return RM_OK;
}

static int unfold_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_attrs at = n->attrs;
  at.window.height = n->in[0]->shape[2];
  at.window.width = n->in[0]->shape[3];
  gin[0] = rm_op1(ctx, RM_OP_FOLD, 1, g, &at);
  return gin[0] ? RM_OK : ctx->err_code;
}

/* Data movement: one load and store per output element. */
static double move_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return 0;
}

rm_tensor *rm_unfold(rm_ctx *ctx, rm_tensor *x, const int64_t geometry[8], double pad_value) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.window.kh = geometry[0];
  at.window.kw = geometry[1];
  at.window.stride_h = geometry[2];
  at.window.stride_w = geometry[3];
  at.window.pad_h = geometry[4];
  at.window.pad_w = geometry[5];
  at.window.dilation_h = geometry[6];
  at.window.dilation_w = geometry[7];
  at.window.pad_value = pad_value;
  return rm_op1(ctx, RM_OP_UNFOLD, 1, &x, &at);
}

/* ---- max pooling ---- */

static int maxpool2d_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  rm_tensor *x = in[0];
  int64_t ho, wo;
  if (window_out(ctx, nin == 1 ? "maxpool2d" : "maxpool2d_backward", x, a, &ho, &wo)) return ctx->err_code;
  rm_tensor_meta(x, &out[0]);
  out[0].shape[2] = ho;
  out[0].shape[3] = wo;
  return RM_OK;
}

static int maxpool2d_backward_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  rm_meta y;
  if (maxpool2d_infer(ctx, 2, in, a, &y)) return ctx->err_code;
  rm_tensor *gy = in[1];
  char s1[96], s2[96];
  bool same = gy->ndim == 4 && gy->dtype == y.dtype && gy->device == y.device;
  for (int d = 0; same && d < 4; d++) same = gy->shape[d] == y.shape[d];
  if (!same)
    return rm_fail(ctx, RM_ERR_SHAPE, "maxpool2d_backward: the gradient %s does not match the pooled output of %s",
                   rm_tensor_shape_str(gy, s1, sizeof s1), rm_tensor_shape_str(in[0], s2, sizeof s2));
  rm_tensor_meta(in[0], &out[0]);
  return RM_OK;
}

static int maxpool2d_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *x = rm_node_input(ctx, n, 0);
  if (!x) return ctx->err_code;
  rm_tensor *in[2] = { x, g[0] };
  gin[0] = rm_op1(ctx, RM_OP_MAXPOOL2D_BACKWARD, 2, in, &n->attrs);
  return gin[0] ? RM_OK : ctx->err_code;
}

/* One compare per window entry. */
static double pool_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  double n = 1;
  for (int d = 0; d < out[0].ndim; d++) n *= (double)out[0].shape[d];
  return n * (double)(a->window.kh * a->window.kw);
}

const rm_op_def rm_opdef_maxpool2d = { .name = "maxpool2d", .nin = 1, .nout = 1, .nvis = 1,
  .save_in = RM_NTH(0), .infer = maxpool2d_infer, .backward = maxpool2d_backward, .flops = pool_flops };
const rm_op_def rm_opdef_maxpool2d_backward = { .name = "maxpool2d_backward", .nin = 2, .nout = 1, .nvis = 1,
  .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL, .infer = maxpool2d_backward_infer, .flops = pool_flops };

const rm_op_def rm_opdef_unfold = { .name = "unfold", .nin = 1, .nout = 1, .nvis = 1,
  .infer = unfold_infer, .backward = unfold_backward, .flops = move_flops };
const rm_op_def rm_opdef_fold = { .name = "fold", .nin = 1, .nout = 1, .nvis = 1,
  .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL, .infer = fold_infer, .flops = move_flops };
