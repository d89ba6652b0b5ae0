/* CPU kernels for elementwise ops. Inputs arrive as strided views already broadcast to
 * the output shape; outputs are contiguous. Fast path when every input is contiguous. */
#include <math.h>

#include "cpu.h"

/* Applies EXPR (over a, b: the elements of in[0], in[1]) for every output element. */
#define BINARY_LOOP(T, EXPR)                                                         \
  do {                                                                               \
    const T *pa = rm_tensor_ptr(in[0]), *pb = rm_tensor_ptr(in[1]);                  \
    T *po = rm_tensor_ptr(out[0]);                                                   \
    int64_t n = rm_tensor_numel(out[0]);                                             \
    if (rm_tensor_is_contiguous(in[0]) && rm_tensor_is_contiguous(in[1])) {          \
      _Pragma("omp parallel for if (n > RM_CPU_PAR_MIN)")                            \
      for (int64_t i = 0; i < n; i++) { T a_ = pa[i], b_ = pb[i]; po[i] = (EXPR); }  \
    } else {                                                                         \
      _Pragma("omp parallel for if (n > RM_CPU_PAR_MIN)")                            \
      for (int64_t i = 0; i < n; i++) {                                              \
        T a_ = pa[rm_cpu_offset(in[0], i)], b_ = pb[rm_cpu_offset(in[1], i)];        \
        po[i] = (EXPR);                                                              \
      }                                                                              \
    }                                                                                \
  } while (0)

#define UNARY_LOOP(T, EXPR)                                                          \
  do {                                                                               \
    const T *pa = rm_tensor_ptr(in[0]);                                              \
    T *po = rm_tensor_ptr(out[0]);                                                   \
    int64_t n = rm_tensor_numel(out[0]);                                             \
    if (rm_tensor_is_contiguous(in[0])) {                                            \
      _Pragma("omp parallel for if (n > RM_CPU_PAR_MIN)")                            \
      for (int64_t i = 0; i < n; i++) { T a_ = pa[i]; po[i] = (EXPR); }              \
    } else {                                                                         \
      _Pragma("omp parallel for if (n > RM_CPU_PAR_MIN)")                            \
      for (int64_t i = 0; i < n; i++) { T a_ = pa[rm_cpu_offset(in[0], i)]; po[i] = (EXPR); } \
    }                                                                                \
  } while (0)

#define DEFINE_BINARY(name, EXPR)                                          \
  RM_CPU_KERNEL(name) {                                                    \
    (void)ctx; (void)nin; (void)nout; (void)a;                             \
    if (out[0]->dtype == RM_F64) BINARY_LOOP(double, EXPR);                \
    else BINARY_LOOP(float, EXPR);                                         \
    return RM_OK;                                                          \
  }

#define DEFINE_UNARY(name, EXPR)                                           \
  RM_CPU_KERNEL(name) {                                                    \
    (void)ctx; (void)nin; (void)nout;                                      \
    const double s_ = a->f[0]; (void)s_;                                   \
    if (out[0]->dtype == RM_F64) UNARY_LOOP(double, EXPR);                 \
    else UNARY_LOOP(float, EXPR);                                          \
    return RM_OK;                                                          \
  }

DEFINE_BINARY(add, a_ + b_)
DEFINE_BINARY(sub, a_ - b_)
DEFINE_BINARY(mul, a_ * b_)
DEFINE_BINARY(div, a_ / b_)

DEFINE_UNARY(neg, -a_)
DEFINE_UNARY(add_scalar, a_ + s_)
DEFINE_UNARY(mul_scalar, a_ * s_)
DEFINE_UNARY(copy, a_)

RM_CPU_KERNEL(fill) {
  (void)ctx; (void)nin; (void)in; (void)nout;
  int64_t n = rm_tensor_numel(out[0]);
  if (out[0]->dtype == RM_F64) {
    double *p = rm_tensor_ptr(out[0]);
    for (int64_t i = 0; i < n; i++) p[i] = a->f[0];
  } else {
    float *p = rm_tensor_ptr(out[0]);
    float v = (float)a->f[0];
    for (int64_t i = 0; i < n; i++) p[i] = v;
  }
  return RM_OK;
}

RM_CPU_KERNEL(cast) {
  (void)ctx; (void)nin; (void)nout; (void)a;
  int64_t n = rm_tensor_numel(out[0]);
  bool contig = rm_tensor_is_contiguous(in[0]);
  if (in[0]->dtype == RM_F32 && out[0]->dtype == RM_F64) {
    const float *s = rm_tensor_ptr(in[0]);
    double *d = rm_tensor_ptr(out[0]);
    for (int64_t i = 0; i < n; i++) d[i] = s[contig ? i : rm_cpu_offset(in[0], i)];
  } else if (in[0]->dtype == RM_F64 && out[0]->dtype == RM_F32) {
    const double *s = rm_tensor_ptr(in[0]);
    float *d = rm_tensor_ptr(out[0]);
    for (int64_t i = 0; i < n; i++) d[i] = (float)s[contig ? i : rm_cpu_offset(in[0], i)];
  } else if (in[0]->dtype == out[0]->dtype) {
    return rm_cpu_copy(ctx, nin, in, nout, out, a);
  } else {
    return rm_fail(ctx, RM_ERR_DTYPE, "cast: cpu cannot convert %s to %s",
                   rm_dtype_name(in[0]->dtype), rm_dtype_name(out[0]->dtype));
  }
  return RM_OK;
}
