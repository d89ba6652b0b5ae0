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
/* Calls f(op, seconds, roofline units, ud) for each measured call. */
void rm_opcost_each(const rm_ctx *ctx, void (*f)(rm_op_id op, double seconds, double units, void *ud), void *ud);
/* Turns calibration on (default) or off (every call priced by the fitted roofline). */
void rm_opcost_enable(rm_ctx *ctx, bool on);
bool rm_opcost_enabled(const rm_ctx *ctx);
/* While on (and the timers run), each priced call's cost becomes the time of its
 * replays inside the real steps that follow (their mean less spikes: timestat.h), or of
 * its first runs where it was not replayed: per-op rates in place, caches and load as
 * the steps see them. Turning it on forgets what was learned. */
void rm_opcost_learn(rm_ctx *ctx, bool on);
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
