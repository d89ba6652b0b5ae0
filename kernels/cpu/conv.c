/* CPU kernels for unfold (im2col) and fold (col2im); semantics in core/op_conv.c.
 * Inputs are contiguous. fold gathers (each image pixel sums the window entries that
 * read it, in window order), so there are no write races and the CUDA twin adds in the
 * same order. */
#include "cpu.h"

typedef struct { int64_t kh, kw, sh, sw, ph, pw, dh, dw; } geo;

static geo geo_of(const rm_attrs *a) {
  return (geo){ a->window.kh, a->window.kw, a->window.stride_h, a->window.stride_w,
                a->window.pad_h, a->window.pad_w, a->window.dilation_h, a->window.dilation_w };
}

/* x (B, C, H, W) -> cols (B, C*kh*kw, Ho*Wo); one (b, c) plane per iteration. */
#define UNFOLD(T)                                                                       \
  do {                                                                                  \
    const T *x = rm_tensor_ptr(in[0]);                                                  \
    T *o = rm_tensor_ptr(out[0]);                                                       \
    const T pad = (T)a->window.pad_value;                                               \
    const int64_t planes = B * C;                                                       \
    _Pragma("omp parallel for if (planes * K * L > RM_CPU_PAR_MIN)")                    \
    for (int64_t p = 0; p < planes; p++) {                                              \
      const T *xp = x + p * H * W;                                                      \
      T *op = o + p * K * L;                                                            \
      for (int64_t i = 0; i < g.kh; i++)                                                \
        for (int64_t j = 0; j < g.kw; j++) {                                            \
          T *row = op + (i * g.kw + j) * L;                                             \
          for (int64_t oh = 0; oh < Ho; oh++) {                                         \
            int64_t h = oh * g.sh - g.ph + i * g.dh;                                    \
            bool hin = h >= 0 && h < H;                                                 \
            for (int64_t ow = 0; ow < Wo; ow++) {                                       \
              int64_t w = ow * g.sw - g.pw + j * g.dw;                                  \
              row[oh * Wo + ow] = hin && w >= 0 && w < W ? xp[h * W + w] : pad;         \
            }                                                                           \
          }                                                                             \
        }                                                                               \
    }                                                                                   \
  } while (0)

RM_CPU_KERNEL(unfold) {
  geo g = geo_of(a);
  const int64_t B = in[0]->shape[0], C = in[0]->shape[1], H = in[0]->shape[2], W = in[0]->shape[3];
  const int64_t K = g.kh * g.kw, L = out[0]->shape[2];
  const int64_t Wo = (W + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1, Ho = L / Wo;
  if (out[0]->dtype == RM_F64) UNFOLD(double);
  else if (out[0]->dtype == RM_F32) UNFOLD(float);
  else return rm_fail(ctx, RM_ERR_DTYPE, "unfold: cpu does not support %s", rm_dtype_name(out[0]->dtype));
  return RM_OK;
}

/* cols (B, C*kh*kw, Ho*Wo) -> x (B, C, H, W): for pixel (h, w) and window entry (i, j),
 * the output position is oh = (h + ph - i dh) / sh when that divides and is in range. */
#define FOLD(T)                                                                         \
  do {                                                                                  \
    const T *c = rm_tensor_ptr(in[0]);                                                  \
    T *x = rm_tensor_ptr(out[0]);                                                       \
    const int64_t planes = B * C;                                                       \
    _Pragma("omp parallel for if (planes * H * W * K > RM_CPU_PAR_MIN)")                \
    for (int64_t p = 0; p < planes; p++) {                                              \
      const T *cp = c + p * K * L;                                                      \
      T *xp = x + p * H * W;                                                            \
      for (int64_t h = 0; h < H; h++)                                                   \
        for (int64_t w = 0; w < W; w++) {                                               \
          T s = 0;                                                                      \
          for (int64_t i = 0; i < g.kh; i++) {                                          \
            int64_t th = h + g.ph - i * g.dh;                                           \
            if (th < 0 || th % g.sh) continue;                                          \
            int64_t oh = th / g.sh;                                                     \
            if (oh >= Ho) continue;                                                     \
            for (int64_t j = 0; j < g.kw; j++) {                                        \
              int64_t tw = w + g.pw - j * g.dw;                                         \
              if (tw < 0 || tw % g.sw) continue;                                        \
              int64_t ow = tw / g.sw;                                                   \
              if (ow >= Wo) continue;                                                   \
              s += cp[(i * g.kw + j) * L + oh * Wo + ow];                               \
            }                                                                           \
          }                                                                             \
          xp[h * W + w] = s;                                                            \
        }                                                                               \
    }                                                                                   \
  } while (0)

RM_CPU_KERNEL(fold) {
  geo g = geo_of(a);
  const int64_t B = out[0]->shape[0], C = out[0]->shape[1], H = out[0]->shape[2], W = out[0]->shape[3];
  const int64_t K = g.kh * g.kw, L = in[0]->shape[2];
  const int64_t Wo = (W + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1, Ho = (H + 2 * g.ph - g.dh * (g.kh - 1) - 1) / g.sh + 1;
  if (out[0]->dtype == RM_F64) FOLD(double);
  else if (out[0]->dtype == RM_F32) FOLD(float);
  else return rm_fail(ctx, RM_ERR_DTYPE, "fold: cpu does not support %s", rm_dtype_name(out[0]->dtype));
  return RM_OK;
}
