/* The checkpoint engine: executes a plan (core/plan.h) while a Sequential runs its
 * forward. After each layer it evicts what the plan does not keep (dropping storage;
 * the tape can rebuild it), and pins each boundary's input to the layer's first node,
 * so that it lives exactly until that layer's backward is done. During backward,
 * evicted tensors are rematerialised on first use (rm_tensor_data_ready), which
 * replays the segment from the nearest kept tensors, never calling Lua. */
#ifndef REMAT_CHECKPOINT_H
#define REMAT_CHECKPOINT_H

#include "plan.h"

/* Engine state for one Sequential forward (nested Sequentials run their own engine,
 * each subscribed to the tape's RM_HOOK_RECORD). */
typedef struct rm_ckpt {
  const rm_plan *plan;
  uint64_t layer_seq;          /* nodes recorded in the current layer have seq > layer_seq */
  bool defer_evict;            /* evict the current layer's input once it has been used */
  rm_node **nodes;             /* nodes recorded during the current layer */
  size_t n, cap;
  rm_tensor *pin;              /* boundary input waiting for the layer's first node */
} rm_ckpt;

/* Engine steps used by rm_sequential_forward: begin (subscribes to the tape), per layer
 * layer_begin/layer_end, finish (always, also after a failure). */
int rm_ckpt_begin(rm_ctx *ctx, rm_ckpt *st, const rm_plan *plan);
void rm_ckpt_layer_begin(rm_ctx *ctx, rm_ckpt *st, int layer, rm_tensor *x);
/* Evicts what layer `layer` does not keep; x is its input, y its output. */
void rm_ckpt_layer_end(rm_ctx *ctx, rm_ckpt *st, int layer, rm_tensor *x, rm_tensor *y);
void rm_ckpt_finish(rm_ctx *ctx, rm_ckpt *st);

#endif
