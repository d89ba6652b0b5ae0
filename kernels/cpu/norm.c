/* CPU kernels for layernorm and rmsnorm over the last dimension, and their backward
 * helpers. Rows are independent (OpenMP over rows); statistics accumulate in double.
 * Weight/bias gradients are summed over rows per block of columns, so the result does
 * not depend on the number of threads. */
#include <math.h>

#include "cpu.h"

#define COLS 64

/* Rows and features of x (the last dim is the feature dim). */
static void rows_cols(const rm_tensor *x, int64_t *R, int64_t *C) {
  *C = x->shape[x->ndim - 1];
  *R = 1;
  for (int d = 0; d < x->ndim - 1; d++) *R *= x->shape[d];
}

/* ---- layernorm: in x[, w[, b]]; out y, mean, rstd; f[0] eps ---- */

#define LN_FWD(T)                                                                   \
  do {                                                                              \
    const T *x = rm_tensor_ptr(in[0]);                                              \
    const T *w = nin > 1 ? rm_tensor_ptr(in[1]) : NULL;                             \
    const T *b = nin > 2 ? rm_tensor_ptr(in[2]) : NULL;                             \
    T *y = rm_tensor_ptr(out[0]), *mu = rm_tensor_ptr(out[1]), *rs = rm_tensor_ptr(out[2]); \
    _Pragma("omp parallel for if (R * C > RM_CPU_PAR_MIN)")                         \
    for (int64_t r = 0; r < R; r++) {                                               \
      const T *xr = x + r * C;                                                      \
      T *yr = y + r * C;                                                            \
      double s = 0, v = 0;                                                          \
      for (int64_t j = 0; j < C; j++) s += xr[j];                                   \
      double m = s / (double)C;                                                     \
      for (int64_t j = 0; j < C; j++) { double d = xr[j] - m; v += d * d; }         \
      double rstd = 1.0 / sqrt(v / (double)C + eps);                                \
      T mt = (T)m, rt = (T)rstd;                                                    \
      for (int64_t j = 0; j < C; j++) {                                             \
        T h = (xr[j] - mt) * rt;                                                    \
        yr[j] = (w ? h * w[j] : h) + (b ? b[j] : (T)0);                             \
      }                                                                             \
      mu[r] = mt;                                                                   \
      rs[r] = rt;                                                                   \
    }                                                                               \
  } while (0)

RM_CPU_KERNEL(layernorm) {
  (void)ctx; (void)nout;
  int64_t R, C;
  rows_cols(in[0], &R, &C);
  double eps = a->f[0];
  if (out[0]->dtype == RM_F64) LN_FWD(double);
  else LN_FWD(float);
  return RM_OK;
}

/* ---- layernorm_backward: in x, mean, rstd, g[, w]; out gx, gw, gb ----
 * i[0]: bit 0 compute gx, bit 1 gw, bit 2 gb (outputs not asked for are zeros). */

#define LN_BWD(T)                                                                   \
  do {                                                                              \
    const T *x = rm_tensor_ptr(in[0]), *mu = rm_tensor_ptr(in[1]);                  \
    const T *rs = rm_tensor_ptr(in[2]), *g = rm_tensor_ptr(in[3]);                  \
    const T *w = nin > 4 ? rm_tensor_ptr(in[4]) : NULL;                             \
    T *gx = rm_tensor_ptr(out[0]), *gw = rm_tensor_ptr(out[1]), *gb = rm_tensor_ptr(out[2]); \
    if (want & 1) {                                                                 \
      _Pragma("omp parallel for if (R * C > RM_CPU_PAR_MIN)")                       \
      for (int64_t r = 0; r < R; r++) {                                             \
        const T *xr = x + r * C, *gr = g + r * C;                                   \
        T *dr = gx + r * C;                                                         \
        T m = mu[r], rstd = rs[r];                                                  \
        double sa = 0, sb = 0;                                                      \
        for (int64_t j = 0; j < C; j++) {                                           \
          T gy = w ? gr[j] * w[j] : gr[j];                                          \
          sa += gy;                                                                 \
          sb += gy * (xr[j] - m) * rstd;                                            \
        }                                                                           \
        T ma = (T)(sa / (double)C), mb = (T)(sb / (double)C);                       \
        for (int64_t j = 0; j < C; j++) {                                           \
          T gy = w ? gr[j] * w[j] : gr[j];                                          \
          dr[j] = rstd * (gy - ma - (xr[j] - m) * rstd * mb);                       \
        }                                                                           \
      }                                                                             \
    }                                                                               \
    int64_t nb = (C + COLS - 1) / COLS;                                             \
    _Pragma("omp parallel for if (R * C > RM_CPU_PAR_MIN)")                         \
    for (int64_t t = 0; t < nb; t++) {                                              \
      int64_t j0 = t * COLS, jn = C - j0 < COLS ? C - j0 : COLS;                    \
      double aw[COLS] = { 0 }, ab[COLS] = { 0 };                                    \
      if (want & 6)                                                                 \
        for (int64_t r = 0; r < R; r++) {                                           \
          const T *xr = x + r * C + j0, *gr = g + r * C + j0;                       \
          T m = mu[r], rstd = rs[r];                                                \
          for (int64_t j = 0; j < jn; j++) {                                        \
            aw[j] += gr[j] * ((xr[j] - m) * rstd);                                  \
            ab[j] += gr[j];                                                         \
          }                                                                         \
        }                                                                           \
      for (int64_t j = 0; j < jn; j++) {                                            \
        gw[j0 + j] = (want & 2) ? (T)aw[j] : (T)0;                                  \
        gb[j0 + j] = (want & 4) ? (T)ab[j] : (T)0;                                  \
      }                                                                             \
    }                                                                               \
  } while (0)

RM_CPU_KERNEL(layernorm_backward) {
  (void)ctx; (void)nout;
  int64_t R, C;
  rows_cols(in[0], &R, &C);
  int64_t want = a->i[0];
  if (out[0]->dtype == RM_F64) LN_BWD(double);
  else LN_BWD(float);
  return RM_OK;
}

/* ---- rmsnorm: in x[, w]; out y, rstd; f[0] eps ---- */

#define RMS_FWD(T)                                                                  \
  do {                                                                              \
    const T *x = rm_tensor_ptr(in[0]);                                              \
    const T *w = nin > 1 ? rm_tensor_ptr(in[1]) : NULL;                             \
    T *y = rm_tensor_ptr(out[0]), *rs = rm_tensor_ptr(out[1]);                      \
    _Pragma("omp parallel for if (R * C > RM_CPU_PAR_MIN)")                         \
    for (int64_t r = 0; r < R; r++) {                                               \
      const T *xr = x + r * C;                                                      \
      T *yr = y + r * C;                                                            \
      double s = 0;                                                                 \
      for (int64_t j = 0; j < C; j++) s += (double)xr[j] * xr[j];                   \
      T rt = (T)(1.0 / sqrt(s / (double)C + eps));                                  \
      for (int64_t j = 0; j < C; j++) yr[j] = w ? xr[j] * rt * w[j] : xr[j] * rt;   \
      rs[r] = rt;                                                                   \
    }                                                                               \
  } while (0)

RM_CPU_KERNEL(rmsnorm) {
  (void)ctx; (void)nout;
  int64_t R, C;
  rows_cols(in[0], &R, &C);
  double eps = a->f[0];
  if (out[0]->dtype == RM_F64) RMS_FWD(double);
  else RMS_FWD(float);
  return RM_OK;
}

/* ---- rmsnorm_backward: in x, rstd, g[, w]; out gx, gw; i[0]: bit 0 gx, bit 1 gw ---- */

#define RMS_BWD(T)                                                                  \
  do {                                                                              \
    const T *x = rm_tensor_ptr(in[0]), *rs = rm_tensor_ptr(in[1]), *g = rm_tensor_ptr(in[2]); \
    const T *w = nin > 3 ? rm_tensor_ptr(in[3]) : NULL;                             \
    T *gx = rm_tensor_ptr(out[0]), *gw = rm_tensor_ptr(out[1]);                     \
    if (want & 1) {                                                                 \
      _Pragma("omp parallel for if (R * C > RM_CPU_PAR_MIN)")                       \
      for (int64_t r = 0; r < R; r++) {                                             \
        const T *xr = x + r * C, *gr = g + r * C;                                   \
        T *dr = gx + r * C;                                                         \
        T rstd = rs[r];                                                             \
        double sb = 0;                                                              \
        for (int64_t j = 0; j < C; j++) sb += (w ? gr[j] * w[j] : gr[j]) * xr[j] * rstd; \
        T mb = (T)(sb / (double)C);                                                 \
        for (int64_t j = 0; j < C; j++) {                                           \
          T gy = w ? gr[j] * w[j] : gr[j];                                          \
          dr[j] = rstd * (gy - xr[j] * rstd * mb);                                  \
        }                                                                           \
      }                                                                             \
    }                                                                               \
    int64_t nb = (C + COLS - 1) / COLS;                                             \
    _Pragma("omp parallel for if (R * C > RM_CPU_PAR_MIN)")                         \
    for (int64_t t = 0; t < nb; t++) {                                              \
      int64_t j0 = t * COLS, jn = C - j0 < COLS ? C - j0 : COLS;                    \
      double aw[COLS] = { 0 };                                                      \
      if (want & 2)                                                                 \
        for (int64_t r = 0; r < R; r++) {                                           \
          const T *xr = x + r * C + j0, *gr = g + r * C + j0;                       \
          T rstd = rs[r];                                                           \
          for (int64_t j = 0; j < jn; j++) aw[j] += gr[j] * (xr[j] * rstd);         \
        }                                                                           \
      for (int64_t j = 0; j < jn; j++) gw[j0 + j] = (T)aw[j];                       \
    }                                                                               \
  } while (0)

RM_CPU_KERNEL(rmsnorm_backward) {
  (void)ctx; (void)nout;
  int64_t R, C;
  rows_cols(in[0], &R, &C);
  int64_t want = a->i[0];
  if (out[0]->dtype == RM_F64) RMS_BWD(double);
  else RMS_BWD(float);
  return RM_OK;
}
