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

#endif
