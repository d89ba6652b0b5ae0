/* The BLAS behind matmul and linear, opened at run time (dlopen) rather than linked.
 *
 * Why at run time: OpenBLAS picks its kernels (its "core") in a load-time constructor,
 * from OPENBLAS_CORETYPE or its own CPU detection, and Debian 12's OpenBLAS 0.3.21 does
 * not know newer CPUs (it falls back to SSE3 "Prescott" kernels, ~3x slower). A linked
 * library has made that choice before any remat code runs; an opened one has not. So,
 * when OPENBLAS_CORETYPE is unset and the library is not in the process yet, remat sets
 * it from the CPU's features (CPUID, with the OS's consent to the wider registers) for
 * the duration of the dlopen, then unsets it again: a value the user or the machine set
 * is never overridden, and the environment is left as found.
 *
 * Which library: the first of REMAT_BLAS (a path, if set) and the build's list (the
 * Makefile's BLAS: Debian's OpenMP build of OpenBLAS first) that opens and has
 * cblas_sgemm. The OpenMP build runs its threads in the same libgomp pool as remat's
 * own OpenMP loops, so the two never compete for cores. When none opens, a built-in
 * blocked GEMM (correct, slower) runs and the log says what to install.
 *
 * The table lives in the CPU backend's per-context state (no global state); opening
 * the same library again from another context is a dlopen reference count. */
#include <dlfcn.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

#ifndef REMAT_BLAS_LIBS
#define REMAT_BLAS_LIBS "libopenblas.so.0"
#endif

/* SIMD levels, for the CPU and for the kernels a BLAS runs. */
enum { SIMD_SSE2, SIMD_SSE42, SIMD_AVX, SIMD_AVX2, SIMD_AVX512 };
static const char *const simd_names[] = { "sse2", "sse4.2", "avx", "avx2", "avx512" };

/* The CPU's level; __builtin_cpu_supports also checks that the OS saves the registers. */
static int cpu_simd(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return SIMD_AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SIMD_AVX2;
  if (__builtin_cpu_supports("avx")) return SIMD_AVX;
  if (__builtin_cpu_supports("sse4.2")) return SIMD_SSE42;
  return SIMD_SSE2;
}

const char *rm_cpu_simd_name(void) { return simd_names[cpu_simd()]; }

/* The OpenBLAS core for a SIMD level. Haswell rather than Zen on AMD: the same AVX2
 * kernels, and measured as fast or faster on a Zen 2 (README, "CPU speed"). */
static const char *core_for(int simd) {
  switch (simd) {
  case SIMD_AVX512: return "SkylakeX";
  case SIMD_AVX2: return "Haswell";
  case SIMD_AVX: return "Sandybridge";
  default: return NULL; /* OpenBLAS's own detection */
  }
}

/* The SIMD level of an OpenBLAS core name (or a BLIS configuration name). */
static int core_simd(const char *core) {
  static const char *const avx512[] = { "skylakex", "cooperlake", "sapphirerapids", "skx", "knl", NULL };
  static const char *const avx2[] = { "haswell", "zen", "zen2", "zen3", "skylake", NULL };
  static const char *const avx[] = { "sandybridge", "bulldozer", "piledriver", "steamroller",
                                     "excavator", NULL };
  for (int i = 0; avx512[i]; i++) if (!strcasecmp(core, avx512[i])) return SIMD_AVX512;
  for (int i = 0; avx2[i]; i++) if (!strcasecmp(core, avx2[i])) return SIMD_AVX2;
  for (int i = 0; avx[i]; i++) if (!strcasecmp(core, avx[i])) return SIMD_AVX;
  return SIMD_SSE2;
}

typedef char *(*str_fn)(void);
typedef int (*int_fn)(void);

/* Fills b's description from the library's own reports. */
static void describe(rm_cpu_blas *b) {
  str_fn ob_config = (str_fn)dlsym(b->handle, "openblas_get_config");
  str_fn ob_core = (str_fn)dlsym(b->handle, "openblas_get_corename");
  int_fn ob_par = (int_fn)dlsym(b->handle, "openblas_get_parallel");
  if (ob_config && ob_core) {
    const char *cfg = ob_config();
    char ver[32] = "";
    sscanf(cfg, "OpenBLAS %31s", ver);
    int par = ob_par ? ob_par() : -1;
    b->openmp = par == 2;
    snprintf(b->name, sizeof b->name, "OpenBLAS %s (%s)", ver,
             par == 2 ? "OpenMP" : par == 1 ? "pthreads" : par == 0 ? "single-threaded" : "threads?");
    snprintf(b->core, sizeof b->core, "%s", ob_core());
    b->is_openblas = true;
    return;
  }
  str_fn blis_ver = (str_fn)dlsym(b->handle, "bli_info_get_version_str");
  int_fn blis_arch = (int_fn)dlsym(b->handle, "bli_arch_query_id");
  const char *(*blis_arch_str)(int) = (const char *(*)(int))dlsym(b->handle, "bli_arch_string");
  if (blis_ver) {
    int_fn blis_omp = (int_fn)dlsym(b->handle, "bli_info_get_enable_openmp");
    b->openmp = blis_omp && blis_omp();
    snprintf(b->name, sizeof b->name, "BLIS %s%s", blis_ver(), b->openmp ? " (OpenMP)" : "");
    snprintf(b->core, sizeof b->core, "%s", blis_arch && blis_arch_str ? blis_arch_str(blis_arch()) : "?");
    return;
  }
  const char *base = strrchr(b->path, '/');
  snprintf(b->name, sizeof b->name, "%.63s", base ? base + 1 : b->path);
  snprintf(b->core, sizeof b->core, "unknown");
}

/* Opens one library (path or soname); true when it has cblas_sgemm and cblas_dgemm. */
static bool try_open(rm_cpu_blas *b, const char *path) {
  int flags = RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE;
  void *h = dlopen(path, flags | RTLD_NOLOAD);
  bool set_core = false;
  const char *core = core_for(cpu_simd());
  b->core_from = "detected by the library";
  if (h) {
    b->core_from = "already loaded in the process";
  } else {
    if (getenv("OPENBLAS_CORETYPE")) {
      b->core_from = "OPENBLAS_CORETYPE";
    } else if (core && strstr(path, "openblas")) {
      set_core = setenv("OPENBLAS_CORETYPE", core, 0) == 0;
      if (set_core) b->core_from = "picked by remat from the CPU's features";
    }
    h = dlopen(path, flags);
    if (set_core) unsetenv("OPENBLAS_CORETYPE");
  }
  if (!h) return false;
  b->sgemm = (rm_sgemm_fn)dlsym(h, "cblas_sgemm");
  b->dgemm = (rm_dgemm_fn)dlsym(h, "cblas_dgemm");
  if (!b->sgemm || !b->dgemm) {
    dlclose(h);
    b->sgemm = NULL;
    b->dgemm = NULL;
    return false;
  }
  b->handle = h;
  Dl_info info;
  if (dladdr((void *)b->sgemm, &info) && info.dli_fname) snprintf(b->path, sizeof b->path, "%s", info.dli_fname);
  else snprintf(b->path, sizeof b->path, "%s", path);
  describe(b);
  return true;
}

void rm_cpu_blas_open(rm_cpu_blas *b) {
  memset(b, 0, sizeof *b);
  const char *user = getenv("REMAT_BLAS");
  if (user && !strcmp(user, "builtin")) {
    snprintf(b->name, sizeof b->name, "built-in");
    snprintf(b->core, sizeof b->core, "portable C");
    b->core_from = "REMAT_BLAS=builtin";
    b->openmp = true;
    b->warned = true; /* asked for: nothing to warn about */
    return;
  }
  if (user && *user && try_open(b, user)) goto opened;
  char list[] = REMAT_BLAS_LIBS;
  for (char *save = NULL, *p = strtok_r(list, " ", &save); p; p = strtok_r(NULL, " ", &save))
    if (try_open(b, p)) goto opened;
  snprintf(b->name, sizeof b->name, "built-in");
  snprintf(b->core, sizeof b->core, "portable C");
  b->core_from = "no BLAS library could be opened";
  b->openmp = true;
opened:
  b->generic = core_simd(b->core) < SIMD_AVX2 && cpu_simd() >= SIMD_AVX2;
}

void rm_cpu_blas_close(rm_cpu_blas *b) {
  if (b->handle) dlclose(b->handle);
  b->handle = NULL;
}

/* The one warning, at the first product, when the BLAS leaves speed on the table (at
 * the first product rather than at init, so that a log set after init still gets it). */
void rm_cpu_blas_warn(rm_ctx *ctx, rm_cpu_blas *b) {
  b->warned = true;
  if (!b->handle) {
    rm_log(ctx, RM_LOG_WARN, "cpu: no BLAS library could be opened (tried %s%s): matmul runs remat's "
           "built-in GEMM, several times slower; install libopenblas0-openmp (make deps)",
           getenv("REMAT_BLAS") ? "REMAT_BLAS and " : "", REMAT_BLAS_LIBS);
    return;
  }
  if (b->generic) {
    const char *want = core_for(cpu_simd());
    if (!strcmp(b->core_from, "OPENBLAS_CORETYPE"))
      rm_log(ctx, RM_LOG_WARN, "cpu: %s runs its generic %s kernels on this %s CPU because "
             "OPENBLAS_CORETYPE=%s is set; unless that is needed here, unset it (remat then picks "
             "%s) or set OPENBLAS_CORETYPE=%s", b->name, b->core, rm_cpu_simd_name(),
             getenv("OPENBLAS_CORETYPE"), want, want);
    else
      rm_log(ctx, RM_LOG_WARN, "cpu: %s runs its generic %s kernels on this %s CPU (%s; %s): "
             "matmul is several times slower than it could be; %s", b->name, b->core,
             rm_cpu_simd_name(), b->core_from, b->path,
             b->is_openblas ? "set OPENBLAS_CORETYPE before the library loads, e.g. OPENBLAS_CORETYPE=Haswell"
                            : "use OpenBLAS (unset REMAT_BLAS)");
  }
  if (b->is_openblas && !b->openmp)
    rm_log(ctx, RM_LOG_WARN, "cpu: %s (%s) keeps its own threads, which compete with remat's OpenMP "
           "threads for the cores; install libopenblas0-openmp (make deps)", b->name, b->path);
}

/* ---- the built-in GEMM: used only when no BLAS opens ---- */

/* Element (i, j) of a row-major matrix m given with its transpose flag and ld. */
#define AT(p, tr, ld, i, j) ((tr) == RM_BLAS_TRANS ? (p)[(j) * (ld) + (i)] : (p)[(i) * (ld) + (j)])

#define BUILTIN_GEMM(T, NAME)                                                               \
  static void NAME(int ta, int tb, int m, int n, int k, const T *a, int lda, const T *b,    \
                   int ldb, T beta, T *c, int ldc) {                                        \
    _Pragma("omp parallel for schedule(static) if ((double)m * n * k > 1e6)")               \
    for (int i = 0; i < m; i++) {                                                           \
      T *ci = c + (int64_t)i * ldc;                                                         \
      for (int j = 0; j < n; j++) ci[j] = beta == 0 ? 0 : beta * ci[j];                     \
      for (int p = 0; p < k; p++) {                                                         \
        T aip = AT(a, ta, (int64_t)lda, (int64_t)i, (int64_t)p);                            \
        for (int j = 0; j < n; j++) ci[j] += aip * AT(b, tb, (int64_t)ldb, (int64_t)p, (int64_t)j); \
      }                                                                                     \
    }                                                                                       \
  }
BUILTIN_GEMM(float, builtin_sgemm)
BUILTIN_GEMM(double, builtin_dgemm)

/* One GEMM call on the calling thread's terms (no split). */
static void gemm_call(rm_cpu_blas *b, rm_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                      const void *a, int64_t lda, const void *bm, int64_t ldb, double beta, void *c,
                      int64_t ldc) {
  if (dt == RM_F64) {
    if (b->dgemm) b->dgemm(RM_BLAS_ROW_MAJOR, ta, tb, (int)m, (int)n, (int)k, 1.0, a, (int)lda, bm,
                           (int)ldb, beta, c, (int)ldc);
    else builtin_dgemm(ta, tb, (int)m, (int)n, (int)k, a, (int)lda, bm, (int)ldb, beta, c, (int)ldc);
  } else {
    if (b->sgemm) b->sgemm(RM_BLAS_ROW_MAJOR, ta, tb, (int)m, (int)n, (int)k, 1.0f, a, (int)lda, bm,
                           (int)ldb, (float)beta, c, (int)ldc);
    else builtin_sgemm(ta, tb, (int)m, (int)n, (int)k, a, (int)lda, bm, (int)ldb, (float)beta, c, (int)ldc);
  }
}

/* Rows of C per thread below which a product is not split (see rm_cpu_gemm). */
#define SPLIT_MIN_ROWS 32

/* Products of up to this many multiply-adds are split by rows of C over the threads,
 * each part a single-threaded call (inside a parallel region the OpenMP BLAS and the
 * built-in GEMM run on the calling thread). The BLAS's own threading shares packed
 * panels between its threads and synchronises on them several times per call, which
 * on these mid-sized products (a training step's linear layers) costs more than
 * packing the small shared operand once per thread (bench/peer.lua: 8-15% of a step).
 * Larger products keep the BLAS's threading. Each part is a fixed range of rows for a
 * given thread count, so results stay the same run to run. */
#define SPLIT_MAX_WORK 5e8

void rm_cpu_gemm(rm_ctx *ctx, rm_cpu_blas *b, rm_dtype dt, int ta, int tb, int64_t m, int64_t n,
                 int64_t k, const void *a, int64_t lda, const void *bm, int64_t ldb, double beta,
                 void *c, int64_t ldc) {
  if (!b->warned) rm_cpu_blas_warn(ctx, b);
  int nth = omp_in_parallel() ? 1 : omp_get_max_threads();
  double work = (double)m * (double)n * (double)k;
  if (nth > 1 && (b->openmp || !b->handle) && m >= 2 * SPLIT_MIN_ROWS && work <= SPLIT_MAX_WORK) {
    int parts = (int)(m / SPLIT_MIN_ROWS < nth ? m / SPLIT_MIN_ROWS : nth);
    size_t es = rm_dtype_size(dt);
    /* part p: rows [m p / parts, m (p+1) / parts), starts rounded down to 8 rows */
    #pragma omp parallel for num_threads(parts) schedule(static, 1)
    for (int p = 0; p < parts; p++) {
      int64_t r0 = (m * p / parts) & ~(int64_t)7;
      int64_t r1 = p + 1 == parts ? m : (m * (p + 1) / parts) & ~(int64_t)7;
      const char *ap = (const char *)a + (size_t)(ta == RM_BLAS_TRANS ? r0 : r0 * lda) * es;
      gemm_call(b, dt, ta, tb, r1 - r0, n, k, ap, lda, bm, ldb, beta, (char *)c + (size_t)(r0 * ldc) * es, ldc);
    }
    return;
  }
  gemm_call(b, dt, ta, tb, m, n, k, a, lda, bm, ldb, beta, c, ldc);
}

void rm_cpu_blas_report(const rm_cpu_blas *b, rm_info *r) {
  snprintf(r->blas, sizeof r->blas, "%s", b->name);
  snprintf(r->blas_core, sizeof r->blas_core, "%s", b->core);
  snprintf(r->blas_core_from, sizeof r->blas_core_from, "%s", b->core_from ? b->core_from : "");
  snprintf(r->blas_path, sizeof r->blas_path, "%s", b->path);
  snprintf(r->simd, sizeof r->simd, "%s", rm_cpu_simd_name());
  r->threads = omp_get_max_threads();
  r->blas_generic = b->generic;
  r->blas_openmp = b->openmp;
  /* what libgomp read when it loaded (lua/main.c says why the command sets a count) */
  const char *wp = getenv("OMP_WAIT_POLICY"), *sc = getenv("GOMP_SPINCOUNT");
  if (wp) snprintf(r->omp_wait, sizeof r->omp_wait, "OMP_WAIT_POLICY=%.40s", wp);
  else if (sc)
    snprintf(r->omp_wait, sizeof r->omp_wait, "GOMP_SPINCOUNT=%.16s%s", sc,
             getenv("REMAT_SET_SPINCOUNT") ? " (set by the remat command)" : "");
  else snprintf(r->omp_wait, sizeof r->omp_wait, "libgomp default (spins 300000 times, then sleeps)");
}
