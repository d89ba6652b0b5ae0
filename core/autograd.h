/* Reverse-mode autograd over the tape of recorded nodes. */
#ifndef REMAT_AUTOGRAD_H
#define REMAT_AUTOGRAD_H

#include "op.h"

/* Backpropagates from root. grad: d(out)/d(root), or NULL for a one-element root (1).
 * Accumulates into .grad of leaves that require grad (category grad); frees each
 * node's saved data and gradients as soon as its backward has run. */
int rm_backward(rm_ctx *ctx, rm_tensor *root, rm_tensor *grad);
/* Fires RM_HOOK_NODE_BEFORE/AFTER around each node's backward, RM_HOOK_GRAD_READY once
 * per leaf as soon as its gradient is final, and RM_HOOK_BACKWARD_DONE at the end. */

/* Accumulates g into *acc (allocating it in category cat on first use). */
int rm_accumulate(rm_ctx *ctx, rm_tensor **acc, rm_tensor *g, rm_category cat);

#endif
