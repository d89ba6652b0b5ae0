/* CPU kernels for layernorm and rmsnorm over the last dimension, and their backward
 * helpers. Rows are independent (OpenMP over rows); statistics accumulate in double.
 * Weight/bias gradients are summed over rows per block of columns, so the result does
 * not depend on the number of threads. */
#include <math.h>

#include "cpu.h"
#include "fastmath.h"

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

/* One row of the forward: y = (x - mean) * rstd [* w] [+ b] (center: layernorm, which
 * also adds its bias, +0 when it has none; else rmsnorm, mean 0), returning the row's
 * statistics. Sums in double over vector lanes (per ISA for float32, as RM_FM_MULTIVERSION:
 * a row's serial double sum was bound by the latency of its adds). */
#define NORM_FWD_ROW(T)                                                                  \
  (const T *restrict xr, const T *restrict w, const T *restrict b, T *restrict yr,       \
   int64_t C, double eps, bool center, T *mo, T *ro),                                    \
  (xr, w, b, yr, C, eps, center, mo, ro), {                                              \
    double m = 0;                                                                        \
    double v = 0;                                                                        \
    if (center) {                                                                        \
      double s = 0;                                                                      \
      _Pragma("omp simd reduction(+:s)")                                                 \
      for (int64_t j = 0; j < C; j++) s += xr[j];                                        \
      m = s / (double)C;                                                                 \
    }                                                                                    \
    _Pragma("omp simd reduction(+:v)")                                                   \
    for (int64_t j = 0; j < C; j++) {                                                    \
      double d = xr[j] - m;                                                              \
      v += d * d;                                                                        \
    }                                                                                    \
    double rstd = 1.0 / sqrt(v / (double)C + eps);                                       \
    T mt = (T)m;                                                                         \
    T rt = (T)rstd;                                                                      \
    if (center && w && b) {                                                              \
      _Pragma("omp simd")                                                                \
      for (int64_t j = 0; j < C; j++) yr[j] = (xr[j] - mt) * rt * w[j] + b[j];           \
    } else if (center && w) {                                                            \
      _Pragma("omp simd")                                                                \
      for (int64_t j = 0; j < C; j++) yr[j] = (xr[j] - mt) * rt * w[j] + (T)0;           \
    } else if (center && b) {                                                            \
      _Pragma("omp simd")                                                                \
      for (int64_t j = 0; j < C; j++) yr[j] = (xr[j] - mt) * rt + b[j];                  \
    } else if (center) {                                                                 \
      _Pragma("omp simd")                                                                \
      for (int64_t j = 0; j < C; j++) yr[j] = (xr[j] - mt) * rt + (T)0;                  \
    } else if (w) {                                                                      \
      _Pragma("omp simd")                                                                \
      for (int64_t j = 0; j < C; j++) yr[j] = (xr[j] - mt) * rt * w[j];                  \
    } else {                                                                             \
      _Pragma("omp simd")                                                                \
      for (int64_t j = 0; j < C; j++) yr[j] = (xr[j] - mt) * rt;                         \
    }                                                                                    \
    *mo = mt;                                                                            \
    *ro = rt;                                                                            \
  }

/* One row of the input gradient: gx = rstd (gy - mean(gy) - xhat mean(gy xhat)),
 * gy = g [* w] (a loop per case: a load from w under a condition does not vectorise). */
#define NORM_BWD_ROW(T)                                                                  \
  (const T *restrict xr, const T *restrict gr, const T *restrict w, T *restrict dr,      \
   int64_t C, bool center, T m, T rstd),                                                 \
  (xr, gr, w, dr, C, center, m, rstd), {                                                 \
    double sa = 0;                                                                       \
    double sb = 0;                                                                       \
    if (w) {                                                                             \
      _Pragma("omp simd reduction(+:sa, sb)")                                            \
      for (int64_t j = 0; j < C; j++) {                                                  \
        T gy = gr[j] * w[j];                                                             \
        sa += gy;                                                                        \
        sb += gy * (xr[j] - m) * rstd;                                                   \
      }                                                                                  \
    } else {                                                                             \
      _Pragma("omp simd reduction(+:sa, sb)")                                            \
      for (int64_t j = 0; j < C; j++) {                                                  \
        sa += gr[j];                                                                     \
        sb += gr[j] * (xr[j] - m) * rstd;                                                \
      }                                                                                  \
    }                                                                                    \
    T ma = center ? (T)(sa / (double)C) : (T)0;                                          \
    T mb = (T)(sb / (double)C);                                                          \
    if (w) {                                                                             \
      _Pragma("omp simd")                                                                \
      for (int64_t j = 0; j < C; j++)                                                    \
        dr[j] = rstd * (gr[j] * w[j] - ma - (xr[j] - m) * rstd * mb);                    \
    } else {                                                                             \
      _Pragma("omp simd")                                                                \
      for (int64_t j = 0; j < C; j++) dr[j] = rstd * (gr[j] - ma - (xr[j] - m) * rstd * mb); \
    }                                                                                    \
  }

/* aw[0, jn) += sum over rows of g * xhat, ab[0, jn) += sum of g, for columns j0.. */
#define NORM_COLS(T)                                                                     \
  (const T *restrict x, const T *restrict g, const T *restrict mu, const T *restrict rs, \
   int64_t R, int64_t C, int64_t j0, int64_t jn, double *restrict aw, double *restrict ab), \
  (x, g, mu, rs, R, C, j0, jn, aw, ab), {                                                \
    for (int64_t r = 0; r < R; r++) {                                                    \
      const T *xr = x + r * C + j0;                                                      \
      const T *gr = g + r * C + j0;                                                      \
      T m = mu ? mu[r] : (T)0;                                                           \
      T rstd = rs[r];                                                                    \
      _Pragma("omp simd")                                                                \
      for (int64_t j = 0; j < jn; j++) {                                                 \
        aw[j] += gr[j] * ((xr[j] - m) * rstd);                                           \
        ab[j] += gr[j];                                                                  \
      }                                                                                  \
    }                                                                                    \
  }

/* (the parameter lists expand into the macros' arguments through one more level) */
#define MV(...) RM_FM_MULTIVERSION(__VA_ARGS__)
#define PLAIN_(ret, name, params, args, body) static ret name params body
#define PLAIN(...) PLAIN_(__VA_ARGS__)
MV(void, fwd_row_f, NORM_FWD_ROW(float))
MV(void, bwd_row_f, NORM_BWD_ROW(float))
MV(void, cols_f, NORM_COLS(float))
PLAIN(void, fwd_row_d, NORM_FWD_ROW(double))
PLAIN(void, bwd_row_d, NORM_BWD_ROW(double))
PLAIN(void, cols_d, NORM_COLS(double))

/* Forward over R rows of C; stores the row statistics (mean only for layernorm).
 * Tensors tw, tb, tmu may be NULL. */
#define NORM_FWD(T, S, tx, tw, tb, ty, tmu, trs)                                    \
  do {                                                                              \
    const T *x = rm_tensor_ptr(tx);                                                 \
    const T *w = tw ? rm_tensor_ptr(tw) : NULL, *b = tb ? rm_tensor_ptr(tb) : NULL; \
    T *y = rm_tensor_ptr(ty), *rs = rm_tensor_ptr(trs);                             \
    T *mu = tmu ? rm_tensor_ptr(tmu) : NULL;                                        \
    _Pragma("omp parallel for if (R * C > RM_CPU_PAR_MIN)")                         \
    for (int64_t r = 0; r < R; r++) {                                               \
      T mt;                                                                         \
      fwd_row_##S(x + r * C, w, b, y + r * C, C, eps, mu != NULL, &mt, &rs[r]);     \
      if (mu) mu[r] = mt;                                                           \
    }                                                                               \
  } while (0)

/* Backward from the saved statistics: gx (when want & 1), gw (want & 2), gb (want & 4;
 * layernorm only); gradients not asked for are zeros. tmu, tw, tgb may be NULL. */
#define NORM_BWD(T, S, tx, tmu, trs, tg, tw, tgx, tgw, tgb)                         \
  do {                                                                              \
    const T *x = rm_tensor_ptr(tx), *rs = rm_tensor_ptr(trs), *g = rm_tensor_ptr(tg); \
    const T *mu = tmu ? rm_tensor_ptr(tmu) : NULL, *w = tw ? rm_tensor_ptr(tw) : NULL; \
    T *gx = rm_tensor_ptr(tgx), *gw = rm_tensor_ptr(tgw);                           \
    T *gb = tgb ? rm_tensor_ptr(tgb) : NULL;                                        \
    if (want & 1) {                                                                 \
      _Pragma("omp parallel for if (R * C > RM_CPU_PAR_MIN)")                       \
      for (int64_t r = 0; r < R; r++)                                               \
        bwd_row_##S(x + r * C, g + r * C, w, gx + r * C, C, mu != NULL,             \
                    mu ? mu[r] : (T)0, rs[r]);                                      \
    }                                                                               \
    int64_t nb = (C + COLS - 1) / COLS;                                             \
    _Pragma("omp parallel for if (R * C > RM_CPU_PAR_MIN)")                         \
    for (int64_t t = 0; t < nb; t++) {                                              \
      int64_t j0 = t * COLS, jn = C - j0 < COLS ? C - j0 : COLS;                    \
      double aw[COLS] = { 0 }, ab[COLS] = { 0 };                                    \
      if (want & 6) cols_##S(x, g, mu, rs, R, C, j0, jn, aw, ab);                   \
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
  if (out[0]->dtype == RM_F64) NORM_FWD(double, d, in[0], wt, bt, out[0], out[1], out[2]);
  else NORM_FWD(float, f, in[0], wt, bt, out[0], out[1], out[2]);
  return RM_OK;
}

/* layernorm_backward: in x, mean, rstd, g[, w]; out gx, gw, gb;
 * i[0]: bit 0 compute gx, bit 1 gw, bit 2 gb (outputs not asked for are zeros) */
RM_CPU_KERNEL(layernorm_backward) {
  int64_t R, C;
  rows_cols(in[0], &R, &C);
  int64_t want = a->norm_backward.want;
  rm_tensor *wt = nin > 4 ? in[4] : NULL;
  if (out[0]->dtype == RM_F64) NORM_BWD(double, d, in[0], in[1], in[2], in[3], wt, out[0], out[1], out[2]);
  else NORM_BWD(float, f, in[0], in[1], in[2], in[3], wt, out[0], out[1], out[2]);
  return RM_OK;
}

/* rmsnorm: in x[, w]; out y, rstd; f[0] eps */
RM_CPU_KERNEL(rmsnorm) {
  int64_t R, C;
  rows_cols(in[0], &R, &C);
  double eps = a->norm.eps;
  rm_tensor *wt = nin > 1 ? in[1] : NULL;
  if (out[0]->dtype == RM_F64) NORM_FWD(double, d, in[0], wt, NULL, out[0], NULL, out[1]);
  else NORM_FWD(float, f, in[0], wt, NULL, out[0], NULL, out[1]);
  return RM_OK;
}

/* rmsnorm_backward: in x, rstd, g[, w]; out gx, gw; i[0]: bit 0 gx, bit 1 gw */
RM_CPU_KERNEL(rmsnorm_backward) {
  int64_t R, C;
  rows_cols(in[0], &R, &C);
  int64_t want = a->norm_backward.want;
  rm_tensor *wt = nin > 3 ? in[3] : NULL;
  if (out[0]->dtype == RM_F64) NORM_BWD(double, d, in[0], NULL, in[1], in[2], wt, out[0], out[1], NULL);
  else NORM_BWD(float, f, in[0], NULL, in[1], in[2], wt, out[0], out[1], NULL);
  return RM_OK;
}
