/* CPU kernels for elementwise ops. Inputs arrive as strided views already broadcast to
 * the output shape (stride 0 along broadcast dims); outputs are contiguous.
 *
 * Two paths: when every input is contiguous, one flat loop (OpenMP + SIMD); otherwise a
 * strided walk (ew_walk) that merges dims, then runs the innermost dim with its own
 * stride, in blocks or tiles, so no per-element offset arithmetic is done.
 *
 * NaN and infinities propagate as IEEE arithmetic does, with these choices: relu(NaN) and
 * maximum(NaN, x) are NaN; gelu/gelu_tanh/silu and their derivatives take their limits at +-inf
 * (gelu(-inf) = 0, gelu'(+inf) = 1, ...) rather than the NaN of inf * 0. */
#include <math.h>
#include <tgmath.h>

#include "cpu.h"
#include "fastmath.h"

/* ---- scalar functions: float64 on libm (tgmath picks exp/erfc etc.), float32 on the
 * vectorisable kernels/cpu/fastmath.h (libm's scalar calls made these ops 30x slower
 * than an add) ---- */

#define DEF_FNS(T, S)                                                                   \
  static inline T relu_##S(T x) { return x < 0 ? (T)0 : x; }                           \
  static inline T max_##S(T a, T b) { return (a > b || a != a) ? a : b; }              \
  static inline T sigmoid_##S(T x) { return (T)1 / ((T)1 + exp(-x)); }                 \
  static inline T silu_##S(T x) {                                                      \
    return isinf(x) ? (x > 0 ? x : (T)0) : x / ((T)1 + exp(-x));                       \
  }                                                                                    \
  static inline T gelu_##S(T x) {                                                      \
    /* 0.5 x erfc(-x/sqrt 2) = x Phi(x), accurate in the left tail too */             \
    return isinf(x) ? (x > 0 ? x : (T)0) : (T)0.5 * x * erfc(-x * (T)M_SQRT1_2);       \
  }                                                                                    \
  static inline T gelu_grad_##S(T x) {                                                 \
    /* Phi(x) + x phi(x) */                                                            \
    if (isinf(x)) return x > 0 ? (T)1 : (T)0;                                          \
    return (T)0.5 * erfc(-x * (T)M_SQRT1_2) +                                          \
           x * exp((T)-0.5 * x * x) * (T)0.3989422804014327;                           \
  }                                                                                    \
  static inline T gelu_tanh_##S(T x) {                                                 \
    /* x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): see rm_gelu_tanhf */          \
    if (isinf(x)) return x > 0 ? x : (T)0;                                             \
    T u = (T)1.5957691216057308 * (x + (T)0.044715 * x * x * x);                       \
    T e = exp(-fabs(u)), r = (T)1 / ((T)1 + e);                                        \
    return x * (u >= 0 ? r : e * r);                                                   \
  }                                                                                    \
  static inline T gelu_tanh_grad_##S(T x) {                                            \
    if (fabs(x) > 30) return x > 0 ? (T)1 : (T)0;                                      \
    T u = (T)1.5957691216057308 * (x + (T)0.044715 * x * x * x);                       \
    T e = exp(-fabs(u)), r = (T)1 / ((T)1 + e);                                        \
    return (u >= 0 ? r : e * r) +                                                      \
           x * (e * r * r) * (T)1.5957691216057308 * ((T)1 + (T)0.134145 * x * x);     \
  }                                                                                    \
  static inline T silu_grad_##S(T x) {                                                 \
    /* s (1 + x (1 - s)), s = sigmoid(x) */                                            \
    if (isinf(x)) return x > 0 ? (T)1 : (T)0;                                          \
    T s = sigmoid_##S(x);                                                              \
    return s * ((T)1 + x * ((T)1 - s));                                                \
  }

DEF_FNS(double, d)
#undef DEF_FNS
static inline double exp_d(double x) { return exp(x); }
static inline double tanh_d(double x) { return tanh(x); }

static inline float relu_f(float x) { return x < 0 ? 0.0f : x; }
static inline float max_f(float a, float b) { return (a > b || a != a) ? a : b; }
#define exp_f rm_expf
#define tanh_f rm_tanhf
#define sigmoid_f rm_sigmoidf
#define silu_f rm_siluf
#define gelu_f rm_geluf
#define gelu_grad_f rm_gelu_gradf
#define gelu_tanh_f rm_gelu_tanhf
#define gelu_tanh_grad_f rm_gelu_tanh_gradf
#define silu_grad_f rm_silu_gradf

#define TG(fn, x) _Generic((x), float: fn##_f, default: fn##_d)

#define EXP(x) TG(exp, x)(x)
#define TANH(x) TG(tanh, x)(x)
#define RELU(x) TG(relu, x)(x)
#define MAXIMUM(a, b) TG(max, a)(a, b)
#define SIGMOID(x) TG(sigmoid, x)(x)
#define SILU(x) TG(silu, x)(x)
#define GELU(x) TG(gelu, x)(x)
#define GELU_GRAD(x) TG(gelu_grad, x)(x)
#define GELU_TANH(x) TG(gelu_tanh, x)(x)
#define GELU_TANH_GRAD(x) TG(gelu_tanh_grad, x)(x)
#define SILU_GRAD(x) TG(silu_grad, x)(x)

/* ---- strided walk ---- */

#define WALK_MAX 3        /* operands (inputs) of a walk */
#define WALK_BLOCK 4096   /* elements of the innermost dim per work item */
#define WALK_TILE 16      /* tile side when an input is read across its rows */

/* The output shape with dims of size 1 dropped and adjacent dims merged wherever every
 * input allows it. A work item is a tile of `rows` dim x innermost dim: one row of up
 * to WALK_BLOCK elements normally (OpenMP gets work even from one long row), or a
 * WALK_TILE square when some input has a non-unit innermost stride (a transposed
 * view), so that the cache lines it touches are reused across the tile's rows. */
typedef struct {
  int nouter;                             /* dims above the two innermost */
  int64_t shape[RM_MAX_DIM];
  int64_t stride[WALK_MAX][RM_MAX_DIM];
  int64_t rows, row_stride[WALK_MAX];     /* second innermost dim (1 when none) */
  int64_t inner, inner_stride[WALK_MAX];  /* innermost dim */
  int64_t rb, cb, nrb, ncb, items;        /* tile size, tiles per row/column, total */
} ew_walk;

static void walk_init(ew_walk *w, int nop, rm_tensor *const *in, const rm_tensor *out) {
  int nd = 0;
  int64_t shape[RM_MAX_DIM + 1], st[WALK_MAX][RM_MAX_DIM + 1];
  for (int d = 0; d < out->ndim; d++) {
    int64_t size = out->shape[d];
    if (size == 1) continue;
    bool merge = nd > 0;
    for (int k = 0; k < nop && merge; k++)
      merge = st[k][nd - 1] == in[k]->stride[d] * size;
    if (merge) {
      shape[nd - 1] *= size;
      for (int k = 0; k < nop; k++) st[k][nd - 1] = in[k]->stride[d];
    } else {
      shape[nd] = size;
      for (int k = 0; k < nop; k++) st[k][nd] = in[k]->stride[d];
      nd++;
    }
  }
  /* pad to two dims (rows x inner) with leading size-1 dims */
  while (nd < 2) {
    for (int d = nd; d > 0; d--) {
      shape[d] = shape[d - 1];
      for (int k = 0; k < nop; k++) st[k][d] = st[k][d - 1];
    }
    shape[0] = 1;
    for (int k = 0; k < nop; k++) st[k][0] = 0;
    nd++;
  }
  w->nouter = nd - 2;
  w->rows = shape[nd - 2];
  w->inner = shape[nd - 1];
  int64_t outer = 1;
  for (int d = 0; d < nd - 2; d++) {
    w->shape[d] = shape[d];
    outer *= shape[d];
  }
  bool tile = false;
  for (int k = 0; k < WALK_MAX; k++) {
    w->row_stride[k] = k < nop ? st[k][nd - 2] : 0;
    w->inner_stride[k] = k < nop ? st[k][nd - 1] : 0;
    for (int d = 0; d < nd - 2; d++) w->stride[k][d] = k < nop ? st[k][d] : 0;
    if (k < nop && w->inner_stride[k] != 0 && w->inner_stride[k] != 1) tile = true;
  }
  tile = tile && w->rows > 1;
  w->rb = tile ? WALK_TILE : 1;
  w->cb = tile ? WALK_TILE : WALK_BLOCK;
  w->nrb = (w->rows + w->rb - 1) / w->rb;
  w->ncb = (w->inner + w->cb - 1) / w->cb;
  w->items = outer * w->nrb * w->ncb;
}

/* Work item it: offsets o[k] of its first element in each input, ob in the output
 * (contiguous), its row length and row count. Row ri of the item starts at
 * o[k] + ri * row_stride[k] and ob + ri * inner. */
static inline void walk_item(const ew_walk *w, int64_t it, int64_t *o, int64_t *ob,
                             int64_t *len, int64_t *nr) {
  int64_t jb = it % w->ncb, t = it / w->ncb;
  int64_t i0 = (t % w->nrb) * w->rb, j0 = jb * w->cb, r = t / w->nrb;
  *ob = (r * w->rows + i0) * w->inner + j0;
  *len = w->inner - j0 < w->cb ? w->inner - j0 : w->cb;
  *nr = w->rows - i0 < w->rb ? w->rows - i0 : w->rb;
  for (int k = 0; k < WALK_MAX; k++) o[k] = i0 * w->row_stride[k] + j0 * w->inner_stride[k];
  for (int d = w->nouter - 1; d >= 0; d--) {
    int64_t i = r % w->shape[d];
    r /= w->shape[d];
    for (int k = 0; k < WALK_MAX; k++) o[k] += i * w->stride[k][d];
  }
}

/* ---- loops ---- */

/* One inner run of a strided walk: LEN elements, operand k starting at q_k with
 * stride s_k; the common strides (1: dense, 0: broadcast) get their own loops so the
 * compiler vectorises them. */
#define RUN1(T, EXPR)                                                                  \
  if (s0 == 1) {                                                                       \
    _Pragma("omp simd")                                                                \
    for (int64_t j = 0; j < len; j++) { T a_ = q0[j]; qo[j] = (EXPR); }                \
  } else {                                                                             \
    for (int64_t j = 0; j < len; j++) { T a_ = q0[j * s0]; qo[j] = (EXPR); }           \
  }

#define RUN2(T, EXPR)                                                                  \
  if (s0 == 1 && s1 == 1) {                                                            \
    _Pragma("omp simd")                                                                \
    for (int64_t j = 0; j < len; j++) { T a_ = q0[j], b_ = q1[j]; qo[j] = (EXPR); }    \
  } else if (s0 == 1 && s1 == 0) {                                                     \
    T b_ = q1[0];                                                                      \
    _Pragma("omp simd")                                                                \
    for (int64_t j = 0; j < len; j++) { T a_ = q0[j]; qo[j] = (EXPR); }                \
  } else if (s0 == 0 && s1 == 1) {                                                     \
    T a_ = q0[0];                                                                      \
    _Pragma("omp simd")                                                                \
    for (int64_t j = 0; j < len; j++) { T b_ = q1[j]; qo[j] = (EXPR); }                \
  } else {                                                                             \
    for (int64_t j = 0; j < len; j++) {                                                \
      T a_ = q0[j * s0], b_ = q1[j * s1];                                              \
      qo[j] = (EXPR);                                                                  \
    }                                                                                  \
  }

#define RUN3(T, EXPR)                                                                  \
  for (int64_t j = 0; j < len; j++) {                                                  \
    T c_ = q0[j * s0], a_ = q1[j * s1], b_ = q2[j * s2];                               \
    qo[j] = (EXPR);                                                                    \
  }

/* The strided walk shared by every arity: sets q0..q2 / s0..s2 for each row of each
 * work item and runs RUN over it. */
#define WALK(T, NOP, RUN, EXPR, COST)                                                  \
  do {                                                                                 \
    ew_walk w_;                                                                        \
    walk_init(&w_, NOP, in, out[0]);                                                   \
    const int64_t items_ = w_.items;                                                   \
    const int par_ = n * (COST) > RM_CPU_PAR_MIN && items_ > 1;                        \
    _Pragma("omp parallel for if (par_)")                                              \
    for (int64_t it = 0; it < items_; it++) {                                          \
      int64_t o_[WALK_MAX], ob_, len, nr_;                                             \
      walk_item(&w_, it, o_, &ob_, &len, &nr_);                                        \
      const int64_t s0 = w_.inner_stride[0], s1 = w_.inner_stride[NOP > 1],            \
                    s2 = w_.inner_stride[NOP > 2 ? 2 : 0];                             \
      (void)s1; (void)s2;                                                              \
      for (int64_t ri = 0; ri < nr_; ri++) {                                           \
        const T *q0 = p0 + o_[0] + ri * w_.row_stride[0];                              \
        const T *q1 = p1 + o_[NOP > 1] + ri * w_.row_stride[NOP > 1];                  \
        const T *q2 = p2 + o_[NOP > 2 ? 2 : 0] + ri * w_.row_stride[NOP > 2 ? 2 : 0];  \
        T *qo = po + ob_ + ri * w_.inner;                                              \
        (void)q1; (void)q2;                                                            \
        RUN(T, EXPR)                                                                   \
      }                                                                                \
    }                                                                                  \
  } while (0)

/* Pointers p0..p2 to the inputs (repeating the last one past NOP), po to the output. */
#define OPERANDS(T, NOP)                                                               \
  const T *p0 = rm_tensor_ptr(in[0]);                                                  \
  const T *p1 = NOP > 1 ? (const T *)rm_tensor_ptr(in[1]) : p0;                        \
  const T *p2 = NOP > 2 ? (const T *)rm_tensor_ptr(in[2]) : p1;                        \
  T *po = rm_tensor_ptr(out[0]);                                                       \
  int64_t n = rm_tensor_numel(out[0]);                                                 \
  (void)p1; (void)p2

#define LOOP1(T, EXPR, COST)                                                           \
  do {                                                                                 \
    OPERANDS(T, 1);                                                                    \
    if (rm_tensor_is_contiguous(in[0])) {                                              \
      const int par_ = n * (COST) > RM_CPU_PAR_MIN;                                    \
      _Pragma("omp parallel for simd if (parallel: par_)")                             \
      for (int64_t i = 0; i < n; i++) { T a_ = p0[i]; po[i] = (EXPR); }                \
    } else WALK(T, 1, RUN1, EXPR, COST);                                               \
  } while (0)

#define LOOP2(T, EXPR, COST)                                                           \
  do {                                                                                 \
    OPERANDS(T, 2);                                                                    \
    if (rm_tensor_is_contiguous(in[0]) && rm_tensor_is_contiguous(in[1])) {            \
      const int par_ = n * (COST) > RM_CPU_PAR_MIN;                                    \
      _Pragma("omp parallel for simd if (parallel: par_)")                             \
      for (int64_t i = 0; i < n; i++) { T a_ = p0[i], b_ = p1[i]; po[i] = (EXPR); }    \
    } else WALK(T, 2, RUN2, EXPR, COST);                                               \
  } while (0)

#define LOOP3(T, EXPR, COST)                                                           \
  do {                                                                                 \
    OPERANDS(T, 3);                                                                    \
    if (rm_tensor_is_contiguous(in[0]) && rm_tensor_is_contiguous(in[1]) &&            \
        rm_tensor_is_contiguous(in[2])) {                                              \
      const int par_ = n * (COST) > RM_CPU_PAR_MIN;                                    \
      _Pragma("omp parallel for simd if (parallel: par_)")                             \
      for (int64_t i = 0; i < n; i++) {                                                \
        T c_ = p0[i], a_ = p1[i], b_ = p2[i];                                          \
        po[i] = (EXPR);                                                                \
      }                                                                                \
    } else WALK(T, 3, RUN3, EXPR, COST);                                               \
  } while (0)

/* ---- float32 transcendental ops on contiguous data: fastmath.h's functions over
 * arrays, compiled per ISA (RM_FM_MULTIVERSION), in fixed chunks under OpenMP ---- */

#define FM_CHUNK 8192

#define FM_MAP1(fn)                                                                    \
  RM_FM_MULTIVERSION_FMA(void, map1_##fn, (const float *restrict a, float *restrict o, int64_t n), \
                     (a, o, n), {                                                      \
                       _Pragma("omp simd")                                             \
                       for (int64_t i = 0; i < n; i++) o[i] = fn(a[i]);                \
                     })
/* (x, g) -> g f'(x) */
#define FM_MAP2(fn)                                                                    \
  RM_FM_MULTIVERSION_FMA(void, map2_##fn,                                                  \
                     (const float *restrict a, const float *restrict g, float *restrict o, int64_t n), \
                     (a, g, o, n), {                                                   \
                       _Pragma("omp simd")                                             \
                       for (int64_t i = 0; i < n; i++) o[i] = g[i] * fn(a[i]);         \
                     })

/* As FM_MAP1 / FM_MAP2 for a function with a cheaper form near 0 (fn(x) = near(x) where
 * |x| <= lim, far(x) elsewhere): a block of FM_BLOCK inputs all within lim runs near
 * alone, one all outside far alone; a mixed block runs near and leaves its outside
 * elements to far, gathered FM_GATHER at a time (so a wide input's few large elements
 * cost what they need, not both forms over whole blocks). Each result depends on its
 * own input only: the same as fn gives for it. */
#define FM_BLOCK 16
#define FM_GATHER (4 * FM_BLOCK)
#define FM_FAR_(x, lim) (!(fabsf(x) <= (lim)))
#define FM_FLUSH_(far, STORE)                                                          \
  do {                                                                                 \
    for (int k = 0; k < nf; k++) buf[k] = a[idx[k]];                                   \
    _Pragma("omp simd")                                                                \
    for (int k = 0; k < nf; k++) buf[k] = far(buf[k]);                                 \
    for (int k = 0; k < nf; k++) STORE(idx[k], buf[k]);                                \
    nf = 0;                                                                            \
  } while (0)
#define FM_NEAR_LOOP(fn, near, far, lim, EXPR, STORE)                                  \
  {                                                                                    \
    int64_t idx[FM_GATHER];                                                            \
    float buf[FM_GATHER];                                                              \
    int nf = 0;                                                                        \
    int64_t i = 0;                                                                     \
    for (; i + FM_BLOCK <= n; i += FM_BLOCK) {                                         \
      int nfar = 0;                                                                    \
      for (int j = 0; j < FM_BLOCK; j++) nfar += FM_FAR_(a[i + j], lim);               \
      if (nfar == FM_BLOCK) {                                                          \
        _Pragma("omp simd")                                                            \
        for (int64_t j = i; j < i + FM_BLOCK; j++) o[j] = EXPR(far);                   \
        continue;                                                                      \
      }                                                                                \
      _Pragma("omp simd")                                                              \
      for (int64_t j = i; j < i + FM_BLOCK; j++) o[j] = EXPR(near);                    \
      if (nfar) {                                                                      \
        if (nf + FM_BLOCK > FM_GATHER) FM_FLUSH_(far, STORE);                          \
        for (int64_t j = i; j < i + FM_BLOCK; j++) { /* branch-free: far is 50/50 */   \
          idx[nf] = j;                                                                 \
          nf += FM_FAR_(a[j], lim);                                                    \
        }                                                                              \
      }                                                                                \
    }                                                                                  \
    FM_FLUSH_(far, STORE);                                                             \
    _Pragma("omp simd")                                                                \
    for (int64_t j = i; j < n; j++) o[j] = EXPR(fn);                                   \
  }
#define FM_APPLY1_(f) f(a[j])
#define FM_APPLY2_(f) g[j] * f(a[j])
#define FM_STORE1_(j, v) (o[j] = (v))
#define FM_STORE2_(j, v) (o[j] = g[j] * (v))
#define FM_MAP1_NEAR(fn, near, far, lim)                                               \
  RM_FM_MULTIVERSION_FMA(void, map1_##fn, (const float *restrict a, float *restrict o, int64_t n), \
                     (a, o, n), FM_NEAR_LOOP(fn, near, far, lim, FM_APPLY1_, FM_STORE1_))
#define FM_MAP2_NEAR(fn, near, far, lim)                                               \
  RM_FM_MULTIVERSION_FMA(void, map2_##fn,                                              \
                     (const float *restrict a, const float *restrict g, float *restrict o, int64_t n), \
                     (a, g, o, n), FM_NEAR_LOOP(fn, near, far, lim, FM_APPLY2_, FM_STORE2_))

FM_MAP1(rm_expf)
FM_MAP1(rm_tanhf)
FM_MAP1(rm_sigmoidf)
FM_MAP1(rm_siluf)
FM_MAP1_NEAR(rm_geluf, rm_gelu_nearf, rm_gelu_farf, RM_GELU_NEAR)
FM_MAP2_NEAR(rm_gelu_gradf, rm_gelu_grad_nearf, rm_gelu_grad_farf, RM_GELU_NEAR)
FM_MAP1(rm_gelu_tanhf)
FM_MAP2(rm_gelu_tanh_gradf)
FM_MAP2(rm_silu_gradf)

/* Runs map1 (nin 1) or map2 (nin 2) over the float32 inputs when they are all
 * contiguous; returns false (nothing done) otherwise, for the generic loops. */
static bool fm_run(rm_tensor *const *in, int nin, rm_tensor *const *out, int cost,
                   void (*map1)(const float *restrict, float *restrict, int64_t),
                   void (*map2)(const float *restrict, const float *restrict, float *restrict, int64_t)) {
  if (out[0]->dtype != RM_F32) return false;
  for (int k = 0; k < nin; k++)
    if (!rm_tensor_is_contiguous(in[k])) return false;
  const float *a = rm_tensor_ptr(in[0]), *g = nin > 1 ? rm_tensor_ptr(in[1]) : NULL;
  float *o = rm_tensor_ptr(out[0]);
  int64_t n = rm_tensor_numel(out[0]), nc = (n + FM_CHUNK - 1) / FM_CHUNK;
  const int par = n * cost > RM_CPU_PAR_MIN && nc > 1;
  #pragma omp parallel for if (par)
  for (int64_t c = 0; c < nc; c++) {
    int64_t lo = c * FM_CHUNK, len = n - lo < FM_CHUNK ? n - lo : FM_CHUNK;
    if (map2) map2(a + lo, g + lo, o + lo, len);
    else map1(a + lo, o + lo, len);
  }
  return true;
}

/* A kernel over LOOPk in float32 or float64. Unary EXPR sees a_ and the scalar s_
 * (attrs f[0], as T); binary sees a_, b_; where sees c_, a_, b_. COST: relative
 * work per element, which lowers the size at which OpenMP pays off. FAST: an
 * expression that does the whole op and is true, or false (then the loops run). */
#define DEFINE_EW(name, LOOP, EXPR, COST) DEFINE_EW_FAST(name, LOOP, EXPR, COST, false)
/* The float64 / float32 branches of a kernel (an `if` chain ending in the dtype error). */
#define EW_FLOAT_CASES(name, LOOP, EXPR, COST)                                         \
  if (out[0]->dtype == RM_F64) {                                                       \
    const double s_ = a->scalar.value; (void)s_;                                       \
    LOOP(double, EXPR, COST);                                                          \
  } else if (out[0]->dtype == RM_F32) {                                                \
    const float s_ = (float)a->scalar.value; (void)s_;                                 \
    LOOP(float, EXPR, COST);                                                           \
  } else {                                                                             \
    return rm_fail(ctx, RM_ERR_DTYPE, #name ": cpu does not support %s",               \
                   rm_dtype_name(out[0]->dtype));                                      \
  }
#define DEFINE_EW_FAST(name, LOOP, EXPR, COST, FAST)                                   \
  RM_CPU_KERNEL(name) {                                                                \
    if (FAST) return RM_OK;                                                            \
    EW_FLOAT_CASES(name, LOOP, EXPR, COST)                                             \
    return RM_OK;                                                                      \
  }

/* The same over float32, float64, int32 and int64 (the ops the backend lists in
 * int_ops). IEXPR is the integer form: sums and products go through uint64_t, so that
 * overflow wraps around (two's complement, as PyTorch's integers do) instead of being
 * undefined; a scalar s_ is a whole number (the op's infer step checked). */
#define DEFINE_EW_INT(name, LOOP, EXPR, IEXPR, COST)                                   \
  RM_CPU_KERNEL(name) {                                                                \
    if (out[0]->dtype == RM_I64) {                                                     \
      const int64_t s_ = (int64_t)a->scalar.value; (void)s_;                           \
      LOOP(int64_t, IEXPR, COST);                                                      \
    } else if (out[0]->dtype == RM_I32) {                                              \
      const int32_t s_ = (int32_t)a->scalar.value; (void)s_;                           \
      LOOP(int32_t, IEXPR, COST);                                                      \
    } else EW_FLOAT_CASES(name, LOOP, EXPR, COST)                                      \
    return RM_OK;                                                                      \
  }
#define WRAP(x) ((uint64_t)(int64_t)(x))

DEFINE_EW_INT(add, LOOP2, a_ + b_, WRAP(a_) + WRAP(b_), 1)
DEFINE_EW_INT(sub, LOOP2, a_ - b_, WRAP(a_) - WRAP(b_), 1)
DEFINE_EW_INT(mul, LOOP2, a_ * b_, WRAP(a_) * WRAP(b_), 1)
DEFINE_EW(div, LOOP2, a_ / b_, 1)
DEFINE_EW(pow, LOOP2, pow(a_, b_), 16)
DEFINE_EW(maximum, LOOP2, MAXIMUM(a_, b_), 1)
DEFINE_EW_INT(eq, LOOP2, a_ == b_, a_ == b_, 1)
DEFINE_EW_INT(ne, LOOP2, a_ != b_, a_ != b_, 1)
DEFINE_EW_INT(lt, LOOP2, a_ < b_, a_ < b_, 1)
DEFINE_EW_INT(le, LOOP2, a_ <= b_, a_ <= b_, 1)
DEFINE_EW_INT(gt, LOOP2, a_ > b_, a_ > b_, 1)
DEFINE_EW_INT(ge, LOOP2, a_ >= b_, a_ >= b_, 1)
/* (x, g) -> g f'(x) */
DEFINE_EW_FAST(gelu_backward, LOOP2, b_ * GELU_GRAD(a_), 16, fm_run(in, 2, out, 16, NULL, map2_rm_gelu_gradf))
DEFINE_EW_FAST(gelu_tanh_backward, LOOP2, b_ * GELU_TANH_GRAD(a_), 12, fm_run(in, 2, out, 12, NULL, map2_rm_gelu_tanh_gradf))
DEFINE_EW_FAST(silu_backward, LOOP2, b_ * SILU_GRAD(a_), 8, fm_run(in, 2, out, 8, NULL, map2_rm_silu_gradf))
/* cond != 0 picks a (a NaN cond counts as true, being != 0) */
DEFINE_EW_INT(where, LOOP3, c_ != 0 ? a_ : b_, c_ != 0 ? a_ : b_, 1)

DEFINE_EW_INT(add_scalar, LOOP1, a_ + s_, WRAP(a_) + WRAP(s_), 1)
DEFINE_EW_INT(mul_scalar, LOOP1, a_ * s_, WRAP(a_) * WRAP(s_), 1)
DEFINE_EW(rdiv_scalar, LOOP1, s_ / a_, 1)
DEFINE_EW_INT(neg, LOOP1, -a_, 0 - WRAP(a_), 1)
DEFINE_EW_FAST(exp, LOOP1, EXP(a_), 8, fm_run(in, 1, out, 8, map1_rm_expf, NULL))
DEFINE_EW(log, LOOP1, log(a_), 8)
DEFINE_EW_FAST(tanh, LOOP1, TANH(a_), 8, fm_run(in, 1, out, 8, map1_rm_tanhf, NULL))
DEFINE_EW(sqrt, LOOP1, sqrt(a_), 2)
DEFINE_EW_INT(abs, LOOP1, fabs(a_), a_ < 0 ? 0 - WRAP(a_) : WRAP(a_), 1)
DEFINE_EW(relu, LOOP1, RELU(a_), 1)
DEFINE_EW_FAST(gelu, LOOP1, GELU(a_), 16, fm_run(in, 1, out, 16, map1_rm_geluf, NULL))
DEFINE_EW_FAST(gelu_tanh, LOOP1, GELU_TANH(a_), 10, fm_run(in, 1, out, 10, map1_rm_gelu_tanhf, NULL))
DEFINE_EW_FAST(silu, LOOP1, SILU(a_), 8, fm_run(in, 1, out, 8, map1_rm_siluf, NULL))
DEFINE_EW_FAST(sigmoid, LOOP1, SIGMOID(a_), 8, fm_run(in, 1, out, 8, map1_rm_sigmoidf, NULL))
DEFINE_EW_INT(copy, LOOP1, a_, a_, 1)

/* x^s; squaring (the common case) is a multiply, which pow would round the same. */
RM_CPU_KERNEL(pow_scalar) {
  if (a->scalar.value == 2.0) {
    if (out[0]->dtype == RM_F64) LOOP1(double, a_ * a_, 1);
    else if (out[0]->dtype == RM_F32) LOOP1(float, a_ * a_, 1);
    else return rm_fail(ctx, RM_ERR_DTYPE, "pow_scalar: cpu does not support %s", rm_dtype_name(out[0]->dtype));
  } else {
    if (out[0]->dtype == RM_F64) { const double s_ = a->scalar.value; LOOP1(double, pow(a_, s_), 16); }
    else if (out[0]->dtype == RM_F32) { const float s_ = (float)a->scalar.value; LOOP1(float, pow(a_, s_), 16); }
    else return rm_fail(ctx, RM_ERR_DTYPE, "pow_scalar: cpu does not support %s", rm_dtype_name(out[0]->dtype));
  }
  return RM_OK;
}

/* clamp(x, lo, hi) = min(max(x, lo), hi); NaN fails both tests and passes through. */
RM_CPU_KERNEL(clamp) {
  if (out[0]->dtype == RM_F64) {
    const double lo = a->clamp.lo, hi = a->clamp.hi;
    LOOP1(double, a_ < lo ? lo : a_ > hi ? hi : a_, 1);
  } else if (out[0]->dtype == RM_F32) {
    const float lo = (float)a->clamp.lo, hi = (float)a->clamp.hi;
    LOOP1(float, a_ < lo ? lo : a_ > hi ? hi : a_, 1);
  } else {
    return rm_fail(ctx, RM_ERR_DTYPE, "clamp: cpu does not support %s", rm_dtype_name(out[0]->dtype));
  }
  return RM_OK;
}

RM_CPU_KERNEL(fill) {
  int64_t n = rm_tensor_numel(out[0]);
  const int par = n > RM_CPU_PAR_MIN;
  if (out[0]->dtype == RM_F64) {
    double *p = rm_tensor_ptr(out[0]);
    const double v = a->fill.value;
    _Pragma("omp parallel for simd if (parallel: par)")
    for (int64_t i = 0; i < n; i++) p[i] = v;
  } else if (out[0]->dtype == RM_F32) {
    float *p = rm_tensor_ptr(out[0]);
    const float v = (float)a->fill.value;
    _Pragma("omp parallel for simd if (parallel: par)")
    for (int64_t i = 0; i < n; i++) p[i] = v;
  } else if (rm_dtype_is_int(out[0]->dtype)) {
    int64_t v; /* the infer step checked that the value fits */
    rm_float_to_int(a->fill.value, out[0]->dtype, &v);
    if (out[0]->dtype == RM_I64) {
      int64_t *p = rm_tensor_ptr(out[0]);
      _Pragma("omp parallel for simd if (parallel: par)")
      for (int64_t i = 0; i < n; i++) p[i] = v;
    } else {
      int32_t *p = rm_tensor_ptr(out[0]);
      const int32_t v32 = (int32_t)v;
      _Pragma("omp parallel for simd if (parallel: par)")
      for (int64_t i = 0; i < n; i++) p[i] = v32;
    }
  } else {
    return rm_fail(ctx, RM_ERR_DTYPE, "fill: cpu does not support %s", rm_dtype_name(out[0]->dtype));
  }
  return RM_OK;
}

/* Converting loop: source type S, destination type D. */
#define CAST_LOOP(S, D)                                                                \
  do {                                                                                 \
    const S *p0 = rm_tensor_ptr(in[0]);                                                \
    D *po = rm_tensor_ptr(out[0]);                                                     \
    int64_t n = rm_tensor_numel(out[0]);                                               \
    const int par = n > RM_CPU_PAR_MIN;                                                \
    if (rm_tensor_is_contiguous(in[0])) {                                              \
      _Pragma("omp parallel for simd if (parallel: par)")                              \
      for (int64_t i = 0; i < n; i++) po[i] = (D)p0[i];                                \
    } else {                                                                           \
      ew_walk w_;                                                                      \
      walk_init(&w_, 1, in, out[0]);                                                   \
      const int64_t items_ = w_.items;                                                 \
      _Pragma("omp parallel for if (par && items_ > 1)")                               \
      for (int64_t it = 0; it < items_; it++) {                                        \
        int64_t o_[WALK_MAX], ob_, len, nr_;                                           \
        walk_item(&w_, it, o_, &ob_, &len, &nr_);                                      \
        const int64_t s = w_.inner_stride[0];                                          \
        for (int64_t ri = 0; ri < nr_; ri++) {                                         \
          const S *q = p0 + o_[0] + ri * w_.row_stride[0];                             \
          D *qo = po + ob_ + ri * w_.inner;                                            \
          for (int64_t j = 0; j < len; j++) qo[j] = (D)q[j * s];                       \
        }                                                                              \
      }                                                                                \
    }                                                                                  \
  } while (0)

/* A float -> integer cast truncates toward zero (as PyTorch does); a NaN, an infinity
 * or a value outside the integer type's range is an error naming the element (C leaves
 * that conversion undefined), checked before anything is written. */
#define CHECK_TO_INT(S)                                                                \
  do {                                                                                 \
    const S *p0 = rm_tensor_ptr(in[0]);                                                \
    int64_t n = rm_tensor_numel(in[0]), bad = -1;                                      \
    for (int64_t i = 0; i < n && bad < 0; i++) {                                       \
      int64_t v;                                                                       \
      if (!rm_float_to_int((double)p0[rm_cpu_offset(in[0], i)], to, &v)) bad = i;      \
    }                                                                                  \
    if (bad >= 0)                                                                      \
      return rm_fail(ctx, RM_ERR_ARG, "cast: element %lld is %.17g, which has no %s value (NaN, "   \
                     "infinite or out of range)", (long long)bad + 1,                  \
                     p0[rm_cpu_offset(in[0], bad)] != p0[rm_cpu_offset(in[0], bad)] ? NAN \
                     : (double)p0[rm_cpu_offset(in[0], bad)], rm_dtype_name(to));      \
  } while (0)

/* CAST_LOOP from source type S to every destination dtype. */
#define CAST_FROM(S)                                                                   \
  do {                                                                                 \
    if (to == RM_F32) CAST_LOOP(S, float);                                             \
    else if (to == RM_F64) CAST_LOOP(S, double);                                       \
    else if (to == RM_I32) CAST_LOOP(S, int32_t);                                      \
    else if (to == RM_I64) CAST_LOOP(S, int64_t);                                      \
    else ok = false;                                                                   \
  } while (0)

RM_CPU_KERNEL(cast) {
  rm_dtype from = in[0]->dtype, to = out[0]->dtype;
  if (from == to) return rm_cpu_copy(ctx, nin, in, nout, out, a);
  bool ok = true;
  if (rm_dtype_is_int(to) && from == RM_F32) CHECK_TO_INT(float);
  if (rm_dtype_is_int(to) && from == RM_F64) CHECK_TO_INT(double);
  if (from == RM_F32) CAST_FROM(float);
  else if (from == RM_F64) CAST_FROM(double);
  else if (from == RM_I32) CAST_FROM(int32_t);
  else if (from == RM_I64) CAST_FROM(int64_t);
  else ok = false;
  if (!ok)
    return rm_fail(ctx, RM_ERR_DTYPE, "cast: cpu cannot convert %s to %s", rm_dtype_name(from),
                   rm_dtype_name(to));
  return RM_OK;
}
