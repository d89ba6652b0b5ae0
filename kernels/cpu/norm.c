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

/* rmsnorm is layernorm without centring and bias: the loops below serve both, mean
 * taken as 0 when there is no mean tensor (x - 0 is exactly x, so rmsnorm's results
 * are what its own loops gave). */

/* Forward over R rows of C: y = (x - mean) * rstd [* w] [+ b]; stores the row
 * statistics (mean only for layernorm). Tensors tw, tb, tmu may be NULL. */
#define NORM_FWD(T, tx, tw, tb, ty, tmu, trs)                                       \
  do {                                                                              \
    const T *x = rm_tensor_ptr(tx);                                                 \
    const T *w = tw ? rm_tensor_ptr(tw) : NULL, *b = tb ? rm_tensor_ptr(tb) : NULL; \
    T *y = rm_tensor_ptr(ty), *rs = rm_tensor_ptr(trs);                             \
    T *mu = tmu ? rm_tensor_ptr(tmu) : NULL;                                        \
    _Pragma("omp parallel for if (R * C > RM_CPU_PAR_MIN)")                         \
    for (int64_t r = 0; r < R; r++) {                                               \
      const T *xr = x + r * C;                                                      \
      T *yr = y + r * C;                                                            \
      double m = 0, v = 0;                                                          \
      if (mu) {                                                                     \
        double s = 0;                                                               \
        for (int64_t j = 0; j < C; j++) s += xr[j];                                 \
        m = s / (double)C;                                                          \
      }                                                                             \
      for (int64_t j = 0; j < C; j++) { double d = xr[j] - m; v += d * d; }         \
      double rstd = 1.0 / sqrt(v / (double)C + eps);                                \
      T mt = (T)m, rt = (T)rstd;                                                    \
      for (int64_t j = 0; j < C; j++) {                                             \
        T h = (xr[j] - mt) * rt;                                                    \
        h = w ? h * w[j] : h;                                                       \
        /* layernorm adds its bias, +0 when it has none (a -0 comes out +0) */      \
        yr[j] = mu ? h + (b ? b[j] : (T)0) : h;                                     \
      }                                                                             \
      if (mu) mu[r] = mt;                                                           \
      rs[r] = rt;                                                                   \
    }                                                                               \
  } while (0)

/* Backward from the saved statistics: gx (when want & 1), gw (want & 2), gb (want & 4;
 * layernorm only); gradients not asked for are zeros. tmu, tw, tgb may be NULL. */
#define NORM_BWD(T, tx, tmu, trs, tg, tw, tgx, tgw, tgb)                            \
  do {                                                                              \
    const T *x = rm_tensor_ptr(tx), *rs = rm_tensor_ptr(trs), *g = rm_tensor_ptr(tg); \
    const T *mu = tmu ? rm_tensor_ptr(tmu) : NULL, *w = tw ? rm_tensor_ptr(tw) : NULL; \
    T *gx = rm_tensor_ptr(tgx), *gw = rm_tensor_ptr(tgw);                           \
    T *gb = tgb ? rm_tensor_ptr(tgb) : NULL;                                        \
    if (want & 1) {                                                                 \
      _Pragma("omp parallel for if (R * C > RM_CPU_PAR_MIN)")                       \
      for (int64_t r = 0; r < R; r++) {                                             \
        const T *xr = x + r * C, *gr = g + r * C;                                   \
        T *dr = gx + r * C;                                                         \
        T m = mu ? mu[r] : (T)0, rstd = rs[r];                                      \
        double sa = 0, sb = 0;                                                      \
        for (int64_t j = 0; j < C; j++) {                                           \
          T gy = w ? gr[j] * w[j] : gr[j];                                          \
          sa += gy;                                                                 \
          sb += gy * (xr[j] - m) * rstd;                                            \
        }                                                                           \
        T ma = mu ? (T)(sa / (double)C) : (T)0, mb = (T)(sb / (double)C);           \
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
          T m = mu ? mu[r] : (T)0, rstd = rs[r];                                    \
          for (int64_t j = 0; j < jn; j++) {                                        \
            aw[j] += gr[j] * ((xr[j] - m) * rstd);                                  \
            ab[j] += gr[j];                                                         \
          }                                                                         \
        }                                                                           \
      for (int64_t j = 0; j < jn; j++) {                                            \
        gw[j0 + j] = (want & 2) ? (T)aw[j] : (T)0;                                  \
        if (gb) gb[j0 + j] = (want & 4) ? (T)ab[j] : (T)0;                          \
      }                                                                             \
    }                                                                               \
  } while (0)

/* layernorm: in x[, w[, b]]; out y, mean, rstd; f[0] eps */
RM_CPU_KERNEL(layernorm) {
  int64_t R, C;
  rows_cols(in[0], &R, &C);
  double eps = a->norm.eps;
  rm_tensor *wt = nin > 1 ? in[1] : NULL, *bt = nin > 2 ? in[2] : NULL;
  if (out[0]->dtype == RM_F64) NORM_FWD(double, in[0], wt, bt, out[0], out[1], out[2]);
  else NORM_FWD(float, in[0], wt, bt, out[0], out[1], out[2]);
  return RM_OK;
}

/* layernorm_backward: in x, mean, rstd, g[, w]; out gx, gw, gb;
 * i[0]: bit 0 compute gx, bit 1 gw, bit 2 gb (outputs not asked for are zeros) */
RM_CPU_KERNEL(layernorm_backward) {
  int64_t R, C;
  rows_cols(in[0], &R, &C);
  int64_t want = a->norm_backward.want;
  rm_tensor *wt = nin > 4 ? in[4] : NULL;
  if (out[0]->dtype == RM_F64) NORM_BWD(double, in[0], in[1], in[2], in[3], wt, out[0], out[1], out[2]);
  else NORM_BWD(float, in[0], in[1], in[2], in[3], wt, out[0], out[1], out[2]);
  return RM_OK;
}

/* rmsnorm: in x[, w]; out y, rstd; f[0] eps */
RM_CPU_KERNEL(rmsnorm) {
  int64_t R, C;
  rows_cols(in[0], &R, &C);
  double eps = a->norm.eps;
  rm_tensor *wt = nin > 1 ? in[1] : NULL;
  if (out[0]->dtype == RM_F64) NORM_FWD(double, in[0], wt, NULL, out[0], NULL, out[1]);
  else NORM_FWD(float, in[0], wt, NULL, out[0], NULL, out[1]);
  return RM_OK;
}

/* rmsnorm_backward: in x, rstd, g[, w]; out gx, gw; i[0]: bit 0 gx, bit 1 gw */
RM_CPU_KERNEL(rmsnorm_backward) {
  int64_t R, C;
  rows_cols(in[0], &R, &C);
  int64_t want = a->norm_backward.want;
  rm_tensor *wt = nin > 3 ? in[3] : NULL;
  if (out[0]->dtype == RM_F64) NORM_BWD(double, in[0], NULL, in[1], in[2], wt, out[0], out[1], NULL);
  else NORM_BWD(float, in[0], NULL, in[1], in[2], wt, out[0], out[1], NULL);
  return RM_OK;
}
