/* Sequential: a chain of modules, the unit that checkpoint plans talk about (one
 * layer = one child). Its forward runs in C, applying the current plan. */
#ifndef REMAT_SEQUENTIAL_H
#define REMAT_SEQUENTIAL_H

#include "module.h"

/* Runs children 0..n-1 of seq on x, returning the last output (a new hold) in *y.
 * Under a checkpoint plan (seq->plan) it keeps, evicts and pins per layer. */
int rm_sequential_forward(rm_ctx *ctx, rm_module *seq, rm_tensor *x, rm_tensor **y);

#endif
