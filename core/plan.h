/* Checkpoint plans: per layer of a Sequential, what the first forward keeps.
 *   keep       everything the layer's backward needs stays (rotor's F_all)
 *   selective  as keep, except outputs of the selected ops: evicted, recomputed on use
 *   boundary   only the layer's input is kept; the layer is replayed from it (F_ck)
 *   recompute  nothing is kept; replayed from the nearest kept tensor before it (F_none)
 * Also: measuring a model by dry runs (phantom memory, no kernels) and the optimal
 * plan under an activation budget. */
#ifndef REMAT_PLAN_H
#define REMAT_PLAN_H

#include "module.h"
#include "opcost.h"

typedef enum { RM_KEEP = 0, RM_SELECTIVE, RM_BOUNDARY, RM_RECOMPUTE, RM_ACTION_COUNT } rm_action;

typedef struct rm_opset { uint64_t bits[2]; } rm_opset;   /* a set of op ids */

typedef struct rm_plan {
  int n;
  rm_action *action;      /* n */
  rm_opset *sel;          /* n: ops evicted by a selective layer */
} rm_plan;

const char *rm_action_name(rm_action a);
static inline bool rm_opset_has(const rm_opset *s, int op) {
  return (s->bits[op >> 6] >> (op & 63)) & 1u;
}
static inline void rm_opset_add(rm_opset *s, int op) { s->bits[op >> 6] |= (uint64_t)1 << (op & 63); }

rm_plan *rm_plan_new(rm_ctx *ctx, int n);
void rm_plan_free(rm_ctx *ctx, rm_plan *p);
/* Installs p on seq (taking ownership; NULL removes the plan). Errors when p->n does
 * not match the number of layers. */
int rm_plan_install(rm_ctx *ctx, rm_module *seq, rm_plan *p);

/* What a dry run of forward (+ loss) + backward measured. */
typedef struct rm_layer_stats {
  double flops;           /* forward FLOPs of the layer */
  double recompute_flops; /* FLOPs replayed for this layer during backward */
  double cost;            /* forward replay cost (FLOPs + bytes x balance, rm_op_cost) */
  double recompute_cost;  /* the same for what was replayed during backward */
  size_t saved;           /* activation bytes allocated by the layer, live after forward */
  size_t in_bytes;        /* size of the layer's input */
  size_t out_bytes;       /* size of the layer's output */
  size_t out_live;        /* out_bytes if the output is still live after the forward, else 0 */
  size_t fwd_peak;        /* peak above the live bytes at the layer's start, forward */
  size_t bwd_peak;        /* peak above the live bytes at the start of its backward */
  size_t param_bytes;
} rm_layer_stats;

typedef struct rm_sim {
  size_t peak;            /* peak live activation bytes (absolute) */
  size_t base;            /* live activation bytes before the forward */
  double flops;           /* forward FLOPs */
  double recompute_flops; /* FLOPs replayed during backward */
  double recompute_cost;  /* their replay cost (rm_op_cost) */
  size_t loss_peak;       /* peak above the forward's end before the first layer's backward */
  size_t held;            /* bytes the loss leaves live for the whole backward (its output,
                           * the model output's gradient) */
  rm_layer_stats *layers; /* n entries when asked for, else NULL */
  int n;
  /* The whole step on x's device, every category: its peak live bytes through forward,
   * loss and backward (gradients included), the live bytes by category at that peak,
   * and what lives when backward ends (where an optimizer step starts). */
  size_t step_peak;
  size_t step_cat[RM_CAT_COUNT];
  size_t end_live;
  size_t end_cat[RM_CAT_COUNT];
} rm_sim;

/* Loss callback for dry runs: *loss = a scalar from the model output y (new hold). */
typedef int (*rm_loss_fn)(rm_ctx *ctx, rm_tensor *y, rm_tensor **loss, void *ud);

/* Dry-runs forward (+ loss, or backward from y with ones) + backward of seq on x under
 * plan p (NULL: the plan installed on seq). Nothing is computed or really allocated;
 * parameter gradients, the generator and memory statistics are left as they were.
 * Fills sim (sim->layers allocated when want_layers; free with rm_sim_free). */
int rm_plan_simulate(rm_ctx *ctx, rm_module *seq, rm_tensor *x, const rm_plan *p,
                     rm_loss_fn loss, void *loss_ud, bool want_layers, rm_sim *sim);
void rm_sim_free(rm_ctx *ctx, rm_sim *sim);

/* ---- the budget dynamic program over an abstract chain ---- */

/* One layer of a chain, as the DP sees it: bytes (as the engine holds them; see
 * chain_dp.c), and replay costs in any additive unit (remat uses rm_op_cost). */
typedef struct rm_chain_layer {
  double keep_saved, sel_saved; /* bytes left after its forward under keep / selective */
  double fwd;                   /* forward peak above the live bytes at its start (input included) */
  double keep_bwd, sel_bwd;     /* backward peak above what keep / selective left */
  double in_bytes;              /* its input (kept by a boundary) */
  double in_kept;               /* bytes of its input that it keeps for its backward */
  double out_bytes;             /* its output (and the output's gradient) */
  double cost;                  /* forward replay cost (under boundary / recompute) */
  double last_cost;             /* replay cost when it ends a segment: only what its own
                                 * backward reads (every(1)'s; < 0: cost) */
  double sel_cost;              /* replay cost under selective (< 0: not available) */
  double param_bytes;           /* its parameters (the cache credit of its replay) */
} rm_chain_layer;

typedef struct rm_chain {
  const rm_chain_layer *layer;
  int n;
  double held;       /* live for the whole backward besides the layers' (the loss' leftovers) */
  double loss_peak;  /* peak of the loss above what the forward left */
  rm_credit credit;  /* the cache credit (zero: costs are replay time alone) */
} rm_chain;

/* The chain of a Sequential from dry runs under keep-everything and all-selective
 * (sel may be NULL: no selective layers). out: n entries. */
void rm_chain_from_sims(const rm_sim *keep, const rm_sim *sel, rm_chain_layer *out, rm_chain *chain);
/* Gives the chain the cache credit (keep: the keep-everything dry run it was built
 * from), so that its costs become the step time a plan adds: a replay's time less what
 * the backward after it saves by reading hot what it made (cr.act x the bytes no longer
 * kept from forward) and the weights it read (cr.param x the parameters of a layer
 * replayed whole), for the share of them that a working set of that size keeps in
 * cache (cr.cold): a long segment's replay outgrows the cache. Never below 0. */
void rm_chain_credit(rm_chain *chain, rm_chain_layer *c, const rm_sim *keep, rm_credit cr);
/* The step time plan p adds over keeping everything, by the same rule, from its dry run
 * sim and keep's (both with layers). */
double rm_plan_step_cost(const rm_sim *sim, const rm_sim *keep, const rm_plan *p, rm_credit cr);
/* The working set a step's cache credit is measured for: what keep-everything holds
 * from forward to backward (activations) plus the parameters. */
size_t rm_credit_working_set(const rm_sim *keep);
/* Peak memory and recompute cost of actions[] on the chain (the DP's cost model). */
void rm_chain_eval(const rm_chain *c, const rm_action *actions, double *peak, double *cost);
/* The plan with the least recompute whose modelled peak is <= budget. Returns true and
 * fills actions[] when one exists. */
bool rm_chain_optimal(rm_ctx *ctx, const rm_chain *c, double budget, rm_action *actions, double *cost);
/* The smallest modelled peak of any plan (and that plan). False: out of host memory. */
bool rm_chain_min_peak(rm_ctx *ctx, const rm_chain *c, rm_action *actions, double *peak);

#endif
