/* OpenBLAS called directly, for bench/matmul.lua: seconds per cblas_sgemm of two n x n
 * float32 matrices into a preallocated output (no allocation, no dispatch).
 * Usage: sgemm_direct n seconds_budget -> prints the mean seconds per call. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  int n = atoi(argv[1]);
  double budget = atof(argv[2]);
  float *a = malloc(sizeof(float) * (size_t)n * (size_t)n);
  float *b = malloc(sizeof(float) * (size_t)n * (size_t)n);
  float *c = malloc(sizeof(float) * (size_t)n * (size_t)n);
  if (!a || !b || !c) return 1;
  for (long i = 0; i < (long)n * n; i++) a[i] = 0.5f, b[i] = 0.25f;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
  long reps = 0;
  double t0 = now(), el;
  do {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    reps++;
    el = now() - t0;
  } while (el < budget);
  printf("%.9f\n", el / (double)reps);
  free(a);
  free(b);
  free(c);
  return 0;
}
