/* CPU kernels for the optimizer steps (semantics and attrs in core/op_optim.c). They
 * run in place: each element of every input is read before the aliased output element
 * is written. Scalars are formed in double and applied in the tensor's dtype, as
 * PyTorch does. */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "fastmath.h"

/* rm_op_into does not run infer: run it here, then make sure the outputs can take the
 * result (same shape, dtype and device as param, contiguous) and the inputs are
 * contiguous, so a bad in-place call is an error, never a stray write. */
static int check_step(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, int nout,
                      rm_tensor *const *out, const rm_attrs *a) {
  const rm_op_def *def = rm_op_def_get(op);
  rm_meta meta[RM_MAX_OUTPUTS];
  if (nin != def->nin || nout != def->nout)
    return rm_fail(ctx, RM_ERR_ARG, "%s: takes %d inputs and %d outputs (got %d and %d)", def->name, def->nin,
                   def->nout, nin, nout);
  if (def->infer(ctx, nin, in, a, meta)) return ctx->err_code;
  for (int i = 0; i < nin; i++)
    if (!rm_tensor_is_contiguous(in[i]))
      return rm_fail(ctx, RM_ERR_ARG, "%s: input %d must be contiguous", def->name, i + 1);
  for (int j = 0; j < nout; j++)
    if (!rm_same_shape(out[j], in[0]) || out[j]->dtype != in[0]->dtype || out[j]->device != in[0]->device ||
        !rm_tensor_is_contiguous(out[j]))
      return rm_fail(ctx, RM_ERR_ARG, "%s: output %d must be a contiguous tensor like param", def->name, j + 1);
  return RM_OK;
}

#define SGD_LOOP(T)                                                                          \
  do {                                                                                       \
    const T *pp = rm_tensor_ptr(in[0]), *pg = rm_tensor_ptr(in[1]), *pbi = rm_tensor_ptr(in[2]); \
    T *po = rm_tensor_ptr(out[0]), *pb = rm_tensor_ptr(out[1]);                              \
    const T lr = (T)a->sgd.lr, mom = (T)a->sgd.momentum, wd = (T)a->sgd.weight_decay;        \
    const T keep = (T)(1.0 - a->sgd.dampening);                                              \
    const bool nesterov = a->sgd.nesterov, first = a->sgd.first;                             \
    if (mom == 0) {                                                                          \
      if (pb != pbi) memcpy(pb, pbi, sizeof(T) * (size_t)n);                                 \
      _Pragma("omp parallel for if (n > RM_CPU_PAR_MIN)")                                    \
      for (int64_t i = 0; i < n; i++) {                                                      \
        T p = pp[i], d = pg[i];                                                              \
        if (wd != 0) d = d + wd * p;                                                         \
        po[i] = p - lr * d;                                                                  \
      }                                                                                      \
    } else {                                                                                 \
      _Pragma("omp parallel for if (n > RM_CPU_PAR_MIN)")                                    \
      for (int64_t i = 0; i < n; i++) {                                                      \
        T p = pp[i], d = pg[i];                                                              \
        if (wd != 0) d = d + wd * p;                                                         \
        T b = first ? d : pbi[i] * mom + keep * d;                                           \
        d = nesterov ? d + mom * b : b;                                                      \
        pb[i] = b;                                                                           \
        po[i] = p - lr * d;                                                                  \
      }                                                                                      \
    }                                                                                        \
  } while (0)

RM_CPU_KERNEL(sgd_step) {
  if (check_step(ctx, RM_OP_SGD_STEP, nin, in, nout, out, a)) return ctx->err_code;
  int64_t n = rm_tensor_numel(in[0]);
  if (in[0]->dtype == RM_F64) SGD_LOOP(double);
  else SGD_LOOP(float);
  return RM_OK;
}

/* PyTorch's lerp: start + w (end - start), from the other end when w >= 0.5. */
#define LERP(s, e, w) ((w) < 0.5 ? (s) + (w) * ((e) - (s)) : (e) - ((e) - (s)) * (1 - (w)))

#define ADAM_LOOP(T, SQRT)                                                                   \
  do {                                                                                       \
    const T *pp = rm_tensor_ptr(in[0]), *pg = rm_tensor_ptr(in[1]);                          \
    const T *pmi = rm_tensor_ptr(in[2]), *pvi = rm_tensor_ptr(in[3]);                        \
    T *po = rm_tensor_ptr(out[0]), *pm = rm_tensor_ptr(out[1]), *pv = rm_tensor_ptr(out[2]); \
    const T w1 = (T)(1.0 - b1), beta2 = (T)b2, c2 = (T)(1.0 - b2), eps = (T)a->adamw.eps;    \
    const T step_size = (T)(lr / bc1), bc2_sqrt = (T)sqrt(bc2);                              \
    const T decay = (T)(1.0 - lr * wd), wdt = (T)wd;                                         \
    _Pragma("omp parallel for if (n > RM_CPU_PAR_MIN)")                                      \
    for (int64_t i = 0; i < n; i++) {                                                        \
      T p = pp[i], g = pg[i], m = pmi[i], v = pvi[i];                                        \
      if (decoupled) p = p * decay;                                                          \
      else if (wdt != 0) g = g + wdt * p;                                                    \
      m = LERP(m, g, w1);                                                                    \
      v = v * beta2 + c2 * g * g;                                                            \
      T denom = SQRT(v) / bc2_sqrt + eps;                                                    \
      pm[i] = m;                                                                             \
      pv[i] = v;                                                                             \
      po[i] = p + (-step_size) * (m / denom);                                                \
    }                                                                                        \
  } while (0)

/* The float32 step in place (the optimizers' usual call: outputs are the inputs), one
 * vectorised loop per ISA (RM_FM_MULTIVERSION): the scalar loop above was 15% of a
 * small MLP's step. The same operations in the same order as ADAM_LOOP, so the same
 * bits; the branches of ADAM_LOOP become constant arguments of one inlined loop
 * (decay: 0 none, 1 decoupled, 2 into the gradient; lo: LERP's w < 0.5 side). */
static inline __attribute__((always_inline)) void adam_loop(float *restrict p, const float *restrict g,
                                                             float *restrict m, float *restrict v, int64_t n,
                                                             const float *k, const int decay, const bool lo) {
  const float w1 = k[0], beta2 = k[1], c2 = k[2], eps = k[3], step_size = k[4];
  const float bc2_sqrt = k[5], dec = k[6], wdt = k[7];
  _Pragma("omp simd")
  for (int64_t i = 0; i < n; i++) {
    float pi = p[i], gi = g[i], mi = m[i], vi = v[i];
    if (decay == 1) pi = pi * dec;
    if (decay == 2) gi = gi + wdt * pi;
    mi = lo ? mi + w1 * (gi - mi) : gi - (gi - mi) * (1 - w1);
    vi = vi * beta2 + c2 * gi * gi;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + (-step_size) * (mi / denom);
  }
}

RM_FM_MULTIVERSION(void, adam_f32,
                   (float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                    int64_t n, const float *k, int decay),
                   (p, g, m, v, n, k, decay), {
                     if (k[0] < 0.5f) {
                       if (decay == 1) adam_loop(p, g, m, v, n, k, 1, true);
                       else if (decay == 2) adam_loop(p, g, m, v, n, k, 2, true);
                       else adam_loop(p, g, m, v, n, k, 0, true);
                     } else {
                       if (decay == 1) adam_loop(p, g, m, v, n, k, 1, false);
                       else if (decay == 2) adam_loop(p, g, m, v, n, k, 2, false);
                       else adam_loop(p, g, m, v, n, k, 0, false);
                     }
                   })

/* Chunks of adam_f32 under OpenMP; k: the float constants of ADAM_LOOP. */
static void adam_f32_inplace(float *p, const float *g, float *m, float *v, int64_t n, const float *k,
                             int decay) {
  const int64_t chunk = 16384;
  int64_t nchunk = (n + chunk - 1) / chunk;
  _Pragma("omp parallel for if (n > RM_CPU_PAR_MIN)")
  for (int64_t c = 0; c < nchunk; c++) {
    int64_t lo = c * chunk, len = n - lo < chunk ? n - lo : chunk;
    adam_f32(p + lo, g + lo, m + lo, v + lo, len, k, decay);
  }
}

RM_CPU_KERNEL(adamw_step) {
  if (check_step(ctx, RM_OP_ADAMW_STEP, nin, in, nout, out, a)) return ctx->err_code;
  int64_t n = rm_tensor_numel(in[0]);
  double lr = a->adamw.lr, b1 = a->adamw.beta1, b2 = a->adamw.beta2, wd = a->adamw.weight_decay;
  bool decoupled = a->adamw.decoupled;
  double bc1 = 1.0 - pow(b1, (double)a->adamw.step), bc2 = 1.0 - pow(b2, (double)a->adamw.step);
  if (in[0]->dtype == RM_F64) ADAM_LOOP(double, sqrt);
  else if (rm_tensor_ptr(out[0]) == rm_tensor_ptr(in[0]) && rm_tensor_ptr(out[1]) == rm_tensor_ptr(in[2]) &&
           rm_tensor_ptr(out[2]) == rm_tensor_ptr(in[3]) && rm_tensor_ptr(in[1]) != rm_tensor_ptr(in[0]) &&
           rm_tensor_ptr(in[1]) != rm_tensor_ptr(in[2]) && rm_tensor_ptr(in[1]) != rm_tensor_ptr(in[3])) {
    const float k[8] = { (float)(1.0 - b1), (float)b2, (float)(1.0 - b2), (float)a->adamw.eps, (float)(lr / bc1),
                         (float)sqrt(bc2), (float)(1.0 - lr * wd), (float)wd };
    adam_f32_inplace(rm_tensor_ptr(out[0]), rm_tensor_ptr(in[1]), rm_tensor_ptr(out[1]), rm_tensor_ptr(out[2]),
                     n, k, decoupled ? 1 : wd != 0 ? 2 : 0);
  } else ADAM_LOOP(float, sqrtf);
  return RM_OK;
}

/* adamw_multi_step: adamw_step on each (param, grad, m, v) group, in place, the same
 * code and so the same bits (the CPU gains nothing from one call but the checks). */
RM_CPU_KERNEL(adamw_multi_step) {
  for (int k = 0; k + 3 < nin; k += 4) {
    rm_tensor *outs[3] = { in[k], in[k + 2], in[k + 3] };
    if (rm_cpu_adamw_step(ctx, 4, in + k, 3, outs, a)) return ctx->err_code;
  }
  return RM_OK;
}

/* torch.optim.RMSprop's single-tensor step; an unused state (buf without momentum,
 * grad_avg when not centered) is copied to its output only when that is another tensor. */
#define RMSPROP_LOOP(T, SQRT)                                                                 \
  do {                                                                                        \
    const T *pp = rm_tensor_ptr(in[0]), *pg = rm_tensor_ptr(in[1]), *psi = rm_tensor_ptr(in[2]); \
    const T *pbi = rm_tensor_ptr(in[3]), *pai = rm_tensor_ptr(in[4]);                         \
    T *po = rm_tensor_ptr(out[0]), *ps = rm_tensor_ptr(out[1]), *pb = rm_tensor_ptr(out[2]);  \
    T *pa = rm_tensor_ptr(out[3]);                                                            \
    const T lr = (T)a->rmsprop.lr, alpha = (T)a->rmsprop.alpha, c = (T)(1.0 - a->rmsprop.alpha); \
    const T eps = (T)a->rmsprop.eps, mom = (T)a->rmsprop.momentum, wdt = (T)wd;               \
    if (mom == 0 && pb != pbi) memcpy(pb, pbi, sizeof(T) * (size_t)n);                       \
    if (!centered && pa != pai) memcpy(pa, pai, sizeof(T) * (size_t)n);                       \
    _Pragma("omp parallel for if (n > RM_CPU_PAR_MIN)")                                       \
    for (int64_t i = 0; i < n; i++) {                                                         \
      T p = pp[i], g = pg[i];                                                                 \
      if (wdt != 0) g = g + wdt * p;                                                          \
      T s = psi[i] * alpha + c * g * g;                                                       \
      T avg;                                                                                  \
      if (centered) {                                                                         \
        T ga = LERP(pai[i], g, c);                                                            \
        avg = SQRT(s + (T)-1 * ga * ga) + eps;                                                \
        pa[i] = ga;                                                                           \
      } else {                                                                                \
        avg = SQRT(s) + eps;                                                                  \
      }                                                                                       \
      ps[i] = s;                                                                              \
      if (mom != 0) {                                                                         \
        T b = pbi[i] * mom + g / avg;                                                         \
        pb[i] = b;                                                                            \
        po[i] = p + (-lr) * b;                                                                \
      } else {                                                                                \
        po[i] = p + (-lr) * (g / avg);                                                        \
      }                                                                                       \
    }                                                                                         \
  } while (0)

RM_CPU_KERNEL(rmsprop_step) {
  if (check_step(ctx, RM_OP_RMSPROP_STEP, nin, in, nout, out, a)) return ctx->err_code;
  int64_t n = rm_tensor_numel(in[0]);
  double wd = a->rmsprop.weight_decay;
  bool centered = a->rmsprop.centered;
  if (in[0]->dtype == RM_F64) RMSPROP_LOOP(double, sqrt);
  else RMSPROP_LOOP(float, sqrtf);
  return RM_OK;
}
