/* Checkpoint engine (plans arrive with the checkpointing work; hooks are no-ops now). */
#include "checkpoint.h"

void rm_ckpt_on_record(rm_ctx *ctx, rm_node *n) { (void)ctx; (void)n; }
void rm_ckpt_backward_begin(rm_ctx *ctx) { (void)ctx; }
void rm_ckpt_before_node(rm_ctx *ctx, rm_node *n) { (void)ctx; (void)n; }
void rm_ckpt_after_node(rm_ctx *ctx, rm_node *n) { (void)ctx; (void)n; }
void rm_ckpt_backward_end(rm_ctx *ctx) { (void)ctx; }
