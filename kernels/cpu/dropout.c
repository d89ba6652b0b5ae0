/* CPU kernels of dropout and dropout_backward (the same map: the backward gets the
 * forward's seed and offset in its attrs): y = x * (keep ? 1/(1-p) : 0), where element e
 * is kept when its uniform of core/philox.h (counter offset/4 + e/4, lane e%4) is > p,
 * bit for bit the mask of rm_rand_uniform and of the CUDA kernel. With u = (r + 1) / 2^32,
 * u > p  <=>  r >= floor(p * 2^32) =: thr (u and p * 2^32 are exact in double and r + 1
 * is an integer), so the mask is one integer compare.
 *
 * Two things make it fast without changing a bit of the output:
 * - Philox runs 8 counters per AVX2 vector, two vectors interleaved to hide the multiply
 *   latency (chosen at run time: the build targets x86-64-v2); elsewhere 16 counters
 *   over arrays that the compiler vectorises;
 * - a group of inputs that are all +0 or -0 is copied without drawing its random
 *   numbers: +-0 times the scale or times 0 is the same +-0. Causal attention
 *   probabilities are 0 above the diagonal, about half of a GPT's largest dropout. NaN
 *   and inf are not zeros, so a dropped one still gives NaN (inf * 0). */
#include <string.h>

#include "../../core/philox.h"
#include "cpu.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DROPOUT_AVX2 1
#endif

/* Elements per OpenMP chunk; at ~1 ns per element (one thread, AVX2) a second thread
 * pays for itself from a few chunks on. */
#define DROP_CHUNK 4096
#define DROP_PAR_MIN (4 * DROP_CHUNK)

/* zeros_<S>(x, n): whether the n values at x are all +0 or -0 (their bits but the sign
 * are 0); U is the unsigned integer of T's size. */
#define DEFINE_ZEROS(T, U, S)                                                           \
  static inline int zeros_##S(const T *x, int n) {                                      \
    U acc = 0;                                                                          \
    for (int i = 0; i < n; i++) {                                                       \
      U u;                                                                              \
      memcpy(&u, x + i, sizeof u);                                                      \
      acc |= u;                                                                         \
    }                                                                                   \
    return (U)(acc << 1) == 0;                                                          \
  }
DEFINE_ZEROS(float, uint32_t, f32)
DEFINE_ZEROS(double, uint64_t, f64)

/* ---- portable: 16 counters (64 elements) at once, lane by lane over arrays ---- */

#define DROP_G 16

/* r[4 * g + l]: lane l of counter ctr + g (element order). */
static inline void philox_block(uint64_t ctr, uint64_t key, uint32_t r[4 * DROP_G]) {
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

/* Elements 64 b .. 64 (b + nb) - 1 of the tensor; block b uses counters ctr + 16 b... */
#define DROPOUT_BLOCKS(T, NAME, ZEROS)                                                  \
  static void NAME(const T *px, T *po, uint64_t seed, uint64_t ctr, int64_t b0, int64_t nb, \
                   uint32_t thr, T scale) {                                             \
    for (int64_t b = b0; b < b0 + nb; b++) {                                            \
      const T *x = px + 4 * DROP_G * b;                                                 \
      T *o = po + 4 * DROP_G * b;                                                       \
      if (ZEROS(x, 4 * DROP_G)) {                                                       \
        memmove(o, x, 4 * DROP_G * sizeof(T));                                          \
        continue;                                                                       \
      }                                                                                 \
      uint32_t r[4 * DROP_G];                                                           \
      philox_block(ctr + (uint64_t)(DROP_G * b), seed, r);                              \
      for (int e = 0; e < 4 * DROP_G; e++) o[e] = x[e] * (r[e] >= thr ? scale : (T)0);  \
    }                                                                                   \
  }
DROPOUT_BLOCKS(float, dropout_blocks_f32, zeros_f32)
DROPOUT_BLOCKS(double, dropout_blocks_f64, zeros_f64)

/* ---- AVX2: 8 counters a vector ---- */

#ifdef DROPOUT_AVX2
#define AVX2_INLINE __attribute__((target("avx2"), always_inline)) static inline
#define AVX2_FN __attribute__((target("avx2"))) static

/* A group is 8 counters, 32 elements. Lane i (0-3) holds counter c + 2i and lane 4 + i
 * counter c + 2i + 1: then unpacking the 4 words gives the elements in order with no
 * lane crossing (philox_elements). */
AVX2_INLINE void philox_init(uint64_t c, __m256i s[4]) {
  const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
  __m256i lo = _mm256_set1_epi32((int)(uint32_t)c);
  __m256i c0 = _mm256_add_epi32(lo, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
  /* carry into the high word where the low word wrapped (c0 < lo, unsigned) */
  __m256i carry = _mm256_cmpgt_epi32(_mm256_xor_si256(lo, sign), _mm256_xor_si256(c0, sign));
  s[0] = c0;
  s[1] = _mm256_sub_epi32(_mm256_set1_epi32((int)(uint32_t)(c >> 32)), carry);
  s[2] = s[3] = _mm256_setzero_si256();
}

/* One Philox round: the 32x32 -> 64-bit products of the even lanes, then of the odd
 * ones moved down, recombined into high and low words. */
AVX2_INLINE void philox_round(__m256i s[4], __m256i k0, __m256i k1) {
  const __m256i m0 = _mm256_set1_epi32((int)0xD2511F53u), m1 = _mm256_set1_epi32((int)0xCD9E8D57u);
  __m256i p0e = _mm256_mul_epu32(s[0], m0), p0o = _mm256_mul_epu32(_mm256_shuffle_epi32(s[0], 0xF5), m0);
  __m256i p1e = _mm256_mul_epu32(s[2], m1), p1o = _mm256_mul_epu32(_mm256_shuffle_epi32(s[2], 0xF5), m1);
  __m256i hi0 = _mm256_blend_epi32(_mm256_shuffle_epi32(p0e, 0xF5), p0o, 0xAA);
  __m256i lo0 = _mm256_blend_epi32(p0e, _mm256_shuffle_epi32(p0o, 0xA0), 0xAA);
  __m256i hi1 = _mm256_blend_epi32(_mm256_shuffle_epi32(p1e, 0xF5), p1o, 0xAA);
  __m256i lo1 = _mm256_blend_epi32(p1e, _mm256_shuffle_epi32(p1o, 0xA0), 0xAA);
  s[0] = _mm256_xor_si256(_mm256_xor_si256(hi1, s[1]), k0);
  s[2] = _mm256_xor_si256(_mm256_xor_si256(hi0, s[3]), k1);
  s[1] = lo1;
  s[3] = lo0;
}

/* The 10 rounds' key words, k[2 round] and k[2 round + 1], for the vector paths to
 * broadcast once per call (fewer live registers). */
static inline void philox_round_keys(uint64_t key, uint32_t k[20]) {
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  for (int round = 0; round < 10; round++, k0 += 0x9E3779B9u, k1 += 0xBB67AE85u) {
    k[2 * round] = k0;
    k[2 * round + 1] = k1;
  }
}

AVX2_INLINE void philox_keys(uint64_t key, __m256i kv[20]) {
  uint32_t k[20];
  philox_round_keys(key, k);
  for (int i = 0; i < 20; i++) kv[i] = _mm256_set1_epi32((int)k[i]);
}

/* Philox4x32-10 of one group, or of two (interleaved: they hide the multiplies'
 * latency). */
AVX2_INLINE void philox_one(uint64_t c, const __m256i kv[20], __m256i a[4]) {
  philox_init(c, a);
  _Pragma("GCC unroll 10")
  for (int round = 0; round < 10; round++) philox_round(a, kv[2 * round], kv[2 * round + 1]);
}

AVX2_INLINE void philox_two(uint64_t ca, uint64_t cb, const __m256i kv[20], __m256i a[4], __m256i b[4]) {
  philox_init(ca, a);
  philox_init(cb, b);
  _Pragma("GCC unroll 10")
  for (int round = 0; round < 10; round++) {
    philox_round(a, kv[2 * round], kv[2 * round + 1]);
    philox_round(b, kv[2 * round], kv[2 * round + 1]);
  }
}

/* The keep masks (all ones: keep) of a group's 32 elements, 8 a vector, in order. */
AVX2_INLINE void keep_masks(const __m256i s[4], __m256i thr, __m256i m[4]) {
  __m256i t0 = _mm256_unpacklo_epi32(s[0], s[1]), t1 = _mm256_unpackhi_epi32(s[0], s[1]);
  __m256i t2 = _mm256_unpacklo_epi32(s[2], s[3]), t3 = _mm256_unpackhi_epi32(s[2], s[3]);
  __m256i r[4] = { _mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                   _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3) };
  for (int k = 0; k < 4; k++) m[k] = _mm256_cmpeq_epi32(_mm256_max_epu32(r[k], thr), r[k]); /* r >= thr */
}

AVX2_INLINE void apply_f32(const float *x, float *o, const __m256i m[4], __m256 scale) {
  for (int k = 0; k < 4; k++)
    _mm256_storeu_ps(o + 8 * k, _mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), _mm256_and_ps(_mm256_castsi256_ps(m[k]), scale)));
}

AVX2_INLINE void apply_f64(const double *x, double *o, const __m256i m[4], __m256d scale) {
  for (int k = 0; k < 4; k++) {
    __m256i lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(m[k]));
    __m256i hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(m[k], 1));
    _mm256_storeu_pd(o + 8 * k, _mm256_mul_pd(_mm256_loadu_pd(x + 8 * k), _mm256_and_pd(_mm256_castsi256_pd(lo), scale)));
    _mm256_storeu_pd(o + 8 * k + 4, _mm256_mul_pd(_mm256_loadu_pd(x + 8 * k + 4), _mm256_and_pd(_mm256_castsi256_pd(hi), scale)));
  }
}

/* Whether a group's 32 inputs are all +-0; if so, copies them to o. */
AVX2_INLINE int copy_zeros_f32(const float *x, float *o) {
  __m256i v[4], acc = _mm256_setzero_si256();
  for (int k = 0; k < 4; k++) acc = _mm256_or_si256(acc, v[k] = _mm256_loadu_si256((const __m256i *)(x + 8 * k)));
  if (!_mm256_testz_si256(acc, _mm256_set1_epi32(0x7FFFFFFF))) return 0;
  for (int k = 0; k < 4; k++) _mm256_storeu_si256((__m256i *)(o + 8 * k), v[k]);
  return 1;
}

AVX2_INLINE int copy_zeros_f64(const double *x, double *o) {
  __m256i v[8], acc = _mm256_setzero_si256();
  for (int k = 0; k < 8; k++) acc = _mm256_or_si256(acc, v[k] = _mm256_loadu_si256((const __m256i *)(x + 4 * k)));
  if (!_mm256_testz_si256(acc, _mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFll))) return 0;
  for (int k = 0; k < 8; k++) _mm256_storeu_si256((__m256i *)(o + 4 * k), v[k]);
  return 1;
}

/* Elements 32 j0 .. 32 (j0 + ng) - 1 of the tensor; group j uses counters ctr + 8 j...
 * The groups that are not all zeros are drawn two at a time (not necessarily adjacent). */
#define DROPOUT_GROUPS_AVX2(T, NAME, VT, SET1, COPY_ZEROS, APPLY)                        \
  AVX2_FN void NAME(const T *px, T *po, uint64_t seed, uint64_t ctr, int64_t j0, int64_t ng, \
                    uint32_t thr, T scale) {                                            \
    const __m256i vthr = _mm256_set1_epi32((int)thr);                                   \
    const VT vscale = SET1(scale);                                                      \
    __m256i kv[20], s0[4], s1[4], m[4];                                                 \
    philox_keys(seed, kv);                                                              \
    int64_t held = -1; /* a group waiting for a second one */                           \
    for (int64_t j = j0; j < j0 + ng; j++) {                                            \
      if (COPY_ZEROS(px + 32 * j, po + 32 * j)) continue;                               \
      if (held < 0) {                                                                   \
        held = j;                                                                       \
        continue;                                                                       \
      }                                                                                 \
      philox_two(ctr + 8 * (uint64_t)held, ctr + 8 * (uint64_t)j, kv, s0, s1);          \
      keep_masks(s0, vthr, m);                                                          \
      APPLY(px + 32 * held, po + 32 * held, m, vscale);                                 \
      keep_masks(s1, vthr, m);                                                          \
      APPLY(px + 32 * j, po + 32 * j, m, vscale);                                       \
      held = -1;                                                                        \
    }                                                                                   \
    if (held >= 0) {                                                                    \
      philox_one(ctr + 8 * (uint64_t)held, kv, s0);                                     \
      keep_masks(s0, vthr, m);                                                          \
      APPLY(px + 32 * held, po + 32 * held, m, vscale);                                 \
    }                                                                                   \
  }
DROPOUT_GROUPS_AVX2(float, dropout_groups_f32_avx2, __m256, _mm256_set1_ps, copy_zeros_f32, apply_f32)
DROPOUT_GROUPS_AVX2(double, dropout_groups_f64_avx2, __m256d, _mm256_set1_pd, copy_zeros_f64, apply_f64)

/* ---- AVX-512 (float32): 16 counters a vector, the same steps as AVX2's ---- */

#define AVX512_INLINE __attribute__((target("avx512f"), always_inline)) static inline
#define AVX512_FN __attribute__((target("avx512f"))) static

/* A group is 16 counters, 64 elements. Position p of 128-bit lane L holds counter
 * c + 4p + L: unpacking the 4 words within each 128-bit lane (as AVX2 does) then gives
 * the elements in order, 16 a vector. */
AVX512_INLINE void philox16_init(uint64_t c, __m512i s[4]) {
  __m512i lo = _mm512_set1_epi32((int)(uint32_t)c);
  __m512i c0 = _mm512_add_epi32(lo, _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  __mmask16 carry = _mm512_cmplt_epu32_mask(c0, lo);   /* the low word wrapped */
  __m512i hi = _mm512_set1_epi32((int)(uint32_t)(c >> 32));
  s[0] = c0;
  s[1] = _mm512_mask_add_epi32(hi, carry, hi, _mm512_set1_epi32(1));
  s[2] = s[3] = _mm512_setzero_si512();
}

AVX512_INLINE void philox16_round(__m512i s[4], __m512i k0, __m512i k1) {
  const __m512i m0 = _mm512_set1_epi32((int)0xD2511F53u), m1 = _mm512_set1_epi32((int)0xCD9E8D57u);
  __m512i p0e = _mm512_mul_epu32(s[0], m0), p0o = _mm512_mul_epu32(_mm512_shuffle_epi32(s[0], 0xF5), m0);
  __m512i p1e = _mm512_mul_epu32(s[2], m1), p1o = _mm512_mul_epu32(_mm512_shuffle_epi32(s[2], 0xF5), m1);
  __m512i hi0 = _mm512_mask_blend_epi32(0xAAAA, _mm512_shuffle_epi32(p0e, 0xF5), p0o);
  __m512i lo0 = _mm512_mask_blend_epi32(0xAAAA, p0e, _mm512_shuffle_epi32(p0o, 0xA0));
  __m512i hi1 = _mm512_mask_blend_epi32(0xAAAA, _mm512_shuffle_epi32(p1e, 0xF5), p1o);
  __m512i lo1 = _mm512_mask_blend_epi32(0xAAAA, p1e, _mm512_shuffle_epi32(p1o, 0xA0));
  s[0] = _mm512_xor_si512(_mm512_xor_si512(hi1, s[1]), k0);
  s[2] = _mm512_xor_si512(_mm512_xor_si512(hi0, s[3]), k1);
  s[1] = lo1;
  s[3] = lo0;
}

/* Philox4x32-10 of two groups, interleaved (they hide the multiplies' latency); kv:
 * philox_round_keys' words, broadcast. */
AVX512_INLINE void philox16_two(uint64_t ca, uint64_t cb, const __m512i kv[20], __m512i a[4], __m512i b[4]) {
  philox16_init(ca, a);
  philox16_init(cb, b);
  _Pragma("GCC unroll 10")
  for (int round = 0; round < 10; round++) {
    philox16_round(a, kv[2 * round], kv[2 * round + 1]);
    philox16_round(b, kv[2 * round], kv[2 * round + 1]);
  }
}

/* y = x * (r >= thr ? scale : 0) for a group's 64 elements, 16 a vector, in order. */
AVX512_INLINE void apply16_f32(const __m512i s[4], __m512i thr, __m512 scale, const float *x, float *o) {
  __m512i t0 = _mm512_unpacklo_epi32(s[0], s[1]), t1 = _mm512_unpackhi_epi32(s[0], s[1]);
  __m512i t2 = _mm512_unpacklo_epi32(s[2], s[3]), t3 = _mm512_unpackhi_epi32(s[2], s[3]);
  __m512i r[4] = { _mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                   _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3) };
  for (int k = 0; k < 4; k++) {
    __m512 keep = _mm512_maskz_mov_ps(_mm512_cmpge_epu32_mask(r[k], thr), scale);  /* scale or +0 */
    _mm512_storeu_ps(o + 16 * k, _mm512_mul_ps(_mm512_loadu_ps(x + 16 * k), keep));
  }
}

/* Whether a group's 64 inputs are all +-0; if so, copies them to o. */
AVX512_INLINE int copy_zeros16_f32(const float *x, float *o) {
  __m512i v[4], acc = _mm512_setzero_si512();
  for (int k = 0; k < 4; k++) acc = _mm512_or_si512(acc, v[k] = _mm512_loadu_si512((const void *)(x + 16 * k)));
  if (_mm512_test_epi32_mask(acc, _mm512_set1_epi32(0x7FFFFFFF))) return 0;
  for (int k = 0; k < 4; k++) _mm512_storeu_si512((void *)(o + 16 * k), v[k]);
  return 1;
}

/* Elements 64 j0 .. 64 (j0 + ng) - 1 of the tensor; group j uses counters ctr + 16 j...
 * The groups that are not all zeros are drawn two at a time; a last one alone draws
 * beside a group it then discards. */
AVX512_FN void dropout_groups_f32_avx512(const float *px, float *po, uint64_t seed, uint64_t ctr, int64_t j0,
                                         int64_t ng, uint32_t thr, float scale) {
  const __m512i vthr = _mm512_set1_epi32((int)thr);
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512i kv[20], s0[4], s1[4];
  uint32_t k[20];
  philox_round_keys(seed, k);
  for (int i = 0; i < 20; i++) kv[i] = _mm512_set1_epi32((int)k[i]);
  int64_t held = -1; /* a group waiting for a second one */
  for (int64_t j = j0; j < j0 + ng; j++) {
    if (copy_zeros16_f32(px + 64 * j, po + 64 * j)) continue;
    if (held < 0) {
      held = j;
      continue;
    }
    philox16_two(ctr + 16 * (uint64_t)held, ctr + 16 * (uint64_t)j, kv, s0, s1);
    apply16_f32(s0, vthr, vscale, px + 64 * held, po + 64 * held);
    apply16_f32(s1, vthr, vscale, px + 64 * j, po + 64 * j);
    held = -1;
  }
  if (held >= 0) {
    philox16_two(ctr + 16 * (uint64_t)held, ctr + 16 * (uint64_t)held, kv, s0, s1);
    apply16_f32(s0, vthr, vscale, px + 64 * held, po + 64 * held);
  }
}
#endif

/* Units of 64 (portable, AVX-512) or 32 (AVX2) elements, in chunks of DROP_CHUNK elements, each
 * thread a contiguous range of chunks, then the last n % unit elements one counter at a
 * time. Dealing the chunks in turn balances one causal matrix better (its upper rows
 * are mostly zeros: 0.33 vs 0.39 ns per element on 2 threads) but was 10-20% slower on
 * dense inputs and on 8 causal matrices, the GPT's case (bench/dropout.lua's shapes). */
#define DROPOUT_LOOP(T, PORTABLE, AVX2, AVX512)                                          \
  do {                                                                                  \
    const T *px = rm_tensor_ptr(in[0]);                                                 \
    T *po = rm_tensor_ptr(out[0]);                                                      \
    int unit = 4 * DROP_G;                                                              \
    void (*blocks)(const T *, T *, uint64_t, uint64_t, int64_t, int64_t, uint32_t, T) = PORTABLE; \
    void (*wide)(const T *, T *, uint64_t, uint64_t, int64_t, int64_t, uint32_t, T) = AVX512; \
    if (avx2) unit = 32, blocks = AVX2;                                                 \
    if (avx512 && wide) unit = 64, blocks = wide;                                       \
    const int64_t nu = n / unit, per = DROP_CHUNK / unit;                               \
    _Pragma("omp parallel for if (n >= DROP_PAR_MIN)")                                  \
    for (int64_t c = 0; c < (nu + per - 1) / per; c++)                                  \
      blocks(px, po, seed, ctr, c * per, nu - c * per < per ? nu - c * per : per, thr, (T)kscale); \
    for (int64_t e = nu * unit; e < n; e++) {                                           \
      uint32_t r[4];                                                                    \
      rm_philox(ctr + (uint64_t)(e / 4), seed, r);                                      \
      po[e] = px[e] * (r[e % 4] >= thr ? (T)kscale : (T)0);                             \
    }                                                                                   \
  } while (0)

static int dropout_kernel(rm_ctx *ctx, rm_tensor *const *in, rm_tensor *const *out,
                          const rm_attrs *a, const char *name) {
  const int64_t n = rm_tensor_numel(out[0]);
  const double p = a->dropout.p;
  const uint64_t seed = a->seed, ctr = a->offset / 4;
  /* p * 2^32 = 2^32 (p = 1) keeps nothing: every r >= 0 then multiplies by 0 */
  const double t = floor(p * 4294967296.0);
  const uint32_t thr = t >= 4294967296.0 ? 0 : (uint32_t)t;
  const double kscale = t >= 4294967296.0 ? 0.0 : 1.0 / (1.0 - p);
#ifdef DROPOUT_AVX2
  const bool avx2 = rm_cpu_avx2(ctx), avx512 = rm_cpu_avx512(ctx);
#define AVX2_F32 dropout_groups_f32_avx2
#define AVX2_F64 dropout_groups_f64_avx2
#define AVX512_F32 dropout_groups_f32_avx512
#else
  const bool avx2 = false, avx512 = false;
#define AVX2_F32 NULL
#define AVX2_F64 NULL
#define AVX512_F32 NULL
#endif
  if (out[0]->dtype == RM_F64) DROPOUT_LOOP(double, dropout_blocks_f64, AVX2_F64, NULL);
  else if (out[0]->dtype == RM_F32) DROPOUT_LOOP(float, dropout_blocks_f32, AVX2_F32, AVX512_F32);
  else return rm_fail(ctx, RM_ERR_DTYPE, "%s: cpu does not support %s", name, rm_dtype_name(out[0]->dtype));
  return RM_OK;
}

RM_CPU_KERNEL(dropout) {
  return dropout_kernel(ctx, in, out, a, "dropout");
}

RM_CPU_KERNEL(dropout_backward) {
  return dropout_kernel(ctx, in, out, a, "dropout_backward");
}
