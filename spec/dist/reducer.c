/* The gradient reducer from C, without Lua (spec/dist_spec.lua builds this against the
 * core headers and libremat.a and runs it under mpirun -np 2).
 *
 * Each rank has the same parameters and its own input; one backward must leave on
 * every rank the gradients averaged over the ranks (the reducer is hooked into it),
 * a backward with the reducer disarmed only the local ones, and rm_reducer_sync then
 * the average of those. Prints "RESULT <rank> reducer_c ok", or what went wrong. */
#include <math.h>
#include <stdio.h>

#include "autograd.h"
#include "dist.h"
#include "ops.h"

static int fails;

static void expect(int rank, const char *what, rm_tensor *g, const double *want, int n) {
  const float *v = rm_tensor_ptr(g);
  for (int i = 0; i < n; i++)
    if (fabs(v[i] - want[i]) > 1e-5) {
      printf("RESULT %d reducer_c %s: element %d is %g, expected %g\n", rank + 1, what, i, v[i], want[i]);
      fails++;
      return;
    }
}

/* loss = sum(x w): dloss/dw[k][j] = sum over rows of x[., k] = 2 (rank + 1) (rows of 2) */
static int step(rm_ctx *ctx, rm_tensor *w, double xval) {
  int64_t xs[2] = { 2, 3 };
  rm_tensor *x = rm_full(ctx, RM_F32, RM_CPU, 2, xs, xval);
  rm_tensor *y = x ? rm_matmul(ctx, x, w) : NULL;
  rm_tensor *loss = y ? rm_sum(ctx, y, RM_DIM_ALL, false) : NULL;
  int rc = loss ? rm_backward(ctx, loss, NULL) : ctx->err_code;
  rm_tensor_drop(ctx, x);
  rm_tensor_drop(ctx, y);
  rm_tensor_drop(ctx, loss);
  return rc;
}

int main(void) {
  rm_ctx *ctx = rm_ctx_new(NULL, NULL, NULL);
  rm_dist d;
  rm_dist_defaults(&d);
  if (!ctx || rm_dist_init(ctx, &d)) {
    printf("RESULT 1 reducer_c init: %s\n", ctx ? rm_errmsg(ctx) : "no context");
    return 1;
  }
  int64_t ws[2] = { 3, 4 };
  rm_tensor *w = rm_full(ctx, RM_F32, RM_CPU, 2, ws, 0.5);
  w->requires_grad = true;
  rm_reducer *r = rm_reducer_new(ctx, &d, 1, &w, 1 << 20);
  if (!r) {
    printf("RESULT %d reducer_c new: %s\n", d.rank + 1, rm_errmsg(ctx));
    return 1;
  }
  double mean = 0;   /* the average over ranks of 2 (rank + 1) */
  for (int k = 0; k < d.size; k++) mean += 2.0 * (k + 1) / d.size;
  double want[12];

  /* armed: backward returns with the average */
  if (step(ctx, w, d.rank + 1)) printf("RESULT %d reducer_c backward: %s\n", d.rank + 1, rm_errmsg(ctx)), fails++;
  for (int i = 0; i < 12; i++) want[i] = mean;
  expect(d.rank, "armed backward", w->grad, want, 12);

  /* disarmed (no_sync): the local gradient accumulates; sync averages the sum */
  rm_tensor_drop(ctx, w->grad);
  w->grad = NULL;
  rm_reducer_arm(r, false);
  if (step(ctx, w, d.rank + 1)) printf("RESULT %d reducer_c backward: %s\n", d.rank + 1, rm_errmsg(ctx)), fails++;
  for (int i = 0; i < 12; i++) want[i] = 2.0 * (d.rank + 1);
  expect(d.rank, "disarmed backward", w->grad, want, 12);
  if (rm_reducer_sync(r)) printf("RESULT %d reducer_c sync: %s\n", d.rank + 1, rm_errmsg(ctx)), fails++;
  for (int i = 0; i < 12; i++) want[i] = mean;
  expect(d.rank, "sync", w->grad, want, 12);

  if (!fails) printf("RESULT %d reducer_c ok\n", d.rank + 1);
  rm_reducer_free(r);
  rm_tensor_drop(ctx, w);
  rm_dist_finalize(&d);
  rm_ctx_free(ctx);
  return fails != 0;
}
