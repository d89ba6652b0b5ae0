/* Per-layer measurement of dry runs (see measure.h). */
#include "measure.h"
#include "opcost.h"

static size_t act_live(rm_ctx *ctx, rm_measure *m) { return ctx->mem[m->device].live[RM_CAT_ACTIVATION]; }

static void window_open(rm_ctx *ctx, rm_measure *m) { m->window = act_live(ctx, m); }

static bool counted(const rm_measure *m, const rm_storage *s) {
  return s->device == m->device && s->category == RM_CAT_ACTIVATION && s->epoch == m->epoch;
}

static int on_alloc(rm_ctx *ctx, const rm_event *ev, void *ud) {
  rm_measure *m = ud;
  rm_storage *s = ev->storage;
  if (!counted(m, s)) return RM_OK;
  size_t live = act_live(ctx, m);
  if (live > m->window) m->window = live;
  if (m->cur >= 0) {
    s->tag = m->cur;
    m->tag_live[m->cur] += s->bytes;
  }
  return RM_OK;
}

static int on_free(rm_ctx *ctx, const rm_event *ev, void *ud) {
  rm_measure *m = ud;
  rm_storage *s = ev->storage;
  if (counted(m, s) && s->tag >= 0 && s->tag < m->n) m->tag_live[s->tag] -= s->bytes;
  return RM_OK;
}

/* The layer whose forward recorded node n (-1: none, e.g. the loss). */
static int layer_of(const rm_measure *m, const rm_node *n) {
  int lo = 0, hi = m->n - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (n->seq <= m->first_seq[mid]) hi = mid - 1;
    else if (n->seq > m->last_seq[mid]) lo = mid + 1;
    else return mid;
  }
  return -1;
}

static int on_op(rm_ctx *ctx, const rm_event *ev, void *ud) {
  rm_measure *m = ud;
  /* a forward op of a layer (backward runs with grad off), or a replay of one */
  int layer = ev->node ? layer_of(m, ev->node) : ctx->grad_enabled ? m->cur : -1;
  if (layer < 0 || !ev->out[0]) return RM_OK;
  rm_meta meta[RM_MAX_OUTPUTS];
  const rm_op_def *def = rm_op_def_get((rm_op_id)ev->op);
  for (int j = 0; j < def->nout; j++) rm_tensor_meta(ev->out[j], &meta[j]);
  double flops = rm_op_flops((rm_op_id)ev->op, ev->nin, ev->in, ev->attrs, meta);
  double cost = rm_opcost_seconds(ctx, (rm_op_id)ev->op, ev->nin, ev->in, ev->attrs, meta, NULL);
  rm_layer_stats *l = &m->layers[layer];
  if (ev->node) {
    l->recompute_flops += flops;
    l->recompute_cost += cost;
  } else {
    l->flops += flops;
    l->cost += cost;
  }
  return RM_OK;
}

static int on_layer_begin(rm_ctx *ctx, const rm_event *ev, void *ud) {
  rm_measure *m = ud;
  if (ev->seq != m->seq) return RM_OK;
  m->cur = ev->layer;
  m->layer_start = act_live(ctx, m);
  m->first_seq[ev->layer] = ctx->node_seq;
  window_open(ctx, m);
  m->layers[ev->layer].in_bytes = rm_tensor_nbytes(ev->x);
  return RM_OK;
}

static int on_layer_end(rm_ctx *ctx, const rm_event *ev, void *ud) {
  rm_measure *m = ud;
  if (ev->seq != m->seq) return RM_OK;
  rm_layer_stats *l = &m->layers[ev->layer];
  l->fwd_peak = m->window - m->layer_start;
  l->out_bytes = rm_tensor_nbytes(ev->y);
  m->last_seq[ev->layer] = ctx->node_seq;
  m->cur = -1;
  if (!m->outs[ev->layer]) {
    rm_tensor_retain(ev->y);
    m->outs[ev->layer] = ev->y;
  }
  return RM_OK;
}

void rm_measure_outputs_done(rm_ctx *ctx, rm_measure *m) {
  for (int i = 0; i < m->n; i++) {
    m->layers[i].saved = m->tag_live[i];
    rm_tensor *y = m->outs[i];
    if (!y) continue;
    m->layers[i].out_live = y->storage ? rm_tensor_nbytes(y) : 0;
    rm_tensor_release(ctx, y);
    m->outs[i] = NULL;
  }
  m->fwd_end = act_live(ctx, m);
  m->in_loss = true;
  window_open(ctx, m);
}

void rm_measure_close(rm_ctx *ctx, rm_measure *m) {
  if (m->bwd_layer >= 0 && m->bwd_layer < m->n) {
    size_t v = m->window > m->window_start ? m->window - m->window_start : 0;
    if (v > m->layers[m->bwd_layer].bwd_peak) m->layers[m->bwd_layer].bwd_peak = v;
  }
  m->bwd_layer = -1;
}

/* Opens the backward window of a node's layer when backward moves to another layer. */
static int on_node_before(rm_ctx *ctx, const rm_event *ev, void *ud) {
  rm_measure *m = ud;
  int layer = layer_of(m, ev->node);
  if (layer == m->bwd_layer) return RM_OK;
  if (m->in_loss) {
    m->in_loss = false;
    m->loss_peak = m->window - m->fwd_end;
    m->held = act_live(ctx, m) - m->fwd_end;
  }
  rm_measure_close(ctx, m);
  m->bwd_layer = layer;
  m->cur = layer;
  m->window_start = act_live(ctx, m);
  window_open(ctx, m);
  return RM_OK;
}

static const struct { rm_hook_kind kind; rm_hook_fn fn; } hooks[] = {
  { RM_HOOK_ALLOC, on_alloc }, { RM_HOOK_FREE, on_free }, { RM_HOOK_OP, on_op },
  { RM_HOOK_LAYER_BEGIN, on_layer_begin }, { RM_HOOK_LAYER_END, on_layer_end },
  { RM_HOOK_NODE_BEFORE, on_node_before },
};
#define NHOOKS (int)(sizeof hooks / sizeof hooks[0])

int rm_measure_begin(rm_ctx *ctx, rm_measure *m, rm_module *seq, rm_device dev,
                     rm_layer_stats *layers) {
  int n = seq->nchildren;
  size_t k = (size_t)(n ? n : 1);
  *m = (rm_measure){ .seq = seq, .n = n, .layers = layers, .device = dev, .epoch = ctx->dry_epoch,
                     .cur = -1, .bwd_layer = -1 };
  m->tag_live = rm_host_calloc(ctx, k, sizeof *m->tag_live);
  m->first_seq = rm_host_calloc(ctx, k, sizeof *m->first_seq);
  m->last_seq = rm_host_calloc(ctx, k, sizeof *m->last_seq);
  m->outs = rm_host_calloc(ctx, k, sizeof *m->outs);
  int rc = m->tag_live && m->first_seq && m->last_seq && m->outs ? RM_OK
         : rm_fail(ctx, RM_ERR_OOM, "plan: out of host memory for measurements");
  for (int i = 0; i < NHOOKS && rc == RM_OK; i++) rc = rm_hook_add(ctx, hooks[i].kind, hooks[i].fn, m);
  if (rc) rm_measure_end(ctx, m);
  return rc;
}

void rm_measure_end(rm_ctx *ctx, rm_measure *m) {
  for (int i = 0; i < NHOOKS; i++) rm_hook_remove(ctx, hooks[i].kind, hooks[i].fn, m);
  size_t k = (size_t)(m->n ? m->n : 1);
  rm_host_free(ctx, m->tag_live, k * sizeof *m->tag_live);
  rm_host_free(ctx, m->first_seq, k * sizeof *m->first_seq);
  rm_host_free(ctx, m->last_seq, k * sizeof *m->last_seq);
  for (int i = 0; m->outs && i < m->n; i++)
    if (m->outs[i]) rm_tensor_release(ctx, m->outs[i]);
  rm_host_free(ctx, m->outs, k * sizeof *m->outs);
  m->outs = NULL;
  m->tag_live = NULL;
  m->first_seq = m->last_seq = NULL;
}
