/* Per-layer measurement during dry runs (plan.c): FLOPs, kept bytes, and forward and
 * backward memory peaks, attributed to the layers of the Sequential being planned.
 * It listens on the hook table (allocations, ops, layers, backward nodes); nothing in
 * the core calls it. */
#ifndef REMAT_MEASURE_H
#define REMAT_MEASURE_H

#include "plan.h"

typedef struct rm_measure {
  rm_module *seq;             /* the Sequential measured (events of others are ignored) */
  int n;
  rm_layer_stats *layers;     /* n; owned by the caller */
  rm_device device;
  uint32_t epoch;             /* the dry run measured: storages of others are not counted */
  int cur;                    /* layer new activations belong to (-1: none) */
  int bwd_layer;              /* layer whose backward window is open (-1: none) */
  size_t window;              /* activation high-water mark since the window opened */
  size_t window_start;        /* live activation bytes when the backward window opened */
  size_t layer_start;         /* live activation bytes at the current layer's start */
  size_t *tag_live;           /* n: live activation bytes allocated per layer */
  uint64_t *first_seq;        /* n: tape nodes of layer i have seq in (first_seq, last_seq] */
  uint64_t *last_seq;
  rm_tensor **outs;           /* n: each layer's output (retained) until the forward is done */
  bool in_loss;               /* between the forward's end and the first layer's backward */
  size_t fwd_end;             /* live activation bytes when the forward ended */
  size_t loss_peak, held;     /* see rm_sim */
} rm_measure;

/* Starts measuring seq's layers into layers[0..n-1] on dev (inside a dry run). */
int rm_measure_begin(rm_ctx *ctx, rm_measure *m, rm_module *seq, rm_device dev,
                     rm_layer_stats *layers);
/* After the forward: which layer outputs are still live (releases them), and the live
 * bytes each layer allocated (layers[].saved). */
void rm_measure_outputs_done(rm_ctx *ctx, rm_measure *m);
/* Closes the open backward window (after the backward). */
void rm_measure_close(rm_ctx *ctx, rm_measure *m);
/* Stops listening and frees what begin allocated (not layers). */
void rm_measure_end(rm_ctx *ctx, rm_measure *m);

#endif
