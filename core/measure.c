/* Per-layer measurement of dry runs (see measure.h). */
#include "measure.h"

static size_t act_live(rm_ctx *ctx, rm_measure *m) { return ctx->mem[m->device].live[RM_CAT_ACTIVATION]; }

static void window_open(rm_ctx *ctx, rm_measure *m) {
  rm_memstats *s = &ctx->mem[m->device];
  s->window = s->live[RM_CAT_ACTIVATION];
}

static size_t window_peak(rm_ctx *ctx, rm_measure *m) { return ctx->mem[m->device].window; }

void rm_measure_layer_begin(rm_ctx *ctx, rm_measure *m, int layer, rm_tensor *x) {
  ctx->alloc_tag = layer;
  m->layer_start = act_live(ctx, m);
  window_open(ctx, m);
  m->layers[layer].in_bytes = rm_tensor_nbytes(x);
}

void rm_measure_layer_end(rm_ctx *ctx, rm_measure *m, int layer, rm_tensor *x, rm_tensor *y) {
  (void)x;
  rm_layer_stats *l = &m->layers[layer];
  l->fwd_peak = window_peak(ctx, m) - m->layer_start;
  l->out_bytes = rm_tensor_nbytes(y);
  ctx->alloc_tag = -1;
  if (!m->outs[layer]) {
    rm_tensor_retain(y);
    m->outs[layer] = y;
  }
}

void rm_measure_outputs_done(rm_ctx *ctx, rm_measure *m) {
  for (int i = 0; i < m->n; i++) {
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

void rm_measure_on_op(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in,
                      const rm_attrs *a, rm_tensor *const *out) {
  rm_measure *m = ctx->measure;
  /* forward FLOPs only: backward runs with grad recording off */
  if (!m || !ctx->grad_enabled || ctx->alloc_tag < 0 || ctx->alloc_tag >= m->n || !out[0]) return;
  rm_meta meta[8];
  const rm_op_def *def = rm_op_def_get(op);
  for (int j = 0; j < def->nout && j < 8; j++) rm_tensor_meta(out[j], &meta[j]);
  m->layers[ctx->alloc_tag].flops += rm_op_flops(op, nin, in, a, meta);
  m->layers[ctx->alloc_tag].cost += rm_op_cost(ctx, op, nin, in, a, meta);
}

void rm_measure_close(rm_ctx *ctx, rm_measure *m) {
  if (m->bwd_layer >= 0 && m->bwd_layer < m->n) {
    size_t peak = window_peak(ctx, m);
    size_t v = peak > m->window_start ? peak - m->window_start : 0;
    if (v > m->layers[m->bwd_layer].bwd_peak) m->layers[m->bwd_layer].bwd_peak = v;
  }
  m->bwd_layer = -1;
}

void rm_measure_before_node(rm_ctx *ctx, rm_measure *m, rm_node *n) {
  if (n->tag == m->bwd_layer) return;
  if (m->in_loss) {
    m->in_loss = false;
    m->loss_peak = window_peak(ctx, m) - m->fwd_end;
    m->held = act_live(ctx, m) - m->fwd_end;
  }
  rm_measure_close(ctx, m);
  m->bwd_layer = n->tag;
  ctx->alloc_tag = n->tag;
  m->window_start = act_live(ctx, m);
  window_open(ctx, m);
}
