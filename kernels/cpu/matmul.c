/* CPU kernels for matmul and linear over the BLAS's GEMM (kernels/cpu/blas.c). Both ops take strided inputs:
 * a matrix whose rows or columns are contiguous (a transpose, a narrow) goes to BLAS as
 * is, with the matching transpose flag and leading dimension; anything else is first
 * copied into a contiguous workspace tensor.
 * A triangular product (matmul's tri attrs, core/ops.def) runs in float32 on AVX-512
 * through its own tiles, which compute only the triangle's part (tri_f32_avx512);
 * elsewhere it is the plain product of a masked copy of the triangular operand, or the
 * plain product masked afterwards (the reference the tiles are checked against). */
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#include "../blas_layout.h"
#include "../../core/ops.h"

typedef rm_blasmat blasmat;

/* FLOPs below which one product of a batch runs on one thread (see matmul's kernel). */
#define SMALL_PRODUCT (32.0 * 1024 * 1024)

/* A contiguous workspace copy of t (new hold), or NULL with the ctx error set. */
static rm_tensor *workspace_copy(rm_ctx *ctx, rm_tensor *t) {
  rm_tensor *c = rm_tensor_new(ctx, t->dtype, t->device, t->ndim, t->shape, RM_CAT_WORKSPACE);
  if (!c) return NULL;
  if (rm_op_into(ctx, RM_OP_COPY, 1, &t, NULL, 1, &c)) { rm_tensor_drop(ctx, c); return NULL; }
  return c;
}

/* C (m x n, ldc) = op(A) op(B) + beta * C, in dt. */
static void gemm(rm_ctx *ctx, rm_dtype dt, blasmat ma, blasmat mb, int64_t m, int64_t n, int64_t k,
                 const void *a, const void *b, double beta, void *c, int64_t ldc) {
  rm_cpu_gemm(ctx, rm_cpu_blas_of(ctx), dt, ma.tr ? RM_BLAS_TRANS : RM_BLAS_NOTRANS,
              mb.tr ? RM_BLAS_TRANS : RM_BLAS_NOTRANS, m, n, k, a, ma.ld, b, mb.ld, beta, c, ldc);
}

/* One operand of matmul seen as a batch of (rows x cols) matrices; 1-D operands are
 * promoted (a: 1 x K, b: K x 1). */
typedef struct {
  rm_tensor *t;       /* the tensor read (maybe a workspace copy) */
  int nbatch;         /* batch dims of t */
  int64_t rows, cols, sr, sc;
  blasmat bm;
} operand;

static void operand_geo(operand *o, rm_tensor *t, bool left) {
  o->t = t;
  if (t->ndim == 1) {
    o->nbatch = 0;
    o->rows = left ? 1 : t->shape[0];
    o->cols = left ? t->shape[0] : 1;
    o->sr = left ? t->shape[0] * t->stride[0] : t->stride[0];
    o->sc = left ? t->stride[0] : 1;
  } else {
    o->nbatch = t->ndim - 2;
    o->rows = t->shape[t->ndim - 2];
    o->cols = t->shape[t->ndim - 1];
    o->sr = t->stride[t->ndim - 2];
    o->sc = t->stride[t->ndim - 1];
  }
}

/* Sets o up for BLAS, copying t into a workspace when its layout does not fit.
 * *copy receives the copy to drop (or NULL). */
static int operand_prepare(rm_ctx *ctx, operand *o, rm_tensor *t, bool left, rm_tensor **copy) {
  *copy = NULL;
  operand_geo(o, t, left);
  if (rm_as_blas(o->rows, o->cols, o->sr, o->sc, &o->bm)) return RM_OK;
  *copy = workspace_copy(ctx, t);
  if (!*copy) return ctx->err_code;
  operand_geo(o, *copy, left);
  rm_as_blas(o->rows, o->cols, o->sr, o->sc, &o->bm);
  return RM_OK;
}

/* Product i of a batched matmul: y[i] = A[i] B[i] with A's and B's batch offsets
 * from the output batch shape (strides 0 broadcast). */
static void batch_gemm(rm_ctx *ctx, rm_dtype dt, const operand *A, const operand *B, int nb, const int64_t *bshape,
                       const int64_t *sa, const int64_t *sb, int64_t i, const char *pa, const char *pb, char *py) {
  const int64_t es = (int64_t)rm_dtype_size(dt), M = A->rows, K = A->cols, N = B->cols;
  int64_t oa, ob;
  rm_batch_offsets(i, nb, bshape, sa, sb, &oa, &ob);
  gemm(ctx, dt, A->bm, B->bm, M, N, K, pa + oa * es, pb + ob * es, 0.0, py + i * M * N * es, N);
}

/* Element strides of o's batch dims aligned to the output batch shape (0: broadcast). */
static void batch_strides(const operand *o, int nb, const int64_t *bshape, int64_t *st) {
  int off = nb - o->nbatch;
  for (int d = 0; d < nb; d++) {
    int k = d - off;
    st[d] = (k < 0 || o->t->shape[k] == 1 || bshape[d] == 1) ? 0 : o->t->stride[k];
  }
}

/* ---- triangular products ---- */

/* Sets to fill the entries outside the triangle (the diagonal and what lies below it, or
 * above it with upper) of each of the n contiguous (T x T) matrices at p. */
static void tri_fill(rm_dtype dt, void *p, int64_t n, int64_t T, bool upper, double fill) {
  _Pragma("omp parallel for if (n * T * T > RM_CPU_PAR_MIN)")
  for (int64_t r = 0; r < n * T; r++) {
    int64_t i = r % T, lo = upper ? 0 : i + 1, hi = upper ? i : T;
    if (dt == RM_F64) {
      double *row = (double *)p + r * T;
      for (int64_t j = lo; j < hi; j++) row[j] = fill;
    } else {
      float *row = (float *)p + r * T;
      for (int64_t j = lo; j < hi; j++) row[j] = (float)fill;
    }
  }
}

/* A contiguous workspace copy of the triangular operand t, 0 outside its triangle (the
 * operand the plain product then reads), or NULL with the ctx error set. */
static rm_tensor *tri_masked_copy(rm_ctx *ctx, rm_tensor *t, bool upper) {
  rm_tensor *c = workspace_copy(ctx, t);
  if (!c) return NULL;
  int64_t T = t->shape[t->ndim - 1], n = T ? rm_tensor_numel(t) / (T * T) : 0;
  tri_fill(t->dtype, rm_tensor_ptr(c), n, T, upper, 0.0);
  return c;
}

/* Tiles of TRI_ROWS x TRI_COLS results (8 rows, two 16-float vectors), each computed by
 * one thread over its k range in order: the bits do not depend on the thread count. */
#define TRI_ROWS 8
#define TRI_COLS 32

/* Columns of a packed B (N rounded up to whole tiles), and tri_bad's int64 per product
 * (tri = a: N of them, b: M, then a flag). */
static int64_t tri_np(int64_t N) { return (N + TRI_COLS - 1) / TRI_COLS * TRI_COLS; }
static int64_t tri_bad_len(int tri, int64_t M, int64_t N) {
  return tri == RM_TRI_A ? N + 1 : tri == RM_TRI_B ? M + 1 : 0;
}

/* Threads the tiles of a batch of products run on: one below RM_CPU_PAR_MIN multiply-adds
 * or inside a parallel region (the kernel and its dry-run workspace agree on it). */
static int tri_threads(int64_t batch, int64_t M, int64_t N, int64_t K) {
  bool par = (double)batch * (double)M * (double)N * (double)K > RM_CPU_PAR_MIN && !omp_in_parallel();
  return par ? omp_get_max_threads() : 1;
}

#if defined(__x86_64__) && defined(__GNUC__)

typedef struct {
  int tri;
  bool upper, packed;           /* packed: B copied per product (its rows not contiguous) */
  float fill;
  int64_t M, N, K, Np, tiles;   /* tiles: row tiles per product */
  const operand *A, *B;
  int nb;
  const int64_t *bshape, *sa, *sb;
  const float *pa, *pb;
  float *bp;                    /* packed: each product's B (K x Np), 0 outside B's triangle and past N */
  float *py;
  int64_t *bad;                 /* tri_bad's, tri_bad_len a product */
  /* matmul_softmax: each row tile's scores go to its thread's rows (TRI_ROWS x Np),
   * and y gets the causal softmax of sc times them, row by row */
  bool softmax;
  float sc;
  float *rows;
} tri_job;

/* Where the other operand of a triangular one holds inf or NaN. A masked copy's product
 * multiplies them by the zeros outside the triangle (NaN), which the tiles never visit:
 * they write that NaN afterwards (tri_bad_fix), so both paths give the plain product of
 * a masked copy.
 * tri = a: per column j of B, the last row k holding one (lower: row i of the result is
 * NaN there when k > i) or the first (upper: when k < i); tri = b: per row i of A, the
 * first column k (b lower keeps k >= j: NaN at j > k) or the last (upper: at j < k).
 * bad[L] is 1 when any was found (L = N or M). */
static void tri_bad(const tri_job *J, int64_t i) {
  int64_t oa, ob;
  rm_batch_offsets(i, J->nb, J->bshape, J->sa, J->sb, &oa, &ob);
  const bool ta = J->tri == RM_TRI_A, up = J->upper;
  const int64_t L = ta ? J->N : J->M, R = J->K, none = ta != up ? -1 : R;
  const operand *o = ta ? J->B : J->A;
  const float *p = ta ? J->pb + ob : J->pa + oa;
  const int64_t sl = ta ? o->sc : o->sr, sk = ta ? o->sr : o->sc;   /* strides along L and along K */
  int64_t *bad = J->bad + i * (L + 1);
  bad[L] = 0;
  /* first whether there is any (0 x inf and 0 x NaN are NaN), in one pass along the
   * operand's contiguous dim: the search below is per line, in an order with no locality */
  const bool lfast = sl == 1 || sl < sk;
  const int64_t n_out = lfast ? R : L, n_in = lfast ? L : R, s_out = lfast ? sk : sl, s_in = lfast ? sl : sk;
  float z = 0.0f;
  for (int64_t u = 0; u < n_out; u++) {
    const float *q = p + u * s_out;
    _Pragma("omp simd reduction(+:z)")
    for (int64_t w = 0; w < n_in; w++) z += q[w * s_in] * 0.0f;
  }
  if (z == 0.0f) return;
  for (int64_t l = 0; l < L; l++) {
    int64_t at = none;
    for (int64_t k = 0; k < R; k++) {
      float v = p[l * sl + k * sk];
      if (!(v - v == 0.0f)) {   /* inf or NaN */
        at = k;
        if (ta == up) break;           /* the first is wanted */
      }
    }
    bad[l] = at;
    bad[L] |= at != none;
  }
}

/* tri_bad, then its NaN in product i's result. Run after the product's tiles: the
 * operand is in cache then, and when it holds no inf or NaN (the usual case) the check
 * is one pass over it. */
static void tri_bad_fix(const tri_job *J, int64_t i) {
  tri_bad(J, i);
  const bool ta = J->tri == RM_TRI_A, up = J->upper;
  const int64_t L = ta ? J->N : J->M, M = J->M, N = J->N;
  const int64_t *bad = J->bad + i * (L + 1);
  if (!bad[L]) return;
  float *y = J->py + i * M * N;
  for (int64_t row = 0; row < M; row++)
    for (int64_t j = 0; j < N; j++) {
      int64_t k = ta ? bad[j] : bad[row];
      bool nan = ta ? (up ? k < row : k > row) : (up ? k > j : k < j);
      if (nan) y[row * N + j] = NAN;
    }
}

/* The tiles use AVX-512F only (rm_cpu_avx512 checks for it at run time). */
#define RM_V4 __attribute__((target("avx512f")))

/* Bits lo..hi-1 of 32 (none when hi <= lo). */
RM_V4 static inline __attribute__((always_inline)) uint32_t lanes_(int64_t lo, int64_t hi) {
  if (hi <= lo) return 0;
  uint32_t h = hi >= 32 ? 0xffffffffu : (1u << hi) - 1, l = lo <= 0 ? 0 : lo >= 32 ? 0xffffffffu : (1u << lo) - 1;
  return h & ~l;
}

/* B of product i (not row-contiguous: k^T, a view of k) packed into J->bp: 16 columns at
 * a time, row k of them one gather (16 rows of k, 32 floats each, stay in cache for all
 * of its k; one element at a time, the scattered stores took a sixth of the scores'
 * time), 0 outside B's triangle (tri = b) and past N. */
RM_V4 static void tri_pack(const tri_job *J, int64_t i) {
  int64_t oa, ob;
  rm_batch_offsets(i, J->nb, J->bshape, J->sa, J->sb, &oa, &ob);
  const float *b = J->pb + ob;
  float *d = J->bp + i * J->K * J->Np;
  const int64_t sr = J->B->sr, sc = J->B->sc, N = J->N, Np = J->Np;
  const bool tb = J->tri == RM_TRI_B, up = J->upper;
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32((int)sc));
  for (int64_t j0 = 0; j0 < Np; j0 += 16) {
    for (int64_t r = j0 + 16; sr == 1 && r < j0 + 32 && r < N; r++)
      for (int64_t k = 0; k < J->K; k += 16) __builtin_prefetch(b + r * sc + k);
    for (int64_t k = 0; k < J->K; k++) {
      /* the columns j0 + c before N, and in B's triangle: row k keeps j <= k (>= with upper) */
      uint32_t m = lanes_(0, N - j0);
      if (tb) m &= up ? lanes_(k - j0, 32) : lanes_(0, k - j0 + 1);
      __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), (__mmask16)(m & 0xffff), idx,
                                          b + k * sr + (m ? j0 * sc : 0), 4);
      _mm512_storeu_ps(d + k * Np + j0, v);
    }
  }
}

/* The rows of a tile: ar[r] points at row i0 + r of A (the last row again past M). */
#define TRI_EACH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define TRI_ACC(r) __m512 c##r##a = _mm512_setzero_ps(), c##r##b = _mm512_setzero_ps();
#define TRI_FMA(r) { __m512 x = _mm512_set1_ps(ar[r][k * sc]); \
                     c##r##a = _mm512_fmadd_ps(x, b0, c##r##a); c##r##b = _mm512_fmadd_ps(x, b1, c##r##b); }
/* a's entries outside its triangle are left out: row i0 + r keeps k <= i0 + r (k >= with
 * upper); its terms are not multiplied by 0 (an inf or NaN of b there does not reach the
 * sum, as in a term past the edge, which is not visited at all) */
#define TRI_FMA_EDGE(r) { __mmask16 in = (upper ? k >= i0 + r : k <= i0 + r) ? 0xffff : 0;                 \
                          __m512 x = _mm512_set1_ps(ar[r][k * sc]);                                       \
                          c##r##a = _mm512_mask3_fmadd_ps(x, b0, c##r##a, in);                            \
                          c##r##b = _mm512_mask3_fmadd_ps(x, b1, c##r##b, in); }
/* b's row k keeps the lanes bm (its triangle's edge, tri = b): the others left out */
#define TRI_FMA_LANES(r) { __m512 x = _mm512_set1_ps(ar[r][k * sc]);                                      \
                           c##r##a = _mm512_mask3_fmadd_ps(x, b0, c##r##a, (__mmask16)(bm & 0xffff));      \
                           c##r##b = _mm512_mask3_fmadd_ps(x, b1, c##r##b, (__mmask16)(bm >> 16)); }
/* row r's columns of the tile, by masked stores: those before N, and of a triangular
 * result (out) those in its triangle, j >= i (upper) or j <= i */
#define TRI_STORE(r) if (r < rows) {                                                              \
    int64_t d = i0 + r - j0;                                                                      \
    uint32_t m = lanes_(out && upper ? d : 0, out && !upper && d + 1 < cols ? d + 1 : cols);      \
    _mm512_mask_storeu_ps(y + r * ldy, (__mmask16)(m & 0xffff), c##r##a);                        \
    _mm512_mask_storeu_ps(y + r * ldy + 16, (__mmask16)(m >> 16), c##r##b); }

/* The two halves of B's row k in j0's tile: the columns cm keeps (those before N), and
 * of them, in B's triangle's edge (tri = b), those its row k keeps. */
#define TRI_LOAD_B(edge) \
    uint32_t bm = cm;                                                                         \
    if (edge) bm &= upper ? lanes_(k - j0, 32) : lanes_(0, k - j0 + 1);                        \
    __m512 b0 = _mm512_maskz_loadu_ps((__mmask16)(bm & 0xffff), bp + k * ldb),                  \
           b1 = _mm512_maskz_loadu_ps((__mmask16)(bm >> 16), bp + k * ldb + 16);

/* y's rows r < rows, columns c < cols of the tile at column j0 (those of a triangular
 * result's triangle) = sum over k in [k0, k1) of A(i0 + r, k) B(k, j0 + c), B's row k at
 * bp + k ldb (the tile's columns first); the k in [e0, e1) are the edge of a's triangle
 * (tri = a: row i0 + r keeps k <= i0 + r, >= with upper) or of b's (tri = b: row k keeps
 * j <= k, >= with upper). */
RM_V4 static inline __attribute__((always_inline)) void tri_tile(const float *const *ar, int64_t sc, const float *bp,
    int64_t ldb, int64_t k0, int64_t k1, int64_t e0, int64_t e1, int tri, bool upper, int64_t i0, int64_t j0,
    int64_t rows, int64_t cols, float *y, int64_t ldy) {
  const bool out = tri == RM_TRI_OUT;
  TRI_EACH(TRI_ACC)
  const uint32_t cm = lanes_(0, cols);
  e0 = e0 < k0 ? k0 : e0 > k1 ? k1 : e0;
  e1 = e1 < e0 ? e0 : e1 > k1 ? k1 : e1;
  for (int64_t k = k0; k < e0; k++) {
    TRI_LOAD_B(false)
    TRI_EACH(TRI_FMA)
  }
  for (int64_t k = e0; k < e1; k++) {
    TRI_LOAD_B(tri == RM_TRI_B)
    if (tri == RM_TRI_A) { TRI_EACH(TRI_FMA_EDGE) }
    else if (tri == RM_TRI_B) { TRI_EACH(TRI_FMA_LANES) }
    else { TRI_EACH(TRI_FMA) }
  }
  for (int64_t k = e1; k < k1; k++) {
    TRI_LOAD_B(false)
    TRI_EACH(TRI_FMA)
  }
  TRI_EACH(TRI_STORE)
}

/* n copies of v at p. Plain stores, not streaming ones: a result's block usually comes
 * back from the allocator's pool still in cache (streaming stores halved a hot call's
 * speed and gained a tenth only where everything came from memory). */
RM_V4 static inline __attribute__((always_inline)) void fill_f32(float *p, int64_t n, float v) {
  __m512 x = _mm512_set1_ps(v);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) _mm512_storeu_ps(p + j, x);
  if (j < n) _mm512_mask_storeu_ps(p + j, (__mmask16)((1u << (n - j)) - 1), x);
}

/* Row tile t of product i: its tiles over the columns and k the triangle needs, stored
 * where the result's triangle keeps them, and the fill outside a triangular result. */
RM_V4 static void tri_task(const tri_job *J, int64_t task) {
  int64_t i = task / J->tiles, i0 = task % J->tiles * TRI_ROWS, M = J->M, N = J->N, K = J->K;
  int64_t rows = M - i0 < TRI_ROWS ? M - i0 : TRI_ROWS;
  int64_t oa, ob;
  rm_batch_offsets(i, J->nb, J->bshape, J->sa, J->sb, &oa, &ob);
  const float *ar[TRI_ROWS];
  for (int r = 0; r < TRI_ROWS; r++) ar[r] = J->pa + oa + (i0 + (r < rows ? r : rows - 1)) * J->A->sr;
  /* the next tile's rows of a (q in the scores: apart in the qkv projection, and in
   * memory when a replay reads them), fetched while this tile computes */
  for (int64_t r = i0 + TRI_ROWS; r < i0 + 2 * TRI_ROWS && r < M && J->A->sc == 1; r++)
    for (int64_t k = 0; k < K && k < 64; k += 16) __builtin_prefetch(J->pa + oa + r * J->A->sr + k);
  /* and its rows of the result, for writing: a triangular result's lines outside the
   * triangle are only written, and a result's block that comes from memory (the
   * allocator's pool does not say) would otherwise be read line by line as they are */
  for (int64_t r = i0 + TRI_ROWS; r < i0 + 2 * TRI_ROWS && r < M; r++)
    for (int64_t j = 0; j < N; j += 16) __builtin_prefetch(J->py + i * M * N + r * N + j, 1, 3);
  const float *bp = J->packed ? J->bp + i * K * J->Np : J->pb + ob;
  const int64_t ldb = J->packed ? J->Np : J->B->sr;
  float *y = J->py + i * M * N + i0 * N;
  /* where the tiles go: y, or this thread's rows (matmul_softmax) */
  float *t = J->softmax ? J->rows + omp_get_thread_num() * TRI_ROWS * J->Np : y;
  const int64_t ldt = J->softmax ? J->Np : N;
  const bool out = J->tri == RM_TRI_OUT, up = J->upper;
  int64_t j0 = out && up ? i0 / TRI_COLS * TRI_COLS : 0;
  for (; j0 < N && !(out && !up && j0 > i0 + rows - 1); j0 += TRI_COLS) {
    int64_t k0 = 0, k1 = K, e0 = 0, e1 = 0;
    if (J->tri == RM_TRI_A) {
      e0 = i0, e1 = i0 + rows;
      if (up) k0 = i0; else k1 = i0 + rows < K ? i0 + rows : K;
    } else if (J->tri == RM_TRI_B) {
      e0 = j0, e1 = j0 + TRI_COLS;
      if (up) k1 = j0 + TRI_COLS < K ? j0 + TRI_COLS : K; else k0 = j0;
    }
    int64_t cols = N - j0 < TRI_COLS ? N - j0 : TRI_COLS;
    tri_tile(ar, J->A->sc, bp + j0, ldb, k0, k1, e0, e1, J->tri, up, i0, j0, rows, cols, t + j0, ldt);
  }
  if (J->softmax) {   /* row i0 + r sees its first i0 + r + 1 scores (the softmax kernel's rows) */
    for (int64_t r = 0; r < rows; r++) rm_cpu_softmax_row_f32(t + r * ldt, y + r * N, N, J->sc, i0 + r + 1);
    return;
  }
  for (int64_t r = 0; out && r < rows; r++) {
    int64_t row = i0 + r;
    if (up) fill_f32(y + r * N, row, J->fill);
    else if (row + 1 < N) fill_f32(y + r * N + row + 1, N - row - 1, J->fill);
  }
}

/* The triangular product y = A B (float32, AVX-512) of the batch: B packed per product
 * (a workspace of batch x K x Np floats), then the row tiles, interleaved over the
 * threads (the triangle makes later tiles longer or shorter). softmax (matmul_softmax):
 * y is the causal softmax of sc times the product (tri: the result, lower), which is
 * never stored. */
static int tri_f32_avx512(rm_ctx *ctx, const rm_attrs *a, rm_tensor *y, const operand *A, const operand *B, int nb,
                          const int64_t *bshape, const int64_t *sa, const int64_t *sb, int64_t batch,
                          bool softmax, float sc) {
  int64_t M = A->rows, K = A->cols, N = B->cols, Np = tri_np(N);
  const bool packed = B->sc != 1;
  int64_t nbad = tri_bad_len((int)a->matmul.tri, M, N), npk = packed ? batch * K * Np : 0;
  const int nthr = tri_threads(batch, M, N, K);
  int64_t nrows = softmax ? (int64_t)nthr * TRI_ROWS * Np : 0;
  /* floats: the packed B, the threads' rows, then the int64 of tri_bad (two floats each) */
  int64_t nbp = npk + nrows + 2 * batch * nbad;
  rm_tensor *ws = nbp ? rm_tensor_new(ctx, RM_F32, RM_CPU, 1, &nbp, RM_CAT_WORKSPACE) : NULL;
  if (nbp && !ws) return ctx->err_code;
  float *wp = ws ? rm_tensor_ptr(ws) : NULL;
  /* the softmax reads a row's scores up to a whole vector past its last one, unused:
   * written once, so that they are never memory no one wrote */
  if (nrows) memset(wp + npk, 0, (size_t)nrows * sizeof(float));
  tri_job J = { .tri = (int)a->matmul.tri, .upper = a->matmul.upper, .packed = packed,
                .fill = a->matmul.neg_inf ? -INFINITY : 0.0f, .M = M, .N = N, .K = K, .Np = Np,
                .tiles = (M + TRI_ROWS - 1) / TRI_ROWS, .A = A, .B = B, .nb = nb, .bshape = bshape, .sa = sa,
                .sb = sb, .pa = rm_tensor_ptr(A->t), .pb = rm_tensor_ptr(B->t), .bp = packed ? wp : NULL,
                .py = rm_tensor_ptr(y),
                .bad = nbad ? (int64_t *)(void *)(wp + npk + nrows) : NULL,
                .softmax = softmax, .sc = sc, .rows = nrows ? wp + npk : NULL };
  const bool par = nthr > 1;
  if (!par || batch >= 2 * nthr) {
    /* whole products per thread: a product's packed B stays in its thread's cache (split
     * by row tiles, two threads took 0.66-0.68x of one thread's time for attention's
     * scores, against 0.55-0.58x this way: the packed rows crossed between the cores) */
    _Pragma("omp parallel for schedule(static) if (par)")
    for (int64_t i = 0; i < batch; i++) {
      if (packed) tri_pack(&J, i);
      for (int64_t t = i * J.tiles; t < (i + 1) * J.tiles; t++) tri_task(&J, t);
      if (J.bad) tri_bad_fix(&J, i);
    }
  } else {
    _Pragma("omp parallel")
    {
      if (packed) {
        _Pragma("omp for schedule(static)")
        for (int64_t i = 0; i < batch; i++) tri_pack(&J, i);
      }
      _Pragma("omp for schedule(static, 1)")
      for (int64_t t = 0; t < batch * J.tiles; t++) tri_task(&J, t);
      if (J.bad) {
        _Pragma("omp for schedule(static)")
        for (int64_t i = 0; i < batch; i++) tri_bad_fix(&J, i);
      }
    }
  }
  rm_tensor_drop(ctx, ws);
  return RM_OK;
}
#else
/* Not reached: rm_cpu_avx512 is false where the tiles are not built. */
static int tri_f32_avx512(rm_ctx *ctx, const rm_attrs *a, rm_tensor *y, const operand *A, const operand *B, int nb,
                          const int64_t *bshape, const int64_t *sa, const int64_t *sb, int64_t batch,
                          bool softmax, float sc) {
  return rm_fail(ctx, RM_ERR_STATE, "matmul: no AVX-512 tiles in this build");
}
#endif

bool rm_cpu_tri_products(rm_ctx *ctx, rm_dtype dt) { return dt == RM_F32 && rm_cpu_avx512(ctx); }

/* Products in matmul(x, b) (their batch dims broadcast; a 1-D operand has none), for
 * dry-run workspace; -1 when the batch dims do not broadcast (the op's infer says so). */
static int64_t products_of(rm_ctx *ctx, const rm_tensor *x, const rm_tensor *b) {
  int n;
  int64_t bs[RM_MAX_DIM], batch = 1;
  if (rm_broadcast_shape(ctx, "matmul", x->ndim > 2 ? x->ndim - 2 : 0, x->shape, b->ndim > 2 ? b->ndim - 2 : 0,
                         b->shape, &n, bs))
    return -1;
  for (int d = 0; d < n; d++) batch *= bs[d];
  return batch;
}

/* A (triangular) matmul's workspace: the masked copy, or the tiles' packed B and
 * tri_bad's; 0 for a plain product. */
static size_t tri_workspace(rm_ctx *ctx, rm_tensor *const *in, const rm_attrs *a) {
  const int tri = a ? (int)a->matmul.tri : RM_TRI_NONE;
  if (tri == RM_TRI_NONE || in[0]->ndim < 2 || in[1]->ndim < 2) return 0;
  const rm_tensor *x = in[0], *b = in[1];
  size_t es = rm_dtype_size(x->dtype);
  if (!rm_cpu_tri_products(ctx, x->dtype)) {   /* the masked copy */
    const rm_tensor *t = tri == RM_TRI_A ? x : tri == RM_TRI_B ? b : NULL;
    return t ? (size_t)rm_tensor_numel(t) * es : 0;
  }
  int nd = b->ndim;
  int64_t M = x->shape[x->ndim - 2], K = b->shape[nd - 2], N = b->shape[nd - 1];
  int64_t sr = b->stride[nd - 2], sc = b->stride[nd - 1], batch = products_of(ctx, x, b);
  if (batch < 0) return 0;
  /* the packed B when it is read down its columns (not when copied first: not predicted) */
  rm_blasmat m;
  size_t bytes = sc != 1 && rm_as_blas(K, N, sr, sc, &m) ? (size_t)(batch * K * tri_np(N)) * sizeof(float) : 0;
  return bytes + (size_t)(batch * tri_bad_len(tri, M, N)) * sizeof(int64_t);
}

/* matmul's operands and batch: A and B over in[0] and in[1] (or the copies BLAS can
 * read: ca, cb, to drop), the batch shape of y and each operand's strides along it. */
typedef struct {
  operand A, B;
  rm_tensor *ca, *cb;
  int nb;
  int64_t bshape[RM_MAX_DIM], sa[RM_MAX_DIM], sb[RM_MAX_DIM], batch;
} mm_geo;

static void mm_geo_release(rm_ctx *ctx, mm_geo *g) {
  rm_tensor_drop(ctx, g->ca);
  rm_tensor_drop(ctx, g->cb);
  g->ca = g->cb = NULL;
}

static int mm_geo_prepare(rm_ctx *ctx, rm_tensor *a, rm_tensor *b, const rm_tensor *y, mm_geo *g) {
  g->ca = g->cb = NULL;
  if (operand_prepare(ctx, &g->A, a, true, &g->ca) || operand_prepare(ctx, &g->B, b, false, &g->cb)) {
    mm_geo_release(ctx, g);
    return ctx->err_code;
  }
  if (g->A.rows >= INT_MAX || g->B.cols >= INT_MAX || g->A.cols >= INT_MAX) {
    mm_geo_release(ctx, g);
    return rm_fail(ctx, RM_ERR_SHAPE, "matmul: dimensions beyond BLAS's int range");
  }
  g->nb = g->A.nbatch > g->B.nbatch ? g->A.nbatch : g->B.nbatch;
  g->batch = 1;
  for (int d = 0; d < g->nb; d++) {
    g->bshape[d] = y->shape[d];
    g->batch *= g->bshape[d];
  }
  batch_strides(&g->A, g->nb, g->bshape, g->sa);
  batch_strides(&g->B, g->nb, g->bshape, g->sb);
  return RM_OK;
}

/* The tiles read B's packed copy through int32 gather offsets: a B whose column stride
 * is past them is copied contiguous first. */
static int tiles_fit_b(rm_ctx *ctx, mm_geo *g) {
  if (g->B.sc == 1 || (g->B.sc >= 0 && g->B.sc <= INT_MAX / 16)) return RM_OK;
  rm_tensor *c = workspace_copy(ctx, g->B.t);
  if (!c) return ctx->err_code;
  rm_tensor_drop(ctx, g->cb);
  g->cb = c;
  operand_geo(&g->B, c, false);
  batch_strides(&g->B, g->nb, g->bshape, g->sb);
  return RM_OK;
}

RM_CPU_KERNEL(matmul) {
  rm_tensor *y = out[0];
  size_t es = rm_dtype_size(y->dtype);
  const int tri = a ? (int)a->matmul.tri : RM_TRI_NONE;
  const bool upper = a && a->matmul.upper;
  /* the tiles: float32 on AVX-512; otherwise a triangular operand is read through a
   * masked copy and a triangular result masked after the plain product */
  const bool tiles = tri != RM_TRI_NONE && rm_cpu_tri_products(ctx, y->dtype);
  bool fill_after = tri == RM_TRI_OUT && !tiles;   /* a triangular result masked after the plain product */
  rm_tensor *masked = NULL, *ops[2] = { in[0], in[1] };
  if (!tiles && (tri == RM_TRI_A || tri == RM_TRI_B)) {
    int w = tri == RM_TRI_A ? 0 : 1;
    if (!(masked = tri_masked_copy(ctx, in[w], upper))) return ctx->err_code;
    ops[w] = masked;
  }
  mm_geo g;
  if (mm_geo_prepare(ctx, ops[0], ops[1], y, &g)) {
    rm_tensor_drop(ctx, masked);
    return ctx->err_code;
  }
  const operand A = g.A, B = g.B;
  const int nb = g.nb;
  const int64_t M = A.rows, K = A.cols, N = B.cols, batch = g.batch, *bshape = g.bshape, *sa = g.sa, *sb = g.sb;
  int rc = RM_OK;
  if (batch * M * N == 0) goto done;
  if (K == 0) {
    memset(rm_tensor_ptr(y), 0, (size_t)(batch * M * N) * es);
    fill_after = tri == RM_TRI_OUT;
    goto done;
  }
  if (tiles) {
    if (!(rc = tiles_fit_b(ctx, &g))) rc = tri_f32_avx512(ctx, a, y, &g.A, &g.B, nb, bshape, g.sa, g.sb, batch, false, 0);
    goto done;
  }
  const char *pa = rm_tensor_ptr(A.t), *pb = rm_tensor_ptr(B.t);
  char *py = rm_tensor_ptr(y);

  /* One call when B is shared by every batch and A's batches stack into rows. */
  if (rm_batch_folds(A.bm.tr, M, A.bm.ld, nb, bshape, sa, sb) && batch * M < INT_MAX) {
    gemm(ctx, y->dtype, A.bm, B.bm, batch * M, N, K, pa, pb, 0.0, py, N);
    goto done;
  }
  /* A batch of products each too small to split well (fewer than 64 rows for
   * rm_cpu_gemm's split, or under SMALL_PRODUCT FLOPs, where the BLAS's own threads
   * scale poorly): the batch is split over the threads instead, each product a
   * single-threaded call on one thread (so every result is the same for any thread
   * count). Left to the BLAS, a CNN's per-image products ran slower on 2 threads than on
   * 1, and attention's (256 x 32) x (32 x 256) products 1.55x slower than split by batch.
   * Otherwise no parallel construct at all: inside even an inactive one (if false),
   * rm_cpu_gemm's own split became a nested team, which cost a linear layer's backward
   * 10% on 2 threads. */
  const double product = 2.0 * (double)M * (double)N * (double)K;
  const bool par = batch > 1 && (M < 64 || product <= SMALL_PRODUCT) &&
                   product * (double)batch > RM_CPU_PAR_MIN && !omp_in_parallel();
  if (par) {
    _Pragma("omp parallel for schedule(static)")
    for (int64_t i = 0; i < batch; i++) batch_gemm(ctx, y->dtype, &A, &B, nb, bshape, sa, sb, i, pa, pb, py);
  } else {
    for (int64_t i = 0; i < batch; i++) batch_gemm(ctx, y->dtype, &A, &B, nb, bshape, sa, sb, i, pa, pb, py);
  }
done:
  if (!rc && fill_after && batch * M * N != 0)
    tri_fill(y->dtype, rm_tensor_ptr(y), batch, M, upper, a->matmul.neg_inf ? -INFINITY : 0.0);
  mm_geo_release(ctx, &g);
  rm_tensor_drop(ctx, masked);
  return rc;
}

RM_CPU_KERNEL(softmax);

/* Whether matmul_softmax with these split attrs runs on the tiles, the softmax taken
 * from each row tile's scores: float32 on AVX-512, the causal softmax of a product
 * triangular in its result (lower: the part that softmax reads). */
static bool softmax_tiles(rm_ctx *ctx, const rm_attrs *mm, const rm_attrs *sm, rm_dtype dt) {
  return rm_cpu_tri_products(ctx, dt) && mm->matmul.tri == RM_TRI_OUT && !mm->matmul.upper && sm->softmax.causal;
}

/* softmax(matmul(a, b)): on the tiles where softmax_tiles says so, else the two kernels
 * in turn, the product in a workspace. Either way the bits of the two ops run apart. */
RM_CPU_KERNEL(matmul_softmax) {
  rm_tensor *y = out[0];
  rm_attrs mm, sm;
  rm_matmul_softmax_split(a, &mm, &sm);
  if (softmax_tiles(ctx, &mm, &sm, y->dtype)) {
    mm_geo g;
    if (mm_geo_prepare(ctx, in[0], in[1], y, &g)) return ctx->err_code;
    int64_t M = g.A.rows, K = g.A.cols, N = g.B.cols;
    int rc = RM_OK;
    if (g.batch * M * N != 0 && K != 0) {
      float sc = (float)(sm.softmax.scale != 0 ? sm.softmax.scale : 1.0);   /* as the softmax kernel takes it */
      if (!(rc = tiles_fit_b(ctx, &g)))
        rc = tri_f32_avx512(ctx, &mm, y, &g.A, &g.B, g.nb, g.bshape, g.sa, g.sb, g.batch, true, sc);
      mm_geo_release(ctx, &g);
      return rc;
    }
    mm_geo_release(ctx, &g);
  }
  rm_tensor *s = rm_tensor_new(ctx, y->dtype, y->device, y->ndim, y->shape, RM_CAT_WORKSPACE);   /* the product */
  if (!s) return ctx->err_code;
  int rc = rm_cpu_matmul(ctx, 2, in, 1, &s, &mm);
  if (!rc) rc = rm_cpu_softmax(ctx, 1, &s, 1, out, &sm);
  rm_tensor_drop(ctx, s);
  return rc;
}

/* matmul_softmax's workspace: the tiles' (their rows among it), or the product's and
 * the matmul kernel's. */
static size_t matmul_softmax_workspace(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a) {
  rm_attrs mm, sm;
  rm_matmul_softmax_split(a, &mm, &sm);
  if (nin != 2 || in[0]->ndim < 1 || in[1]->ndim < 1) return 0;
  const rm_tensor *x = in[0], *b = in[1];
  int nd = b->ndim;
  int64_t batch = products_of(ctx, x, b);
  int64_t numel = batch * (x->ndim >= 2 ? x->shape[x->ndim - 2] : 1) * (nd >= 2 ? b->shape[nd - 1] : 1);
  if (numel <= 0) return 0;   /* neither kernel runs (or no batch: the infer raised) */
  if (softmax_tiles(ctx, &mm, &sm, x->dtype) && x->shape[x->ndim - 1] != 0) {
    int64_t M = x->shape[x->ndim - 2], K = x->shape[x->ndim - 1], N = b->shape[nd - 1];
    return tri_workspace(ctx, in, &mm) + (size_t)tri_threads(batch, M, N, K) * TRI_ROWS * (size_t)tri_np(N) * sizeof(float);
  }
  return (size_t)numel * rm_dtype_size(x->dtype) + (x->shape[x->ndim - 1] != 0 ? tri_workspace(ctx, in, &mm) : 0);
}

size_t rm_cpu_matmul_workspace(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a) {
  if (op == RM_OP_MATMUL_SOFTMAX) return matmul_softmax_workspace(ctx, nin, in, a);
  return tri_workspace(ctx, in, a);
}

/* y (R x out) = x (R x in) w^T (+ b): one GEMM over the flattened leading dims of x; the
 * bias is written into y first and accumulated by the GEMM (beta = 1). */
RM_CPU_KERNEL(linear) {
  rm_tensor *x = in[0], *w = in[1], *b = nin > 2 ? in[2] : NULL, *y = out[0];
  int64_t fin = w->shape[1], fout = w->shape[0];
  if (fout == 0) return RM_OK;
  int64_t R = rm_tensor_numel(y) / fout;
  rm_tensor *cx = NULL, *cw = NULL;
  int rc = RM_OK;
  if (R == 0) return RM_OK;
  if (R >= INT_MAX || fin >= INT_MAX || fout >= INT_MAX)
    return rm_fail(ctx, RM_ERR_SHAPE, "linear: dimensions beyond BLAS's int range");

  /* fill y with the bias (or zeros: the GEMM then uses beta = 1 either way); a
   * contiguous bias row by row with memcpy (the strided loop below does not vectorise) */
  int64_t bs = b ? b->stride[0] : 0;
  size_t es = rm_dtype_size(y->dtype), row = (size_t)fout * es;
  char *yb = rm_tensor_ptr(y);
  if (!b) {
    memset(yb, 0, (size_t)R * row);
  } else if (bs == 1) {
    const char *bb = rm_tensor_ptr(b);
    _Pragma("omp parallel for if (R * fout > RM_CPU_PAR_MIN)")
    for (int64_t r = 0; r < R; r++) memcpy(yb + (size_t)r * row, bb, row);
  } else if (y->dtype == RM_F64) {
    double *py = rm_tensor_ptr(y);
    const double *pb = b ? rm_tensor_ptr(b) : NULL;
    _Pragma("omp parallel for if (R * fout > RM_CPU_PAR_MIN)")
    for (int64_t r = 0; r < R; r++)
      for (int64_t o = 0; o < fout; o++) py[r * fout + o] = pb ? pb[o * bs] : 0.0;
  } else {
    float *py = rm_tensor_ptr(y);
    const float *pb = b ? rm_tensor_ptr(b) : NULL;
    _Pragma("omp parallel for if (R * fout > RM_CPU_PAR_MIN)")
    for (int64_t r = 0; r < R; r++)
      for (int64_t o = 0; o < fout; o++) py[r * fout + o] = pb ? pb[o * bs] : 0.0f;
  }
  if (fin == 0) return RM_OK;

  /* X as R x in: a 1-D or 2-D view as is when BLAS can read it, else contiguous */
  blasmat mx, mw;
  int64_t sr, sc;
  if (x->ndim == 1) { sr = fin * x->stride[0]; sc = x->stride[0]; }
  else if (x->ndim == 2) { sr = x->stride[0]; sc = x->stride[1]; }
  else if (rm_tensor_is_contiguous(x)) { sr = fin; sc = 1; }
  else { sr = 0; sc = 0; }
  if ((x->ndim > 2 && !rm_tensor_is_contiguous(x)) || !rm_as_blas(R, fin, sr, sc, &mx)) {
    if (!(cx = workspace_copy(ctx, x))) return ctx->err_code;
    x = cx;
    rm_as_blas(R, fin, fin, 1, &mx);
  }
  /* W^T as in x out: element (i, o) is w[o, i] */
  if (!rm_as_blas(fin, fout, w->stride[1], w->stride[0], &mw)) {
    if (!(cw = workspace_copy(ctx, w))) { rc = ctx->err_code; goto done; }
    w = cw;
    rm_as_blas(fin, fout, 1, fin, &mw);
  }
  gemm(ctx, y->dtype, mx, mw, R, fout, fin, rm_tensor_ptr(x), rm_tensor_ptr(w), 1.0, rm_tensor_ptr(y), fout);
done:
  rm_tensor_drop(ctx, cx);
  rm_tensor_drop(ctx, cw);
  return rc;
}

RM_CPU_KERNEL(gelu_tanh);

/* linear_gelu: the linear kernel into the pre-activation (out[1]), then the gelu_tanh
 * kernel from it into y (out[0]): the same bits as linear followed by gelu_tanh. */
RM_CPU_KERNEL(linear_gelu) {
  int rc = rm_cpu_linear(ctx, nin, in, 1, &out[1], a);
  return rc ? rc : rm_cpu_gelu_tanh(ctx, 1, &out[1], 1, &out[0], a);
}
