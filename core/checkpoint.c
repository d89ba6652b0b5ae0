/* The checkpoint engine (see checkpoint.h). */
#include <string.h>

#include "checkpoint.h"

static bool evicts(const rm_plan *p, int layer, rm_op_id op) {
  if (!p || layer < 0 || layer >= p->n) return false;
  switch (p->action[layer]) {
  case RM_BOUNDARY:
  case RM_RECOMPUTE: return true;
  case RM_SELECTIVE: return rm_opset_has(&p->sel[layer], (int)op);
  default: return false;
  }
}

/* RM_HOOK_RECORD: notes the nodes of the current layer. */
static int on_record(rm_ctx *ctx, const rm_event *ev, void *ud) {
  rm_ckpt *st = ud;
  rm_node *n = ev->node;
  if (st->n == st->cap) {
    size_t cap = st->cap ? 2 * st->cap : 64;
    rm_node **nn = rm_host_realloc(ctx, st->nodes, st->cap * sizeof *nn, cap * sizeof *nn);
    if (!nn) return rm_fail(ctx, RM_ERR_OOM, "checkpoint: out of host memory for the list of a layer's %zu nodes", st->n);
    st->nodes = nn;
    st->cap = cap;
  }
  if (st->pin) {
    /* the layer's first node holds its boundary input until its backward is done */
    n->pinned = st->pin;
    st->pin->pins++;
    st->pin = NULL;
  }
  rm_node_retain(n);
  st->nodes[st->n++] = n;
  return RM_OK;
}

int rm_ckpt_begin(rm_ctx *ctx, rm_ckpt *st, const rm_plan *plan) {
  *st = (rm_ckpt){ .plan = plan };
  return rm_hook_add(ctx, RM_HOOK_RECORD, on_record, st);
}

void rm_ckpt_layer_begin(rm_ctx *ctx, rm_ckpt *st, int layer, rm_tensor *x) {
  st->layer_seq = ctx->node_seq;
  st->pin = NULL;
  if (ctx->grad_enabled && st->plan->action[layer] == RM_BOUNDARY) {
    rm_tensor_hold(x);          /* passed on to the first node by on_record */
    st->pin = x;
  }
}

void rm_ckpt_layer_end(rm_ctx *ctx, rm_ckpt *st, int layer, rm_tensor *x, rm_tensor *y) {
  if (st->pin) {            /* the layer recorded nothing: nothing to replay */
    rm_tensor_drop(ctx, st->pin);
    st->pin = NULL;
  }
  /* x (the previous layer's output) was kept until this layer had used it */
  if (st->defer_evict) rm_tensor_evict(ctx, x);
  /* y is evicted after the next layer has used it when this layer is selective for
   * y's op, or when the next layer is replayed with this one (same segment). A
   * segment's last output stays while the next layer keeps it for its backward:
   * evicting it would replay the whole segment for that layer's backward. */
  rm_node *p = y->grad_fn ? y->grad_fn : y->producer;
  const rm_plan *pl = st->plan;
  bool same_segment = pl && layer + 1 < pl->n && pl->action[layer + 1] == RM_RECOMPUTE;
  st->defer_evict = p && p->seq > st->layer_seq && evicts(pl, layer, p->op) &&
                    (pl->action[layer] == RM_SELECTIVE || same_segment);
  for (size_t i = 0; i < st->n; i++) {
    rm_node *n = st->nodes[i];
    if (evicts(st->plan, layer, n->op))
      for (int j = 0; j < n->nout; j++)
        if (n->out[j] && n->out[j] != y) rm_tensor_evict(ctx, n->out[j]);
    rm_node_release(ctx, n);
  }
  st->n = 0;
}

void rm_ckpt_finish(rm_ctx *ctx, rm_ckpt *st) {
  rm_hook_remove(ctx, RM_HOOK_RECORD, on_record, st);
  if (st->pin) rm_tensor_drop(ctx, st->pin);
  st->pin = NULL;
  for (size_t i = 0; i < st->n; i++) rm_node_release(ctx, st->nodes[i]);
  rm_host_free(ctx, st->nodes, st->cap * sizeof *st->nodes);
  st->nodes = NULL;
  st->n = st->cap = 0;
}
