/* The Sequential forward loop: runs each layer in C (built-in layers never return to
 * Lua) and lets the checkpoint engine apply the plan between layers. */
#include <stdio.h>

#include "checkpoint.h"
#include "sequential.h"

int rm_sequential_forward(rm_ctx *ctx, rm_module *seq, rm_tensor *x, rm_tensor **y) {
  rm_ckpt st;
  bool engine = ctx->grad_enabled && seq->plan;
  if (seq->plan && seq->plan->n != seq->nchildren)
    return rm_fail(ctx, RM_ERR_STATE, "Sequential: the checkpoint plan has %d layers but the model has %d (set the policy again after adding layers)",
                   seq->plan->n, seq->nchildren);
  if (engine && rm_ckpt_begin(ctx, &st, seq->plan)) return ctx->err_code;
  bool begin = rm_hooked(ctx, RM_HOOK_LAYER_BEGIN), end = rm_hooked(ctx, RM_HOOK_LAYER_END);
  rm_tensor *cur = x;
  rm_tensor_hold(cur);
  int rc = RM_OK;
  for (int i = 0; i < seq->nchildren && rc == RM_OK; i++) {
    rm_event ev = { .seq = seq, .layer = i, .x = cur };
    if (begin) rc = rm_hook_fire(ctx, RM_HOOK_LAYER_BEGIN, &ev);
    if (rc) break;
    if (engine) rm_ckpt_layer_begin(ctx, &st, i, cur);
    rm_tensor *next = NULL;
    rc = rm_module_forward(ctx, seq->children[i], cur, &next);
    if (rc != RM_OK) {
      char what[64];
      snprintf(what, sizeof what, "layer %d (%s)", i + 1, seq->children[i]->type->name);
      rm_fail_prefix(ctx, what);
      break;
    }
    ev.y = next;
    if (end) rc = rm_hook_fire(ctx, RM_HOOK_LAYER_END, &ev);
    if (engine) rm_ckpt_layer_end(ctx, &st, i, cur, next);
    rm_tensor_drop(ctx, cur);
    cur = next;
  }
  if (engine) rm_ckpt_finish(ctx, &st);
  if (rc != RM_OK) {
    rm_tensor_drop(ctx, cur);
    return rc;
  }
  *y = cur;
  return RM_OK;
}
