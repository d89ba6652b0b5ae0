/* The context: all of remat's state hangs off one rm_ctx (allocator and its
 * accounting, RNG, error message, grad mode, tape counters, backends). Two contexts
 * in one process share nothing. A context is used from one thread at a time. */
#ifndef REMAT_CTX_H
#define REMAT_CTX_H

/* replayed inputs that may wait for the end of the outermost replay (op.c) */
#define RM_REPLAY_DEFER 32

#include <stdarg.h>
#include <stdio.h>

#include "hook.h"
#include "types.h"
#include "remat.h"

struct rm_backend;
struct rm_storage;

typedef struct rm_memstats {
  size_t live[RM_CAT_COUNT];
  size_t peak[RM_CAT_COUNT];      /* per-category peak since the last reset */
  size_t live_total, peak_total;  /* peak_total: peak of the sum, not the sum of peaks */
  size_t peak_live[RM_CAT_COUNT]; /* live bytes by category when peak_total was reached */
  size_t reserved;                /* bytes held from the device (>= live on caching devices) */
  size_t limit;                   /* 0: none */
  uint64_t n_allocs;
  uint64_t fail_at;               /* debug: fail the k-th allocation from now (0: off) */
} rm_memstats;

struct rm_ctx {
  rm_host_alloc host;             /* where the ctx's own host memory comes from */
  rm_log_fn log;
  void *log_ud;
  char err[1024];
  int err_code;                   /* rm_status of the last failure */

  rm_memstats mem[RM_DEVICE_COUNT];
  rm_category category;           /* category of the next op output allocation (scoped) */
  /* Called once before an allocation fails for lack of memory; returns true when it
   * freed something worth retrying (the Lua binding runs a full collection). */
  bool (*reclaim)(void *ud);
  void *reclaim_ud;

  uint64_t rng_seed, rng_offset;  /* counter-based generator state */
  bool grad_enabled;              /* record ops on the tape (scoped) */
  bool dry;                       /* dry run: op outputs are phantom, kernels are skipped (scoped) */
  uint32_t dry_epoch;             /* which dry run (storages made in one carry it) */
  size_t dry_live[RM_DEVICE_COUNT][RM_CAT_COUNT]; /* live bytes made by this dry run */
  uint64_t node_seq;
  int64_t live_nodes, live_tensors;
  uint64_t plan_sims;             /* dry runs of rm_plan_simulate (a budget search counts them) */

  double recompute_flops;         /* FLOPs replayed to rematerialise evicted tensors */
  int replay_depth;               /* nesting of rm_node_recompute */
  int forward_depth;              /* nesting of rm_module_forward (0: a top-level call) */
  int replay_n;                   /* replayed inputs whose eviction waits for the outermost replay */
  rm_tensor *replay_defer[RM_REPLAY_DEFER];
  struct rm_opcost *opcost;       /* measured per-op costs and timers (opcost.c) */
  bool opcost_off;                /* calibration off: costs are the fitted roofline */
  bool op_timing;                 /* timers on: op.c times every op it runs */
  bool opcost_learn;              /* timed first runs set their call's cost (opcost.h) */
  rm_hooks hooks;                 /* extension points (hook.h) */

  /* Accounted workspace for plugin kernels, which link no core symbol (kernels/cuda:
   * cu_scratch): a storage of category workspace under the limit, and its release. */
  struct rm_storage *(*workspace_new)(rm_ctx *ctx, rm_device dev, size_t bytes);
  void (*storage_release)(rm_ctx *ctx, struct rm_storage *s);

  const struct rm_backend *backend[RM_DEVICE_COUNT];
  void *backend_state[RM_DEVICE_COUNT];
  void *cuda_lib;                 /* dlopen handle of the CUDA backend */
};

static inline bool rm_hooked(const rm_ctx *ctx, rm_hook_kind kind) { return ctx->hooks.n[kind] > 0; }

/* ---- scoped state ----
 * The only way to change the category, the grad mode or the dry-run state for a while:
 *   rm_scope s;
 *   rm_scope_enter(ctx, &s, RM_CAT_PARAM, RM_GRAD_OFF);
 *   ... (every path out goes through) ...
 *   rm_scope_leave(ctx, &s);
 * Scopes nest; leave them in reverse order. */
enum { RM_SAME = -1 };                  /* keep the current category / grad mode */
enum { RM_GRAD_OFF = 0, RM_GRAD_ON = 1 };

typedef struct rm_scope {
  rm_category category;
  bool grad_enabled;
  bool dry;                             /* this scope opened a dry run; below: restored by leave */
  rm_memstats mem[RM_DEVICE_COUNT];
  uint64_t rng_seed, rng_offset;
  double recompute_flops;
} rm_scope;

/* Sets the category (or RM_SAME) and grad mode (RM_GRAD_OFF/ON or RM_SAME). */
void rm_scope_enter(rm_ctx *ctx, rm_scope *s, int category, int grad);
/* Opens a dry run: op outputs are phantom (accounted, no memory), kernels are
 * skipped, the memory limit is lifted, grad is on and outputs are activations. On
 * leave, what it made stops counting, and peaks, limits, the generator and the
 * recompute counter are as they were. RM_ERR_STATE inside another dry run. */
int rm_scope_enter_dry(rm_ctx *ctx, rm_scope *s);
void rm_scope_leave(rm_ctx *ctx, rm_scope *s);
/* Sets the grad mode for good (not scoped: a host or a scheduler switching between
 * loops that each have their own). */
void rm_set_grad_enabled(rm_ctx *ctx, bool on);

/* Sets the context error (printf-style) and returns code, so callers can write
 * `return rm_fail(ctx, RM_ERR_SHAPE, "...", ...)`. */
int rm_fail(rm_ctx *ctx, rm_status code, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));
/* rm_fail's body, inline: the CUDA plugin, which links no core symbol, records its
 * errors through it too (cu_fail). */
static inline int rm_failv(rm_ctx *ctx, rm_status code, const char *fmt, va_list ap) {
  vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
  ctx->err_code = code;
  return code;
}
/* Prepends "what: " to the current message (adds context on the way up). */
int rm_fail_prefix(rm_ctx *ctx, const char *what);
void rm_clear_error(rm_ctx *ctx);

void *rm_host_malloc(rm_ctx *ctx, size_t n);
void *rm_host_calloc(rm_ctx *ctx, size_t count, size_t n);
void *rm_host_realloc(rm_ctx *ctx, void *p, size_t old, size_t n);
void rm_host_free(rm_ctx *ctx, void *p, size_t n);

/* Returns the backend for dev, loading it on first use; NULL with an error set when
 * the device is not available. */
const struct rm_backend *rm_backend_get(rm_ctx *ctx, rm_device dev);

#endif
