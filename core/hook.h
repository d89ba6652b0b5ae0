/* The hook table: the core's extension points. The allocator, the op runner, the tape
 * and backward fire events; measurement, the checkpoint engine, the gradient reducer
 * and optimizers fused into backward subscribe. The core itself never names a
 * subscriber, so alloc.c, op.c and autograd.c know nothing of what listens.
 *
 * Several subscribers per hook ({fn, ud} pairs), called in the order they were added.
 * A subscriber may add or remove subscribers (itself included) while it runs; the
 * change applies from the next event. */
#ifndef REMAT_HOOK_H
#define REMAT_HOOK_H

#include "types.h"

struct rm_storage;
struct rm_attrs;
struct rm_module;

typedef enum {
  RM_HOOK_ALLOC,          /* a storage was made (storage); must not fail */
  RM_HOOK_FREE,           /* a storage is about to be given back (storage); must not fail */
  RM_HOOK_OP,             /* an op ran (op, nin, in, attrs, out); node set: a replay of it */
  RM_HOOK_RECORD,         /* a node was recorded on the tape (node) */
  RM_HOOK_LAYER_BEGIN,    /* a Sequential (seq) starts layer `layer` on x */
  RM_HOOK_LAYER_END,      /* ... and finished it with output y */
  RM_HOOK_NODE_BEFORE,    /* backward is about to run node's backward */
  RM_HOOK_NODE_AFTER,     /* ... and ran it */
  RM_HOOK_GRAD_READY,     /* the gradient of a leaf (tensor) is final for this backward */
  RM_HOOK_BACKWARD_DONE,  /* a backward from tensor finished (rc: its status) */
  RM_HOOK_COUNT
} rm_hook_kind;

/* What happened. Only the fields named for the kind are set. */
typedef struct rm_event {
  rm_hook_kind kind;
  struct rm_storage *storage;
  int op;                             /* an rm_op_id */
  int nin;
  rm_tensor *const *in;
  const struct rm_attrs *attrs;
  rm_tensor *const *out;              /* all the op's outputs */
  rm_node *node;
  struct rm_module *seq;
  int layer;                          /* 0-based */
  rm_tensor *x, *y;
  rm_tensor *tensor;
  int rc;
} rm_event;

/* A nonzero return (an rm_status, message set) stops the operation that fired the
 * event: the op, the Sequential forward or the backward fails with it. */
typedef int (*rm_hook_fn)(rm_ctx *ctx, const rm_event *ev, void *ud);

#define RM_HOOK_MAX 16          /* subscribers per hook */

typedef struct rm_hook_sub { rm_hook_fn fn; void *ud; } rm_hook_sub;

typedef struct rm_hooks {
  int n[RM_HOOK_COUNT];
  rm_hook_sub sub[RM_HOOK_COUNT][RM_HOOK_MAX];
} rm_hooks;

/* Subscribes fn(ctx, ev, ud) to kind. RM_ERR_STATE when RM_HOOK_MAX are there. */
int rm_hook_add(rm_ctx *ctx, rm_hook_kind kind, rm_hook_fn fn, void *ud);
/* Removes the subscription (fn, ud) from kind; nothing when there is none. */
void rm_hook_remove(rm_ctx *ctx, rm_hook_kind kind, rm_hook_fn fn, void *ud);
/* (rm_hooked(ctx, kind), in ctx.h: whether anyone listens; callers skip building the
 * event when not.) */
/* Calls kind's subscribers with ev (ev->kind is set here); stops at the first failure
 * and returns it. */
int rm_hook_fire(rm_ctx *ctx, rm_hook_kind kind, rm_event *ev);

#endif
