/* The checkpoint engine: executes a plan (per layer: keep, selective, boundary,
 * recompute) during a Sequential forward, and frees/rematerialises during backward. */
#ifndef REMAT_CHECKPOINT_H
#define REMAT_CHECKPOINT_H

#include "op.h"

/* Hooks called by the tape (op.c) and backward (autograd.c) while ctx->ckpt is set. */
void rm_ckpt_on_record(rm_ctx *ctx, rm_node *n);
void rm_ckpt_backward_begin(rm_ctx *ctx);
void rm_ckpt_before_node(rm_ctx *ctx, rm_node *n);
void rm_ckpt_after_node(rm_ctx *ctx, rm_node *n);
void rm_ckpt_backward_end(rm_ctx *ctx);

#endif
