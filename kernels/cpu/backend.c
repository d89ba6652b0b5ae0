/* The CPU backend table: host memory and the kernels of kernels/cpu/<family>.c. */
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

#define X(ID, name, family) RM_CPU_KERNEL(name) __attribute__((weak));
#include "../../core/ops.def"
#undef X

static void *cpu_malloc(rm_ctx *ctx, size_t n) {
  (void)ctx;
  void *p = NULL;
  /* 64-byte alignment for vector loads; size rounded up as aligned_alloc requires */
  if (posix_memalign(&p, 64, (n + 63) & ~(size_t)63)) return NULL;
  return p;
}

static void cpu_free(rm_ctx *ctx, void *p, size_t n) { (void)ctx; (void)n; free(p); }

static int cpu_copy(rm_ctx *ctx, void *dst, const void *src, size_t n) {
  (void)ctx;
  memcpy(dst, src, n);
  return RM_OK;
}

static int cpu_sync(rm_ctx *ctx) { (void)ctx; return RM_OK; }

const rm_backend rm_cpu_backend = {
  .name = "cpu",
  .device = RM_CPU,
  .malloc = cpu_malloc,
  .free = cpu_free,
  .to_host = cpu_copy,
  .from_host = cpu_copy,
  .synchronize = cpu_sync,
  .supports_dtype = { [RM_F32] = true, [RM_F64] = true },
  .kernel = {
#define X(ID, name, family) [RM_OP_##ID] = rm_cpu_##name,
#include "../../core/ops.def"
#undef X
  },
};
