/* remat: the C API for host programs (a game editor, an engine tool, a server).
 *
 * A host creates a context, opens remat into its own lua_State tied to that context,
 * and runs Lua that trains, a slice per frame if it likes (rm_lua_slice, and
 * remat.train.stepper on the Lua side). The host owns the process: remat has no global
 * mutable state, never exits, aborts or prints (text it wants to show goes to the log
 * callback), and never longjmps through the host's C frames: every function below
 * returns a status (RM_OK == 0) or a value, and leaves a message on the context
 * (rm_errmsg). The one exception is luaopen_remat, a lua_CFunction: like every Lua
 * open function it raises a Lua error on failure (run it under lua_pcall, or use
 * rm_lua_open, which returns a status).
 *
 * Memory: the context's own allocations (the context, storage headers, tape nodes,
 * modules, plans, file-format buffers) come from its rm_host_alloc. Tensor data comes
 * from the device backend (CPU: 64-byte aligned blocks from rm_host_alloc too, freed
 * large ones kept in a cache that rm_ctx_free gives back; CUDA: the device), counted
 * by rm_memory_live and capped by rm_set_memory_limit. The C library
 * and zlib keep their own buffers while a file is read or written. A lua_State's own
 * memory comes from the lua_Alloc the host gave lua_newstate.
 *
 * Threads: a context, and every lua_State opened on it, is used from one thread at a
 * time (no internal locking; hand it over with the host's own synchronisation).
 * Different contexts may be used from different threads at once: they share nothing
 * but read-only tables (op registry, kernels). CPU kernels, BLAS calls included, run
 * in one process-wide OpenMP (libgomp) thread pool: OMP_NUM_THREADS or the host's own
 * omp_set_num_threads() sets its size (leave cores to the host's threads that way);
 * the log callback is always called on the thread that made the call that logs. */
#ifndef REMAT_H
#define REMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define REMAT_VERSION "0.1.0"
#define REMAT_VERSION_MAJOR 0
#define REMAT_VERSION_MINOR 1
#define REMAT_VERSION_PATCH 0

/* Status codes, returned by every fallible function here and in core/ (core/types.h
 * takes them from this header). RM_OK is 0; every error is positive. */
typedef enum {
  RM_OK = 0,
  RM_ERR_ARG,      /* bad argument: type, range, unknown name */
  RM_ERR_SHAPE,    /* shapes do not agree */
  RM_ERR_DTYPE,    /* dtypes do not agree or are not supported */
  RM_ERR_DEVICE,   /* devices do not agree, or the device is unavailable */
  RM_ERR_OOM,      /* allocation failed or exceeded the limit */
  RM_ERR_IO,       /* file or format error */
  RM_ERR_STATE,    /* freed tensor, released data, misuse of the tape */
  RM_ERR_RUNTIME,  /* backend failure (CUDA call, BLAS), or an error raised by Lua code */
  RM_ERR_LAYOUT    /* a tensor's memory layout does not fit (not contiguous where it must be) */
} rm_status;

typedef struct rm_ctx rm_ctx;
struct lua_State;

/* Host allocator: malloc/realloc/free with a user pointer. realloc(ud, p, old_n, new_n)
 * resizes, and allocates when p is NULL (old_n 0); free gets the size last asked for. Any NULL member: the C library's (give all three or none, so that one
 * allocator frees what it allocated). The functions are called on the thread using
 * the context. */
typedef struct rm_host_alloc {
  void *(*alloc)(void *ud, size_t n);
  void *(*realloc)(void *ud, void *p, size_t old_n, size_t new_n);
  void (*free)(void *ud, void *p, size_t n);
  void *ud;
} rm_host_alloc;

/* Log callback: the only way remat ever writes text on its own. level: RM_LOG_*.
 * msg is valid during the call only and has no trailing newline. */
typedef void (*rm_log_fn)(void *ud, int level, const char *msg);
#define RM_LOG_INFO 0
#define RM_LOG_WARN 1
#define RM_LOG_ERROR 2

/* ---- contexts (core/ctx.c, core/host.c) ---- */

/* Creates a context; alloc and log may be NULL. Returns NULL only when the allocator
 * itself fails. */
rm_ctx *rm_ctx_new(const rm_host_alloc *alloc, rm_log_fn log, void *log_ud);
/* Destroys a context (NULL is fine); every byte it took from the host allocator is
 * given back. Close the lua_States opened on it first. */
void rm_ctx_free(rm_ctx *ctx);
/* Replaces the log callback (NULL: silent). Returns RM_OK. */
int rm_set_log(rm_ctx *ctx, rm_log_fn log, void *log_ud);
/* Sends a printf-style message to the context's log callback; nothing when none. */
void rm_log(rm_ctx *ctx, int level, const char *fmt, ...)
#if defined(__GNUC__)
  __attribute__((format(printf, 3, 4)))
#endif
  ;

/* The last error message on ctx ("" when none). Valid until the next failing call. */
const char *rm_errmsg(const rm_ctx *ctx);
/* The status of the last failure on ctx (RM_OK when none since the last clear). */
int rm_errcode(const rm_ctx *ctx);
/* Forgets the last error (rm_errmsg "" and rm_errcode RM_OK afterwards). */
void rm_clear_error(rm_ctx *ctx);
/* A short name for a status ("ok", "out of memory", ...); "unknown status" otherwise. */
const char *rm_status_name(int status);

/* Sets the memory limit in bytes for a device (0 = CPU, 1 = CUDA); 0 removes it.
 * Returns RM_OK or RM_ERR_DEVICE. */
int rm_set_memory_limit(rm_ctx *ctx, int device, size_t bytes);
/* The memory limit of a device in bytes (0: none, or an unknown device). */
size_t rm_memory_limit(const rm_ctx *ctx, int device);
/* Live and peak bytes (all categories) of tensor storage on a device. */
size_t rm_memory_live(const rm_ctx *ctx, int device);
size_t rm_memory_peak(const rm_ctx *ctx, int device);
/* Peak bytes of one category ("param", "grad", "optim", "activation", "workspace",
 * "temp", "data") on a device; 0 for an unknown category or device. */
size_t rm_memory_category_peak(const rm_ctx *ctx, int device, const char *category);
/* Restarts a device's peaks from what is live now. Returns RM_OK or RM_ERR_DEVICE. */
int rm_memory_restart_peak(rm_ctx *ctx, int device);

/* What runs CPU work (as remat.info() and `remat -v`): the BLAS and the kernels it
 * chose, the OpenMP thread count, the CPU's SIMD level. Strings are NUL-terminated. */
typedef struct rm_info {
  char version[16];        /* REMAT_VERSION */
  char blas[64];           /* "OpenBLAS 0.3.21 (OpenMP)", "BLIS 0.9.0", "built-in" */
  char blas_core[32];      /* the kernels it runs: "Haswell", "SkylakeX", "Prescott", ... */
  char blas_core_from[48]; /* who chose them: "picked by remat from the CPU's features", ... */
  char blas_path[256];     /* the library file opened ("" for the built-in GEMM) */
  char simd[16];           /* the CPU's: "avx512", "avx2", "avx", "sse4.2", "sse2" */
  int threads;             /* OpenMP threads a parallel region gets (BLAS included) */
  int blas_generic;        /* 1: the BLAS runs pre-AVX2 kernels on an AVX2+ CPU (slow) */
  int blas_openmp;         /* 1: BLAS calls share remat's OpenMP thread pool */
  char omp_wait[64];       /* libgomp's wait policy as set in the environment: "GOMP_SPINCOUNT=1000
                              (set by the remat command)", "OMP_WAIT_POLICY=passive", or
                              "libgomp default (spins 300000 times, then sleeps)" */
  char vector_path[16];    /* the CPU kernels' hand-vectorised path (dropout): "avx512", "avx2"
                              or "portable" (REMAT_NO_AVX512=1, REMAT_NO_AVX2=1 step down) */
} rm_info;
/* Fills *info (opening the CPU backend, and its BLAS, if not done yet). Returns RM_OK
 * or an error status. */
int rm_get_info(rm_ctx *ctx, rm_info *info);

/* Seeds the context's random generator (as remat.manual_seed). Returns RM_OK. */
int rm_manual_seed(rm_ctx *ctx, uint64_t seed);
/* Reads the generator state (seed and counter offset); either pointer may be NULL.
 * Returns RM_OK. */
int rm_rng_state(const rm_ctx *ctx, uint64_t *seed, uint64_t *offset);

/* ---- models, tensors and checkpoint policies from C (core/module.c, core/policy.c) ----
 * The built-in layers of remat.nn and the policies of remat.policy, for a host that
 * builds and trains a model without Lua (examples/host/checkpoint.c). Modules and
 * tensors are counted handles: give each back (rm_module_release, rm_tensor_drop).
 * Functions return NULL or a status on error, with the message on ctx. */
typedef struct rm_module rm_module;
typedef struct rm_tensor rm_tensor;

rm_module *rm_sequential_new(rm_ctx *ctx);
/* Appends child to a Sequential, which takes its own reference. */
int rm_module_add_child(rm_ctx *ctx, rm_module *parent, rm_module *child);
/* Built-in layers (parameters float32 on the CPU, initialised as remat.nn does). */
rm_module *rm_nn_linear(rm_ctx *ctx, int64_t in, int64_t out, bool bias);
rm_module *rm_nn_layernorm(rm_ctx *ctx, int64_t d, double eps, bool affine);
rm_module *rm_nn_gelu(rm_ctx *ctx);
rm_module *rm_nn_relu(rm_ctx *ctx);
rm_module *rm_nn_mlp(rm_ctx *ctx, int64_t d, int64_t hidden, double dropout);
rm_module *rm_nn_block(rm_ctx *ctx, int64_t d, int64_t heads, double dropout);
void rm_module_release(rm_ctx *ctx, rm_module *m);
/* A new float32 tensor of the given shape on device (0 = CPU, 1 = CUDA), every element
 * value (NULL with the error set). */
rm_tensor *rm_tensor_filled(rm_ctx *ctx, int device, int ndim, const int64_t *shape, double value);
void rm_tensor_drop(rm_ctx *ctx, rm_tensor *t);
/* y = m(x) (*y: a new handle), recorded for backward when grad is on. A Sequential
 * with a size-dependent policy plans it for x here, at its first forward with x's
 * shape (as remat's model(x)). */
int rm_module_forward(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y);
/* Backpropagates from root (grad: d(out)/d(root); NULL for a one-element root). */
int rm_backward(rm_ctx *ctx, rm_tensor *root, rm_tensor *grad);

/* What a Sequential keeps for backward, layer by layer (remat.policy). */
typedef enum {
  RM_POLICY_NONE = 0,   /* keep everything */
  RM_POLICY_EVERY,      /* a boundary every `every` layers, the layers between recomputed */
  RM_POLICY_SQRT,       /* every(round(sqrt(layers))) */
  RM_POLICY_SELECTIVE,  /* every layer keeps all but the outputs of the ops named */
  RM_POLICY_BUDGET      /* the least recompute that fits `budget` (or the whole step) */
} rm_policy_kind;

typedef struct rm_policy {
  rm_policy_kind kind;
  int every;                /* EVERY: k >= 1 */
  const char *const *ops;   /* SELECTIVE: op names ("softmax", "gelu", ...); BUDGET: the ops a */
  int nops;                 /*   layer may recompute (0: the cheap ones, as remat.policy.budget) */
  size_t budget;            /* BUDGET: peak activation bytes (policy.budget(bytes)) */
  int whole_step;           /* BUDGET, 1: the whole training step (forward, loss, backward) fits in
                             * what the memory limit of the input's device leaves (policy.budget()) */
} rm_policy;

/* Sets seq's checkpoint policy. One that needs sizes (BUDGET) is planned by dry runs at
 * the first forward with grad on (rm_module_forward), or now by rm_checkpoint_plan. A
 * budget that cannot be met fails with RM_ERR_OOM, naming the smallest that fits. */
int rm_checkpoint(rm_ctx *ctx, rm_module *seq, const rm_policy *p);
/* Plans seq's policy for input x now (dry runs: nothing computed or allocated). */
int rm_checkpoint_plan(rm_ctx *ctx, rm_module *seq, rm_tensor *x);
/* Whether plans price a replay by the measured time of its ops (1, the default: each
 * op call a dry run meets is timed alone once and cached) or by the roofline alone (0:
 * the same plans in every process, whatever the machine's load). Returns RM_OK. */
int rm_checkpoint_measured_costs(rm_ctx *ctx, int on);
/* The planned action of a layer (0-based): "keep", "selective", "boundary",
 * "recompute"; NULL when seq has no plan (yet) or no such layer. */
const char *rm_checkpoint_action(const rm_module *seq, int layer);
/* Predicted by a dry run of forward + backward (from ones) of seq on x under its plan:
 * the peak activation bytes (absolute, as policy budgets count them) and the whole
 * step's peak bytes on x's device; either pointer may be NULL. */
int rm_checkpoint_predict(rm_ctx *ctx, rm_module *seq, rm_tensor *x, size_t *peak, size_t *step_peak);

/* ---- Lua (lua/lremat.c, lua/lhost.c) ---- */

/* Opens remat into L bound to ctx, leaving the module table on the stack (like
 * luaL_requiref; lua_setglobal(L, "remat") to name it). The ctx must outlive L.
 * Several lua_States may each be opened on their own context; a state already opened
 * (by rm_lua_open or require "remat") is refused with RM_ERR_STATE. Returns RM_OK or an
 * error status (nothing pushed then). Every host entry point accepts NULL arguments:
 * it returns RM_ERR_ARG (or 0 / nothing) instead of touching them. */
int rm_lua_open(struct lua_State *L, rm_ctx *ctx);
/* lua_CFunction for luaL_requiref(L, "remat", luaopen_remat, 0): opens remat with a
 * context of its own, owned by (and freed with) that lua_State; raises on failure. */
int luaopen_remat(struct lua_State *L);
/* The context L was opened on (by rm_lua_open or luaopen_remat), or NULL. */
rm_ctx *rm_lua_context(struct lua_State *L);
/* Runs a Lua file (or a chunk when is_code) in L; on error the message (with a
 * traceback) goes to ctx and the status is returned; L stays usable. */
int rm_lua_run(struct lua_State *L, rm_ctx *ctx, const char *file_or_code, int is_code);
/* As rm_lua_run, but leaves nresults results of the chunk on the stack on success
 * (LUA_MULTRET-style -1: all of them); nothing pushed on error. */
int rm_lua_exec(struct lua_State *L, rm_ctx *ctx, const char *file_or_code, int is_code,
                int nresults);

/* What one slice of training did (rm_lua_slice). */
typedef struct rm_slice {
  int steps;         /* optimizer steps completed in this slice */
  int units;         /* units run (steps, or micro-batches when the stepper has several) */
  int64_t total;     /* steps completed since the stepper was made */
  double ms;         /* wall-clock milliseconds the slice took */
  double loss;       /* loss of the last completed step (NaN before the first) */
  int done;          /* 1 when the stepper has finished (step count or data exhausted) */
} rm_slice;

/* Runs stepper:run_for(budget_ms) on the remat.train stepper at stack index idx of L
 * and fills *out (out may be NULL). An error in the training code (or a stepper that
 * already failed) returns RM_ERR_RUNTIME with the message on ctx; L stays usable. */
int rm_lua_slice(struct lua_State *L, rm_ctx *ctx, int idx, double budget_ms, rm_slice *out);

#ifdef __cplusplus
}
#endif
#endif
