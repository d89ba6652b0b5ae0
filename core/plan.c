/* Plans: creation, installation on a Sequential, and dry-run simulation. */
#include <string.h>

#include "autograd.h"
#include "measure.h"
#include "opcost.h"
#include "policy.h"
#include "sequential.h"

rm_plan *rm_plan_new(rm_ctx *ctx, int n) {
  rm_plan *p = rm_host_calloc(ctx, 1, sizeof *p);
  if (p) {
    p->n = n;
    p->action = rm_host_calloc(ctx, (size_t)(n ? n : 1), sizeof *p->action);
    p->sel = rm_host_calloc(ctx, (size_t)(n ? n : 1), sizeof *p->sel);
  }
  if (!p || !p->action || !p->sel) {
    rm_plan_free(ctx, p);
    rm_fail(ctx, RM_ERR_OOM, "checkpoint: out of host memory for a plan");
    return NULL;
  }
  return p;
}

void rm_plan_free(rm_ctx *ctx, rm_plan *p) {
  if (!p) return;
  size_t n = (size_t)(p->n ? p->n : 1);
  rm_host_free(ctx, p->action, n * sizeof *p->action);
  rm_host_free(ctx, p->sel, n * sizeof *p->sel);
  rm_host_free(ctx, p, sizeof *p);
}

int rm_plan_install(rm_ctx *ctx, rm_module *seq, rm_plan *p) {
  if (rm_check_sequential(ctx, seq, "checkpoint")) {
    rm_plan_free(ctx, p);
    return ctx->err_code;
  }
  if (p && p->n != seq->nchildren) {
    int n = p->n;
    rm_plan_free(ctx, p);
    return rm_fail(ctx, RM_ERR_ARG, "checkpoint: the plan has %d layers but the Sequential has %d", n, seq->nchildren);
  }
  if (seq->plan && seq->plan_free) seq->plan_free(ctx, seq->plan);
  seq->plan = p;
  seq->plan_free = p ? rm_plan_free : NULL;
  return RM_OK;
}

void rm_sim_free(rm_ctx *ctx, rm_sim *sim) {
  if (sim->layers) rm_host_free(ctx, sim->layers, sizeof *sim->layers * (size_t)sim->n);
  sim->layers = NULL;
}

/* Parameter gradients put aside during a dry run. */
typedef struct stash { rm_tensor **grads; size_t n, cap; rm_ctx *ctx; bool oom; } stash;

static int stash_grad(void *ud, const char *name, rm_tensor **slot, rm_module *owner) {
  stash *s = ud;
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 32;
    rm_tensor **g = rm_host_realloc(s->ctx, s->grads, s->cap * sizeof *g, cap * sizeof *g);
    if (!g) { s->oom = true; return 1; }
    s->grads = g;
    s->cap = cap;
  }
  s->grads[s->n++] = (*slot)->grad;
  (*slot)->grad = NULL;
  return 0;
}

typedef struct restore { stash *s; size_t i; rm_ctx *ctx; } restore;

static int restore_grad(void *ud, const char *name, rm_tensor **slot, rm_module *owner) {
  restore *r = ud;
  if (r->i >= r->s->n) return 1;
  if ((*slot)->grad) rm_tensor_drop(r->ctx, (*slot)->grad); /* a phantom */
  (*slot)->grad = r->s->grads[r->i++];
  return 0;
}

static int param_bytes(void *ud, const char *name, rm_tensor **slot, rm_module *owner) {
  *(size_t *)ud += rm_tensor_nbytes(*slot);
  return 0;
}

static int simulate(rm_ctx *ctx, rm_module *seq, rm_tensor *x, const rm_plan *p,
                    rm_loss_fn loss, void *loss_ud, bool want_layers, rm_sim *sim) {
  memset(sim, 0, sizeof *sim);
  if (rm_check_sequential(ctx, seq, "plan")) return ctx->err_code;
  int n = seq->nchildren;
  size_t nl = (size_t)(n ? n : 1);
  rm_device dev = x->device;
  rm_layer_stats *layers = rm_host_calloc(ctx, nl, sizeof *layers);
  if (!layers) return rm_fail(ctx, RM_ERR_OOM, "plan: out of host memory");
  for (int i = 0; i < n; i++) rm_module_visit_params(ctx, seq->children[i], param_bytes, &layers[i].param_bytes);

  rm_scope sc;
  int rc = rm_scope_enter_dry(ctx, &sc);
  if (rc) {
    rm_host_free(ctx, layers, nl * sizeof *layers);
    return rm_fail_prefix(ctx, "plan");
  }
  /* what else a dry run may disturb: the plan and gradients (phantoms while it runs) */
  stash st = { .ctx = ctx };
  rm_plan *installed = seq->plan;
  rm_tensor *xgrad = x->grad;
  x->grad = NULL;
  rm_module_visit_params(ctx, seq, stash_grad, &st);
  if (p) seq->plan = (rm_plan *)p;
  rm_memstats *ms = &ctx->mem[dev];
  sim->base = ms->live[RM_CAT_ACTIVATION];
  ms->peak[RM_CAT_ACTIVATION] = ms->live[RM_CAT_ACTIVATION];
  ms->peak_total = ms->live_total;
  memcpy(ms->peak_live, ms->live, sizeof ms->peak_live);

  rm_measure m;
  rc = st.oom ? rm_fail(ctx, RM_ERR_OOM, "plan: out of host memory") : rm_measure_begin(ctx, &m, seq, dev, layers);
  bool measuring = rc == RM_OK;
  rm_tensor *y = NULL, *l = NULL;
  if (rc == RM_OK) rc = rm_sequential_forward(ctx, seq, x, &y);
  if (measuring) rm_measure_outputs_done(ctx, &m);
  if (rc == RM_OK && loss) rc = loss(ctx, y, &l, loss_ud);
  if (rc == RM_OK) {
    if (!l) {
      rm_tensor *g = rm_full_like(ctx, y, 1.0);
      rc = g ? rm_backward(ctx, y, g) : ctx->err_code;
      rm_tensor_drop(ctx, g);
    } else if (l->requires_grad) {
      rc = rm_backward(ctx, l, NULL);
    }
    rm_measure_close(ctx, &m);
    sim->end_live = ms->live_total;
    memcpy(sim->end_cat, ms->live, sizeof sim->end_cat);
  }
  rm_tensor_drop(ctx, l);
  rm_tensor_drop(ctx, y);
  sim->peak = ms->peak[RM_CAT_ACTIVATION];
  sim->step_peak = ms->peak_total;
  memcpy(sim->step_cat, ms->peak_live, sizeof sim->step_cat);
  sim->recompute_flops = ctx->recompute_flops;
  if (measuring) {
    sim->loss_peak = m.loss_peak;
    sim->held = m.held;
    rm_measure_end(ctx, &m);
  }
  for (int i = 0; i < n; i++) {
    sim->flops += layers[i].flops;
    sim->recompute_cost += layers[i].recompute_cost;
  }

  seq->plan = installed;
  if (x->grad) rm_tensor_drop(ctx, x->grad);
  x->grad = xgrad;
  restore r = { &st, 0, ctx };
  rm_module_visit_params(ctx, seq, restore_grad, &r);
  rm_host_free(ctx, st.grads, st.cap * sizeof *st.grads);
  rm_scope_leave(ctx, &sc);
  if (rc != RM_OK || !want_layers) {
    rm_host_free(ctx, layers, nl * sizeof *layers);
  } else {
    sim->layers = layers;
    sim->n = n;
  }
  return rc;
}

/* Costs are seconds measured per op call (opcost.h): a dry run that met calls not
 * measured yet measures them and runs again, priced. */
int rm_plan_simulate(rm_ctx *ctx, rm_module *seq, rm_tensor *x, const rm_plan *p,
                     rm_loss_fn loss, void *loss_ud, bool want_layers, rm_sim *sim) {
  ctx->plan_sims++;
  int rc = simulate(ctx, seq, x, p, loss, loss_ud, want_layers, sim);
  if (rc || !rm_opcost_pending(ctx) || ctx->dry) return rc;
  rm_sim_free(ctx, sim);
  if ((rc = rm_opcost_calibrate(ctx))) return rc;
  return simulate(ctx, seq, x, p, loss, loss_ud, want_layers, sim);
}
