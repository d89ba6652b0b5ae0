/* Shared helpers for the CUDA backend (the .cu files of kernels/cuda).
 *
 * libremat_cuda.so is dlopen'ed RTLD_LOCAL by remat.so, itself loaded RTLD_LOCAL by
 * Lua, so it must not reference any core symbol: everything it needs from core/ is
 * here as header-only code (numel, contiguity, data pointers, dtype sizes, setting
 * the context error). `nm -uD libremat_cuda.so | grep ' rm_'` must stay empty.
 *
 * Dtypes: float32, float64 (so the float64 specs run too) and bfloat16 (storage only:
 * arithmetic in float32). Everything runs on one stream per context (the state's
 * `stream`), which makes the caching allocator stream-ordered for free.
 *
 * Debug and timing modes, read from the environment when a context starts:
 *   REMAT_CUDA_SYNC=1     synchronise after every launch and every op: an asynchronous
 *                         fault is reported under the kernel and op that caused it, and
 *                         index checks fail at the op call (as on the CPU);
 *   REMAT_CUDA_PROFILE=1  time every op with CUDA events (synchronising after each op,
 *                         so the events bracket that op's GPU work alone); the totals are
 *                         read with the backend's `profile` entry (remat.cuda.profile()). */
#ifndef REMAT_CUDA_COMMON_CUH
#define REMAT_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>

extern "C" {
#include "../../core/backend.h"
#include "../../core/blockpool.h"
#include "../../core/ops.h"
}
#include "../../core/philox.h"

/* Kernel signature (see core/backend.h); one per op, named cuk_<op>. */
#define RM_CUDA_KERNEL(name)                                                      \
  int cuk_##name(rm_ctx *ctx, int nin, rm_tensor *const *in, int nout,            \
                 rm_tensor *const *out, const rm_attrs *a)

#define CU_THREADS 256
#define CU_MAX_BLOCKS 8192

/* ---- per-context state (backend.cu) ---- */


/* Index and label checks run on the device without waiting: each check owns a slot
 * (first bad position and its value, written by the device) and the host remembers
 * what to say about it; the slots are read at the next synchronisation (to_host,
 * synchronize), which reports the first failure (backend.cu: cu_checks_flush). */
#define CU_MAX_CHECKS 256
#define CU_MAX_SCRATCH 16 /* kernel workspace buffers held at once (attention: 4) */
#define CU_WHERE_POSITION (-1) /* "(position p)": a flat index list */
#define CU_WHERE_ROW (-2)      /* "(row p)": one label per row */

typedef struct cu_check_slot {
  unsigned long long pos; /* ~0: no bad value */
  double val;
} cu_check_slot;

typedef struct cu_check_info {
  const char *op;   /* a string literal (op name) */
  const char *what; /* "index" or "label" */
  int64_t size;     /* valid range 1..size */
  int dim;          /* dim of the indexed tensor, or CU_WHERE_POSITION / CU_WHERE_ROW */
} cu_check_info;

typedef struct cu_state {
  int device;
  cudaStream_t stream;
  cublasHandle_t blas;
  void *lt;                      /* cublasLtHandle_t (matmul.cu) */
  void *lt_ws;                   /* cublasLt workspace (device) */
  size_t lt_ws_bytes;
  bool sync_each;                /* REMAT_CUDA_SYNC */
  bool profile;                  /* REMAT_CUDA_PROFILE */
  cudaEvent_t ev[2];
  double prof_ms[RM_OP_COUNT];
  int64_t prof_calls[RM_OP_COUNT];
  cu_check_slot *checks;         /* device: CU_MAX_CHECKS slots */
  cu_check_info check_info[CU_MAX_CHECKS];
  int nchecks;                   /* slots in use since the last flush */
  rm_pool pool;                  /* the caching allocator (core/blockpool.h) */
  rm_ctx *ctx;                   /* whose host memory the pool's records use */
  cudaError_t pool_err;          /* why the last segment could not be had */
  struct { void *p; rm_storage *s; } scratch[CU_MAX_SCRATCH]; /* kernel workspace out */
  int nscratch;
  char name[256];
  size_t total_mem;
} cu_state;

/* ---- errors: rm_fail, through its inline body (the plugin links no core symbol) ---- */

static inline int cu_fail(rm_ctx *ctx, rm_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int cu_fail(rm_ctx *ctx, rm_status code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = rm_failv(ctx, code, fmt, ap);
  va_end(ap);
  return rc;
}

/* Turns a CUDA status into a remat error naming the call; RM_OK on success. */
static inline int cu_check(rm_ctx *ctx, cudaError_t e, const char *call) {
  if (e == cudaSuccess) return RM_OK;
  (void)cudaGetLastError(); /* clear a sticky-free error so the next call is clean */
  return cu_fail(ctx, RM_ERR_RUNTIME, "CUDA error in %s: %s (%s, code %d)", call,
                 cudaGetErrorString(e), cudaGetErrorName(e), (int)e);
}

static inline int cublas_check(rm_ctx *ctx, cublasStatus_t s, const char *call) {
  if (s == CUBLAS_STATUS_SUCCESS) return RM_OK;
  return cu_fail(ctx, RM_ERR_RUNTIME, "cuBLAS error in %s: %s (%s, code %d)", call,
                 cublasGetStatusString(s), cublasGetStatusName(s), (int)s);
}

#define CU_CHECK(ctx, call) cu_check((ctx), (call), #call)
#define CUBLAS_CHECK(ctx, call) cublas_check((ctx), (call), #call)

static inline cu_state *cu_st(rm_ctx *ctx) { return (cu_state *)ctx->backend_state[RM_CUDA]; }

/* After a launch: reports a bad configuration. Asynchronous faults surface at the next
 * synchronisation, except under REMAT_CUDA_SYNC=1, which waits here and names `what`. */
static inline int cu_launched(rm_ctx *ctx, const char *what) {
  int rc = cu_check(ctx, cudaGetLastError(), what);
  cu_state *st = cu_st(ctx);
  if (rc || !st || !st->sync_each) return rc;
  cudaError_t e = cudaStreamSynchronize(st->stream);
  if (e == cudaSuccess) return RM_OK;
  (void)cudaGetLastError();
  return cu_fail(ctx, RM_ERR_RUNTIME, "CUDA error in %s (found by REMAT_CUDA_SYNC=1 right after the launch): %s (%s)",
                 what, cudaGetErrorString(e), cudaGetErrorName(e));
}
#define CU_LAUNCHED(ctx, what) cu_launched((ctx), (what))

/* ---- tensors (header-only copies of the core helpers) ---- */

static inline size_t cu_dsize(rm_dtype d) {
  return (d == RM_F64 || d == RM_I64) ? 8 : (d == RM_BF16 || d == RM_F16) ? 2 : 4;
}

static inline const char *cu_dname(rm_dtype d) {
  switch (d) {
  case RM_F32: return "float32";
  case RM_F64: return "float64";
  case RM_BF16: return "bfloat16";
  case RM_F16: return "float16";
  case RM_I32: return "int32";
  case RM_I64: return "int64";
  default: return "?";
  }
}

static inline int64_t cu_numel(const rm_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

static inline bool cu_contig(const rm_tensor *t) {
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->stride[i] != s) return false;
    s *= t->shape[i];
  }
  return true;
}

static inline void *cu_ptr(const rm_tensor *t) {
  if (!t->storage || !t->storage->data) return NULL;
  return (char *)t->storage->data + (size_t)t->offset * cu_dsize(t->dtype);
}

static inline unsigned cu_blocks(int64_t n, int threads = CU_THREADS) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return (unsigned)(b > CU_MAX_BLOCKS ? CU_MAX_BLOCKS : b);
}

/* Error for a dtype an op does not handle on this backend. */
static inline int cu_bad_dtype(rm_ctx *ctx, const char *op, rm_dtype d) {
  return cu_fail(ctx, RM_ERR_DTYPE, "%s: cuda does not support %s for this op", op, cu_dname(d));
}

/* Strided geometry passed to kernels by value. */
typedef struct cu_geo {
  int ndim;
  int64_t shape[RM_MAX_DIM];
  int64_t stride[RM_MAX_DIM];
} cu_geo;

static inline cu_geo cu_geo_of(const rm_tensor *t) {
  cu_geo g;
  g.ndim = t->ndim;
  for (int i = 0; i < t->ndim; i++) g.shape[i] = t->shape[i], g.stride[i] = t->stride[i];
  return g;
}

/* Element offset of the row-major linear index i. */
__device__ __forceinline__ int64_t cu_offset(const cu_geo &g, int64_t i) {
  int64_t off = 0;
  for (int d = g.ndim - 1; d >= 0; d--) {
    int64_t s = g.shape[d];
    off += (i % s) * g.stride[d];
    i /= s;
  }
  return off;
}

/* ---- numeric types: T in storage, acc_t<T> for arithmetic ---- */

template <class T> struct cu_acc { typedef float type; };
template <> struct cu_acc<double> { typedef double type; };
/* integers compute in int64 (elementwise.cu wraps sums and products around) */
template <> struct cu_acc<int32_t> { typedef int64_t type; };
template <> struct cu_acc<int64_t> { typedef int64_t type; };

__device__ __forceinline__ float cu_ld(const float *p) { return *p; }
__device__ __forceinline__ double cu_ld(const double *p) { return *p; }
__device__ __forceinline__ float cu_ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void cu_sv(float *p, float v) { *p = v; }
__device__ __forceinline__ void cu_sv(double *p, double v) { *p = v; }
__device__ __forceinline__ void cu_sv(__nv_bfloat16 *p, float v) { *p = __float2bfloat16(v); }
/* float64 -> bfloat16 in one rounding (through float32 would round twice) */
__device__ __forceinline__ void cu_sv(__nv_bfloat16 *p, double v) { *p = __double2bfloat16(v); }
__device__ __forceinline__ int64_t cu_ld(const int32_t *p) { return *p; }
__device__ __forceinline__ int64_t cu_ld(const int64_t *p) { return *p; }
__device__ __forceinline__ void cu_sv(int32_t *p, int64_t v) { *p = (int32_t)v; }
__device__ __forceinline__ void cu_sv(int64_t *p, int64_t v) { *p = v; }
__device__ __forceinline__ void cu_sv(__nv_bfloat16 *p, int64_t v) { *p = __double2bfloat16((double)v); }

/* Same, with the integer types too (ops whose kernels take int32/int64: the backend's
 * int_ops). */
#define CU_DISPATCH_I(ctx, opname, dt, ...)                                        \
  do {                                                                             \
    switch (dt) {                                                                  \
    case RM_F32: { typedef float T; __VA_ARGS__; } break;                          \
    case RM_F64: { typedef double T; __VA_ARGS__; } break;                         \
    case RM_BF16: { typedef __nv_bfloat16 T; __VA_ARGS__; } break;                 \
    case RM_I32: { typedef int32_t T; __VA_ARGS__; } break;                        \
    case RM_I64: { typedef int64_t T; __VA_ARGS__; } break;                        \
    default: return cu_bad_dtype((ctx), (opname), (dt));                           \
    }                                                                              \
  } while (0)

/* Calls F.template operator()<T>() for the tensor dtype (float32, float64, bfloat16). */
#define CU_DISPATCH(ctx, opname, dt, ...)                                          \
  do {                                                                             \
    switch (dt) {                                                                  \
    case RM_F32: { typedef float T; __VA_ARGS__; } break;                          \
    case RM_F64: { typedef double T; __VA_ARGS__; } break;                         \
    case RM_BF16: { typedef __nv_bfloat16 T; __VA_ARGS__; } break;                 \
    default: return cu_bad_dtype((ctx), (opname), (dt));                           \
    }                                                                              \
  } while (0)

/* Same, without bfloat16 (ops whose bf16 variant is not provided). */
#define CU_DISPATCH_F(ctx, opname, dt, ...)                                        \
  do {                                                                             \
    switch (dt) {                                                                  \
    case RM_F32: { typedef float T; __VA_ARGS__; } break;                          \
    case RM_F64: { typedef double T; __VA_ARGS__; } break;                         \
    default: return cu_bad_dtype((ctx), (opname), (dt));                           \
    }                                                                              \
  } while (0)


/* ---- block reductions (blockDim.x a multiple of 32, at most 1024) ---- */

template <class A> __device__ __forceinline__ A cu_warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class A> __device__ __forceinline__ A cu_warp_max(A v) {
  for (int o = 16; o > 0; o >>= 1) {
    A w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

/* Sum of v over the block, returned to every thread. `sh` holds 32 A's; the result is
 * the same for a given blockDim (fixed tree), so runs are reproducible. */
template <class A> __device__ __forceinline__ A cu_block_sum(A v, A *sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = cu_warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : (A)0;
  return cu_warp_sum(v);
}

/* Max over the block (NaN-blind, like the CPU's `>` scan), returned to every thread. */
template <class A> __device__ __forceinline__ A cu_block_max(A v, A *sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = cu_warp_max(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : (A)-INFINITY;
  return cu_warp_max(v);
}

/* Threads for a block that walks rows of n elements: a power of two in [32, 1024]. */
static inline int cu_row_threads(int64_t n, int cap = 256) {
  int t = 32;
  while (t < cap && t < n) t <<= 1;
  return t;
}

/* ---- scratch memory and helpers shared by the families (backend.cu, elementwise.cu) ---- */

/* Kernel workspace: a storage from the core's accounted allocator (category workspace,
 * under the memory limit; ctx->workspace_new), freed before the kernel returns (stream
 * ordering makes the reuse safe). NULL + error naming the workspace and the limit. */
void *cu_scratch(rm_ctx *ctx, size_t bytes);
void cu_scratch_free(rm_ctx *ctx, void *p, size_t bytes);

/* A contiguous copy of t's data (*scratch set when a copy was made: give it back with
 * cu_scratch_free(ctx, *scratch, cu_numel(t) * cu_dsize(t->dtype))). NULL + error. */
const void *cu_contig_data(rm_ctx *ctx, const rm_tensor *t, void **scratch);

/* Kernel workspace of one call, for dry runs (rm_backend.workspace; backend.cu). */
size_t cu_attention_workspace(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a);
size_t cu_loss_workspace(rm_op_id op, int nin, rm_tensor *const *in);
size_t cu_matmul_softmax_workspace(int nin, rm_tensor *const *in);

/* Strided copy (with dtype conversion) of src into contiguous dst of the same shape. */
int cu_copy_strided(rm_ctx *ctx, const rm_tensor *src, void *dst, rm_dtype dst_dtype);

/* Queues a check of idx (contiguous data p): every value must be a whole number in
 * 1..size. Nothing waits: the first bad value is reported at the next synchronisation
 * ("<op>: <what> 7 is out of range 1..5 (dimension d, position p)"; dim may be
 * CU_WHERE_POSITION or CU_WHERE_ROW instead).
 * Kernels that read indices must stay in bounds for bad values (cu_ix_ok). */
int cu_check_indices(rm_ctx *ctx, const char *op, const char *what, const rm_tensor *idx,
                     const void *p, int64_t size, int dim);

/* Whether v is a whole number in 1..size (the device side of cu_check_indices). */
__device__ __forceinline__ bool cu_ix_ok(double v, int64_t size) {
  return v >= 1 && v <= (double)size && v == floor(v);
}

/* Index value k of index data p (int64, int32, float64, bfloat16 or float32), as a
 * double (for messages). */
__device__ __forceinline__ double cu_index_value(const void *p, rm_dtype dt, int64_t k) {
  switch (dt) {
  case RM_I64: return (double)((const int64_t *)p)[k];
  case RM_I32: return (double)((const int32_t *)p)[k];
  case RM_F64: return ((const double *)p)[k];
  case RM_BF16: return (double)__bfloat162float(((const __nv_bfloat16 *)p)[k]);
  default: return (double)((const float *)p)[k];
  }
}

/* The 0-based position index value k of p holds, or -1 when it is not a whole number in
 * 1..size (integers compared exactly, beyond 2^53 too). */
__device__ __forceinline__ int64_t cu_index_at(const void *p, rm_dtype dt, int64_t k, int64_t size) {
  if (dt == RM_I64 || dt == RM_I32) {
    int64_t v = dt == RM_I64 ? ((const int64_t *)p)[k] : (int64_t)((const int32_t *)p)[k];
    return v >= 1 && v <= size ? v - 1 : -1;
  }
  double v = cu_index_value(p, dt, k);
  return cu_ix_ok(v, size) ? (int64_t)v - 1 : -1;
}

/* Fills n elements of dtype dt at p with v. */
int cu_fill(rm_ctx *ctx, void *p, rm_dtype dt, int64_t n, double v);

/* Contiguous data of every input (scratch copies for strided ones), given back with
 * cu_inputs_free. */
typedef struct cu_inputs {
  int n;
  const void *p[16];
  void *scratch[16];
  size_t bytes[16];
} cu_inputs;

static inline int cu_inputs_get(rm_ctx *ctx, int nin, rm_tensor *const *in, cu_inputs *ci) {
  ci->n = 0;
  for (int i = 0; i < nin && i < 16; i++) {
    ci->p[i] = cu_contig_data(ctx, in[i], &ci->scratch[i]);
    ci->bytes[i] = (size_t)cu_numel(in[i]) * cu_dsize(in[i]->dtype);
    ci->n = i + 1;
    if (!ci->p[i] && cu_numel(in[i]) > 0) return ctx->err_code ? ctx->err_code : RM_ERR_RUNTIME;
  }
  return RM_OK;
}

static inline void cu_inputs_free(rm_ctx *ctx, cu_inputs *ci) {
  for (int i = 0; i < ci->n; i++)
    if (ci->scratch[i]) cu_scratch_free(ctx, ci->scratch[i], ci->bytes[i]);
  ci->n = 0;
}

#endif
