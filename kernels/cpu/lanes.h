/* Row reductions over 16 floats at a time, held as one GCC vector (each ISA version of
 * an RM_FM_MULTIVERSION function lowers it to its own registers: one AVX-512 register,
 * two AVX2 ones, four SSE ones) and folded by halves at the end of the row. An omp simd
 * reduction keeps its lanes in memory and folds them one after another (16 dependent
 * maxss, 8 dependent addsd a row): on rows of a few hundred elements (causal attention's
 * softmax rows) that fold was a large part of the row's time.
 * Sums are in double, as the kernels' omp simd reductions were. All functions are
 * always inlined: no call passes a vector, so GCC's ABI note (-Wpsabi) is silenced. */
#ifndef REMAT_CPU_LANES_H
#define REMAT_CPU_LANES_H

#include <stdint.h>
#include <string.h>

#include "fastmath.h"

#pragma GCC diagnostic ignored "-Wpsabi"

typedef float rm_lf16 __attribute__((vector_size(64)));
typedef int32_t rm_li16 __attribute__((vector_size(64)));
typedef double rm_ld8 __attribute__((vector_size(64)));
typedef float rm_lf8 __attribute__((vector_size(32)));
typedef int64_t rm_ll8 __attribute__((vector_size(64)));

/* v's lanes permuted (index lists of v's own length): GCC 12 and clang have
 * __builtin_shufflevector; older GCC has __builtin_shuffle with an index vector. */
#if defined(__clang__) || __GNUC__ >= 12
#define RM_LANES_SHUF16(v, ...) __builtin_shufflevector(v, v, __VA_ARGS__)
#define RM_LANES_SHUF8(v, ...) __builtin_shufflevector(v, v, __VA_ARGS__)
#else
#define RM_LANES_SHUF16(v, ...) __builtin_shuffle(v, (rm_li16){ __VA_ARGS__ })
#define RM_LANES_SHUF8(v, ...) __builtin_shuffle(v, (rm_ll8){ __VA_ARGS__ })
#endif

RM_FM_INLINE rm_lf16 rm_lanes_load(const float *p) {
  rm_lf16 v;
  memcpy(&v, p, sizeof v);
  return v;
}

RM_FM_INLINE rm_lf16 rm_lanes_splat(float x) {
  rm_lf16 v;
  for (int j = 0; j < 16; j++) v[j] = x;
  return v;
}

/* max(a, b) lane by lane; a NaN in b never wins (the compare is false). */
RM_FM_INLINE rm_lf16 rm_lanes_max(rm_lf16 a, rm_lf16 b) {
  rm_li16 gt = b > a;
  return (rm_lf16)(((rm_li16)b & gt) | ((rm_li16)a & ~gt));
}

RM_FM_INLINE float rm_lanes_fold_max(rm_lf16 v) {
  v = rm_lanes_max(v, RM_LANES_SHUF16(v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  v = rm_lanes_max(v, RM_LANES_SHUF16(v, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3));
  v = rm_lanes_max(v, RM_LANES_SHUF16(v, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1));
  v = rm_lanes_max(v, RM_LANES_SHUF16(v, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0));
  return v[0];
}

/* The low and high 8 lanes of v in double (the halves taken by memcpy, which compiles
 * to a register extract). */
RM_FM_INLINE rm_ld8 rm_lanes_lo(rm_lf16 v) {
  rm_lf8 h;
  memcpy(&h, &v, sizeof h);
  return __builtin_convertvector(h, rm_ld8);
}
RM_FM_INLINE rm_ld8 rm_lanes_hi(rm_lf16 v) {
  rm_lf8 h;
  memcpy(&h, (const char *)&v + sizeof h, sizeof h);
  return __builtin_convertvector(h, rm_ld8);
}

RM_FM_INLINE double rm_lanes_fold_sum(rm_ld8 s) {
  s += RM_LANES_SHUF8(s, 4, 5, 6, 7, 0, 1, 2, 3);
  s += RM_LANES_SHUF8(s, 2, 3, 0, 1, 2, 3, 0, 1);
  s += RM_LANES_SHUF8(s, 1, 0, 1, 0, 1, 0, 1, 0);
  return s[0];
}

/* The sum in double of y[0, n) (16 at a time, then the rest one by one). */
RM_FM_INLINE double rm_lanes_sum(const float *y, int64_t n) {
  rm_ld8 lo = { 0 }, hi = { 0 };
  int64_t q = n & ~(int64_t)15, k = 0;
  for (; k < q; k += 16) {
    rm_lf16 v = rm_lanes_load(y + k);
    lo += rm_lanes_lo(v);
    hi += rm_lanes_hi(v);
  }
  double sum = rm_lanes_fold_sum(lo + hi);
  for (; k < n; k++) sum += y[k];
  return sum;
}

/* The sum in double of the float products a[k] * b[k], k in [0, n). */
RM_FM_INLINE double rm_lanes_dot(const float *a, const float *b, int64_t n) {
  rm_ld8 lo = { 0 }, hi = { 0 };
  int64_t q = n & ~(int64_t)15, k = 0;
  for (; k < q; k += 16) {
    rm_lf16 v = rm_lanes_load(a + k) * rm_lanes_load(b + k);
    lo += rm_lanes_lo(v);
    hi += rm_lanes_hi(v);
  }
  double sum = rm_lanes_fold_sum(lo + hi);
  for (; k < n; k++) sum += a[k] * b[k];
  return sum;
}

#endif
