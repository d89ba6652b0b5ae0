/* The hook table (see hook.h). */
#include <string.h>

#include "ctx.h"

int rm_hook_add(rm_ctx *ctx, rm_hook_kind kind, rm_hook_fn fn, void *ud) {
  rm_hooks *h = &ctx->hooks;
  if (h->n[kind] == RM_HOOK_MAX)
    return rm_fail(ctx, RM_ERR_STATE, "hooks: %d subscribers to one hook already (nested too deep?)", RM_HOOK_MAX);
  h->sub[kind][h->n[kind]++] = (rm_hook_sub){ fn, ud };
  return RM_OK;
}

void rm_hook_remove(rm_ctx *ctx, rm_hook_kind kind, rm_hook_fn fn, void *ud) {
  rm_hooks *h = &ctx->hooks;
  for (int i = h->n[kind] - 1; i >= 0; i--) {
    if (h->sub[kind][i].fn != fn || h->sub[kind][i].ud != ud) continue;
    memmove(&h->sub[kind][i], &h->sub[kind][i + 1], sizeof h->sub[kind][0] * (size_t)(h->n[kind] - i - 1));
    h->n[kind]--;
    return;
  }
}

int rm_hook_fire(rm_ctx *ctx, rm_hook_kind kind, rm_event *ev) {
  /* a snapshot, so that subscribers may add or remove subscribers as they run */
  rm_hook_sub subs[RM_HOOK_MAX];
  int n = ctx->hooks.n[kind];
  memcpy(subs, ctx->hooks.sub[kind], sizeof subs[0] * (size_t)n);
  ev->kind = kind;
  for (int i = 0; i < n; i++) {
    int rc = subs[i].fn(ctx, ev, subs[i].ud);
    if (rc) return rc;
  }
  return RM_OK;
}
