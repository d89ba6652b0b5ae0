/* CPU tensor memory: blocks from the context's host allocator (so a host that counts
 * or pools memory sees every byte), 64-byte aligned, with a cache of freed blocks.
 *
 * Why a cache: a training step allocates the same sizes step after step, and large
 * fresh blocks cost page faults on first touch (a fresh 256 MiB copy runs at a fifth of
 * the speed of a copy into reused memory). Freed blocks of 64 KiB and up are kept in size
 * classes (8 per power of two, so at most 12.5% is lost to rounding) and handed out
 * again; the cache holds at most max(256 MiB, the most bytes ever in use at once), and is
 * given back by remat.memory.empty_cache() and when the context is destroyed. Smaller blocks go
 * straight to the host allocator, which is good at them. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu.h"

#define CACHE_MIN ((size_t)64 << 10)
#define CACHE_FLOOR ((size_t)256 << 20)
#define NCLASS (64 * 8)
#define CLASS_MIN (16 * 8)   /* the class of CACHE_MIN (2^16): no block is smaller */

typedef struct block { struct block *next; } block;

typedef struct cpu_state {
  block *free[NCLASS];   /* cached blocks per size class */
  size_t held;           /* bytes taken from the host allocator (in use + cached) */
  size_t cached;         /* of which cached */
  size_t peak_in_use;    /* high-water mark of held - cached */
  rm_cpu_blas blas;      /* the BLAS this context calls (kernels/cpu/blas.c) */
  bool avx2;             /* kernels with an AVX2 path may take it (rm_cpu_avx2) */
  bool avx512;           /* ... and an AVX-512 one (rm_cpu_avx512) */
} cpu_state;

static cpu_state *state(rm_ctx *ctx) { return ctx->backend_state[RM_CPU]; }

/* Size class of n (>= CACHE_MIN) and its block size: n rounded up to 1/8 of its power of two. */
static int class_of(size_t n, size_t *size) {
  int p = 63 - __builtin_clzll((unsigned long long)n);  /* 2^p <= n < 2^(p+1) */
  size_t step = (size_t)1 << (p - 3);
  size_t r = (n + step - 1) & ~(step - 1);
  if (r == (size_t)1 << (p + 1)) {
    *size = r;
    return (p + 1) * 8;
  }
  *size = r;
  return p * 8 + (int)((r >> (p - 3)) & 7);
}

/* The block size of class c. */
static size_t class_size(int c) {
  return c % 8 == 0 ? (size_t)1 << (c / 8) : ((size_t)8 + (size_t)(c % 8)) << (c / 8 - 3);
}

/* One aligned block of `size` bytes from the host allocator. */
static void *host_block(rm_ctx *ctx, size_t size) {
  size_t total = size + 64;
  if (total < size) return NULL;
  unsigned char *base = rm_host_malloc(ctx, total);
  if (!base) return NULL;
  unsigned char *p = (unsigned char *)(((uintptr_t)base + 64) & ~(uintptr_t)63);
  p[-1] = (unsigned char)(p - base); /* distance back to the block's start (1..64) */
  return p;
}

static void host_unblock(rm_ctx *ctx, void *p, size_t size) {
  unsigned char *d = p;
  rm_host_free(ctx, d - d[-1], size + 64);
}

int rm_cpu_init(rm_ctx *ctx, void **st) {
  *st = rm_host_calloc(ctx, 1, sizeof(cpu_state));
  if (!*st) return rm_fail(ctx, RM_ERR_OOM, "cpu: out of host memory for the backend state");
  rm_cpu_blas_open(&((cpu_state *)*st)->blas);
#if defined(__x86_64__) && defined(__GNUC__)
  const char *no = getenv("REMAT_NO_AVX2");
  ((cpu_state *)*st)->avx2 = __builtin_cpu_supports("avx2") && !(no && *no && strcmp(no, "0") != 0);
  const char *no512 = getenv("REMAT_NO_AVX512");
  ((cpu_state *)*st)->avx512 = ((cpu_state *)*st)->avx2 && __builtin_cpu_supports("avx512f") &&
                               !(no512 && *no512 && strcmp(no512, "0") != 0);
#endif
  return RM_OK;
}

rm_cpu_blas *rm_cpu_blas_of(rm_ctx *ctx) { return &state(ctx)->blas; }

bool rm_cpu_avx2(rm_ctx *ctx) { return state(ctx)->avx2; }

bool rm_cpu_avx512(rm_ctx *ctx) { return state(ctx)->avx512; }

int rm_cpu_runtime_info(rm_ctx *ctx, rm_info *info) {
  rm_cpu_blas_report(rm_cpu_blas_of(ctx), info);
  snprintf(info->vector_path, sizeof info->vector_path, "%s",
           state(ctx)->avx512 ? "avx512" : state(ctx)->avx2 ? "avx2" : "portable");
  return RM_OK;
}

size_t rm_cpu_empty_cache(rm_ctx *ctx) {
  cpu_state *s = state(ctx);
  size_t released = 0;
  if (!s) return 0;
  for (int c = CLASS_MIN; c < NCLASS; c++) {
    size_t size = class_size(c);
    while (s->free[c]) {
      block *b = s->free[c];
      s->free[c] = b->next;
      host_unblock(ctx, b, size);
      released += size;
    }
  }
  s->cached -= released;
  s->held -= released;
  return released;
}

void rm_cpu_shutdown(rm_ctx *ctx, void *st) {
  if (!st) return;
  rm_cpu_blas_close(&((cpu_state *)st)->blas);
  rm_cpu_empty_cache(ctx);
  rm_host_free(ctx, st, sizeof(cpu_state));
}

void *rm_cpu_malloc(rm_ctx *ctx, size_t n) {
  cpu_state *s = state(ctx);
  if (n < CACHE_MIN || !s) {
    void *p = host_block(ctx, n ? n : 1);
    if (p && s) s->held += n ? n : 1;
    return p;
  }
  size_t size;
  int c = class_of(n, &size);
  if (s->free[c]) {
    block *b = s->free[c];
    s->free[c] = b->next;
    s->cached -= size;
    return b;
  }
  void *p = host_block(ctx, size);
  if (!p && s->cached) { /* give the cache back and try once more */
    rm_cpu_empty_cache(ctx);
    p = host_block(ctx, size);
  }
  if (p) {
    s->held += size;
    if (s->held - s->cached > s->peak_in_use) s->peak_in_use = s->held - s->cached;
  }
  return p;
}

void rm_cpu_free(rm_ctx *ctx, void *p, size_t n) {
  cpu_state *s = state(ctx);
  if (n < CACHE_MIN || !s) {
    host_unblock(ctx, p, n ? n : 1);
    if (s) s->held -= n ? n : 1;
    return;
  }
  size_t size;
  int c = class_of(n, &size);
  size_t cap = s->peak_in_use > CACHE_FLOOR ? s->peak_in_use : CACHE_FLOOR;
  if (size > cap) {
    host_unblock(ctx, p, size);
    s->held -= size;
    return;
  }
  /* make room by giving back cached blocks of other sizes, largest first: the sizes a
   * program uses now are the ones worth keeping */
  for (int k = NCLASS - 1; k >= CLASS_MIN && s->cached + size > cap; k--) {
    size_t ksize = class_size(k);
    while (s->free[k] && s->cached + size > cap) {
      block *b = s->free[k];
      s->free[k] = b->next;
      host_unblock(ctx, b, ksize);
      s->cached -= ksize;
      s->held -= ksize;
    }
  }
  block *b = p;
  b->next = s->free[c];
  s->free[c] = b;
  s->cached += size;
}

size_t rm_cpu_reserved(rm_ctx *ctx) {
  cpu_state *s = state(ctx);
  return s ? s->held : 0;
}

/* ---- memory rates (the planner's cache credit, core/opcost.c) ----
 *
 * Each thread takes its part of buf. Cold: it writes the whole part, then reads it from
 * the start (a part larger than the caches comes back from memory, as activations kept
 * from forward do in backward). Hot: the same bytes go through one 128 KiB window that
 * stays in the thread's L2, as a replay's output does for the backward right after it.
 * The least time of 3 of each; the rates are the differences per byte (0 when the
 * working set fits the caches). */
#define PROBE_WINDOW ((size_t)32 << 10)   /* floats: 128 KiB */

static double probe_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds for every thread to write (when write) and read its part of p[0, n), through
 * windows of w floats (w = the part: one pass over it). */
static double probe_pass(float *p, size_t n, size_t w, bool write) {
  double t0 = probe_clock();
  float total = 0;
  #pragma omp parallel reduction(+:total)
  {
    int nt = omp_get_num_threads(), t = omp_get_thread_num();
    size_t part = n / (size_t)nt;
    float *q = p + (size_t)t * part;
    size_t win = w < part ? w : part;
    float acc = 0;
    for (size_t done = 0; win && done + win <= part; done += win) {
      float *b = w < part ? q : q + done;
      if (write) {
        #pragma omp simd
        for (size_t i = 0; i < win; i++) b[i] = 1.0f;
      }
      #pragma omp simd reduction(+:acc)
      for (size_t i = 0; i < win; i++) acc += b[i];
    }
    total += acc;
  }
  double t1 = probe_clock();
  if (total < 0) p[0] = total;    /* keeps the reads */
  return t1 - t0;
}

static double least_of_3(float *p, size_t n, size_t w, bool write, bool prime) {
  double best = HUGE_VAL;
  for (int r = 0; r < 3; r++) {
    if (prime) probe_pass(p, n, n, true);   /* written, not timed: the read comes cold */
    double t = probe_pass(p, n, w, write);
    if (t < best) best = t;
  }
  return best;
}

int rm_cpu_memory_rates(rm_ctx *ctx, void *buf, size_t bytes, double *roundtrip, double *read) {
  float *p = buf;
  size_t n = bytes / sizeof(float);
  *roundtrip = *read = 0;
  if (n < 2 * PROBE_WINDOW) return RM_OK;
  probe_pass(p, n, n, true);              /* first touch: page faults are not the point */
  double cold_rt = least_of_3(p, n, n, true, false);
  double hot_rt = least_of_3(p, n, PROBE_WINDOW, true, false);
  double cold_rd = least_of_3(p, n, n, false, true);
  double hot_rd = least_of_3(p, n, PROBE_WINDOW, false, false);
  double b = (double)bytes;
  *roundtrip = cold_rt > hot_rt ? (cold_rt - hot_rt) / b : 0;
  *read = cold_rd > hot_rd ? (cold_rd - hot_rd) / b : 0;
  return RM_OK;
}
