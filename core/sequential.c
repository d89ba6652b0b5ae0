/* The Sequential forward loop: runs each layer in C (built-in layers never return to
 * Lua) and lets the checkpoint engine apply the plan between layers. */
#include <stdio.h>

#include "checkpoint.h"
#include "sequential.h"

int rm_sequential_forward(rm_ctx *ctx, rm_module *seq, rm_tensor *x, rm_tensor **y) {
  rm_ckpt st = { 0 };
  bool engine = ctx->grad_enabled && (seq->plan || (ctx->measure && !ctx->ckpt));
  if (seq->plan && seq->plan->n != seq->nchildren)
    return rm_fail(ctx, RM_ERR_STATE, "Sequential: the checkpoint plan has %d layers but the model has %d (set the policy again after adding layers)",
                   seq->plan->n, seq->nchildren);
  if (engine) {
    st.parent = ctx->ckpt;
    st.plan = seq->plan;
    st.measure = st.parent ? NULL : ctx->measure;
    ctx->ckpt = &st;
  }
  int saved_layer = ctx->layer;
  rm_tensor *cur = x;
  rm_tensor_hold(cur);
  int rc = RM_OK;
  for (int i = 0; i < seq->nchildren && rc == RM_OK; i++) {
    ctx->layer = i;
    if (engine) rm_ckpt_layer_begin(ctx, &st, i, cur);
    rm_tensor *next = NULL;
    rc = rm_module_forward(ctx, seq->children[i], cur, &next);
    if (rc != RM_OK) {
      char what[64];
      snprintf(what, sizeof what, "layer %d (%s)", i + 1, seq->children[i]->type->name);
      rm_fail_prefix(ctx, what);
      break;
    }
    if (engine) rm_ckpt_layer_end(ctx, &st, i, cur, next);
    rm_tensor_drop(ctx, cur);
    cur = next;
  }
  ctx->layer = saved_layer;
  if (engine) {
    rm_ckpt_finish(ctx, &st);
    ctx->ckpt = st.parent;
  }
  if (rc != RM_OK) {
    rm_tensor_drop(ctx, cur);
    return rc;
  }
  *y = cur;
  return RM_OK;
}
