/* How a strided matrix, and a batch of them, reaches a row-major GEMM (the CPU's BLAS,
 * cuBLAS) without a copy: shared by kernels/cpu/matmul.c and kernels/cuda/matmul.cu. */
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

/* For a batch of products over batch shape bshape[nb] with A's and B's batch strides
 * sa, sb (0: broadcast): whether it is one product, B shared by every batch and A's
 * batches (not passed transposed, leading dimension lda, M rows each) stacked into
 * batch * M rows. */
static inline bool rm_batch_folds(bool a_tr, int64_t M, int64_t lda, int nb, const int64_t *bshape,
                                  const int64_t *sa, const int64_t *sb) {
  if (a_tr) return false;
  int64_t expect = M * lda;
  for (int d = nb - 1; d >= 0; d--) {
    if (bshape[d] == 1) continue;
    if (sb[d] != 0 || sa[d] != expect) return false;
    expect *= bshape[d];
  }
  return true;
}

/* Element offsets in A and B of batch i (row-major over bshape[nb]). */
static inline void rm_batch_offsets(int64_t i, int nb, const int64_t *bshape, const int64_t *sa,
                                    const int64_t *sb, int64_t *oa, int64_t *ob) {
  int64_t a = 0, b = 0, q = i;
  for (int d = nb - 1; d >= 0; d--) {
    int64_t k = q % bshape[d];
    q /= bshape[d];
    a += k * sa[d];
    b += k * sb[d];
  }
  *oa = a;
  *ob = b;
}

#endif
