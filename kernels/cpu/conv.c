/* CPU kernels for unfold (im2col), fold (col2im) and max pooling; semantics in
 * core/op_conv.c.
 * Inputs are contiguous. fold sums, for each image pixel, the window entries that read
 * it in window order (i, then j), as the CUDA twin does. */
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

/* cols (B, C*kh*kw, Ho*Wo) -> x (B, C, H, W). Each thread owns whole planes, so the
 * window entries are added into a zeroed plane in place, entry by entry in window order
 * (i, then j): per pixel that is the order a gather would add them in, so the result
 * is the same bits, without a division per pixel and entry (which made fold 10x slower
 * than unfold). */
#define FOLD(T)                                                                         \
  do {                                                                                  \
    const T *c = rm_tensor_ptr(in[0]);                                                  \
    T *x = rm_tensor_ptr(out[0]);                                                       \
    const int64_t planes = B * C;                                                       \
    _Pragma("omp parallel for if (planes * K * L > RM_CPU_PAR_MIN)")                    \
    for (int64_t p = 0; p < planes; p++) {                                              \
      const T *cp = c + p * K * L;                                                      \
      T *xp = x + p * H * W;                                                            \
      for (int64_t e = 0; e < H * W; e++) xp[e] = 0;                                    \
      for (int64_t i = 0; i < g.kh; i++)                                                \
        for (int64_t j = 0; j < g.kw; j++) {                                            \
          const T *row = cp + (i * g.kw + j) * L;                                       \
          /* ow range whose w = ow sw - pw + j dw lies in [0, W) */                     \
          int64_t w0 = j * g.dw - g.pw;                                                 \
          int64_t ow_lo = w0 >= 0 ? 0 : (-w0 + g.sw - 1) / g.sw;                        \
          int64_t ow_hi = W - 1 - w0 < 0 ? 0 : (W - 1 - w0) / g.sw + 1;                 \
          if (ow_hi > Wo) ow_hi = Wo;                                                   \
          for (int64_t oh = 0; oh < Ho; oh++) {                                         \
            int64_t h = oh * g.sh - g.ph + i * g.dh;                                    \
            if (h < 0 || h >= H) continue;                                              \
            T *xr = xp + h * W;                                                         \
            const T *cr = row + oh * Wo;                                                \
            for (int64_t ow = ow_lo; ow < ow_hi; ow++) xr[w0 + ow * g.sw] += cr[ow];    \
          }                                                                             \
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

/* ---- max pooling: a window's first maximum in window order, a NaN winning ---- */

/* Windows (oh, ow) for ow in [o0, o1) of plane xp (H, W): best[ow - o0] the maximum,
 * at[ow - o0] (when at is not NULL) its plane offset h * W + w (-1: padding, which
 * reads -inf). Entry (0, 0) seeds each window (the first maximum wins ties, a padded
 * one included); every later entry replaces it when greater or NaN unless the maximum
 * so far is NaN. Entry by entry over a run of windows, the update is a vectorisable
 * select: per window, a branch on "greater" (mispredicted half the time on random
 * data) made pooling 25 ns a window. */
#define DEF_POOL_ROW(T)                                                                 \
  static void pool_row_##T(const T *xp, int64_t H, int64_t W, const geo *g, int64_t oh, \
                           int64_t o0, int64_t o1, T *restrict best, int64_t *restrict at) { \
    for (int64_t i = 0; i < g->kh; i++) {                                               \
      const int64_t h = oh * g->sh - g->ph + i * g->dh;                                 \
      const bool hin = h >= 0 && h < H;                                                 \
      for (int64_t j = 0; j < g->kw; j++) {                                             \
        /* windows ow in [lo, hi) read w = ow sw + w0 inside [0, W) */                  \
        const int64_t w0 = j * g->dw - g->pw, sw = g->sw;                               \
        int64_t lo = w0 >= 0 ? 0 : (-w0 + sw - 1) / sw;                                 \
        int64_t hi = W - 1 - w0 < 0 ? 0 : (W - 1 - w0) / sw + 1;                        \
        if (lo < o0) lo = o0;                                                           \
        if (hi > o1) hi = o1;                                                           \
        if (!hin || lo > hi) lo = hi = o0;                                              \
        const T *xr = xp + (hin ? h * W : 0);                                           \
        const int64_t row = h * W + w0;                                                 \
        if (i == 0 && j == 0) {                                                         \
          for (int64_t ow = o0; ow < o1; ow++) {                                        \
            const bool in = ow >= lo && ow < hi;                                        \
            best[ow - o0] = in ? xr[w0 + ow * sw] : (T)-INFINITY;                       \
            if (at) at[ow - o0] = in ? row + ow * sw : -1;                              \
          }                                                                             \
        } else if (at) {                                                                \
          _Pragma("omp simd")                                                           \
          for (int64_t ow = lo; ow < hi; ow++) {                                        \
            const T x = xr[w0 + ow * sw], b = best[ow - o0];                            \
            const bool take = (b == b) & ((x > b) | (x != x));                          \
            best[ow - o0] = take ? x : b;                                               \
            at[ow - o0] = take ? row + ow * sw : at[ow - o0];                           \
          }                                                                             \
        } else {                                                                        \
          _Pragma("omp simd")                                                           \
          for (int64_t ow = lo; ow < hi; ow++) {                                        \
            const T x = xr[w0 + ow * sw], b = best[ow - o0];                            \
            best[ow - o0] = (b == b) & ((x > b) | (x != x)) ? x : b;                    \
          }                                                                             \
        }                                                                               \
      }                                                                                 \
    }                                                                                   \
  }
DEF_POOL_ROW(float)
DEF_POOL_ROW(double)

/* Windows per run in the backward (its stack arrays). */
#define POOL_RUN 256

/* x (B, C, H, W) -> y (B, C, Ho, Wo); one plane per iteration. */
#define MAXPOOL(T)                                                                      \
  do {                                                                                  \
    const T *x = rm_tensor_ptr(in[0]);                                                  \
    T *y = rm_tensor_ptr(out[0]);                                                       \
    _Pragma("omp parallel for if (planes * Ho * Wo * K > RM_CPU_PAR_MIN)")              \
    for (int64_t p = 0; p < planes; p++)                                                \
      for (int64_t oh = 0; oh < Ho; oh++)                                               \
        pool_row_##T(x + p * H * W, H, W, &g, oh, 0, Wo, y + (p * Ho + oh) * Wo, NULL); \
  } while (0)

RM_CPU_KERNEL(maxpool2d) {
  geo g = geo_of(a);
  const int64_t planes = in[0]->shape[0] * in[0]->shape[1], H = in[0]->shape[2], W = in[0]->shape[3];
  const int64_t Ho = out[0]->shape[2], Wo = out[0]->shape[3], K = g.kh * g.kw;
  if (out[0]->dtype == RM_F64) MAXPOOL(double);
  else if (out[0]->dtype == RM_F32) MAXPOOL(float);
  else return rm_fail(ctx, RM_ERR_DTYPE, "maxpool2d: cpu does not support %s", rm_dtype_name(out[0]->dtype));
  return RM_OK;
}

/* (x (B, C, H, W), gy (B, C, Ho, Wo)) -> gx (B, C, H, W): each plane zeroed, then each
 * gy added at its window's maximum, in output order. */
#define MAXPOOL_BACKWARD(T)                                                             \
  do {                                                                                  \
    const T *x = rm_tensor_ptr(in[0]), *gy = rm_tensor_ptr(in[1]);                      \
    T *gx = rm_tensor_ptr(out[0]);                                                      \
    _Pragma("omp parallel for if (planes * Ho * Wo * K > RM_CPU_PAR_MIN)")              \
    for (int64_t p = 0; p < planes; p++) {                                              \
      T best[POOL_RUN];                                                                 \
      int64_t at[POOL_RUN];                                                             \
      const T *gp = gy + p * Ho * Wo;                                                   \
      T *op = gx + p * H * W;                                                           \
      for (int64_t e = 0; e < H * W; e++) op[e] = 0;                                    \
      for (int64_t oh = 0; oh < Ho; oh++)                                               \
        for (int64_t o0 = 0; o0 < Wo; o0 += POOL_RUN) {                                 \
          const int64_t o1 = Wo - o0 < POOL_RUN ? Wo : o0 + POOL_RUN;                   \
          pool_row_##T(x + p * H * W, H, W, &g, oh, o0, o1, best, at);                  \
          for (int64_t ow = o0; ow < o1; ow++)                                          \
            if (at[ow - o0] >= 0) op[at[ow - o0]] += gp[oh * Wo + ow];                  \
        }                                                                               \
    }                                                                                   \
  } while (0)

RM_CPU_KERNEL(maxpool2d_backward) {
  geo g = geo_of(a);
  const int64_t planes = in[0]->shape[0] * in[0]->shape[1], H = in[0]->shape[2], W = in[0]->shape[3];
  const int64_t Ho = in[1]->shape[2], Wo = in[1]->shape[3], K = g.kh * g.kw;
  if (out[0]->dtype == RM_F64) MAXPOOL_BACKWARD(double);
  else if (out[0]->dtype == RM_F32) MAXPOOL_BACKWARD(float);
  else return rm_fail(ctx, RM_ERR_DTYPE, "maxpool2d_backward: cpu does not support %s", rm_dtype_name(out[0]->dtype));
  return RM_OK;
}
