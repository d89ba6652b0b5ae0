/* Per-op costs measured on the device, and per-op timers.
 *
 * A budget plan is the plan with the least replay time, so the planner needs what each
 * replayed op costs on this machine. A roofline (FLOPs + bytes x balance) is off by up to
 * 10x on CPU (dropout's Philox, softmax's exp, small matmuls' overhead), so costs are
 * measured: each distinct op call a dry run meets (op, attrs, the geometry of its
 * inputs) is run alone, for real, on inputs of that geometry filled with ones, and its
 * least time of 7 is cached on the context. Calibration happens at first use
 * (rm_plan_simulate calls rm_opcost_calibrate when its dry run met calls not yet
 * measured) and costs milliseconds; later plans of the same shapes reuse it. A call that
 * cannot be measured (out of memory, an op that rejects ones) is priced by the roofline
 * times the seconds per roofline unit fitted on the measured calls of its device.
 *
 * The timers (rm_opcost_profile) add up, per op, the seconds of every op the context
 * runs, split into first runs and replays: where a step's time goes. They read the host
 * clock around each op: on CUDA that is launch time (REMAT_CUDA_PROFILE=1 gives device
 * time), so only CPU calls learn from them. */
#ifndef REMAT_OPCOST_H
#define REMAT_OPCOST_H

#include "op.h"

struct rm_plan;

/* Seconds op call (in, attrs a, outputs of meta out) costs on its device: measured;
 * else (a call not measured yet is noted for rm_opcost_calibrate) the roofline
 * rm_op_cost times the fitted seconds per unit. *measured: whether it was. */
double rm_opcost_seconds(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a,
                         const rm_meta *out, bool *measured);
/* Calls noted and not yet measured. */
int rm_opcost_pending(const rm_ctx *ctx);
/* Measures the noted calls (outside a dry run). A call that fails is priced by the
 * roofline from then on; only a host allocation failure is an error. */
int rm_opcost_calibrate(rm_ctx *ctx);
/* What a call's first runs and its nodes' backward cost depends on besides the call: the
 * plan of the step it runs in (caches and memory traffic change with what is kept).
 *   plain     the step keeps everything (no plan, or one that evicts nothing)
 *   kept      the step evicts, but not this: the layer keeps its outputs (first runs),
 *             the node reads what forward kept (backward)
 *   replayed  the layer's outputs are evicted (first runs: they go to blocks soon reused),
 *             the node reads what a replay rebuilt (backward: from cache)
 * kept and replayed are learned per bucket of the share of the model the plan keeps
 * (keep 1, selective 1/2, boundary and recompute 0, averaged over its layers): a plan
 * that keeps less leaves more of the caches to what runs. A run slot is plain (0) or
 * one of those (rm_opcost_layer_slot). */
typedef enum { RM_RUN_PLAIN = 0, RM_RUN_KEPT, RM_RUN_REPLAYED, RM_RUN_STATES } rm_run_state;
#define RM_RUN_BUCKETS 4
#define RM_RUN_SLOTS (1 + 2 * RM_RUN_BUCKETS)

/* A measured call, as rm_opcost_each reports it. */
typedef struct rm_opcost_call {
  rm_op_id op;
  double seconds, units;                 /* timed alone; its roofline units */
  double mean[2][RM_RUN_SLOTS];          /* learned seconds, means: [0] first runs, [1] its
                                          * nodes' backward, per run slot ... */
  int64_t n[2][RM_RUN_SLOTS];            /* ... over this many */
} rm_opcost_call;
/* Calls f(call, ud) for each measured call. */
void rm_opcost_each(const rm_ctx *ctx, void (*f)(const rm_opcost_call *call, void *ud), void *ud);
/* Turns calibration on (default) or off (every call priced by the fitted roofline). */
void rm_opcost_enable(rm_ctx *ctx, bool on);
bool rm_opcost_enabled(const rm_ctx *ctx);
/* While on (and the timers run), each priced call's cost becomes the mean time of its
 * replays inside the real steps that follow, or of its first runs where it was not
 * replayed: per-op rates in place, caches and load as the steps see them. Its first runs
 * and its nodes' backward (less the replays that backward ran) are also learned per run
 * state (rm_opcost_context_credit). It listens on the hook table (layers, backward
 * nodes). Turning it on forgets what was learned; raises when the hook table is full. */
int rm_opcost_learn(rm_ctx *ctx, bool on);
/* Whether node n's backward reads data a replay rebuilds (or rebuilt) in this backward:
 * a saved input or output that is evicted, or was restored by a replay. */
bool rm_opcost_node_hot(const rm_node *n);
/* The run slot of a forward op of layer `layer` under plan p (NULL: no plan), and of
 * node n's backward under p (at the node's turn in backward). */
int rm_opcost_layer_slot(const struct rm_plan *p, int layer);
int rm_opcost_node_slot(const struct rm_plan *p, const rm_node *n);
/* The context credit of a call: the seconds its first run (backward false) or its
 * node's backward (true) saves in run slot `slot` against a step that keeps everything,
 * the learned means of each (a bucket not learned takes the nearest learned one of its
 * state); may be below 0. *known: whether both were learned (else 0; a view, or the
 * plain slot, is 0 and known). */
double rm_opcost_context_credit(const rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a,
                                bool backward, int slot, bool *known);

/* The cache credit: seconds per byte a step saves when backward reads a byte straight
 * after a replay made it (or read it: a parameter), from cache, where keeping it from
 * forward would have it come from memory: act for activations (written in forward and
 * read back), param for parameters (read). Both are 0 when the step's working set fits
 * the caches. */
#define RM_CREDIT_SIZES 7   /* working sets of 1, 2, 4, ... 64 MiB */
typedef struct rm_credit {
  double act, param;
  /* the share of those rates a working set of 2^(20 + i) bytes pays (the rest comes back
   * from cache): a replay of that many bytes gets the credit for 1 - this of them */
  double cold[RM_CREDIT_SIZES];
} rm_credit;
/* The credit on dev for a working set of that many bytes (activations kept from forward
 * plus parameters): the backend's memory_rates on scratch blocks of 1, 2, ... 64 MiB
 * (larger sets are priced at 64 MiB), measured at first use (about 0.2 s on the CPU) and
 * cached. Outside dry runs only; 0 where the backend does not measure; raises when the
 * device cannot be started. */
int rm_opcost_cache_credit(rm_ctx *ctx, rm_device dev, size_t working_set, rm_credit *out);
/* Forgets every measurement (the device's speed changed: other kernels, other load). */
void rm_opcost_reset(rm_ctx *ctx);
void rm_opcost_free(rm_ctx *ctx);

/* ---- timers ---- */
typedef struct rm_op_timing {
  double seconds[RM_OP_COUNT], replay_seconds[RM_OP_COUNT];
  int64_t calls[RM_OP_COUNT], replay_calls[RM_OP_COUNT];
} rm_op_timing;

/* Starts (on) or stops timing every op call; starting clears the totals. */
int rm_opcost_profile(rm_ctx *ctx, bool on);
/* The totals since the timers started (NULL when they never did). */
const rm_op_timing *rm_opcost_timing(const rm_ctx *ctx);
/* Called by op.c around each outermost op execution while timing. */
double rm_opcost_clock(void);
void rm_opcost_record(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a,
                      double seconds);

#endif
