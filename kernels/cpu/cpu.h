/* Shared helpers for CPU kernels: strided addressing and dtype dispatch. */
#ifndef REMAT_KERNELS_CPU_H
#define REMAT_KERNELS_CPU_H

#include "../../core/backend.h"

/* Kernel signature (see core/backend.h). */
#define RM_CPU_KERNEL(name) \
  int rm_cpu_##name(rm_ctx *ctx, int nin, rm_tensor *const *in, int nout, \
                    rm_tensor *const *out, const rm_attrs *a)

/* Element offset (in elements, from the view's first element) of the linear index i
 * of a tensor walked in row-major order of its shape. */
static inline int64_t rm_cpu_offset(const rm_tensor *t, int64_t i) {
  int64_t off = 0;
  for (int d = t->ndim - 1; d >= 0; d--) {
    int64_t s = t->shape[d];
    off += (i % s) * t->stride[d];
    i /= s;
  }
  return off;
}

/* Rows for OpenMP: only parallelise loops worth a thread. */
#define RM_CPU_PAR_MIN 32768

#endif
