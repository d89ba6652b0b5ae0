/* CPU kernels for the random ops. They follow core/philox.h bit for bit (so CPU and
 * CUDA agree), but call Philox once per 4 uniforms (or 2 normals) instead of once per
 * element: element e uses counter offset/4 + e/4, lane e%4 (normals: e/2, lanes
 * 2(e%2), 2(e%2)+1), whatever the tensor's size. Dropout is in dropout.c. */
#include <math.h>

#include "../../core/philox.h"
#include "cpu.h"

/* The 4 uniforms in (0, 1] of elements 4q..4q+3. */
static inline void uniform4(uint64_t seed, uint64_t offset, int64_t q, double u[4]) {
  uint32_t r[4];
  rm_philox(offset / 4 + (uint64_t)q, seed, r);
  for (int l = 0; l < 4; l++) u[l] = ((double)r[l] + 1.0) * (1.0 / 4294967296.0);
}

/* The 2 normals of elements 2q, 2q+1 (the formula of rm_rand_normal). */
static inline void normal2(uint64_t seed, uint64_t offset, int64_t q, double z[2]) {
  uint32_t r[4];
  rm_philox(offset / 4 + (uint64_t)q, seed, r);
  for (int h = 0; h < 2; h++) {
    double u1 = ((double)r[2 * h] + 1.0) * (1.0 / 4294967296.0);
    double u2 = (double)r[2 * h + 1] * (1.0 / 4294967296.0);
    z[h] = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
  }
}

/* Philox is ~20 FLOPs per element: parallelise earlier than cheap loops. */
#define RAND_PAR_MIN (RM_CPU_PAR_MIN / 8)

#define RAND_LOOP(T)                                                                   \
  do {                                                                                 \
    T *po = rm_tensor_ptr(out[0]);                                                     \
    const int64_t ng = (n + 3) / 4;                                                    \
    _Pragma("omp parallel for if (n > RAND_PAR_MIN)")                                  \
    for (int64_t q = 0; q < ng; q++) {                                                 \
      double u[4];                                                                     \
      uniform4(a->seed, a->offset, q, u);                                              \
      for (int l = 0; l < 4 && 4 * q + l < n; l++) po[4 * q + l] = (T)u[l];            \
    }                                                                                  \
  } while (0)

RM_CPU_KERNEL(rand) {
  int64_t n = rm_tensor_numel(out[0]);
  if (out[0]->dtype == RM_F64) RAND_LOOP(double);
  else if (out[0]->dtype == RM_F32) RAND_LOOP(float);
  else return rm_fail(ctx, RM_ERR_DTYPE, "rand: cpu does not support %s", rm_dtype_name(out[0]->dtype));
  return RM_OK;
}

#define RANDN_LOOP(T)                                                                  \
  do {                                                                                 \
    T *po = rm_tensor_ptr(out[0]);                                                     \
    const int64_t ng = (n + 1) / 2;                                                    \
    _Pragma("omp parallel for if (n > RAND_PAR_MIN)")                                  \
    for (int64_t q = 0; q < ng; q++) {                                                 \
      double z[2];                                                                     \
      normal2(a->seed, a->offset, q, z);                                               \
      po[2 * q] = (T)z[0];                                                             \
      if (2 * q + 1 < n) po[2 * q + 1] = (T)z[1];                                      \
    }                                                                                  \
  } while (0)

RM_CPU_KERNEL(randn) {
  int64_t n = rm_tensor_numel(out[0]);
  if (out[0]->dtype == RM_F64) RANDN_LOOP(double);
  else if (out[0]->dtype == RM_F32) RANDN_LOOP(float);
  else return rm_fail(ctx, RM_ERR_DTYPE, "randn: cpu does not support %s", rm_dtype_name(out[0]->dtype));
  return RM_OK;
}
