/* Fast float32 transcendental functions for the CPU kernels.
 *
 * Every function is static inline (forced) and branch-free (conditions are selects on
 * values, never ifs), so a loop calling one vectorises: SSE4.2 at the build's
 * -march=x86-64-v2, AVX2/AVX-512 through RM_FM_MULTIVERSION (end of file). glibc's
 * scalar expf/erfcf per element made exp, gelu and softmax 30x slower than an add.
 * Only the float32 paths use these; float64 stays on libm.
 *
 * Accuracy, measured against long double libm over every float32 input (exp) or a
 * dense sample (the others), without FMA (x86-64-v2) and with it (v3, v4); the sweep
 * in spec/fastmath_spec.lua checks these bounds against float64 Lua math:
 *   rm_expf       <= 1.08 ulp; inf above 88.72, 0 below -103.97, subnormal results
 *                 rounded once, NaN propagates
 *   rm_tanhf      <= 2.5 ulp      rm_sigmoidf  <= 2.5 ulp
 *   rm_siluf      <= 3.5 ulp where sigmoid(x) is normal (x >= -87.3)
 *   rm_geluf      <= 9 ulp (5.4 seen), relative error <= 6e-7 where the result is a normal
 *                 float: the left tail too (x Phi(x) down to x = -13, where it becomes
 *                 subnormal)
 *   rm_gelu_gradf, rm_silu_gradf: <= 12 and 6 ulp of the size of the terms they add
 *                 (they cross 0)
 *   rm_gelu_tanhf <= 4 ulp (2.0 seen) for x >= 0; for x < 0 up to 3 |2u| ulp more (2 seen), the
 *                 rounding of its float32 argument 2u through exp (relative 2e-5 at
 *                 x = -10, where the result is 1e-36); rm_gelu_tanh_gradf <= 6 ulp (2.4
 *                 seen) of its terms' size, with the same extra. These two were measured
 *                 on one machine's ISA version only (the spec's sweep holds them).
 * No FMA is assumed (x86-64-v2 has none): the range reductions are exact with separate
 * multiplies, and stay so when the compiler contracts them into FMAs. */
#ifndef REMAT_KERNELS_CPU_FASTMATH_H
#define REMAT_KERNELS_CPU_FASTMATH_H

#include <math.h>
#include <stdint.h>

/* Forced inline: a call in a loop stops it from vectorising, and GCC's size limits
 * decline to inline gelu's body into a second loop of the same file. */
#if defined(__GNUC__)
#define RM_FM_INLINE static inline __attribute__((always_inline))
#else
#define RM_FM_INLINE static inline
#endif

/* Bit casts through a union (well defined in C11, and vectorised by GCC and Clang). */
RM_FM_INLINE uint32_t rm_fm_bits_(float x) { union { float f; uint32_t u; } v = { .f = x }; return v.u; }
RM_FM_INLINE float rm_fm_float_(uint32_t u) { union { uint32_t u; float f; } v = { .u = u }; return v.f; }

/* c ? a : b as bit masks. GCC compiles float selects on constants into branches
 * (partial redundancy elimination copies the constant-folded work into each arm, which
 * with -ftrapping-math cannot be if-converted back), and a branch stops a loop from
 * vectorising; masks are plain integer arithmetic, vectorised as and/andnot/or. */
RM_FM_INLINE float rm_fm_sel_(int c, float a, float b) {
  uint32_t m = (uint32_t)0 - (uint32_t)(c != 0);
  return rm_fm_float_((rm_fm_bits_(a) & m) | (rm_fm_bits_(b) & ~m));
}

/* 2^n for n in [-126, 127], built in the exponent field. */
RM_FM_INLINE float rm_fm_pow2_(int32_t n) { return rm_fm_float_((uint32_t)(n + 127) << 23); }

/* Cody-Waite split of ln 2: C1 = 0.693359375 has 9 significant bits, so k * C1 is exact
 * for |k| < 2^15 without an FMA; C2 = (float)(ln 2 - C1), leaving 1.6e-12 * k. */
#define RM_FM_LN2_HI 0x1.63p-1f
#define RM_FM_LN2_LO -0x1.bd0106p-13f
#define RM_FM_LOG2E 0x1.715476p+0f
/* adding 1.5 * 2^23 rounds a float of magnitude < 2^22 to an integer (round to
 * nearest even), which then sits in the low bits of the sum's representation */
#define RM_FM_SHIFTER 0x1.8p23f

/* expm1(r) for |r| <= ln2/2: r + r^2 P(r). P interpolates (e^r - 1 - r) / r^2 at the 5
 * Chebyshev nodes of [-ln2/2, ln2/2] (solved in long double, rounded to float); the
 * polynomial's relative error for e^r is 9.7e-9 (0.08 ulp) there. */
RM_FM_INLINE float rm_fm_expm1_reduced_(float r) {
  /* Estrin's scheme rather than Horner's: these loops are bound by the latency of
   * one element's chain of operations (the out-of-order window holds only a few
   * iterations), and Estrin halves the polynomial's depth */
  float r2 = r * r;
  float p = (0.5f + 0x1.5554dep-3f * r) + r2 * ((0x1.55551ap-5f + 0x1.120b62p-7f * r) + r2 * 0x1.6d10fcp-10f);
  return r + r2 * p;
}

/* exp(hi + lo) for a finite hi (or NaN) and a small correction lo (|lo| << 1, or 0):
 * lo is added after the range reduction, so an argument known to more than float
 * precision (see the gelu tail) keeps its accuracy. n = round((hi + lo) / ln2),
 * r = hi + lo - n ln2 (Cody-Waite: hi - n*C1 is exact), exp = 2^n (1 + expm1(r)).
 * 2^n is applied as two factors 2^(n/2) 2^(n - n/2), so subnormal results are rounded
 * once and 2^128 times a mantissa >= 1 overflows to inf as it should. Sums outside
 * [-104, 89] are clamped into it by moving hi, where the result already is 0 or inf;
 * NaN propagates through the arithmetic. Error <= 1.08 ulp. */
RM_FM_INLINE float rm_expf_hilo(float hi, float lo) {
  float x = hi + lo;
  float xc = rm_fm_sel_(x < -104.0f, -104.0f, x);
  xc = rm_fm_sel_(xc > 89.0f, 89.0f, xc);
  hi += xc - x;
  float sh = xc * RM_FM_LOG2E + RM_FM_SHIFTER;
  int32_t n = (int32_t)(rm_fm_bits_(sh) - rm_fm_bits_(RM_FM_SHIFTER));
  float k = sh - RM_FM_SHIFTER;
  float r = ((hi - k * RM_FM_LN2_HI) - k * RM_FM_LN2_LO) + lo;
  float p = 1.0f + rm_fm_expm1_reduced_(r);
  int32_t n1 = n / 2;
  return p * rm_fm_pow2_(n1) * rm_fm_pow2_(n - n1);
}

/* exp(x) for float: <= 1.08 ulp, inf above 88.7228, 0 below -103.97 (+-inf included:
 * x is clamped to [-104, 89], where those are the results), NaN -> NaN. The steps of
 * rm_expf_hilo without the correction term and its second clamp. */
RM_FM_INLINE float rm_expf(float x) {
  float xc = rm_fm_sel_(x < -104.0f, -104.0f, x);
  xc = rm_fm_sel_(xc > 89.0f, 89.0f, xc);
  float sh = xc * RM_FM_LOG2E + RM_FM_SHIFTER;
  int32_t n = (int32_t)(rm_fm_bits_(sh) - rm_fm_bits_(RM_FM_SHIFTER));
  float k = sh - RM_FM_SHIFTER;
  float r = (xc - k * RM_FM_LN2_HI) - k * RM_FM_LN2_LO;
  float p = 1.0f + rm_fm_expm1_reduced_(r);
  int32_t n1 = n / 2;
  return p * rm_fm_pow2_(n1) * rm_fm_pow2_(n - n1);
}

/* tanh(|x|) from one range reduction of y = -2|x| (clamped to -30, where tanh is 1):
 * with u = expm1(y) and e = exp(y), -u / (2 + u) below |x| = 0.55 (no cancellation
 * near 0: u ~ -2|x| is accurate) and 1 - 2e / (1 + e) above it (the result is >= 0.5,
 * so subtracting from 1 costs at most half an ulp). x's sign is copied: tanh(+-0) =
 * +-0, tanh(+-inf) = +-1, NaN -> NaN. <= 2.5 ulp (<= 1.6 ulp above 0.55). */
RM_FM_INLINE float rm_tanhf(float x) {
  float a = fabsf(x);
  float y = -2.0f * a;
  y = rm_fm_sel_(y < -30.0f, -30.0f, y);
  float sh = y * RM_FM_LOG2E + RM_FM_SHIFTER;
  int32_t n = (int32_t)(rm_fm_bits_(sh) - rm_fm_bits_(RM_FM_SHIFTER));
  float k = sh - RM_FM_SHIFTER;
  float r = (y - k * RM_FM_LN2_HI) - k * RM_FM_LN2_LO;
  float q = rm_fm_expm1_reduced_(r);
  float s = rm_fm_pow2_(n);
  float u = s * q + (s - 1.0f), e = s * q + s;
  float v = rm_fm_sel_(a < 0.55f, -u / (2.0f + u), 1.0f - (2.0f * e) / (1.0f + e));
  v = rm_fm_sel_(x != x, x, v);
  return copysignf(v, x);
}

/* sigmoid(x) = 1 / (1 + e^-x), computed from e = exp(-|x|) <= 1 (never overflows):
 * 1/(1+e) for x >= 0, e/(1+e) for x < 0 (full relative accuracy as it goes to 0).
 * sigmoid(-inf) = 0, sigmoid(inf) = 1. <= 2.5 ulp. */
RM_FM_INLINE float rm_sigmoidf(float x) {
  float e = rm_expf(-fabsf(x));
  return rm_fm_sel_(x < 0, e, 1.0f) / (1.0f + e);
}

/* silu(x) = x sigmoid(x); silu(inf) = inf, silu(-inf) = 0 (the limits). <= 3.5 ulp for
 * x >= -87.3; below, sigmoid(x) is subnormal and x times it carries up to |x|/2 of the
 * result's 2^-149 ulps. */
RM_FM_INLINE float rm_siluf(float x) {
  float y = x * rm_sigmoidf(x);
  return rm_fm_sel_(x == -INFINITY, 0.0f, y);
}

/* silu'(x) = s (1 + x (1 - s)), s = sigmoid(x), with 1 - s = sigmoid(-x) computed as
 * directly as s (no cancellation for large x): +inf -> 1, -inf -> 0. */
RM_FM_INLINE float rm_silu_gradf(float x) {
  float e = rm_expf(-fabsf(x));
  float inv = 1.0f / (1.0f + e);
  float s = rm_fm_sel_(x < 0, e * inv, inv);
  float sc = rm_fm_sel_(x < 0, inv, e * inv);
  float y = s * (1.0f + x * sc);
  y = rm_fm_sel_(x == INFINITY, 1.0f, y);
  return rm_fm_sel_(x == -INFINITY, 0.0f, y);
}

/* ---- normal distribution tails (gelu) ----
 *
 * erfc(z) for z >= 0 is t exp(-z^2 + P(t)), t = 1 / (1 + z/2), with the Chebyshev
 * fitted P of Numerical Recipes (Press, Teukolsky, Vetterling, Flannery, Numerical
 * Recipes in C, 2nd ed., 1992, section 6.2, function erfcc: fractional error below
 * 1.2e-7 for every z >= 0). Its relative accuracy holds in the tail, where 1 - erf
 * would cancel. For Phi(-a) = erfc(a / sqrt 2) / 2 the exponent -a^2/2 is formed in
 * two parts (a = ah + al, ah with 12 significant bits so ah^2 is exact), since
 * rounding a^2 in float would cost up to 100 * 6e-8 = 6e-6 of relative accuracy at
 * a = 13. Inputs are clamped to |x| <= 20, beyond which every tail is 0 in float. */

/* Sets *hi, *lo to the exact -a^2/2 as a sum, for a >= 0 (a = ah + al, ah with 12
 * significant bits). */
RM_FM_INLINE void rm_fm_gauss_split_(float a, float *hi, float *lo) {
  float ah = rm_fm_float_(rm_fm_bits_(a) & 0xfffff000u);
  float al = a - ah;
  *hi = -0.5f * (ah * ah);
  *lo = -0.5f * (al * (ah + a));
}

/* For a = min(|x|, 20): sets *t = 1 / (1 + a / (2 sqrt 2)) and *hi, *lo to the exact
 * -a^2/2 as a sum. */
RM_FM_INLINE void rm_fm_gauss_arg_(float x, float *t, float *hi, float *lo) {
  float a = fabsf(x);
  a = rm_fm_sel_(a > 20.0f, 20.0f, a);
  *t = 1.0f / (1.0f + (0.5f * 0x1.6a09e6p-1f) * a);
  rm_fm_gauss_split_(a, hi, lo);
}

/* The Numerical Recipes erfcc polynomial in t (see above), by Estrin's scheme (see
 * rm_fm_expm1_reduced_). */
RM_FM_INLINE float rm_fm_erfc_poly_(float t) {
  float t2 = t * t, t4 = t2 * t2, t8 = t4 * t4;
  float p01 = -1.26551223f + 1.00002368f * t, p23 = 0.37409196f + 0.09678418f * t;
  float p45 = -0.18628806f + 0.27886807f * t, p67 = -1.13520398f + 1.48851587f * t;
  float p89 = -0.82215223f + 0.17087277f * t;
  return ((p01 + t2 * p23) + t4 * (p45 + t2 * p67)) + t8 * p89;
}

/* ---- gelu near 0: |x| <= RM_GELU_NEAR, no division and one short exp ----
 *
 * There Phi(-a) = (1/2) e^(-a^2/2) M(a), M(a) = erfc(a / sqrt 2) e^(a^2/2) a smooth
 * function falling from 1 to 0.15. M is a degree-15 polynomial in u = 0.4 a - 1 (the
 * Chebyshev fit over [0, 5] weighted by 1/M: relative error 8e-9 before its
 * coefficients were rounded to float; 2e-7 as evaluated in float), by Estrin's scheme.
 * The exponent's split is the tail's (rm_fm_gauss_arg_) and needs no clamp: -a^2/2 >=
 * -12.5, so 2^n is one factor. About 0.7x the far form's time (no division, one
 * unclamped exp; gelu 2.42 -> 1.65 ns an element on one AVX2 thread, and gelu' 2.64 ->
 * 1.68, for inputs of standard deviation 1). Training's pre-activations lie almost all
 * inside [-5, 5]; a block of them all inside takes this form alone (the array maps in
 * elementwise.c), and the scalar functions below select it per element, so a result
 * depends on its own input only. */
#define RM_GELU_NEAR 5.0f

RM_FM_INLINE float rm_fm_gelu_m_(float a) {
  float u = 0.4f * a - 1.0f, u2 = u * u, u4 = u2 * u2, u8 = u4 * u4;
  float q0 = 0x1.217252p-2f - 0x1.d3164p-3f * u, q1 = 0x1.5d651ep-3f - 0x1.ea61dap-4f * u;
  float q2 = 0x1.459cfcp-4f - 0x1.9bec9ep-5f * u, q3 = 0x1.f35c6ap-6f - 0x1.21e85p-6f * u;
  float q4 = 0x1.408508p-7f - 0x1.631826p-8f * u, q5 = 0x1.a1b114p-9f - 0x1.842b48p-10f * u;
  float q6 = 0x1.539da2p-12f - 0x1.112ca6p-12f * u, q7 = 0x1.965834p-12f - 0x1.3c5512p-13f * u;
  return ((q0 + u2 * q1) + u4 * (q2 + u2 * q3)) + u8 * ((q4 + u2 * q5) + u4 * (q6 + u2 * q7));
}

/* exp(hi + lo) for hi + lo in [-87, 0.1] (lo small, or 0): rm_expf_hilo's steps
 * without its clamps; 2^n, n in [-126, 0], is one factor. <= 1 ulp. */
RM_FM_INLINE float rm_fm_exp_unclamped_(float hi, float lo) {
  float sh = (hi + lo) * RM_FM_LOG2E + RM_FM_SHIFTER;
  int32_t n = (int32_t)(rm_fm_bits_(sh) - rm_fm_bits_(RM_FM_SHIFTER));
  float k = sh - RM_FM_SHIFTER;
  float r = ((hi - k * RM_FM_LN2_HI) - k * RM_FM_LN2_LO) + lo;
  return (1.0f + rm_fm_expm1_reduced_(r)) * rm_fm_pow2_(n);
}

/* e^(-a^2/2) for a = |x| <= RM_GELU_NEAR, from the tail's exact split: -a^2/2 >= -12.5
 * needs no clamp (nor does a, unlike rm_fm_gauss_arg_'s). */
RM_FM_INLINE float rm_fm_gauss_near_(float x) {
  float hi, lo;
  rm_fm_gauss_split_(fabsf(x), &hi, &lo);
  return rm_fm_exp_unclamped_(hi, lo);
}

/* gelu(x) for |x| <= RM_GELU_NEAR: q = x Phi(-|x|) = ((x/2) M) e^(-x^2/2), and gelu =
 * q for x < 0, x - q for x >= 0. */
RM_FM_INLINE float rm_gelu_nearf(float x) {
  float q = ((0.5f * x) * rm_fm_gelu_m_(fabsf(x))) * rm_fm_gauss_near_(x);
  return rm_fm_sel_(x < 0, q, x - q);
}

/* gelu'(x) = Phi(x) + x phi(x) for |x| <= RM_GELU_NEAR: e = e^(-x^2/2) gives both
 * phi = e / sqrt(2 pi) and Phi(-|x|) = (e / 2) M. */
RM_FM_INLINE float rm_gelu_grad_nearf(float x) {
  float e = rm_fm_gauss_near_(x);
  float tail = (0.5f * e) * rm_fm_gelu_m_(fabsf(x));
  return rm_fm_sel_(x < 0, tail, 1.0f - tail) + x * (0x1.988454p-2f * e);
}

/* gelu(x) = x Phi(x) for |x| > RM_GELU_NEAR (correct everywhere): with q = x Phi(-|x|)
 * (the tail, computed as (x t / 2) e^(..) so the only rounding after the exp is one
 * multiply), gelu = q for x < 0 and x - q for x >= 0. gelu(inf) = inf, gelu(-inf) = 0
 * (the limits), NaN -> NaN. */
RM_FM_INLINE float rm_gelu_farf(float x) {
  float t, hi, lo;
  rm_fm_gauss_arg_(x, &t, &hi, &lo);
  float q = (0.5f * x * t) * rm_expf_hilo(hi, lo + rm_fm_erfc_poly_(t));
  float y = rm_fm_sel_(x < 0, q, x - q);
  y = rm_fm_sel_(x == INFINITY, x, y);
  return rm_fm_sel_(x == -INFINITY, 0.0f, y);
}

/* gelu(x): rm_gelu_nearf within RM_GELU_NEAR, rm_gelu_farf outside. */
RM_FM_INLINE float rm_geluf(float x) {
  return rm_fm_sel_(fabsf(x) <= RM_GELU_NEAR, rm_gelu_nearf(x), rm_gelu_farf(x));
}

/* gelu'(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi), for |x| >
 * RM_GELU_NEAR (correct everywhere): one exp of the split exponent, e = exp(-x^2/2),
 * gives phi, and Phi(-|x|) = (t / 2) e exp(P(t)) takes the polynomial's short exp on
 * top of it. gelu'(inf) = 1, gelu'(-inf) = 0, NaN -> NaN. */
RM_FM_INLINE float rm_gelu_grad_farf(float x) {
  float t, hi, lo;
  rm_fm_gauss_arg_(x, &t, &hi, &lo);
  float e = rm_expf_hilo(hi, lo);
  float tail = ((0.5f * t) * e) * rm_fm_exp_unclamped_(rm_fm_erfc_poly_(t), 0.0f); /* Phi(-|x|) */
  float phi = 0x1.988454p-2f * e;
  float y = rm_fm_sel_(x < 0, tail, 1.0f - tail) + x * phi;
  y = rm_fm_sel_(x == INFINITY, 1.0f, y);
  return rm_fm_sel_(x == -INFINITY, 0.0f, y);
}

/* gelu'(x): rm_gelu_grad_nearf within RM_GELU_NEAR, rm_gelu_grad_farf outside. */
RM_FM_INLINE float rm_gelu_gradf(float x) {
  return rm_fm_sel_(fabsf(x) <= RM_GELU_NEAR, rm_gelu_grad_nearf(x), rm_gelu_grad_farf(x));
}

/* The tanh-approximate GELU (GPT-2's), 0.5 x (1 + tanh(u)) with
 * u = sqrt(2/pi) (x + 0.044715 x^3), computed as x sigmoid(2u) (the same function):
 * 1 + tanh(u) cancels in the left tail, sigmoid does not. With e = exp(-|2u|),
 * sigmoid(2u) = 1/(1+e) or e/(1+e), and sigmoid' = e/(1+e)^2 with no 1 - s. The limits:
 * (-inf) -> 0 and (+inf) -> +inf; the derivative is 0 or 1 past |x| = 30 (exactly so in
 * float64 too), where x^2 would otherwise meet a zero sigmoid' as inf * 0. */
#define RM_GELU_TANH_2C 1.5957691216057308f  /* 2 sqrt(2/pi) */
#define RM_GELU_TANH_K 0.044715f
RM_FM_INLINE float rm_gelu_tanhf(float x) {
  float u = RM_GELU_TANH_2C * (x + RM_GELU_TANH_K * x * x * x);
  float e = rm_expf(-fabsf(u)), r = 1.0f / (1.0f + e);
  float y = x * rm_fm_sel_(u >= 0, r, e * r);
  return rm_fm_sel_(x == -INFINITY, 0.0f, y);
}
RM_FM_INLINE float rm_gelu_tanh_gradf(float x) {
  float u = RM_GELU_TANH_2C * (x + RM_GELU_TANH_K * x * x * x);
  float e = rm_expf(-fabsf(u)), r = 1.0f / (1.0f + e);
  float s = rm_fm_sel_(u >= 0, r, e * r), ds = e * r * r;
  float y = s + x * ds * RM_GELU_TANH_2C * (1.0f + 3.0f * RM_GELU_TANH_K * x * x);
  return rm_fm_sel_(fabsf(x) > 30.0f, rm_fm_sel_(x > 0, 1.0f, 0.0f), y);
}

/* ---- runtime ISA dispatch for float32 array loops ----
 *
 * The build targets x86-64-v2 (SSE4.2: 4 floats a vector). RM_FM_MULTIVERSION(ret,
 * name, params, args, body) defines `name` as a function whose body is compiled three
 * times, for x86-64-v4 (AVX-512), x86-64-v3 (AVX2 + FMA) and the build's own target,
 * and runs the best one the CPU has (cpuid, read once by libgcc): 2-4x on the loops
 * above, while the binary still runs on any x86-64-v2 machine. The bounds above hold for
 * all three, with FMA contraction in the wider ones (RM_FM_MULTIVERSION_FMA, which the
 * array maps use) and without. Elsewhere (other compilers or CPUs) it is the plain
 * function. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define RM_FM_VERSIONS_(ret, name, params, args, body, wide)                           \
  __attribute__((target("arch=x86-64-v4") wide)) static ret name##_v4 params body      \
  __attribute__((target("arch=x86-64-v3") wide)) static ret name##_v3 params body      \
  static ret name##_base params body                                                   \
  static ret name params {                                                             \
    if (__builtin_cpu_supports("x86-64-v4")) return name##_v4 args;                    \
    if (__builtin_cpu_supports("x86-64-v3")) return name##_v3 args;                    \
    return name##_base args;                                                           \
  }
#define RM_FM_MULTIVERSION(ret, name, params, args, body) RM_FM_VERSIONS_(ret, name, params, args, body, )
/* As RM_FM_MULTIVERSION, and the wider versions contract a * b + c into FMAs (the build's
 * -std=c11 turns contraction off): the functions above run 10-20% faster and stay within
 * their bounds (spec/fastmath_spec.lua sweeps the version this CPU runs). Not for loops
 * whose bits must equal another path's (the optimizers' fast path equals their generic
 * loop). */
#define RM_FM_MULTIVERSION_FMA(ret, name, params, args, body)                          \
  RM_FM_VERSIONS_(ret, name, params, args, body, RM_FM_COMMA_ optimize("fp-contract=fast"))
#define RM_FM_COMMA_ ,
#else
#define RM_FM_MULTIVERSION(ret, name, params, args, body) static ret name params body
#define RM_FM_MULTIVERSION_FMA RM_FM_MULTIVERSION
#endif

#endif
