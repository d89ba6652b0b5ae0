/* CUDA kernels for elementwise ops, with the same semantics as kernels/cpu/elementwise.c:
 * inputs are strided views already broadcast to the output shape (stride 0 along
 * broadcast dims), outputs contiguous. NaN propagates as on the CPU: relu(NaN) and
 * maximum(NaN, x) are NaN; gelu (exact erf GELU), gelu_tanh and silu take their limits at +-inf.
 *
 * One kernel per dtype handles every op (the op id is a uniform switch): elementwise
 * ops are memory-bound, and a single instantiation keeps the build short. Strided
 * inputs have their dims merged on the host first, so the per-element offset
 * arithmetic runs over as few dims as the layout allows. bfloat16 is stored as is and
 * computed in float32. Contiguous, 16-byte aligned operands are read and written 16
 * bytes per load/store (8 bf16, 4 float32): fewer memory instructions for the same
 * bytes, which is what lets a memory-bound kernel approach the bandwidth. */
#include "cuda_common.cuh"

/* ---- scalar functions (acc type A: float or double) ---- */

template <class A> __device__ __forceinline__ A ew_relu(A x) { return x < 0 ? (A)0 : x; }
template <class A> __device__ __forceinline__ A ew_max(A a, A b) { return (a > b || a != a) ? a : b; }
template <class A> __device__ __forceinline__ A ew_sigmoid(A x) { return (A)1 / ((A)1 + exp(-x)); }
template <class A> __device__ __forceinline__ A ew_silu(A x) {
  return isinf(x) ? (x > 0 ? x : (A)0) : x / ((A)1 + exp(-x));
}
template <class A> __device__ __forceinline__ A ew_gelu(A x) {
  return isinf(x) ? (x > 0 ? x : (A)0) : (A)0.5 * x * erfc(-x * (A)0.70710678118654752440);
}
template <class A> __device__ __forceinline__ A ew_gelu_grad(A x) {
  if (isinf(x)) return x > 0 ? (A)1 : (A)0;
  return (A)0.5 * erfc(-x * (A)0.70710678118654752440) +
         x * exp((A)-0.5 * x * x) * (A)0.3989422804014327;
}
/* tanh-approximate GELU as x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): the
 * CPU's formula (kernels/cpu/fastmath.h, rm_gelu_tanhf), no cancellation in 1 + tanh. */
template <class A> __device__ __forceinline__ A ew_gelu_tanh(A x) {
  if (isinf(x)) return x > 0 ? x : (A)0;
  A u = (A)1.5957691216057308 * (x + (A)0.044715 * x * x * x);
  A e = exp(-fabs(u)), r = (A)1 / ((A)1 + e);
  return x * (u >= 0 ? r : e * r);
}
template <class A> __device__ __forceinline__ A ew_gelu_tanh_grad(A x) {
  if (fabs(x) > (A)30) return x > 0 ? (A)1 : (A)0;
  A u = (A)1.5957691216057308 * (x + (A)0.044715 * x * x * x);
  A e = exp(-fabs(u)), r = (A)1 / ((A)1 + e);
  return (u >= 0 ? r : e * r) + x * (e * r * r) * (A)1.5957691216057308 * ((A)1 + (A)0.134145 * x * x);
}
template <class A> __device__ __forceinline__ A ew_silu_grad(A x) {
  if (isinf(x)) return x > 0 ? (A)1 : (A)0;
  A s = ew_sigmoid(x);
  return s * ((A)1 + x * ((A)1 - s));
}

/* The value of op at one element: c (cond of where), a, b as loaded; s = attrs f[0]. */
template <class A>
__device__ __forceinline__ A ew_apply(int op, A a, A b, A c, A s) {
  switch (op) {
  case RM_OP_ADD: return a + b;
  case RM_OP_SUB: return a - b;
  case RM_OP_MUL: return a * b;
  case RM_OP_DIV: return a / b;
  case RM_OP_POW: return pow(a, b);
  case RM_OP_MAXIMUM: return ew_max(a, b);
  case RM_OP_EQ: return a == b;
  case RM_OP_NE: return a != b;
  case RM_OP_LT: return a < b;
  case RM_OP_LE: return a <= b;
  case RM_OP_GT: return a > b;
  case RM_OP_GE: return a >= b;
  case RM_OP_GELU_BACKWARD: return b * ew_gelu_grad(a);
  case RM_OP_SILU_BACKWARD: return b * ew_silu_grad(a);
  case RM_OP_GELU_TANH_BACKWARD: return b * ew_gelu_tanh_grad(a);
  case RM_OP_WHERE: return c != 0 ? a : b;
  case RM_OP_ADD_SCALAR: return a + s;
  case RM_OP_MUL_SCALAR: return a * s;
  case RM_OP_RDIV_SCALAR: return s / a;
  case RM_OP_POW_SCALAR: return s == (A)2 ? a * a : pow(a, s);
  case RM_OP_NEG: return -a;
  case RM_OP_EXP: return exp(a);
  case RM_OP_LOG: return log(a);
  case RM_OP_TANH: return tanh(a);
  case RM_OP_SQRT: return sqrt(a);
  case RM_OP_ABS: return fabs(a);
  case RM_OP_RELU: return ew_relu(a);
  case RM_OP_GELU: return ew_gelu(a);
  case RM_OP_GELU_TANH: return ew_gelu_tanh(a);
  case RM_OP_SILU: return ew_silu(a);
  case RM_OP_SIGMOID: return ew_sigmoid(a);
  default: return a; /* copy */
  }
}

/* The integer ops (the backend's int_ops), in int64: sums and products go through
 * uint64_t so that overflow wraps around as on the CPU; comparisons give 1/0. Other op
 * ids never reach an integer kernel (rm_op_run refuses them). */
__device__ __forceinline__ int64_t ew_apply(int op, int64_t a, int64_t b, int64_t c, int64_t s) {
  typedef unsigned long long U;
  switch (op) {
  case RM_OP_ADD: return (int64_t)((U)a + (U)b);
  case RM_OP_SUB: return (int64_t)((U)a - (U)b);
  case RM_OP_MUL: return (int64_t)((U)a * (U)b);
  case RM_OP_EQ: return a == b;
  case RM_OP_NE: return a != b;
  case RM_OP_LT: return a < b;
  case RM_OP_LE: return a <= b;
  case RM_OP_GT: return a > b;
  case RM_OP_GE: return a >= b;
  case RM_OP_WHERE: return c != 0 ? a : b;
  case RM_OP_ADD_SCALAR: return (int64_t)((U)a + (U)s);
  case RM_OP_MUL_SCALAR: return (int64_t)((U)a * (U)s);
  case RM_OP_NEG: return (int64_t)(0ull - (U)a);
  case RM_OP_ABS: return a < 0 ? (int64_t)(0ull - (U)a) : a;
  default: return a; /* copy */
  }
}

#define EW_MAXOP 3

/* Merged geometry of up to three operands over the output shape. */
typedef struct ew_geo {
  int ndim;
  int64_t shape[RM_MAX_DIM];
  int64_t stride[EW_MAXOP][RM_MAX_DIM];
} ew_geo;

/* Drops size-1 dims and merges adjacent dims wherever every operand allows it. */
static ew_geo ew_merge(int nop, const rm_tensor *const *ops, const rm_tensor *out) {
  ew_geo g;
  int nd = 0;
  for (int d = 0; d < out->ndim; d++) {
    int64_t size = out->shape[d];
    if (size == 1) continue;
    bool merge = nd > 0;
    for (int k = 0; k < nop && merge; k++) merge = g.stride[k][nd - 1] == ops[k]->stride[d] * size;
    if (merge) {
      g.shape[nd - 1] *= size;
      for (int k = 0; k < nop; k++) g.stride[k][nd - 1] = ops[k]->stride[d];
    } else {
      g.shape[nd] = size;
      for (int k = 0; k < nop; k++) g.stride[k][nd] = ops[k]->stride[d];
      nd++;
    }
  }
  for (int k = nop; k < EW_MAXOP; k++)
    for (int d = 0; d < nd; d++) g.stride[k][d] = 0;
  g.ndim = nd;
  return g;
}

template <class T>
__global__ void ew_contig_kernel(int op, int nop, int64_t n, const T *__restrict__ p0,
                                 const T *__restrict__ p1, const T *__restrict__ p2,
                                 T *__restrict__ po, double s) {
  typedef typename cu_acc<T>::type A;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    A x = cu_ld(p0 + i), y = nop > 1 ? cu_ld(p1 + i) : (A)0, z = nop > 2 ? cu_ld(p2 + i) : (A)0;
    /* where's operands are (cond, a, b) */
    A r = nop == 3 ? ew_apply(op, y, z, x, (A)s) : ew_apply(op, x, y, (A)0, (A)s);
    cu_sv(po + i, r);
  }
}

/* 16 bytes of T: what one vector load moves. */
template <class T> struct alignas(16) ew_vec { T v[16 / sizeof(T)]; };

/* Contiguous operands, 16-byte aligned: thread i handles the i-th 16-byte group of
 * every operand with one vector load / store each (nv groups; the tail is left to
 * ew_contig_kernel). */
template <class T>
__global__ void ew_vec_kernel(int op, int nop, int64_t nv, const T *__restrict__ p0, const T *__restrict__ p1,
                              const T *__restrict__ p2, T *__restrict__ po, double s) {
  typedef typename cu_acc<T>::type A;
  constexpr int V = 16 / sizeof(T);
  const ew_vec<T> *v0 = (const ew_vec<T> *)p0, *v1 = (const ew_vec<T> *)p1, *v2 = (const ew_vec<T> *)p2;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nv;
       i += (int64_t)gridDim.x * blockDim.x) {
    ew_vec<T> a = v0[i], b = nop > 1 ? v1[i] : a, c = nop > 2 ? v2[i] : a, r;
#pragma unroll
    for (int k = 0; k < V; k++) {
      A x = cu_ld(&a.v[k]), y = nop > 1 ? cu_ld(&b.v[k]) : (A)0, z = nop > 2 ? cu_ld(&c.v[k]) : (A)0;
      A q = nop == 3 ? ew_apply(op, y, z, x, (A)s) : ew_apply(op, x, y, (A)0, (A)s);
      cu_sv(&r.v[k], q);
    }
    ((ew_vec<T> *)po)[i] = r;
  }
}

template <class T>
__global__ void ew_strided_kernel(int op, int nop, int64_t n, ew_geo g, const T *p0, const T *p1,
                                  const T *p2, T *__restrict__ po, double s) {
  typedef typename cu_acc<T>::type A;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i, o0 = 0, o1 = 0, o2 = 0;
    for (int d = g.ndim - 1; d >= 0; d--) {
      int64_t k = r % g.shape[d];
      r /= g.shape[d];
      o0 += k * g.stride[0][d];
      o1 += k * g.stride[1][d];
      o2 += k * g.stride[2][d];
    }
    A x = cu_ld(p0 + o0), y = nop > 1 ? cu_ld(p1 + o1) : (A)0, z = nop > 2 ? cu_ld(p2 + o2) : (A)0;
    A r2 = nop == 3 ? ew_apply(op, y, z, x, (A)s) : ew_apply(op, x, y, (A)0, (A)s);
    cu_sv(po + i, r2);
  }
}

template <class T>
static int ew_launch(rm_ctx *ctx, int op, int nop, rm_tensor *const *in, rm_tensor *o, double s) {
  int64_t n = cu_numel(o);
  if (n == 0) return RM_OK;
  const T *p[EW_MAXOP];
  bool contig = true;
  for (int k = 0; k < EW_MAXOP; k++) {
    p[k] = (const T *)cu_ptr(in[k < nop ? k : 0]);
    if (k < nop && !cu_contig(in[k])) contig = false;
  }
  cudaStream_t st = cu_st(ctx)->stream;
  T *po = (T *)cu_ptr(o);
  bool aligned = ((uintptr_t)po & 15) == 0;
  for (int k = 0; k < nop; k++) aligned = aligned && ((uintptr_t)p[k] & 15) == 0;
  if (contig && aligned && n >= 16 / (int64_t)sizeof(T)) {
    const int64_t V = 16 / (int64_t)sizeof(T), nv = n / V, done = nv * V;
    ew_vec_kernel<T><<<cu_blocks(nv), CU_THREADS, 0, st>>>(op, nop, nv, p[0], p[1], p[2], po, s);
    if (done < n)
      ew_contig_kernel<T><<<1, CU_THREADS, 0, st>>>(op, nop, n - done, p[0] + done, p[1] + done, p[2] + done,
                                                    po + done, s);
  } else if (contig) {
    ew_contig_kernel<T><<<cu_blocks(n), CU_THREADS, 0, st>>>(op, nop, n, p[0], p[1], p[2], po, s);
  } else {
    ew_geo g = ew_merge(nop, in, o);
    ew_strided_kernel<T><<<cu_blocks(n), CU_THREADS, 0, st>>>(op, nop, n, g, p[0], p[1], p[2],
                                                             (T *)cu_ptr(o), s);
  }
  return CU_LAUNCHED(ctx, "elementwise kernel");
}

static int ew_run(rm_ctx *ctx, const char *name, int op, int nop, rm_tensor *const *in,
                  rm_tensor *o, double s) {
  for (int k = 0; k < nop; k++)
    if (in[k]->dtype != o->dtype)
      return cu_fail(ctx, RM_ERR_DTYPE, "%s: input %d is %s but the output is %s", name, k + 1,
                     cu_dname(in[k]->dtype), cu_dname(o->dtype));
  CU_DISPATCH_I(ctx, name, o->dtype, return ew_launch<T>(ctx, op, nop, in, o, s));
  return RM_OK;
}

#define EW_KERNEL(name, ID, NOP)                                                   \
  RM_CUDA_KERNEL(name) {                                                           \
    return ew_run(ctx, #name, RM_OP_##ID, NOP, in, out[0], a->scalar.value);       \
  }

EW_KERNEL(add, ADD, 2)
EW_KERNEL(sub, SUB, 2)
EW_KERNEL(mul, MUL, 2)
EW_KERNEL(div, DIV, 2)
EW_KERNEL(pow, POW, 2)
EW_KERNEL(maximum, MAXIMUM, 2)
EW_KERNEL(eq, EQ, 2)
EW_KERNEL(ne, NE, 2)
EW_KERNEL(lt, LT, 2)
EW_KERNEL(le, LE, 2)
EW_KERNEL(gt, GT, 2)
EW_KERNEL(ge, GE, 2)
EW_KERNEL(gelu_backward, GELU_BACKWARD, 2)
EW_KERNEL(silu_backward, SILU_BACKWARD, 2)
EW_KERNEL(gelu_tanh_backward, GELU_TANH_BACKWARD, 2)
EW_KERNEL(where, WHERE, 3)
EW_KERNEL(add_scalar, ADD_SCALAR, 1)
EW_KERNEL(mul_scalar, MUL_SCALAR, 1)
EW_KERNEL(pow_scalar, POW_SCALAR, 1)
EW_KERNEL(rdiv_scalar, RDIV_SCALAR, 1)
EW_KERNEL(neg, NEG, 1)
EW_KERNEL(exp, EXP, 1)
EW_KERNEL(log, LOG, 1)
EW_KERNEL(tanh, TANH, 1)
EW_KERNEL(sqrt, SQRT, 1)
EW_KERNEL(abs, ABS, 1)
EW_KERNEL(relu, RELU, 1)
EW_KERNEL(gelu, GELU, 1)
EW_KERNEL(silu, SILU, 1)
EW_KERNEL(gelu_tanh, GELU_TANH, 1)
EW_KERNEL(sigmoid, SIGMOID, 1)
EW_KERNEL(copy, COPY, 1)

/* ---- fill, cast and the shared copy helpers ---- */

template <class T>
__global__ void fill_kernel(T *p, int64_t n, double v) {
  typedef typename cu_acc<T>::type A;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    cu_sv(p + i, (A)v);
}

int cu_fill(rm_ctx *ctx, void *p, rm_dtype dt, int64_t n, double v) {
  if (n == 0) return RM_OK;
  cudaStream_t st = cu_st(ctx)->stream;
  CU_DISPATCH_I(ctx, "fill", dt, fill_kernel<T><<<cu_blocks(n), CU_THREADS, 0, st>>>((T *)p, n, v));
  return CU_LAUNCHED(ctx, "fill kernel");
}

RM_CUDA_KERNEL(fill) {
  return cu_fill(ctx, cu_ptr(out[0]), out[0]->dtype, cu_numel(out[0]), a->fill.value);
}

/* Converting copy of a strided source into a contiguous destination. Float64 goes
 * straight to the destination type (no float32 detour, which would round twice on the
 * way to bfloat16). */
template <class S, class D>
__global__ void cast_kernel(const S *src, D *dst, int64_t n, cu_geo g, bool contig) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const S *q = src + (contig ? i : cu_offset(g, i));
    cu_sv(dst + i, cu_ld(q)); /* the source's arithmetic type: float64 -> bfloat16 rounds once */
  }
}

template <class S>
static int cast_from(rm_ctx *ctx, const rm_tensor *src, void *dst, rm_dtype to) {
  int64_t n = cu_numel(src);
  if (n == 0) return RM_OK;
  cudaStream_t st = cu_st(ctx)->stream;
  cu_geo g = cu_geo_of(src);
  bool contig = cu_contig(src);
  const S *s = (const S *)cu_ptr(src);
  switch (to) {
  case RM_F32: cast_kernel<S, float><<<cu_blocks(n), CU_THREADS, 0, st>>>(s, (float *)dst, n, g, contig); break;
  case RM_F64: cast_kernel<S, double><<<cu_blocks(n), CU_THREADS, 0, st>>>(s, (double *)dst, n, g, contig); break;
  case RM_BF16:
    cast_kernel<S, __nv_bfloat16><<<cu_blocks(n), CU_THREADS, 0, st>>>(s, (__nv_bfloat16 *)dst, n, g, contig);
    break;
  case RM_I32: cast_kernel<S, int32_t><<<cu_blocks(n), CU_THREADS, 0, st>>>(s, (int32_t *)dst, n, g, contig); break;
  case RM_I64: cast_kernel<S, int64_t><<<cu_blocks(n), CU_THREADS, 0, st>>>(s, (int64_t *)dst, n, g, contig); break;
  default: return cu_bad_dtype(ctx, "cast", to);
  }
  return CU_LAUNCHED(ctx, "cast kernel");
}

/* Float -> integer casts truncate toward zero, as on the CPU; the first element that has
 * no value in the integer type (NaN, infinite, out of range) is found here first, and
 * the cast is an error naming it (this waits for the device: a conversion, not a hot
 * path). */
template <class S>
__global__ void cast_check_kernel(const S *src, int64_t n, cu_geo g, bool contig, double lo,
                                  unsigned long long *bad) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    double v = (double)cu_ld(src + (contig ? i : cu_offset(g, i)));
    double t = trunc(v);
    if (!(t >= lo && t < -lo)) atomicMin(bad, (unsigned long long)i);
  }
}

static inline double host_val(float v) { return v; }
static inline double host_val(double v) { return v; }
static inline double host_val(__nv_bfloat16 v) { return (double)__bfloat162float(v); }

template <class S>
static int check_to_int(rm_ctx *ctx, const rm_tensor *src, rm_dtype to) {
  int64_t n = cu_numel(src);
  if (n == 0) return RM_OK;
  cudaStream_t st = cu_st(ctx)->stream;
  unsigned long long *bad = (unsigned long long *)cu_scratch(ctx, sizeof *bad);
  if (!bad) return ctx->err_code;
  cu_geo g = cu_geo_of(src);
  bool contig = cu_contig(src);
  double lo = to == RM_I32 ? -2147483648.0 : -9223372036854775808.0;
  unsigned long long h = ~0ull;
  int rc = CU_CHECK(ctx, cudaMemsetAsync(bad, 0xff, sizeof *bad, st));
  if (!rc) {
    cast_check_kernel<S><<<cu_blocks(n), CU_THREADS, 0, st>>>((const S *)cu_ptr(src), n, g, contig, lo, bad);
    rc = CU_LAUNCHED(ctx, "cast check kernel");
  }
  if (!rc) rc = CU_CHECK(ctx, cudaMemcpyAsync(&h, bad, sizeof h, cudaMemcpyDeviceToHost, st));
  if (!rc) rc = CU_CHECK(ctx, cudaStreamSynchronize(st));
  cu_scratch_free(ctx, bad, sizeof *bad);
  if (rc || h == ~0ull) return rc;
  S v;
  const S *at = (const S *)cu_ptr(src) + (contig ? (int64_t)h : 0);
  if (!contig) { /* the bad element's offset through the strides */
    int64_t off = 0, r = (int64_t)h;
    for (int d = g.ndim - 1; d >= 0; d--) off += (r % g.shape[d]) * g.stride[d], r /= g.shape[d];
    at = (const S *)cu_ptr(src) + off;
  }
  rc = CU_CHECK(ctx, cudaMemcpy(&v, at, sizeof v, cudaMemcpyDeviceToHost));
  if (rc) return rc;
  double dv = host_val(v);
  if (dv != dv) dv = NAN;
  return cu_fail(ctx, RM_ERR_ARG, "cast: element %llu is %.17g, which has no %s value (NaN, infinite or out of range)",
                 h + 1, dv, cu_dname(to));
}

int cu_copy_strided(rm_ctx *ctx, const rm_tensor *src, void *dst, rm_dtype to) {
  if (src->dtype == to && cu_contig(src)) {
    size_t bytes = (size_t)cu_numel(src) * cu_dsize(to);
    if (!bytes) return RM_OK;
    return CU_CHECK(ctx, cudaMemcpyAsync(dst, cu_ptr(src), bytes, cudaMemcpyDeviceToDevice,
                                         cu_st(ctx)->stream));
  }
  if ((to == RM_I32 || to == RM_I64) && (src->dtype == RM_F32 || src->dtype == RM_F64 || src->dtype == RM_BF16)) {
    int rc = RM_OK;
    CU_DISPATCH(ctx, "cast", src->dtype, rc = check_to_int<T>(ctx, src, to));
    if (rc) return rc;
  }
  CU_DISPATCH_I(ctx, "cast", src->dtype, return cast_from<T>(ctx, src, dst, to));
  return RM_OK;
}

RM_CUDA_KERNEL(cast) {
  return cu_copy_strided(ctx, in[0], cu_ptr(out[0]), out[0]->dtype);
}

const void *cu_contig_data(rm_ctx *ctx, const rm_tensor *t, void **scratch) {
  *scratch = NULL;
  if (cu_contig(t)) return cu_ptr(t);
  size_t bytes = (size_t)cu_numel(t) * cu_dsize(t->dtype);
  void *p = cu_scratch(ctx, bytes);
  if (!p) return NULL;
  if (cu_copy_strided(ctx, t, p, t->dtype)) {
    cu_scratch_free(ctx, p, bytes);
    return NULL;
  }
  *scratch = p;
  return p;
}

/* ---- clamp (two scalars: its own kernel; semantics of kernels/cpu/elementwise.c) ---- */

template <class T>
__global__ void clamp_kernel(int64_t n, ew_geo g, bool contig, const T *x, T *__restrict__ y,
                             double lo, double hi) {
  typedef typename cu_acc<T>::type A;
  const A l = (A)lo, h = (A)hi;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t o = i;
    if (!contig) {
      int64_t r = i;
      o = 0;
      for (int d = g.ndim - 1; d >= 0; d--) {
        o += (r % g.shape[d]) * g.stride[0][d];
        r /= g.shape[d];
      }
    }
    A v = cu_ld(x + o);
    cu_sv(y + i, v < l ? l : v > h ? h : v);
  }
}

RM_CUDA_KERNEL(clamp) {
  int64_t n = cu_numel(out[0]);
  if (n == 0) return RM_OK;
  bool contig = cu_contig(in[0]);
  ew_geo g = ew_merge(1, in, out[0]);
  cudaStream_t st = cu_st(ctx)->stream;
  CU_DISPATCH(ctx, "clamp", out[0]->dtype,
              clamp_kernel<T><<<cu_blocks(n), CU_THREADS, 0, st>>>(n, g, contig, (const T *)cu_ptr(in[0]),
                                                                  (T *)cu_ptr(out[0]), a->clamp.lo, a->clamp.hi));
  return CU_LAUNCHED(ctx, "clamp kernel");
}
