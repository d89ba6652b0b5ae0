/* CPU kernels for batchnorm and its backward helper (semantics in core/op_batchnorm.c).
 * x is contiguous (N, C, S), S the product of the dims after the channel. Channels are
 * independent (OpenMP over channels); a channel's sums accumulate in double in a fixed
 * order, so results do not depend on the number of threads. */
#include <math.h>
#include <string.h>

#include "cpu.h"

/* Sums over channel c of x (N, C, S): s1 = sum x, then s2 = sum (x - mean)^2. */
#define BN_STATS(T, x, N, C, S, c, mean, var)                                           \
  do {                                                                                  \
    double s1_ = 0, s2_ = 0;                                                            \
    for (int64_t n_ = 0; n_ < (N); n_++) {                                              \
      const T *r_ = (x) + (n_ * (C) + (c)) * (S);                                       \
      _Pragma("omp simd reduction(+:s1_)")                                              \
      for (int64_t s_ = 0; s_ < (S); s_++) s1_ += r_[s_];                               \
    }                                                                                   \
    const double m_ = s1_ / (double)((N) * (S));                                        \
    for (int64_t n_ = 0; n_ < (N); n_++) {                                              \
      const T *r_ = (x) + (n_ * (C) + (c)) * (S);                                       \
      _Pragma("omp simd reduction(+:s2_)")                                              \
      for (int64_t s_ = 0; s_ < (S); s_++) {                                            \
        const double d_ = r_[s_] - m_;                                                  \
        s2_ += d_ * d_;                                                                 \
      }                                                                                 \
    }                                                                                   \
    (mean) = m_;                                                                        \
    (var) = s2_ / (double)((N) * (S));                                                  \
  } while (0)

/* x (N, C, S) [, w, b (C)] -> y (N, C, S), mean (C), var (C) */
#define BN_FWD(T)                                                                       \
  do {                                                                                  \
    const T *x = rm_tensor_ptr(in[0]);                                                  \
    const T *w = nin > 1 ? rm_tensor_ptr(in[1]) : NULL, *b = nin > 2 ? rm_tensor_ptr(in[2]) : NULL; \
    T *y = rm_tensor_ptr(out[0]), *mo = rm_tensor_ptr(out[1]), *vo = rm_tensor_ptr(out[2]); \
    _Pragma("omp parallel for if (N * C * S > RM_CPU_PAR_MIN)")                         \
    for (int64_t c = 0; c < C; c++) {                                                   \
      double m, v;                                                                      \
      BN_STATS(T, x, N, C, S, c, m, v);                                                 \
      const T mt = (T)m, rt = (T)(1.0 / sqrt(v + eps));                                 \
      const T scale = w ? rt * w[c] : rt, shift = b ? b[c] : (T)0;                      \
      for (int64_t n = 0; n < N; n++) {                                                 \
        const T *xr = x + (n * C + c) * S;                                              \
        T *yr = y + (n * C + c) * S;                                                    \
        _Pragma("omp simd")                                                             \
        for (int64_t s = 0; s < S; s++) yr[s] = (xr[s] - mt) * scale + shift;           \
      }                                                                                 \
      mo[c] = mt;                                                                       \
      vo[c] = (T)v;                                                                     \
    }                                                                                   \
  } while (0)

static void bn_dims(const rm_tensor *x, int64_t *N, int64_t *C, int64_t *S) {
  *N = x->shape[0];
  *C = x->shape[1];
  *S = 1;
  for (int d = 2; d < x->ndim; d++) *S *= x->shape[d];
}

RM_CPU_KERNEL(batchnorm) {
  int64_t N, C, S;
  bn_dims(in[0], &N, &C, &S);
  const double eps = a->norm.eps;
  if (out[0]->dtype == RM_F64) BN_FWD(double);
  else if (out[0]->dtype == RM_F32) BN_FWD(float);
  else return rm_fail(ctx, RM_ERR_DTYPE, "batchnorm: cpu does not support %s", rm_dtype_name(out[0]->dtype));
  return RM_OK;
}

/* (x, mean, var, g [, w]) -> gx, gw, gb. Per channel, with xhat = (x - mean) rstd:
 * gb = sum g, gw = sum g xhat, gx = rstd w (g - gb / M - xhat gw / M), M = N S. */
#define BN_BWD(T)                                                                       \
  do {                                                                                  \
    const T *x = rm_tensor_ptr(in[0]), *mean = rm_tensor_ptr(in[1]), *var = rm_tensor_ptr(in[2]); \
    const T *g = rm_tensor_ptr(in[3]), *w = nin > 4 ? rm_tensor_ptr(in[4]) : NULL;      \
    T *gx = rm_tensor_ptr(out[0]), *gw = rm_tensor_ptr(out[1]), *gb = rm_tensor_ptr(out[2]); \
    _Pragma("omp parallel for if (N * C * S > RM_CPU_PAR_MIN)")                         \
    for (int64_t c = 0; c < C; c++) {                                                   \
      const T mt = mean[c], rt = (T)(1.0 / sqrt((double)var[c] + eps));                 \
      double sa = 0, sb = 0;                                                            \
      for (int64_t n = 0; n < N; n++) {                                                 \
        const T *xr = x + (n * C + c) * S, *gr = g + (n * C + c) * S;                   \
        _Pragma("omp simd reduction(+:sa, sb)")                                         \
        for (int64_t s = 0; s < S; s++) {                                               \
          sa += gr[s];                                                                  \
          sb += (double)gr[s] * (double)((xr[s] - mt) * rt);                            \
        }                                                                               \
      }                                                                                 \
      gb[c] = (T)sa;                                                                    \
      gw[c] = (T)sb;                                                                    \
      if (want & 1) {                                                                   \
        const double M = (double)(N * S);                                               \
        const T k = w ? rt * w[c] : rt, ma = (T)(sa / M), mb = (T)(sb / M);             \
        for (int64_t n = 0; n < N; n++) {                                               \
          const T *xr = x + (n * C + c) * S, *gr = g + (n * C + c) * S;                 \
          T *dr = gx + (n * C + c) * S;                                                 \
          _Pragma("omp simd")                                                           \
          for (int64_t s = 0; s < S; s++) dr[s] = k * (gr[s] - ma - (xr[s] - mt) * rt * mb); \
        }                                                                               \
      }                                                                                 \
    }                                                                                   \
    if (!(want & 1)) memset(gx, 0, (size_t)(N * C * S) * sizeof(T));                   \
  } while (0)

RM_CPU_KERNEL(batchnorm_backward) {
  int64_t N, C, S;
  bn_dims(in[0], &N, &C, &S);
  const double eps = a->batchnorm_backward.eps;
  const int64_t want = a->batchnorm_backward.want;
  if (out[0]->dtype == RM_F64) BN_BWD(double);
  else if (out[0]->dtype == RM_F32) BN_BWD(float);
  else return rm_fail(ctx, RM_ERR_DTYPE, "batchnorm_backward: cpu does not support %s", rm_dtype_name(out[0]->dtype));
  return RM_OK;
}
