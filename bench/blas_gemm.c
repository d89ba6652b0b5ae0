/* GEMM throughput of one BLAS library, opened with dlopen: GFLOP/s for the products of
 * the peer models (bench/peer.lua), forward and backward. Run by bench/blas.sh.
 * usage: blas_gemm LIBRARY cblas|dnnl   (CPUT=1: process CPU time instead of wall time) */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*cblas_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                         float, float *, int);
typedef int (*dnnl_fn)(char, char, long, long, long, float, const float *, long, const float *, long,
                       float, float *, long);

static double now(void) {
  struct timespec t;
  clock_gettime(getenv("CPUT") ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: blas_gemm LIBRARY cblas|dnnl\n"); return 2; }
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
  int dnnl = !strcmp(argv[2], "dnnl");
  cblas_fn cb = (cblas_fn)dlsym(h, "cblas_sgemm");
  dnnl_fn dg = (dnnl_fn)dlsym(h, "dnnl_sgemm");
  if (dnnl ? !dg : !cb) { fprintf(stderr, "%s: no %s\n", argv[1], dnnl ? "dnnl_sgemm" : "cblas_sgemm"); return 1; }
  /* M N K transA transB: the 24-block MLP's forward, input-gradient and weight-gradient
   * products, a square one, a GPT projection and a small one */
  static const int S[][5] = { { 512, 1024, 256, 0, 1 }, { 512, 256, 1024, 0, 0 }, { 1024, 256, 512, 1, 0 },
                              { 256, 1024, 512, 1, 0 }, { 512, 256, 1024, 0, 1 }, { 1024, 1024, 1024, 0, 0 },
                              { 2048, 384, 128, 0, 1 }, { 64, 64, 64, 0, 0 } };
  float *A = malloc(sizeof(float) << 22), *B = malloc(sizeof(float) << 22), *C = malloc(sizeof(float) << 22);
  for (int i = 0; i < (1 << 22); i++) { A[i] = (float)(i % 7) * 0.1f; B[i] = (float)(i % 5) * 0.1f; }
  for (size_t s = 0; s < sizeof S / sizeof S[0]; s++) {
    int M = S[s][0], N = S[s][1], K = S[s][2], ta = S[s][3], tb = S[s][4];
    int lda = ta ? M : K, ldb = tb ? K : N;
    double fl = 2.0 * M * N * K, best = 1e30;
    int reps = (int)(3e8 / fl) + 1;
    for (int t = 0; t < 5; t++) {
      double t0 = now();
      for (int r = 0; r < reps; r++) {
        if (dnnl) dg(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.f, A, lda, B, ldb, 0.f, C, N);
        else cb(101, ta ? 112 : 111, tb ? 112 : 111, M, N, K, 1.f, A, lda, B, ldb, 0.f, C, N);
      }
      double e = (now() - t0) / reps;
      if (e < best) best = e;
    }
    printf("%s%dx%dx%d%s %.1f\n", ta ? "T" : "", M, N, K, tb ? "T" : "", fl / best / 1e9);
  }
  return 0;
}
