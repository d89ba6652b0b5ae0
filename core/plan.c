/* Plans: creation, installation on a Sequential, and dry-run simulation. */
#include <string.h>

#include "autograd.h"
#include "measure.h"
#include "plan.h"
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
  if (seq->type != &rm_type_sequential) {
    rm_plan_free(ctx, p);
    return rm_fail(ctx, RM_ERR_ARG, "checkpoint: policies apply to a Sequential, not a %s", seq->type->name);
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
  (void)name; (void)owner;
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
  (void)name; (void)owner;
  restore *r = ud;
  if (r->i >= r->s->n) return 1;
  if ((*slot)->grad) rm_tensor_drop(r->ctx, (*slot)->grad); /* a phantom */
  (*slot)->grad = r->s->grads[r->i++];
  return 0;
}

static int param_bytes(void *ud, const char *name, rm_tensor **slot, rm_module *owner) {
  (void)name; (void)owner;
  *(size_t *)ud += rm_tensor_nbytes(*slot);
  return 0;
}

int rm_plan_simulate(rm_ctx *ctx, rm_module *seq, rm_tensor *x, const rm_plan *p,
                     rm_loss_fn loss, void *loss_ud, bool want_layers, rm_sim *sim) {
  memset(sim, 0, sizeof *sim);
  if (seq->type != &rm_type_sequential)
    return rm_fail(ctx, RM_ERR_ARG, "plan: expected a Sequential, got a %s", seq->type->name);
  if (ctx->dry) return rm_fail(ctx, RM_ERR_STATE, "plan: a dry run is already in progress");
  int n = seq->nchildren;
  rm_device dev = x->device;
  rm_measure m = { .n = n, .device = dev, .bwd_layer = -1 };
  m.layers = rm_host_calloc(ctx, (size_t)(n ? n : 1), sizeof *m.layers);
  m.tag_live = rm_host_calloc(ctx, (size_t)(n ? n : 1), sizeof *m.tag_live);
  m.outs = rm_host_calloc(ctx, (size_t)(n ? n : 1), sizeof *m.outs);
  stash st = { .ctx = ctx };
  if (!m.layers || !m.tag_live || !m.outs) {
    rm_host_free(ctx, m.layers, sizeof *m.layers * (size_t)(n ? n : 1));
    rm_host_free(ctx, m.tag_live, sizeof *m.tag_live * (size_t)(n ? n : 1));
    rm_host_free(ctx, m.outs, sizeof *m.outs * (size_t)(n ? n : 1));
    return rm_fail(ctx, RM_ERR_OOM, "plan: out of host memory");
  }
  for (int i = 0; i < n; i++) rm_module_visit_params(ctx, seq->children[i], param_bytes, &m.layers[i].param_bytes);

  /* everything a dry run may disturb; its own bytes stop counting when it ends */
  rm_memstats saved_mem[RM_DEVICE_COUNT];
  memcpy(saved_mem, ctx->mem, sizeof saved_mem);
  ctx->dry_epoch++;
  uint64_t seed = ctx->rng_seed, offset = ctx->rng_offset;
  bool grad = ctx->grad_enabled;
  rm_category cat = ctx->category;
  double rflops = ctx->recompute_flops;
  rm_plan *installed = seq->plan;
  rm_tensor *xgrad = x->grad;
  x->grad = NULL;
  rm_module_visit_params(ctx, seq, stash_grad, &st);

  for (int d = 0; d < RM_DEVICE_COUNT; d++) {
    ctx->mem[d].limit = 0;
    ctx->mem[d].fail_at = 0;
  }
  ctx->dry = true;
  ctx->grad_enabled = true;
  ctx->category = RM_CAT_ACTIVATION;
  ctx->recompute_flops = 0;
  ctx->measure = &m;
  if (p) seq->plan = (rm_plan *)p;
  rm_memstats *ms = &ctx->mem[dev];
  sim->base = ms->live[RM_CAT_ACTIVATION];
  ms->peak[RM_CAT_ACTIVATION] = ms->live[RM_CAT_ACTIVATION];

  int rc = RM_OK;
  if (st.oom) rc = rm_fail(ctx, RM_ERR_OOM, "plan: out of host memory");
  rm_tensor *y = NULL, *l = NULL;
  if (rc == RM_OK) rc = rm_sequential_forward(ctx, seq, x, &y);
  rm_measure_outputs_done(ctx, &m);
  if (rc == RM_OK) {
    for (int i = 0; i < n; i++) m.layers[i].saved = m.tag_live[i];
    if (loss) rc = loss(ctx, y, &l, loss_ud);
  }
  if (rc == RM_OK) {
    if (!l) {
      rm_tensor *g = rm_full_like(ctx, y, 1.0);
      rc = g ? rm_backward(ctx, y, g) : ctx->err_code;
      rm_tensor_drop(ctx, g);
    } else if (l->requires_grad) {
      rc = rm_backward(ctx, l, NULL);
    }
    rm_measure_close(ctx, &m);
  }
  rm_tensor_drop(ctx, l);
  rm_tensor_drop(ctx, y);
  sim->peak = ms->peak[RM_CAT_ACTIVATION];
  sim->loss_peak = m.loss_peak;
  sim->held = m.held;
  sim->recompute_flops = ctx->recompute_flops;
  for (int i = 0; i < n; i++) {
    sim->flops += m.layers[i].flops;
    sim->recompute_cost += m.layers[i].recompute_cost;
  }

  ctx->measure = NULL;
  ctx->alloc_tag = -1;
  seq->plan = installed;
  if (x->grad) rm_tensor_drop(ctx, x->grad);
  x->grad = xgrad;
  restore r = { &st, 0, ctx };
  rm_module_visit_params(ctx, seq, restore_grad, &r);
  rm_host_free(ctx, st.grads, st.cap * sizeof *st.grads);
  rm_memory_end_dry(ctx);
  ctx->dry = false;
  for (int d = 0; d < RM_DEVICE_COUNT; d++) {
    rm_memstats *cur = &ctx->mem[d], *was = &saved_mem[d];
    for (int c = 0; c < RM_CAT_COUNT; c++)
      cur->peak[c] = was->peak[c] > cur->live[c] ? was->peak[c] : cur->live[c];
    cur->peak_total = was->peak_total > cur->live_total ? was->peak_total : cur->live_total;
    cur->limit = was->limit;
    cur->fail_at = was->fail_at;
    cur->n_allocs = was->n_allocs;
    cur->window = was->window;
  }
  ctx->rng_seed = seed;
  ctx->rng_offset = offset;
  ctx->grad_enabled = grad;
  ctx->category = cat;
  ctx->recompute_flops = rflops;
  rm_host_free(ctx, m.tag_live, sizeof *m.tag_live * (size_t)(n ? n : 1));
  rm_host_free(ctx, m.outs, sizeof *m.outs * (size_t)(n ? n : 1));
  if (rc != RM_OK || !want_layers) {
    rm_host_free(ctx, m.layers, sizeof *m.layers * (size_t)(n ? n : 1));
  } else {
    sim->layers = m.layers;
    sim->n = n;
  }
  return rc;
}
