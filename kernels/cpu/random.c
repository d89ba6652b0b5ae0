/* CPU kernels for the random ops. They follow core/philox.h bit for bit (so CPU and
 * CUDA agree), but call Philox once per 4 uniforms (or 2 normals) instead of once per
 * element: element e uses counter offset/4 + e/4, lane e%4 (normals: e/2, lanes
 * 2(e%2), 2(e%2)+1), whatever the tensor's size. */
#include <math.h>

#include "../../core/philox.h"
#include "cpu.h"
#include "fastmath.h"

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

/* Dropout draws Philox for 16 groups (64 elements) at once, lane by lane over arrays,
 * so that the compiler vectorises the rounds (the scalar rm_philox per 4 elements made
 * dropout 40% of a GPT step on CPU). Element e is kept when its uniform
 * u = (r + 1) / 2^32 is > p, that is when r >= floor(p * 2^32) (u and p * 2^32 are exact
 * in double, and r + 1 is an integer): the same mask as rm_rand_uniform, bit for bit. */
#define DROP_G 16

/* r[4 * g + l]: lane l of counter ctr + g (element order). */
__attribute__((always_inline)) static inline void philox_block(uint64_t ctr, uint64_t key, uint32_t r[4 * DROP_G]) {
  uint32_t c0[DROP_G], c1[DROP_G], c2[DROP_G], c3[DROP_G];
  for (int l = 0; l < DROP_G; l++) {
    c0[l] = (uint32_t)(ctr + (uint64_t)l);
    c1[l] = (uint32_t)((ctr + (uint64_t)l) >> 32);
    c2[l] = c3[l] = 0;
  }
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  for (int round = 0; round < 10; round++) {
    for (int l = 0; l < DROP_G; l++) {
      uint64_t p0 = (uint64_t)0xD2511F53u * c0[l], p1 = (uint64_t)0xCD9E8D57u * c2[l];
      uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ k1;
      c1[l] = (uint32_t)p1;
      c3[l] = (uint32_t)p0;
      c0[l] = n0;
      c2[l] = n2;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int g = 0; g < DROP_G; g++) r[4 * g] = c0[g], r[4 * g + 1] = c1[g], r[4 * g + 2] = c2[g], r[4 * g + 3] = c3[g];
}

/* Elements 4*q0 .. 4*(q0 + nb*DROP_G) - 1, all inside the tensor. */
#define DROPOUT_BLOCKS(T, NAME)                                                         \
  RM_FM_MULTIVERSION(void, NAME,                                                       \
    (const T *restrict px, T *restrict po, uint64_t seed, uint64_t offset, int64_t q0, \
     int64_t nb, uint32_t thr, T scale),                                               \
    (px, po, seed, offset, q0, nb, thr, scale), {                                      \
      for (int64_t b = 0; b < nb; b++) {                                               \
        int64_t q = q0 + b * DROP_G;                                                   \
        uint32_t r[4 * DROP_G];                                                        \
        philox_block(offset / 4 + (uint64_t)q, seed, r);                               \
        const T *x = px + 4 * q;                                                       \
        T *o = po + 4 * q;                                                             \
        for (int e = 0; e < 4 * DROP_G; e++) o[e] = x[e] * (r[e] >= thr ? scale : (T)0); \
      }                                                                                \
    })
DROPOUT_BLOCKS(float, dropout_blocks_f32)
DROPOUT_BLOCKS(double, dropout_blocks_f64)

/* y = x * (keep ? 1/(1-p) : 0): a dropped NaN or inf gives NaN, as x * 0 does. */
#define DROPOUT_LOOP(T, BLOCKS)                                                        \
  do {                                                                                 \
    const T *px = rm_tensor_ptr(in[0]);                                                \
    T *po = rm_tensor_ptr(out[0]);                                                     \
    const T scale = (T)(1.0 / (1.0 - p));                                              \
    /* p * 2^32 = 2^32 (p = 1) keeps nothing: every r >= 0 then multiplies by 0 */      \
    const double t = floor(p * 4294967296.0);                                          \
    const uint32_t thr = t >= 4294967296.0 ? 0 : (uint32_t)t;                          \
    const T kscale = t >= 4294967296.0 ? (T)0 : scale;                                 \
    const int64_t nblk = n / (4 * DROP_G), chunk = 64;                                 \
    _Pragma("omp parallel for if (n > RAND_PAR_MIN)")                                  \
    for (int64_t c = 0; c < (nblk + chunk - 1) / chunk; c++) {                         \
      int64_t b0 = c * chunk, nb = nblk - b0 < chunk ? nblk - b0 : chunk;              \
      BLOCKS(px, po, a->seed, a->offset, b0 * DROP_G, nb, thr, kscale);                \
    }                                                                                  \
    for (int64_t q = nblk * DROP_G; q < (n + 3) / 4; q++) {                            \
      double u[4];                                                                     \
      uniform4(a->seed, a->offset, q, u);                                              \
      for (int l = 0; l < 4 && 4 * q + l < n; l++)                                     \
        po[4 * q + l] = px[4 * q + l] * (u[l] > p ? scale : (T)0);                     \
    }                                                                                  \
  } while (0)

/* dropout and dropout_backward are the same map (the mask times 1/(1-p)); the
 * backward receives the forward's seed and offset in its attrs. */
static int dropout_kernel(rm_ctx *ctx, rm_tensor *const *in, rm_tensor *const *out,
                          const rm_attrs *a, const char *name) {
  int64_t n = rm_tensor_numel(out[0]);
  const double p = a->dropout.p;
  if (out[0]->dtype == RM_F64) DROPOUT_LOOP(double, dropout_blocks_f64);
  else if (out[0]->dtype == RM_F32) DROPOUT_LOOP(float, dropout_blocks_f32);
  else return rm_fail(ctx, RM_ERR_DTYPE, "%s: cpu does not support %s", name, rm_dtype_name(out[0]->dtype));
  return RM_OK;
}

RM_CPU_KERNEL(dropout) {
  return dropout_kernel(ctx, in, out, a, "dropout");
}

RM_CPU_KERNEL(dropout_backward) {
  return dropout_kernel(ctx, in, out, a, "dropout_backward");
}
