/* CPU kernels for the losses (see core/op_loss.c). Row math and sums run in double for
 * both dtypes. cross_entropy_backward may write over its logits (core/op_loss.c does so
 * when nothing reads them afterwards): each row is read whole (its lse) before it is
 * written, and element j is read just before it is written. Sums are split into a fixed number of chunks that depends only on the
 * size, added in order, so the loss is bit-identical whatever the thread count. */
#include <math.h>

#include "cpu.h"
#include "fastmath.h"

#define CHUNKS 64

/* total = the sum over i in [0, n) of the terms that the statement BODY adds to `acc`
 * for index i: [0, n) is cut into CHUNKS chunks that depend only on n (OpenMP over
 * them when work > RM_CPU_PAR_MIN), whose sums are added in order. */
#define CHUNKED_SUM(total, n, work, i, ...)                                              \
  do {                                                                                   \
    double part_[CHUNKS] = { 0 };                                                        \
    int64_t n_ = (n), work_ = (work), per_ = (n_ + CHUNKS - 1) / CHUNKS;                 \
    _Pragma("omp parallel for if (work_ > RM_CPU_PAR_MIN)")                              \
    for (int c_ = 0; c_ < CHUNKS; c_++) {                                                \
      double acc = 0;                                                                    \
      int64_t end_ = (c_ + 1) * per_ < n_ ? (c_ + 1) * per_ : n_;                        \
      for (int64_t i = c_ * per_; i < end_; i++) __VA_ARGS__                             \
      part_[c_] = acc;                                                                   \
    }                                                                                    \
    (total) = 0;                                                                         \
    for (int c_ = 0; c_ < CHUNKS; c_++) (total) += part_[c_];                            \
  } while (0)

/* log(sum(exp(row))), computed stably (NaN in, NaN out). The exps run in the data
 * type (float32: the vectorisable rm_expf; row[j] - max rounds by at most half an ulp
 * of a difference whose exp is then small next to the sum's 1), the sum in double. */
#define ROW_LSE(T, row, C, out)                                      \
  do {                                                               \
    T m_ = -INFINITY;                                                \
    double s_ = 0;                                                   \
    _Pragma("omp simd reduction(max:m_)")                            \
    for (int64_t j_ = 0; j_ < (C); j_++)                             \
      m_ = (row)[j_] > m_ ? (row)[j_] : m_; /* NaN never wins */     \
    _Pragma("omp simd reduction(+:s_)")                              \
    for (int64_t j_ = 0; j_ < (C); j_++) s_ += EXP_##T((row)[j_] - m_); \
    (out) = (double)m_ + log(s_);                                    \
  } while (0)

static inline double EXP_double(double x) { return exp(x); }
static inline float EXP_float(float x) { return rm_expf(x); }

/* exp(x - lse) for a float32 x and a double lse: the difference, exact in double, is
 * passed to rm_expf_hilo as a float plus its rounding error, so the probability keeps
 * float accuracy however far x is below lse. */
static inline float exp_diff_float(float x, double lse) {
  double d = (double)x - lse;
  float hi = (float)d;
  return rm_expf_hilo(hi, (float)(d - (double)hi));
}
static inline double exp_diff_double(double x, double lse) { return exp(x - lse); }

/* ROW_LSE and the gradient row of cross_entropy_backward for float32, compiled per ISA
 * (RM_FM_MULTIVERSION_FMA: the build's SSE4.2 ran the backward at 9 ns an element on
 * two threads, a language model's whole vocabulary per token). row and o may be the
 * same (the backward writing over its logits): each element is read before it is
 * written, after the row's lse. */
RM_FM_MULTIVERSION_FMA(double, ce_row_lse_f32, (const float *row, int64_t classes), (row, classes), {
  double lse;
  ROW_LSE(float, row, classes, lse);
  return lse;
})
RM_FM_MULTIVERSION_FMA(void, ce_row_backward_f32,
                       (const float *row, float *o, int64_t classes, int64_t y, double scale),
                       (row, o, classes, y, scale), {
  double lse;
  ROW_LSE(float, row, classes, lse);
  /* x - lse as the float pair (s, err - ll): lse = lh + ll, and s + err = x - lh exactly
   * (Knuth's two-sum), so each probability keeps float accuracy however far x lies below
   * lse, in float lanes (exp_diff_float's double arithmetic did not vectorise). One
   * declaration a line: this body is a macro argument, where a comma would split it. */
  float lh = (float)lse;
  float ll = (float)(lse - (double)lh);
  float sc = (float)scale;
  float xy = y >= 0 && y < classes ? row[y] : 0.0f; /* read before o overwrites it */
  _Pragma("omp simd")
  for (int64_t j = 0; j < classes; j++) {
    float x = row[j];
    float s = x - lh;
    float b = s - x;
    float err = (x - (s - b)) + (-lh - b);
    /* below -110 the probability is 0 in float (and a -inf logit's pair is NaN) */
    o[j] = rm_fm_sel_(s < -110.0f, 0.0f, rm_expf_hilo(s, err - ll) * sc);
  }
  if (y >= 0 && y < classes) {
    double py = (double)xy - lse < -110.0 ? 0.0 : (double)exp_diff_float(xy, lse);
    o[y] = (float)((py - 1.0) * scale);
  }
})

#define ROW_LSE_double(row, C, out) ROW_LSE(double, row, C, out)
#define ROW_LSE_float(row, C, out) ((out) = ce_row_lse_f32(row, C))

#define CE_FORWARD(T)                                                                    \
  do {                                                                                   \
    const T *px = rm_tensor_ptr(in[0]);                                                  \
    double total;                                                                        \
    CHUNKED_SUM(total, rows, rows * classes, r, {                                        \
      const T *row = px + r * classes;                                                   \
      double lse;                                                                        \
      ROW_LSE_##T(row, classes, lse);                                                    \
      acc += lse - (double)row[rm_cpu_index_at(lp, r)];                                  \
    });                                                                                  \
    *(T *)rm_tensor_ptr(out[0]) = (T)(total / (double)rows);                             \
  } while (0)

RM_CPU_KERNEL(cross_entropy) {
  int64_t rows = in[0]->shape[0], classes = in[0]->shape[1];
  if (rm_cpu_check_indices(ctx, "cross_entropy", "label", in[1], classes, -1, "row"))
    return ctx->err_code;
  rm_cpu_indices lp = rm_cpu_indices_of(in[1]);
  if (out[0]->dtype == RM_F64) CE_FORWARD(double);
  else CE_FORWARD(float);
  return RM_OK;
}

#define CE_BACKWARD(T, ROW)                                                              \
  do {                                                                                   \
    const T *px = rm_tensor_ptr(in[0]);                                                  \
    T *po = rm_tensor_ptr(out[0]);                                                       \
    double scale = (double)*(const T *)rm_tensor_ptr(in[2]) / (double)rows;              \
    _Pragma("omp parallel for if (rows * classes > RM_CPU_PAR_MIN)")                     \
    for (int64_t r = 0; r < rows; r++)                                                   \
      ROW(px + r * classes, po + r * classes, classes, rm_cpu_index_at(lp, r), scale);  \
  } while (0)

static void ce_row_backward_f64(const double *row, double *o, int64_t classes, int64_t y, double scale) {
  double lse;
  ROW_LSE(double, row, classes, lse);
  for (int64_t j = 0; j < classes; j++) o[j] = (exp_diff_double(row[j], lse) - (j == y ? 1.0 : 0.0)) * scale;
}

RM_CPU_KERNEL(cross_entropy_backward) {
  int64_t rows = in[0]->shape[0], classes = in[0]->shape[1];
  if (rm_cpu_check_indices(ctx, "cross_entropy_backward", "label", in[1], classes, -1, "row"))
    return ctx->err_code;
  rm_cpu_indices lp = rm_cpu_indices_of(in[1]);
  if (out[0]->dtype == RM_F64) CE_BACKWARD(double, ce_row_backward_f64);
  else CE_BACKWARD(float, ce_row_backward_f32);
  return RM_OK;
}

#define MSE_LOOP(T)                                                                      \
  do {                                                                                   \
    const T *pp = rm_tensor_ptr(in[0]), *pt = rm_tensor_ptr(in[1]);                      \
    double total;                                                                        \
    CHUNKED_SUM(total, n, n, i, {                                                        \
      double d = (double)pp[i] - (double)pt[i];                                          \
      acc += d * d;                                                                      \
    });                                                                                  \
    *(T *)rm_tensor_ptr(out[0]) = (T)(total / (double)n);                                \
  } while (0)

RM_CPU_KERNEL(mse) {
  int64_t n = rm_tensor_numel(in[0]);
  if (out[0]->dtype == RM_F64) MSE_LOOP(double);
  else MSE_LOOP(float);
  return RM_OK;
}
