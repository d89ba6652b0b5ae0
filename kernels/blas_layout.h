/* How a strided matrix reaches a row-major GEMM (the CPU's BLAS, cuBLAS) without a copy:
 * shared by kernels/cpu/matmul.c and kernels/cuda/matmul.cu. */
#ifndef REMAT_BLAS_LAYOUT_H
#define REMAT_BLAS_LAYOUT_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct {
  bool tr;            /* passed transposed */
  int64_t ld;         /* leading dimension */
} rm_blasmat;

/* Whether a rows x cols matrix with strides (sr, sc) can be passed to GEMM directly
 * (its rows or its columns contiguous); fills m when it can. Size-1 dims may have any
 * stride. */
static inline bool rm_as_blas(int64_t rows, int64_t cols, int64_t sr, int64_t sc, rm_blasmat *m) {
  if ((cols == 1 || sc == 1) && (rows == 1 || sr >= cols)) {
    m->tr = false;
    m->ld = rows == 1 ? (cols > 1 ? cols : 1) : sr;
    return m->ld < INT_MAX;
  }
  if ((rows == 1 || sr == 1) && (cols == 1 || sc >= rows)) {
    m->tr = true;
    m->ld = cols == 1 ? (rows > 1 ? rows : 1) : sc;
    return m->ld < INT_MAX;
  }
  return false;
}

#endif
