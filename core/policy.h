/* Checkpoint policies: policy -> plan -> dry runs -> budget search -> install.
 *
 * A policy says what a Sequential should keep; it becomes a plan (plan.h) for the
 * Sequential's current length, at once for the policies that need no sizes, and from
 * dry runs on an input for those that do (budget, custom): the budget search runs the
 * chain DP (chain_dp.c) and verifies its plan by one simulation, the simulation being
 * the truth. The Sequential owns its policy; a top-level forward with grad on resolves
 * it for its input (module.c), once per input signature. C hosts describe a policy
 * with rm_policy (remat.h); the Lua library only parses remat.policy values into one. */
#ifndef REMAT_POLICY_H
#define REMAT_POLICY_H

#include "plan.h"

/* A policy whose per-layer decisions a callback makes (Lua functions); internal. */
enum { RM_POLICY_CUSTOM = RM_POLICY_BUDGET + 1 };

/* The training step a size-dependent plan is made for. */
typedef struct rm_step_env {
  rm_loss_fn loss;        /* scalar loss from the model output (NULL: backward from ones) */
  void *loss_ud;
  size_t optim_extra;     /* optimizer state still to be made (lives through later steps) */
} rm_step_env;

typedef struct rm_policy_def {
  int kind;               /* rm_policy_kind or RM_POLICY_CUSTOM */
  int every;              /* EVERY: k */
  rm_opset ops;           /* SELECTIVE: the ops recomputed; BUDGET: those a layer may recompute */
  size_t budget;          /* BUDGET: activation bytes (absolute peak) */
  bool whole_step;        /* BUDGET: fit the whole step in what the memory limit leaves */
  /* CUSTOM: fills out (n layers) from keep-everything's dry run (keep->layers set). */
  int (*decide)(rm_ctx *ctx, rm_module *seq, const rm_sim *keep, rm_plan *out, void *ud);
  /* The step a plan is made for at a forward (NULL: no loss, no optimizer). */
  int (*step)(rm_ctx *ctx, rm_module *seq, rm_step_env *env, void *ud);
  void *ud;
  void (*free_ud)(rm_ctx *ctx, void *ud);
  char name[96];          /* for messages: "every(4)", "budget(2 GiB)" */
} rm_policy_def;

/* The ops a budget plan may make selective when none are named: cheap to replay. */
extern const char *const rm_policy_cheap_ops[];

/* "where: policies apply to a Sequential, not a Linear" unless m is one: the one place
 * that says so. */
int rm_check_sequential(rm_ctx *ctx, const rm_module *m, const char *where);

/* Reads a host's description into *def (checks it; names its ops). */
int rm_policy_read(rm_ctx *ctx, const rm_policy *p, rm_policy_def *def);
bool rm_policy_needs_input(const rm_policy_def *def);

/* The plan def gives seq (x: needed by policies that need sizes; env may be NULL).
 * *out: a new plan. A budget that cannot be met fails with RM_ERR_OOM naming the
 * smallest peak of any plan. */
int rm_policy_plan(rm_ctx *ctx, rm_module *seq, const rm_policy_def *def, rm_tensor *x,
                   const rm_step_env *env, rm_plan **out);

/* Sets seq's policy (taking def and its ud, also on failure), planning it now when it
 * needs no sizes; on failure seq keeps its previous policy. NULL def: none. */
int rm_policy_set(rm_ctx *ctx, rm_module *seq, rm_policy_def *def);
/* RM_ERR_STATE (naming where) while seq's policy is being planned: its callbacks may
 * not change the policy or the layers. */
int rm_policy_busy(rm_ctx *ctx, const rm_module *seq, const char *where);
/* The policy set on seq, or NULL. */
const rm_policy_def *rm_policy_get(const rm_module *seq);
/* Plans seq's policy for x when it needs sizes and has no plan for x's signature yet
 * (env NULL: the policy's step callback). A failure uninstalls the policy (seq keeps
 * everything) and says so. */
int rm_policy_prepare(rm_ctx *ctx, rm_module *seq, rm_tensor *x, const rm_step_env *env);
/* Whether rm_policy_prepare has planning to do for x. */
bool rm_policy_pending(const rm_module *seq, const rm_tensor *x);
/* seq's layers changed: replans a policy that needs no sizes, forgets the plan of one
 * that does (replanned at the next forward). */
int rm_policy_layers_changed(rm_ctx *ctx, rm_module *seq);
/* Frees seq's policy state (module destruction). */
void rm_policy_free(rm_ctx *ctx, rm_module *seq);

#endif
