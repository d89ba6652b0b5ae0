/* The packed form of attention (core/op_attention.c) as the kernels see it: a
 * (..., T, P·H·D) tensor (P = 3 for the packed q, k, v projection and its gradient,
 * P = 1 for y and gy) read as part p of P, a (..., H, T, D) view. Kernels of every
 * backend (C and CUDA C++) build these on the stack and run the three-input code on
 * them, so the packed form moves no data: q, k and v are read where the projection
 * wrote them, y is written as (..., T, H·D) rows, and the packed backward writes gq, gk
 * and gv into the three parts of one dqkv gradient.
 *
 * A view is a copy of t's struct with new geometry: it shares t's storage and holds no
 * reference (the caller holds t while the kernel runs), so it is never held, dropped
 * or recorded. t must have fewer than RM_MAX_DIM dims (the op's infer checks). */
#ifndef REMAT_ATTENTION_VIEWS_H
#define REMAT_ATTENTION_VIEWS_H

#include "tensor.h"

static inline void rm_attention_part(const rm_tensor *t, int64_t heads, int64_t part, int64_t parts,
                                     rm_tensor *view) {
  int n = t->ndim;
  int64_t T = t->shape[n - 2], s = t->stride[n - 1], D = t->shape[n - 1] / (parts * heads);
  *view = *t;
  view->ndim = n + 1;
  view->shape[n - 2] = heads;
  view->stride[n - 2] = D * s;
  view->shape[n - 1] = T;
  view->stride[n - 1] = t->stride[n - 2];
  view->shape[n] = D;
  view->stride[n] = s;
  view->offset = t->offset + part * heads * D * s;
}

/* The packed backward's inputs qkv, y, lse, gy (in[0..3]) as the three-input backward
 * takes them: views[0..4] are q, k, v, y, gy; args = { q, k, v, y, lse, gy }. */
static inline void rm_attention_qkv_backward_args(rm_tensor *const *in, int64_t heads, rm_tensor views[5],
                                                  const rm_tensor *args[6]) {
  for (int i = 0; i < 3; i++) rm_attention_part(in[0], heads, i, 3, &views[i]);
  rm_attention_part(in[1], heads, 0, 1, &views[3]);
  rm_attention_part(in[3], heads, 0, 1, &views[4]);
  args[0] = &views[0];
  args[1] = &views[1];
  args[2] = &views[2];
  args[3] = &views[3];
  args[4] = in[2];
  args[5] = &views[4];
}

#endif
