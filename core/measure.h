/* Per-layer measurement during dry runs (plan.c): FLOPs, kept bytes, and forward and
 * backward memory peaks, attributed to the layers of the Sequential being planned. */
#ifndef REMAT_MEASURE_H
#define REMAT_MEASURE_H

#include "plan.h"

typedef struct rm_measure {
  int n;
  rm_layer_stats *layers;     /* n */
  rm_device device;
  int bwd_layer;              /* layer whose backward window is open (-1: none) */
  size_t window_start;        /* live activation bytes when the window opened */
  size_t layer_start;         /* live activation bytes at the current layer's start */
  size_t *tag_live;           /* live activation bytes allocated per layer (n) */
  rm_tensor **outs;           /* each layer's output (retained) until the forward is done (n) */
  bool in_loss;               /* between the forward's end and the first layer's backward */
  size_t fwd_end;             /* live activation bytes when the forward ended */
  size_t loss_peak, held;     /* see rm_sim */
} rm_measure;

void rm_measure_layer_begin(rm_ctx *ctx, rm_measure *m, int layer, rm_tensor *x);
void rm_measure_layer_end(rm_ctx *ctx, rm_measure *m, int layer, rm_tensor *x, rm_tensor *y);
void rm_measure_on_op(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in,
                      const rm_attrs *a, rm_tensor *const *out);
/* Opens the backward window of n's layer when backward moves to another layer. */
void rm_measure_before_node(rm_ctx *ctx, rm_measure *m, rm_node *n);
/* After the forward: records which layer outputs are still live, releases them. */
void rm_measure_outputs_done(rm_ctx *ctx, rm_measure *m);
/* Closes the open backward window. */
void rm_measure_close(rm_ctx *ctx, rm_measure *m);

#endif
