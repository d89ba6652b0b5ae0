/* Shared helpers for CPU kernels: strided addressing, dtype dispatch, index values. */
#ifndef REMAT_KERNELS_CPU_H
#define REMAT_KERNELS_CPU_H

#include <math.h>
#include <stdio.h>

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

/* Tensor memory (kernels/cpu/memory.c): the backend's malloc/free with a block cache. */
int rm_cpu_init(rm_ctx *ctx, void **state);
void rm_cpu_shutdown(rm_ctx *ctx, void *state);
void *rm_cpu_malloc(rm_ctx *ctx, size_t n);
void rm_cpu_free(rm_ctx *ctx, void *p, size_t n);
size_t rm_cpu_reserved(rm_ctx *ctx);
size_t rm_cpu_empty_cache(rm_ctx *ctx);
int rm_cpu_memory_rates(rm_ctx *ctx, void *buf, size_t bytes, double *roundtrip, double *read);
int rm_cpu_runtime_info(rm_ctx *ctx, rm_info *info);

/* The BLAS (kernels/cpu/blas.c): opened per context at backend init. CBLAS's ABI
 * values for the layout and transpose flags. */
#define RM_BLAS_ROW_MAJOR 101
#define RM_BLAS_NOTRANS 111
#define RM_BLAS_TRANS 112
typedef void (*rm_sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha,
                            const float *a, int lda, const float *b, int ldb, float beta,
                            float *c, int ldc);
typedef void (*rm_dgemm_fn)(int order, int ta, int tb, int m, int n, int k, double alpha,
                            const double *a, int lda, const double *b, int ldb, double beta,
                            double *c, int ldc);
typedef struct rm_cpu_blas {
  void *handle;           /* NULL: the built-in GEMM */
  rm_sgemm_fn sgemm;
  rm_dgemm_fn dgemm;
  char name[64], core[32], path[256];
  const char *core_from;  /* who chose the kernels (a literal) */
  bool is_openblas, openmp, generic, warned;
} rm_cpu_blas;

void rm_cpu_blas_open(rm_cpu_blas *b);
void rm_cpu_blas_close(rm_cpu_blas *b);
void rm_cpu_blas_report(const rm_cpu_blas *b, rm_info *r);
const char *rm_cpu_simd_name(void);
/* The context's BLAS (the backend is initialised before any kernel runs). */
rm_cpu_blas *rm_cpu_blas_of(rm_ctx *ctx);
/* Logs, once (sets b->warned), when the BLAS leaves speed on the table; rm_cpu_gemm calls
 * it at the first product. Call it before calling the BLAS from several threads. */
void rm_cpu_blas_warn(rm_ctx *ctx, rm_cpu_blas *b);
/* C (m x n, ldc) = op(A) op(B) + beta C, row-major, in dtype dt; ta/tb: RM_BLAS_*. */
void rm_cpu_gemm(rm_ctx *ctx, rm_cpu_blas *b, rm_dtype dt, int ta, int tb, int64_t m, int64_t n,
                 int64_t k, const void *a, int64_t lda, const void *bm, int64_t ldb, double beta,
                 void *c, int64_t ldc);

/* Whether this CPU has AVX2 and REMAT_NO_AVX2 is not set (kernels/cpu/dropout.c picks
 * its path by it; the variable lets the specs check the portable path on any machine). */
bool rm_cpu_avx2(rm_ctx *ctx);
/* Whether it also has AVX-512 (F) and REMAT_NO_AVX512 is not set (dropout's float32
 * path; the variable lets the specs check the AVX2 path on an AVX-512 machine). */
bool rm_cpu_avx512(rm_ctx *ctx);

/* Rows for OpenMP: only parallelise loops worth a thread. */
#define RM_CPU_PAR_MIN 32768

/* Workspace bytes one call of attention, attention_backward or attention_qkv_backward
 * takes (kernels/cpu/attention.c), for dry runs. */
size_t rm_cpu_attention_workspace(rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a);
/* Bytes of workspace a triangular matmul takes (the packed k^T of the tiles, or the
 * masked copy of the fallback; 0 for a plain one), or a matmul_softmax (op). */
size_t rm_cpu_matmul_workspace(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a);
/* Whether triangular products in dt run through the tiles (float32, AVX-512). */
bool rm_cpu_tri_products(rm_ctx *ctx, rm_dtype dt);
/* One contiguous float32 row of the softmax kernel: y[0, n) = the softmax of sc x[k]
 * over k < live (the rest 0), bit for bit as that kernel computes it (kernels/cpu/
 * reduce.c); matmul_softmax runs it on scores it holds in a buffer. */
void rm_cpu_softmax_row_f32(const float *x, float *y, int64_t n, float sc, int64_t live);

/* The data of a tensor of index values (gather/index_select/embedding indices,
 * cross_entropy labels: 1-based), whichever of its four dtypes (int64, int32, or whole
 * numbers in float32/float64). */
typedef struct { const void *p; rm_dtype dt; } rm_cpu_indices;

static inline rm_cpu_indices rm_cpu_indices_of(const rm_tensor *t) {
  rm_cpu_indices p = { rm_tensor_ptr(t), t->dtype };
  return p;
}

/* 0-based position held at k (valid once rm_cpu_check_indices passed). */
static inline int64_t rm_cpu_index_at(rm_cpu_indices p, int64_t k) {
  switch (p.dt) {
  case RM_I64: return ((const int64_t *)p.p)[k] - 1;
  case RM_I32: return (int64_t)((const int32_t *)p.p)[k] - 1;
  case RM_F64: return (int64_t)((const double *)p.p)[k] - 1;
  default: return (int64_t)((const float *)p.p)[k] - 1;
  }
}

/* Checks that each value of idx is a whole number in 1..size, so that kernels never
 * read out of bounds. Raises RM_ERR_ARG "<op>: <what> <v> is out of range 1..<size>
 * (<where>)" (or "is not a whole number in 1..<size>"), where names the dimension
 * indexed (dim >= 0, 0-based; none when dim < 0) and the bad value's 1-based row-major
 * position, called `pos` ("position", "row"). Returns RM_OK or the error. */
static inline int rm_cpu_check_indices(rm_ctx *ctx, const char *op, const char *what,
                                       const rm_tensor *idx, int64_t size, int dim,
                                       const char *pos) {
  rm_cpu_indices p = rm_cpu_indices_of(idx);
  int64_t n = rm_tensor_numel(idx);
  for (int64_t k = 0; k < n; k++) {
    char where[64];
    if (rm_dtype_is_int(p.dt)) {
      int64_t v = rm_cpu_index_at(p, k) + 1;
      if (v >= 1 && v <= size) continue;
      if (dim >= 0) snprintf(where, sizeof where, "dimension %d, %s %lld", dim + 1, pos, (long long)k + 1);
      else snprintf(where, sizeof where, "%s %lld", pos, (long long)k + 1);
      return rm_fail(ctx, RM_ERR_ARG, "%s: %s %lld is out of range 1..%lld (%s)", op, what, (long long)v,
                     (long long)size, where);
    }
    double v = p.dt == RM_F64 ? ((const double *)p.p)[k] : (double)((const float *)p.p)[k];
    if (v >= 1 && v <= (double)size && v == floor(v)) continue;
    if (dim >= 0) snprintf(where, sizeof where, "dimension %d, %s %lld", dim + 1, pos, (long long)k + 1);
    else snprintf(where, sizeof where, "%s %lld", pos, (long long)k + 1);
    if (v != v) v = NAN; /* print "nan", not "-nan" */
    if (v == floor(v))
      return rm_fail(ctx, RM_ERR_ARG, "%s: %s %.17g is out of range 1..%lld (%s)", op, what, v,
                     (long long)size, where);
    return rm_fail(ctx, RM_ERR_ARG, "%s: %s %.17g is not a whole number in 1..%lld (%s)", op, what, v,
                   (long long)size, where);
  }
  return RM_OK;
}

#endif
