/* The CUDA backend table: per-context state (device, stream, cuBLAS handle), the
 * caching allocator, host <-> device copies, synchronisation and error mapping.
 *
 * Caching allocator: core/blockpool.c over cudaMalloc segments. A request takes the
 * best-fitting free block, split to size (512 B granularity); a freed block merges with
 * its free neighbours. All work runs on the context's one stream, so a block freed
 * after a kernel was queued can be handed to the next kernel on that stream without
 * waiting: the stream orders them. When cudaMalloc fails, free segments go back
 * largest first until the request fits, then all of them; after that the accounted
 * allocator (core/alloc.c) reports the out-of-memory error (and runs its
 * collect-then-retry). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

/* Every op but the views needs its kernel (RM_IF_KERNEL, core/backend.h): a missing
 * one is an undefined symbol, and the library is linked with --no-undefined (Makefile),
 * so it fails to link. */
#define X(ID, name, family, set) RM_IF_KERNEL(family, RM_CUDA_KERNEL(name);)
#include "../../core/ops.def"
#undef X

int cu_lt_init(rm_ctx *ctx, cu_state *st);  /* matmul.cu */
void cu_lt_shutdown(cu_state *st);

/* ---- the caching allocator: core/blockpool.c over cudaMalloc segments ---- */

static void *host_alloc(rm_ctx *ctx, size_t n) { return ctx->host.alloc(ctx->host.ud, n); }
static void host_free(rm_ctx *ctx, void *p, size_t n) { if (p) ctx->host.free(ctx->host.ud, p, n); }

static void *pool_seg_alloc(void *ud, size_t bytes) {
  cu_state *st = (cu_state *)ud;
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* out of memory is not sticky: clear it */
    st->pool_err = e;
    return NULL;
  }
  return p;
}

/* Work queued on the stream may still use the segment's last blocks: wait for it
 * (cudaFree would synchronise the device anyway). */
static void pool_seg_free(void *ud, void *p, size_t bytes) {
  cu_state *st = (cu_state *)ud;
  cudaStreamSynchronize(st->stream);
  cudaFree(p);
}

static void *pool_host_alloc(void *ud, size_t n) { return host_alloc(((cu_state *)ud)->ctx, n); }
static void pool_host_free(void *ud, void *p, size_t n) { host_free(((cu_state *)ud)->ctx, p, n); }

/* Raw allocation from the pool; NULL when the device is out of memory (why says so). */
static void *cu_alloc(cu_state *st, size_t bytes, cudaError_t *why) {
  st->pool_err = cudaErrorMemoryAllocation; /* also what a host-memory failure reads as */
  void *p = rm_pool_alloc(&st->pool, bytes);
  *why = p ? cudaSuccess : st->pool_err;
  return p;
}

static void cu_release(cu_state *st, void *p) { if (p) rm_pool_free(&st->pool, p); }

/* ---- backend entry points ---- */

static int cuda_init(rm_ctx *ctx, void **state) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return cu_fail(ctx, RM_ERR_DEVICE, "CUDA is not available: %s%s", cudaGetErrorString(e),
                   e == cudaErrorInsufficientDriver
                       ? " (no NVIDIA driver was found, or it is older than the CUDA runtime)"
                       : "");
  }
  if (n < 1) return cu_fail(ctx, RM_ERR_DEVICE, "CUDA is not available: no CUDA device found");
  cu_state *st = (cu_state *)host_alloc(ctx, sizeof *st);
  if (!st) return cu_fail(ctx, RM_ERR_OOM, "CUDA: out of host memory for the backend state");
  memset(st, 0, sizeof *st);
  st->ctx = ctx;
  rm_pool_cfg pool = {pool_seg_alloc, pool_seg_free, pool_host_alloc, pool_host_free, st};
  rm_pool_init(&st->pool, &pool);
  int rc = CU_CHECK(ctx, cudaGetDevice(&st->device));
  cudaDeviceProp prop;
  if (!rc) rc = CU_CHECK(ctx, cudaGetDeviceProperties(&prop, st->device));
  if (!rc) {
    snprintf(st->name, sizeof st->name, "%s", prop.name);
    st->total_mem = prop.totalGlobalMem;
    rc = CU_CHECK(ctx, cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking));
  }
  if (!rc) rc = CUBLAS_CHECK(ctx, cublasCreate(&st->blas));
  if (!rc) rc = CUBLAS_CHECK(ctx, cublasSetStream(st->blas, st->stream));
  if (!rc) rc = cu_lt_init(ctx, st);
  if (!rc) rc = CU_CHECK(ctx, cudaMalloc((void **)&st->checks, CU_MAX_CHECKS * sizeof(cu_check_slot)));
  if (!rc) rc = CU_CHECK(ctx, cudaMemsetAsync(st->checks, 0xff, CU_MAX_CHECKS * sizeof(cu_check_slot), st->stream));
  const char *env = getenv("REMAT_CUDA_SYNC");
  st->sync_each = env && *env && strcmp(env, "0") != 0;
  env = getenv("REMAT_CUDA_PROFILE");
  st->profile = env && *env && strcmp(env, "0") != 0;
  if (!rc && st->profile) rc = CU_CHECK(ctx, cudaEventCreate(&st->ev[0]));
  if (!rc && st->profile) rc = CU_CHECK(ctx, cudaEventCreate(&st->ev[1]));
  if (rc) {
    /* keep the reason, but say it the way callers expect */
    char why[sizeof ctx->err];
    snprintf(why, sizeof why, "%s", ctx->err);
    if (st->ev[0]) cudaEventDestroy(st->ev[0]);
    if (st->ev[1]) cudaEventDestroy(st->ev[1]);
    if (st->checks) cudaFree(st->checks);
    cu_lt_shutdown(st);
    if (st->blas) cublasDestroy(st->blas);
    if (st->stream) cudaStreamDestroy(st->stream);
    host_free(ctx, st, sizeof *st);
    return cu_fail(ctx, RM_ERR_DEVICE, "CUDA is not available: %s", why);
  }
  *state = st;
  return RM_OK;
}

static void cuda_shutdown(rm_ctx *ctx, void *state) {
  cu_state *st = (cu_state *)state;
  if (!st) return;
  cudaStreamSynchronize(st->stream);
  rm_pool_destroy(&st->pool);
  if (st->ev[0]) cudaEventDestroy(st->ev[0]);
  if (st->ev[1]) cudaEventDestroy(st->ev[1]);
  cudaFree(st->checks);
  cu_lt_shutdown(st);
  cublasDestroy(st->blas);
  cudaStreamDestroy(st->stream);
  host_free(ctx, st, sizeof *st);
}

static void *cuda_malloc(rm_ctx *ctx, size_t bytes) {
  cudaError_t why;
  return cu_alloc(cu_st(ctx), bytes, &why);
}

static void cuda_free(rm_ctx *ctx, void *p, size_t bytes) { cu_release(cu_st(ctx), p); }

/* ---- deferred index checks (see cu_check_indices) ---- */

/* Reads the check slots (the stream must be idle: called right after a synchronisation),
 * resets them, and reports the first failed check in queue order. */
static int cu_checks_flush(rm_ctx *ctx, cu_state *st) {
  int n = st->nchecks;
  if (!n) return RM_OK;
  cu_check_slot h[CU_MAX_CHECKS];
  int rc = CU_CHECK(ctx, cudaMemcpy(h, st->checks, (size_t)n * sizeof *h, cudaMemcpyDeviceToHost));
  if (!rc) rc = CU_CHECK(ctx, cudaMemsetAsync(st->checks, 0xff, (size_t)n * sizeof *h, st->stream));
  st->nchecks = 0;
  if (rc) return rc;
  for (int i = 0; i < n; i++) {
    if (h[i].pos == ~0ull) continue;
    const cu_check_info *ci = &st->check_info[i];
    double v = h[i].val;
    if (v != v) v = NAN; /* print "nan", not "-nan" */
    char where[96];
    if (ci->dim >= 0)
      snprintf(where, sizeof where, "dimension %d, position %llu", ci->dim + 1, h[i].pos + 1);
    else
      snprintf(where, sizeof where, "%s %llu", ci->dim == CU_WHERE_ROW ? "row" : "position", h[i].pos + 1);
    const char *kind = v == floor(v) ? "is out of range" : "is not a whole number in";
    return cu_fail(ctx, RM_ERR_ARG, "%s: %s %.17g %s 1..%lld (%s; found on cuda at the next synchronisation)",
                   ci->op, ci->what, v, kind, (long long)ci->size, where);
  }
  return RM_OK;
}

/* Waits for the stream, then reports a queued index check that failed. */
static int cu_sync_checked(rm_ctx *ctx, cu_state *st) {
  int rc = CU_CHECK(ctx, cudaStreamSynchronize(st->stream));
  return rc ? rc : cu_checks_flush(ctx, st);
}

__global__ void ix_check_kernel(const void *p, rm_dtype dt, int64_t n, int64_t size, cu_check_slot *slot) {
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x) {
    if (cu_index_at(p, dt, k, size) < 0) atomicMin(&slot->pos, (unsigned long long)k);
  }
}

/* Runs after ix_check_kernel on the same stream: records the value at the first bad
 * position while the index data is still alive (stream order). */
__global__ void ix_check_value_kernel(const void *p, rm_dtype dt, cu_check_slot *slot) {
  unsigned long long k = slot->pos;
  if (k == ~0ull) return;
  slot->val = cu_index_value(p, dt, (int64_t)k);
}

int cu_check_indices(rm_ctx *ctx, const char *op, const char *what, const rm_tensor *idx, const void *p,
                     int64_t size, int dim) {
  int64_t n = cu_numel(idx);
  if (n == 0) return RM_OK;
  if (idx->dtype != RM_F32 && idx->dtype != RM_F64 && idx->dtype != RM_BF16 && idx->dtype != RM_I32 &&
      idx->dtype != RM_I64)
    return cu_fail(ctx, RM_ERR_DTYPE, "%s: %ss must be int64, int32, float32, float64 or bfloat16 (got %s)", op,
                   what, cu_dname(idx->dtype));
  cu_state *st = cu_st(ctx);
  if (st->nchecks == CU_MAX_CHECKS) { /* every slot in use: drain once, then start over */
    int rc = cu_sync_checked(ctx, st);
    if (rc) return rc;
  }
  int i = st->nchecks++;
  st->check_info[i].op = op;
  st->check_info[i].what = what;
  st->check_info[i].size = size;
  st->check_info[i].dim = dim;
  ix_check_kernel<<<cu_blocks(n), CU_THREADS, 0, st->stream>>>(p, idx->dtype, n, size, st->checks + i);
  ix_check_value_kernel<<<1, 1, 0, st->stream>>>(p, idx->dtype, st->checks + i);
  return CU_LAUNCHED(ctx, "index check kernel");
}

static int cuda_to_host(rm_ctx *ctx, void *dst, const void *src, size_t n) {
  cu_state *st = cu_st(ctx);
  int rc = n ? CU_CHECK(ctx, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, st->stream)) : RM_OK;
  return rc ? rc : cu_sync_checked(ctx, st);
}

static int cuda_from_host(rm_ctx *ctx, void *dst, const void *src, size_t n) {
  if (!n) return RM_OK;
  cu_state *st = cu_st(ctx);
  int rc = CU_CHECK(ctx, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, st->stream));
  /* synchronous: the caller may free or reuse src as soon as we return */
  return rc ? rc : cu_sync_checked(ctx, st);
}

static int cuda_sync(rm_ctx *ctx) { return cu_sync_checked(ctx, cu_st(ctx)); }

/* ---- every op goes through here: REMAT_CUDA_SYNC and REMAT_CUDA_PROFILE ---- */

static int cu_run(rm_ctx *ctx, rm_op_id op, const char *name, rm_kernel_fn k, int nin, rm_tensor *const *in,
                  int nout, rm_tensor *const *out, const rm_attrs *a) {
  cu_state *st = cu_st(ctx);
  if (!st || (!st->sync_each && !st->profile)) return k(ctx, nin, in, nout, out, a);
  int rc = RM_OK;
  if (st->profile) rc = CU_CHECK(ctx, cudaEventRecord(st->ev[0], st->stream));
  if (!rc) rc = k(ctx, nin, in, nout, out, a);
  if (!rc && st->profile) rc = CU_CHECK(ctx, cudaEventRecord(st->ev[1], st->stream));
  if (rc) return rc;
  cudaError_t e = cudaStreamSynchronize(st->stream);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return cu_fail(ctx, RM_ERR_RUNTIME, "CUDA error in op %s (found by synchronising after it): %s (%s)", name,
                   cudaGetErrorString(e), cudaGetErrorName(e));
  }
  if (st->profile) {
    float ms = 0;
    if ((rc = CU_CHECK(ctx, cudaEventElapsedTime(&ms, st->ev[0], st->ev[1])))) return rc;
    st->prof_ms[op] += ms;
    st->prof_calls[op]++;
  }
  return st->sync_each ? cu_checks_flush(ctx, st) : RM_OK;
}

#define X(ID, name, family, set)                                                          \
  RM_IF_KERNEL(family,                                                                 \
  static int run_##name(rm_ctx *ctx, int nin, rm_tensor *const *in, int nout,       \
                        rm_tensor *const *out, const rm_attrs *a) {                 \
    return cu_run(ctx, RM_OP_##ID, #name, cuk_##name, nin, in, nout, out, a);       \
  })
#include "../../core/ops.def"
#undef X

/* Per-op GPU milliseconds and calls since the last reset (REMAT_CUDA_PROFILE=1; RM_OP_COUNT
 * entries each). Returns 0 when profiling is off (arrays untouched), 1 otherwise. */
static int cuda_profile(rm_ctx *ctx, double *ms, int64_t *calls, bool reset) {
  cu_state *st = cu_st(ctx);
  if (!st || !st->profile) return 0;
  for (int i = 0; i < RM_OP_COUNT; i++) {
    if (ms) ms[i] = st->prof_ms[i];
    if (calls) calls[i] = st->prof_calls[i];
    if (reset) st->prof_ms[i] = 0, st->prof_calls[i] = 0;
  }
  return 1;
}

/* ---- scratch for the kernels ---- */

/* Kernel workspace is accounted like every tensor (category workspace, under the
 * memory limit): it comes from the core's allocator through the context. */
void *cu_scratch(rm_ctx *ctx, size_t bytes) {
  cu_state *st = cu_st(ctx);
  if (st->nscratch == CU_MAX_SCRATCH) {
    cu_fail(ctx, RM_ERR_STATE, "cuda: more than %d kernel workspace buffers at once", CU_MAX_SCRATCH);
    return NULL;
  }
  rm_storage *s = ctx->workspace_new(ctx, RM_CUDA, bytes ? bytes : 1);
  if (!s) return NULL; /* the allocator's message names the workspace and the limit */
  st->scratch[st->nscratch].p = s->data;
  st->scratch[st->nscratch].s = s;
  st->nscratch++;
  return s->data;
}

void cu_scratch_free(rm_ctx *ctx, void *p, size_t bytes) {
  cu_state *st = cu_st(ctx);
  for (int i = st->nscratch - 1; i >= 0; i--)
    if (st->scratch[i].p == p) {
      rm_storage *s = st->scratch[i].s;
      st->scratch[i] = st->scratch[--st->nscratch];
      ctx->storage_release(ctx, s);
      return;
    }
}

/* ---- kernel workspace for dry runs ----
 * Predicted: attention's score blocks and operand copies (by far the largest: up to
 * ATT_WORKSPACE, 256 MiB), the losses' row sums and matmul_softmax's product. Not
 * predicted: the few-KB partial sums of reductions and norms, the embedding backward's
 * sort buffers, and copies of operands a GEMM cannot read in place. */
static size_t cuda_workspace(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a) {
  switch (op) {
  case RM_OP_ATTENTION:
  case RM_OP_ATTENTION_BACKWARD:
  case RM_OP_ATTENTION_QKV_BACKWARD: return cu_attention_workspace(ctx, op, nin, in, a);
  case RM_OP_CROSS_ENTROPY:
  case RM_OP_MSE: return cu_loss_workspace(op, nin, in);
  case RM_OP_MATMUL_SOFTMAX: return cu_matmul_softmax_workspace(nin, in);
  default: return 0;
  }
}

/* ---- the table ---- */

#define RM_CUDA_EXPORT extern "C" __attribute__((visibility("default")))
RM_CUDA_EXPORT size_t rm_cuda_reserved(rm_ctx *ctx);
RM_CUDA_EXPORT size_t rm_cuda_empty_cache(rm_ctx *ctx);
RM_CUDA_EXPORT int rm_cuda_device_info(rm_ctx *ctx, char *name, size_t n, size_t *total,
                                       size_t *free_bytes);

/* Built once, on first use, by a function-local static: C++ has no array designated
 * initialisers, so the table cannot be a constant initialiser as on the CPU. It is not
 * mutable state: after its (thread-safe, C++11) construction it is never written, and
 * every context shares the same constant table; per-context state lives in cu_state. */
static rm_backend make_table(void) {
  rm_backend b;
  memset(&b, 0, sizeof b);
  b.name = "cuda";
  b.device = RM_CUDA;
  b.init = cuda_init;
  b.shutdown = cuda_shutdown;
  b.malloc = cuda_malloc;
  b.free = cuda_free;
  b.to_host = cuda_to_host;
  b.from_host = cuda_from_host;
  b.synchronize = cuda_sync;
  b.reserved = rm_cuda_reserved;
  b.empty_cache = rm_cuda_empty_cache;
  b.device_info = rm_cuda_device_info;
  b.profile = cuda_profile;
  b.workspace = cuda_workspace;
  b.flops_per_byte = 100.0; /* H200: ~500 TFLOP/s reachable bf16 GEMM over 4.8 TB/s */
  b.supports_dtype[RM_F32] = true;
  b.supports_dtype[RM_F64] = true;
  b.supports_dtype[RM_BF16] = true;
  b.supports_dtype[RM_I32] = true;
  b.supports_dtype[RM_I64] = true;
  /* the ops whose kernels take int32/int64 data: the same list as the CPU's */
  static const rm_op_id int_ops[] = { RM_OP_ADD, RM_OP_SUB, RM_OP_MUL, RM_OP_NEG, RM_OP_ABS, RM_OP_ADD_SCALAR,
                                       RM_OP_MUL_SCALAR, RM_OP_EQ, RM_OP_NE, RM_OP_LT, RM_OP_LE, RM_OP_GT,
                                       RM_OP_GE, RM_OP_WHERE, RM_OP_COPY, RM_OP_CAST, RM_OP_FILL, RM_OP_SUM,
                                       RM_OP_CONCAT };
  for (size_t i = 0; i < sizeof int_ops / sizeof int_ops[0]; i++) b.int_ops[int_ops[i]] = true;
#define X(ID, name, family, set) RM_IF_KERNEL(family, b.kernel[RM_OP_##ID] = run_##name;)
#include "../../core/ops.def"
#undef X
  return b;
}

/* Returns the CUDA backend table (found by core/device.c with dlsym). Never fails:
 * whether a device is usable is decided by the table's init. */
RM_CUDA_EXPORT const rm_backend *rm_cuda_backend_get(void) {
  static const rm_backend table = make_table();
  return &table;
}

/* Reserved bytes, emptying the cache, device info: in the table, and exported too.
 * They take the context, so two contexts never see each other's cache. */

/* Bytes held from the device (live + cached); 0 when the backend is not initialised. */
RM_CUDA_EXPORT size_t rm_cuda_reserved(rm_ctx *ctx) {
  cu_state *st = cu_st(ctx);
  return st ? st->pool.reserved : 0;
}

/* Gives every cached (free) block back to the device; returns the bytes released. */
RM_CUDA_EXPORT size_t rm_cuda_empty_cache(rm_ctx *ctx) {
  cu_state *st = cu_st(ctx);
  if (!st) return 0;
  return rm_pool_trim(&st->pool, SIZE_MAX);
}

/* Device name, total and free memory (bytes). Returns RM_OK or an error. */
RM_CUDA_EXPORT int rm_cuda_device_info(rm_ctx *ctx, char *name, size_t n, size_t *total,
                                       size_t *free_bytes) {
  cu_state *st = cu_st(ctx);
  if (!st) return cu_fail(ctx, RM_ERR_DEVICE, "CUDA is not initialised");
  if (name && n) snprintf(name, n, "%s", st->name);
  size_t fr = 0, tot = 0;
  int rc = CU_CHECK(ctx, cudaMemGetInfo(&fr, &tot));
  if (rc) return rc;
  if (total) *total = tot;
  if (free_bytes) *free_bytes = fr;
  return RM_OK;
}
