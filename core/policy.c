/* Checkpoint policies: policy -> plan -> dry runs -> budget search -> install (see
 * policy.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "opcost.h"
#include "policy.h"
#include "sequential.h"

const char *const rm_policy_cheap_ops[] = {
  "softmax", "log_softmax", "gelu", "gelu_tanh", "silu", "relu", "sigmoid", "tanh", "dropout", NULL
};

/* The budget search, when one simulation does not confirm the DP's plan. */
#define TIGHTEN_ROUNDS 8    /* whole step: DP plans re-budgeted by what they overshoot */
#define SWEEP_STEPS 24      /* then DP plans at budgets keep x 0.85^i ... */
#define SWEEP_FACTOR 0.85
#define EVERY_MAX 8         /* ... and every(k) for k <= 8, and sqrt() */

/* What a Sequential holds of its policy. */
typedef struct rm_policy_state {
  rm_policy_def def;
  bool planned;             /* a size-dependent policy has a plan for sig */
  bool busy;                /* being planned: callbacks may not change it or the layers */
  rm_meta sig;
} rm_policy_state;

int rm_check_sequential(rm_ctx *ctx, const rm_module *m, const char *where) {
  if (m->type == &rm_type_sequential) return RM_OK;
  return rm_fail(ctx, RM_ERR_ARG, "%s: policies apply to a Sequential, not a %s", where, m->type->name);
}

/* ---- descriptions ---- */

static bool user_op(int op) {
  const rm_op_def *d = op >= 0 ? rm_op_def_get((rm_op_id)op) : NULL;
  return d && !(d->flags & RM_OPF_INTERNAL);
}

static void cheap_ops(rm_opset *set) {
  memset(set, 0, sizeof *set);
  for (int i = 0; rm_policy_cheap_ops[i]; i++) {
    int op = rm_op_find(rm_policy_cheap_ops[i]);
    if (user_op(op)) rm_opset_add(set, op);
  }
}

static bool opset_empty(const rm_opset *s) { return !s->bits[0] && !s->bits[1]; }

int rm_policy_read(rm_ctx *ctx, const rm_policy *p, rm_policy_def *def) {
  memset(def, 0, sizeof *def);
  if (!p) return rm_fail(ctx, RM_ERR_ARG, "checkpoint: no policy");
  def->kind = p->kind;
  switch (p->kind) {
  case RM_POLICY_NONE: snprintf(def->name, sizeof def->name, "none()"); break;
  case RM_POLICY_EVERY:
    if (p->every < 1) return rm_fail(ctx, RM_ERR_ARG, "policy.every: k must be an integer >= 1, got %d", p->every);
    def->every = p->every;
    snprintf(def->name, sizeof def->name, "every(%d)", p->every);
    break;
  case RM_POLICY_SQRT: snprintf(def->name, sizeof def->name, "sqrt()"); break;
  case RM_POLICY_SELECTIVE:
  case RM_POLICY_BUDGET:
    if (p->nops < 0 || (p->nops > 0 && !p->ops)) return rm_fail(ctx, RM_ERR_ARG, "policy: %d op names and no list", p->nops);
    for (int i = 0; i < p->nops; i++) {
      int op = p->ops[i] ? rm_op_find(p->ops[i]) : -1;
      if (!user_op(op)) return rm_fail(ctx, RM_ERR_ARG, "policy: unknown op '%s'", p->ops[i] ? p->ops[i] : "(null)");
      rm_opset_add(&def->ops, op);
    }
    if (p->kind == RM_POLICY_SELECTIVE) {
      if (p->nops == 0) return rm_fail(ctx, RM_ERR_ARG, "policy.selective: expected a list of op names such as {\"softmax\", \"gelu\"}");
      snprintf(def->name, sizeof def->name, "selective{%d ops}", p->nops);
      break;
    }
    def->whole_step = p->whole_step != 0;
    if (def->whole_step) {
      snprintf(def->name, sizeof def->name, "budget()");
    } else {
      char b[32];
      def->budget = p->budget;
      snprintf(def->name, sizeof def->name, "budget(%s)", rm_format_bytes(p->budget, b, sizeof b));
    }
    break;
  default: return rm_fail(ctx, RM_ERR_ARG, "checkpoint: unknown policy kind %d", (int)p->kind);
  }
  return RM_OK;
}

bool rm_policy_needs_input(const rm_policy_def *def) {
  return def->kind == RM_POLICY_BUDGET || def->kind == RM_POLICY_CUSTOM;
}

/* ---- fixed plans ---- */

static rm_plan *uniform(rm_ctx *ctx, int n, rm_action a, const rm_opset *ops) {
  rm_plan *p = rm_plan_new(ctx, n);
  for (int i = 0; p && i < n; i++) {
    p->action[i] = a;
    if (a == RM_SELECTIVE) p->sel[i] = *ops;
  }
  return p;
}

/* A boundary at layers 0, k, 2k, ...; the layers between are recomputed, except after
 * the last boundary: backward starts with that segment, so replaying it would only
 * repeat the forward that just ran it, while keeping it holds the same tensors when
 * backward reaches it (only the loss's own temporaries, made in between, then sit
 * beside them: the same peak on the models the specs measure). Those layers keep (as
 * PyTorch's checkpoint_sequential runs its last segment without checkpointing). */
static rm_plan *every(rm_ctx *ctx, int n, int k) {
  rm_plan *p = rm_plan_new(ctx, n);
  int last = (n - 1) / k * k;
  for (int i = 0; p && i < n; i++)
    p->action[i] = i >= last ? RM_KEEP : i % k == 0 ? RM_BOUNDARY : RM_RECOMPUTE;
  return p;
}

static int sqrt_k(int n) {
  int k = (int)floor(sqrt((double)n) + 0.5);
  return k < 1 ? 1 : k;
}

static rm_plan *plan_of(rm_ctx *ctx, int n, const rm_action *act, const rm_opset *ops) {
  rm_plan *p = rm_plan_new(ctx, n);
  for (int i = 0; p && i < n; i++) {
    p->action[i] = act[i];
    if (act[i] == RM_SELECTIVE) p->sel[i] = *ops;
  }
  return p;
}

/* ---- the budget search ---- */

typedef struct search {
  rm_ctx *ctx;
  rm_module *seq;
  rm_tensor *x;
  const rm_policy_def *def;
  rm_step_env env;
  double limit;             /* what a plan's peak must not exceed */
  rm_plan *best;            /* fallback: the fitting plan that adds the least step time */
  double best_cost, smallest;
  const rm_sim *keep;       /* keep-everything's dry run (with layers) */
  rm_credit credit;         /* the cache credit of the step (opcost.h) */
} search;

static int simulate(search *s, const rm_plan *p, bool layers, rm_sim *sim) {
  return rm_plan_simulate(s->ctx, s->seq, s->x, p, s->env.loss, s->env.loss_ud, layers, sim);
}

/* The peak a plan is judged by: its activations, or the whole step with the optimizer
 * state still to be made. */
static double peak_of(const search *s, const rm_sim *sim) {
  return s->def->whole_step ? (double)sim->step_peak + (double)s->env.optim_extra : (double)sim->peak;
}

/* What the memory limit of dev leaves the whole step (CUDA without a limit: what the
 * device has, reserved by remat or free); 0: no limit. */
static int room(rm_ctx *ctx, rm_device dev, double *out) {
  const rm_memstats *ms = &ctx->mem[dev];
  *out = (double)ms->limit;
  if (ms->limit || dev != RM_CUDA) return RM_OK;
  const rm_backend *be = rm_backend_get(ctx, dev);
  if (!be) return ctx->err_code;
  size_t total = 0, fr = 0;
  if (be->device_info && be->device_info(ctx, NULL, 0, &total, &fr) != RM_OK) return ctx->err_code;
  *out = (double)(ms->reserved + fr);
  return RM_OK;
}

/* Simulates p (taking it); keeps it as the best when it fits and adds the least step
 * time (replays less the cache credit, as the DP counts them). */
static int try_plan(search *s, rm_plan *p) {
  if (!p) return s->ctx->err_code;
  rm_sim sim;
  int rc = simulate(s, p, true, &sim);
  if (rc) {
    rm_plan_free(s->ctx, p);
    return rc;
  }
  double peak = peak_of(s, &sim), cost = rm_plan_step_cost(&sim, s->keep, p, s->credit);
  rm_sim_free(s->ctx, &sim);
  if (peak < s->smallest) s->smallest = peak;
  if (peak <= s->limit && cost < s->best_cost) {
    rm_plan_free(s->ctx, s->best);
    s->best = p;
    s->best_cost = cost;
  } else {
    rm_plan_free(s->ctx, p);
  }
  return RM_OK;
}

static int try_actions(search *s, int n, const rm_action *act, const rm_opset *ops) {
  return try_plan(s, plan_of(s->ctx, n, act, ops));
}

/* The DP (its memory model is the engine's, so one simulation normally confirms its
 * plan); then, for a model the DP does not describe, a sweep of DP plans and every(k). */
static int search_plans(search *s, const rm_sim *keep, const rm_chain *chain, const rm_opset *ops,
                        rm_action *act, rm_plan **out) {
  rm_ctx *ctx = s->ctx;
  int n = chain->n, rc = RM_OK;
  double keep_peak = peak_of(s, keep), cost;
  double m = s->limit - (keep_peak - (double)keep->peak) - (double)keep->base;
  bool found = rm_chain_optimal(ctx, chain, m, act, &cost), first = found;
  for (int r = 0; r < (s->def->whole_step ? TIGHTEN_ROUNDS : 1) && found; r++) {
    rm_plan *p = plan_of(ctx, n, act, ops);
    rm_sim sim;
    rc = p ? simulate(s, p, false, &sim) : ctx->err_code;
    if (rc) {
      rm_plan_free(ctx, p);
      return rc;
    }
    double over = peak_of(s, &sim) - s->limit;
    if (over <= 0) {
      *out = p;
      return RM_OK;
    }
    rm_plan_free(ctx, p);
    m -= over + 1;
    found = rm_chain_optimal(ctx, chain, m, act, &cost);
  }
  double min_peak;
  if (!rm_chain_min_peak(ctx, chain, act, &min_peak)) return rm_fail(ctx, RM_ERR_OOM, "policy.budget: out of host memory");
  rc = try_actions(s, n, act, ops);
  if (!rc && (first || s->def->whole_step)) {
    double hi = (double)keep->peak - (double)keep->base;
    for (int i = 0; i < SWEEP_STEPS && !rc; i++)
      if (rm_chain_optimal(ctx, chain, hi * pow(SWEEP_FACTOR, i), act, &cost)) rc = try_actions(s, n, act, ops);
    for (int k = 1; k <= (n < EVERY_MAX ? n : EVERY_MAX) && !rc; k++) rc = try_plan(s, every(ctx, n, k));
    if (!rc) rc = try_plan(s, every(ctx, n, sqrt_k(n)));
  }
  if (rc) return rc;
  if (s->best) {
    *out = s->best;
    s->best = NULL;
    return RM_OK;
  }
  char want[32], need[32], more[32];
  rm_format_bytes((size_t)s->limit, want, sizeof want);
  rm_format_bytes((size_t)s->smallest, need, sizeof need);
  if (s->def->whole_step)
    return rm_fail(ctx, RM_ERR_OOM, "policy.budget(): no plan fits the whole step in %s; the smallest step needs %s (%s more)",
                   want, need, rm_format_bytes((size_t)(s->smallest - s->limit), more, sizeof more));
  return rm_fail(ctx, RM_ERR_OOM, "policy.budget: no plan keeps activations within %s; the smallest that fits needs %s (policy.budget(%.0f))",
                 want, need, s->smallest);
}

static int budget_plan(search *s, rm_plan **out) {
  rm_ctx *ctx = s->ctx;
  int n = s->seq->nchildren, rc = RM_OK;
  size_t nl = (size_t)(n ? n : 1);
  if (s->def->whole_step) {
    if ((rc = room(ctx, s->x->device, &s->limit))) return rc;
    if (s->limit <= 0)
      return rm_fail(ctx, RM_ERR_ARG, "policy.budget(): no memory limit is set for the step to fit in; set one with "
                     "remat.memory.limit(\"1GiB\"), or give an activation budget: policy.budget(\"512MiB\")");
  } else {
    s->limit = (double)s->def->budget;
  }
  rm_opset ops = s->def->ops;
  if (opset_empty(&ops)) cheap_ops(&ops);
  rm_sim keep = { 0 }, sel = { 0 };
  rm_plan *keep_plan = uniform(ctx, n, RM_KEEP, &ops), *sel_plan = uniform(ctx, n, RM_SELECTIVE, &ops);
  rm_chain_layer *layers = rm_host_calloc(ctx, nl, sizeof *layers);
  rm_action *act = rm_host_calloc(ctx, nl, sizeof *act);
  if (!keep_plan || !sel_plan || !layers || !act) rc = rm_fail(ctx, RM_ERR_OOM, "policy.budget: out of host memory");
  if (!rc) rc = simulate(s, keep_plan, true, &keep);
  if (!rc && peak_of(s, &keep) <= s->limit) {
    *out = keep_plan;
    keep_plan = NULL;
  } else if (!rc) {
    /* A layer whose selective run evicts its own output (a lone GELU) offers no
     * selective choice; measure the others with it kept, as the DP will place them. */
    rc = simulate(s, sel_plan, true, &sel);
    bool again = false;
    for (int i = 0; !rc && i < n; i++)
      if (sel.layers[i].out_live != keep.layers[i].out_live) {
        sel_plan->action[i] = RM_KEEP;
        again = true;
      }
    if (!rc && again) {
      rm_sim_free(ctx, &sel);
      rc = simulate(s, sel_plan, true, &sel);
    }
    rm_chain chain;
    if (!rc) {
      rm_chain_from_sims(&keep, &sel, layers, &chain);
      /* what a segment's last layer replays: only what its own backward reads (every(1)) */
      rm_plan *e1 = uniform(ctx, n, RM_BOUNDARY, NULL);
      rm_sim last = { 0 };
      rc = e1 ? simulate(s, e1, true, &last) : rm_fail(ctx, RM_ERR_OOM, "policy.budget: out of host memory");
      for (int i = 0; !rc && i < n; i++) layers[i].last_cost = last.layers[i].recompute_cost;
      rm_sim_free(ctx, &last);
      rm_plan_free(ctx, e1);
      /* the DP's costs become step time: replays less what backward then reads hot */
      if (!rc) rc = rm_opcost_cache_credit(ctx, s->x->device, rm_credit_working_set(&keep), &s->credit);
      if (!rc) rm_chain_credit(&chain, layers, &keep, s->credit);
      s->keep = &keep;
    }
    if (!rc) rc = search_plans(s, &keep, &chain, &ops, act, out);
  }
  rm_plan_free(ctx, s->best);
  s->best = NULL;
  rm_plan_free(ctx, keep_plan);
  rm_plan_free(ctx, sel_plan);
  rm_sim_free(ctx, &keep);
  rm_sim_free(ctx, &sel);
  rm_host_free(ctx, layers, nl * sizeof *layers);
  rm_host_free(ctx, act, nl * sizeof *act);
  return rc;
}

static int custom_plan(rm_ctx *ctx, rm_module *seq, const rm_policy_def *def, rm_tensor *x,
                       const rm_step_env *env, rm_plan **out) {
  rm_sim keep;
  rm_plan *keep_plan = rm_plan_new(ctx, seq->nchildren);
  if (!keep_plan) return ctx->err_code;
  int rc = rm_plan_simulate(ctx, seq, x, keep_plan, env->loss, env->loss_ud, true, &keep);
  rm_plan_free(ctx, keep_plan);
  if (rc) return rc;
  rm_plan *p = rm_plan_new(ctx, seq->nchildren);
  rc = p ? def->decide(ctx, seq, &keep, p, def->ud) : ctx->err_code;
  rm_sim_free(ctx, &keep);
  if (rc) {
    rm_plan_free(ctx, p);
    return rc;
  }
  *out = p;
  return RM_OK;
}

int rm_policy_plan(rm_ctx *ctx, rm_module *seq, const rm_policy_def *def, rm_tensor *x,
                   const rm_step_env *env, rm_plan **out) {
  *out = NULL;
  int rc = rm_check_sequential(ctx, seq, "checkpoint");
  if (rc) return rc;
  int n = seq->nchildren;
  rm_step_env none = { 0 };
  if (!env) env = &none;
  if (rm_policy_needs_input(def) && !x)
    return rm_fail(ctx, RM_ERR_ARG, "checkpoint: %s needs an example input to measure the model", def->name);
  switch (def->kind) {
  case RM_POLICY_NONE: *out = uniform(ctx, n, RM_KEEP, NULL); break;
  case RM_POLICY_EVERY: *out = every(ctx, n, def->every); break;
  case RM_POLICY_SQRT: *out = every(ctx, n, sqrt_k(n)); break;
  case RM_POLICY_SELECTIVE: *out = uniform(ctx, n, RM_SELECTIVE, &def->ops); break;
  case RM_POLICY_BUDGET: {
    search s = { .ctx = ctx, .seq = seq, .x = x, .def = def, .env = *env, .best_cost = HUGE_VAL, .smallest = HUGE_VAL };
    return budget_plan(&s, out);
  }
  case RM_POLICY_CUSTOM:
    if (!def->decide) return rm_fail(ctx, RM_ERR_ARG, "checkpoint: a custom policy without a decide callback");
    return custom_plan(ctx, seq, def, x, env, out);
  default: return rm_fail(ctx, RM_ERR_ARG, "checkpoint: unknown policy kind %d", def->kind);
  }
  return *out ? RM_OK : ctx->err_code;
}

/* ---- the policy a Sequential holds ---- */

static void def_free(rm_ctx *ctx, rm_policy_def *def) {
  if (def && def->free_ud) def->free_ud(ctx, def->ud);
}

void rm_policy_free(rm_ctx *ctx, rm_module *seq) {
  rm_policy_state *st = seq->policy;
  if (!st) return;
  seq->policy = NULL;
  def_free(ctx, &st->def);
  rm_host_free(ctx, st, sizeof *st);
}

const rm_policy_def *rm_policy_get(const rm_module *seq) {
  return seq->policy ? &((const rm_policy_state *)seq->policy)->def : NULL;
}

int rm_policy_busy(rm_ctx *ctx, const rm_module *seq, const char *where) {
  const rm_policy_state *st = seq->policy;
  if (!st || !st->busy) return RM_OK;
  return rm_fail(ctx, RM_ERR_STATE, "%s: the model's checkpoint policy is being planned (a callback of the policy cannot change it or its layers)", where);
}

int rm_policy_set(rm_ctx *ctx, rm_module *seq, rm_policy_def *def) {
  int rc = rm_check_sequential(ctx, seq, "checkpoint");
  if (!rc) rc = rm_policy_busy(ctx, seq, "checkpoint");
  if (rc || !def) {
    def_free(ctx, def);
    if (!rc) {
      rm_policy_free(ctx, seq);
      rc = rm_plan_install(ctx, seq, NULL);
    }
    return rc;
  }
  rm_plan *plan = NULL;
  if (!rm_policy_needs_input(def) && (rc = rm_policy_plan(ctx, seq, def, NULL, NULL, &plan))) {
    def_free(ctx, def);
    return rm_fail_prefix(ctx, "checkpoint");
  }
  rm_policy_state *st = rm_host_calloc(ctx, 1, sizeof *st);
  if (!st) {
    rm_plan_free(ctx, plan);
    def_free(ctx, def);
    return rm_fail(ctx, RM_ERR_OOM, "checkpoint: out of host memory");
  }
  st->def = *def;
  rm_policy_free(ctx, seq);
  seq->policy = st;
  /* resolved at the first forward, when sizes are known, for policies that need them */
  return rm_plan_install(ctx, seq, plan);
}

static bool same_sig(const rm_meta *a, const rm_tensor *x) {
  if (a->dtype != x->dtype || a->device != x->device || a->ndim != x->ndim) return false;
  for (int i = 0; i < x->ndim; i++)
    if (a->shape[i] != x->shape[i]) return false;
  return true;
}

bool rm_policy_pending(const rm_module *seq, const rm_tensor *x) {
  const rm_policy_state *st = seq->policy;
  return st && rm_policy_needs_input(&st->def) && !(st->planned && same_sig(&st->sig, x));
}

int rm_policy_prepare(rm_ctx *ctx, rm_module *seq, rm_tensor *x, const rm_step_env *env) {
  rm_policy_state *st = seq->policy;
  if (!rm_policy_pending(seq, x)) return RM_OK;
  if (st->busy) return rm_policy_busy(ctx, seq, "forward");
  rm_step_env e = { 0 };
  int rc = RM_OK;
  rm_plan *plan = NULL;
  st->busy = true;
  if (env) e = *env;
  else if (st->def.step) rc = st->def.step(ctx, seq, &e, st->def.ud);
  if (!rc) rc = rm_policy_plan(ctx, seq, &st->def, x, &e, &plan);
  st->busy = false;
  if (!rc) rc = rm_plan_install(ctx, seq, plan);
  if (rc) {
    /* a failed policy does not stay installed: the model keeps everything again */
    char name[sizeof st->def.name];
    memcpy(name, st->def.name, sizeof name);
    rm_policy_free(ctx, seq);
    rm_plan_install(ctx, seq, NULL);
    char msg[sizeof ctx->err];
    memcpy(msg, ctx->err, sizeof msg);
    return rm_fail(ctx, rc, "checkpoint: %s failed and was uninstalled (the model keeps everything): %s", name, msg);
  }
  st->planned = true;
  st->sig = (rm_meta){ .dtype = x->dtype, .device = x->device, .ndim = x->ndim };
  memcpy(st->sig.shape, x->shape, sizeof x->shape[0] * (size_t)x->ndim);
  return RM_OK;
}

int rm_policy_layers_changed(rm_ctx *ctx, rm_module *seq) {
  rm_policy_state *st = seq->policy;
  if (!st) return RM_OK;
  st->planned = false;
  rm_plan *plan = NULL;
  if (!rm_policy_needs_input(&st->def) && rm_policy_plan(ctx, seq, &st->def, NULL, NULL, &plan))
    return rm_fail_prefix(ctx, "add");
  return rm_plan_install(ctx, seq, plan);
}

/* ---- the host API (remat.h) ---- */

int rm_checkpoint(rm_ctx *ctx, rm_module *seq, const rm_policy *p) {
  if (!ctx) return RM_ERR_ARG;
  if (!seq) return rm_fail(ctx, RM_ERR_ARG, "checkpoint: no model");
  rm_policy_def def;
  int rc = rm_policy_read(ctx, p, &def);
  return rc ? rc : rm_policy_set(ctx, seq, &def);
}

int rm_checkpoint_plan(rm_ctx *ctx, rm_module *seq, rm_tensor *x) {
  if (!ctx) return RM_ERR_ARG;
  if (!seq || !x) return rm_fail(ctx, RM_ERR_ARG, "checkpoint: no %s", seq ? "input" : "model");
  int rc = rm_check_sequential(ctx, seq, "checkpoint");
  if (rc) return rc;
  rm_policy_state *st = seq->policy;
  if (st) st->planned = false;
  return rm_policy_prepare(ctx, seq, x, NULL);
}

int rm_checkpoint_measured_costs(rm_ctx *ctx, int on) {
  if (!ctx) return RM_ERR_ARG;
  rm_opcost_enable(ctx, on != 0);
  return RM_OK;
}

const char *rm_checkpoint_action(const rm_module *seq, int layer) {
  const rm_plan *p = seq ? seq->plan : NULL;
  if (!p || layer < 0 || layer >= p->n) return NULL;
  return rm_action_name(p->action[layer]);
}

int rm_checkpoint_predict(rm_ctx *ctx, rm_module *seq, rm_tensor *x, size_t *peak, size_t *step_peak) {
  if (!ctx) return RM_ERR_ARG;
  if (!seq || !x) return rm_fail(ctx, RM_ERR_ARG, "plan: no %s", seq ? "input" : "model");
  int rc = rm_check_sequential(ctx, seq, "plan");
  if (rc) return rc;
  rm_sim sim;
  if ((rc = rm_plan_simulate(ctx, seq, x, NULL, NULL, NULL, false, &sim))) return rc;
  if (peak) *peak = sim.peak;
  if (step_peak) *step_peak = sim.step_peak;
  return RM_OK;
}

rm_tensor *rm_tensor_filled(rm_ctx *ctx, int device, int ndim, const int64_t *shape, double value) {
  if (!ctx) return NULL;
  if (device < 0 || device >= RM_DEVICE_COUNT) {
    rm_fail(ctx, RM_ERR_DEVICE, "tensor: no device %d (0: cpu, 1: cuda)", device);
    return NULL;
  }
  if (ndim < 0 || ndim > RM_MAX_DIM || (ndim && !shape)) {
    rm_fail(ctx, RM_ERR_ARG, "tensor: %d dimensions (at most %d)", ndim, RM_MAX_DIM);
    return NULL;
  }
  return rm_full(ctx, RM_F32, (rm_device)device, ndim, shape, value);
}
