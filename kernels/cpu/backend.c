/* The CPU backend table: host memory and the kernels of kernels/cpu/<family>.c. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

/* One kernel per op, except view ops (no kernel: they only make a new geometry).
 * Strong references, so that a static link pulls in every family's object file. */
#define KERNEL_view(ID, name)
#define KERNEL_ANY(ID, name) [RM_OP_##ID] = rm_cpu_##name,
#define KERNEL_elementwise KERNEL_ANY
#define KERNEL_random KERNEL_ANY
#define KERNEL_reduce KERNEL_ANY
#define KERNEL_matmul KERNEL_ANY
#define KERNEL_norm KERNEL_ANY
#define KERNEL_index KERNEL_ANY
#define KERNEL_loss KERNEL_ANY
#define KERNEL_optim KERNEL_ANY
#define KERNEL_attention KERNEL_ANY
#define DECL_view(ID, name)
#define DECL_ANY(ID, name) RM_CPU_KERNEL(name);
#define DECL_elementwise DECL_ANY
#define DECL_random DECL_ANY
#define DECL_reduce DECL_ANY
#define DECL_matmul DECL_ANY
#define DECL_norm DECL_ANY
#define DECL_index DECL_ANY
#define DECL_loss DECL_ANY
#define DECL_optim DECL_ANY
#define DECL_attention DECL_ANY

#define X(ID, name, family) DECL_##family(ID, name)
#include "../../core/ops.def"
#undef X

/* Tensor data comes from the context's host allocator, so that a host that counts or
 * pools memory sees it: over-allocated by 64 bytes and aligned up to 64 (for vector
 * loads); the distance back to the block's start (1..64) is kept in the byte before. */
static void *cpu_malloc(rm_ctx *ctx, size_t n) {
  size_t total = (n ? n : 1) + 64;
  if (total < n) return NULL;
  unsigned char *base = rm_host_malloc(ctx, total);
  if (!base) return NULL;
  unsigned char *p = (unsigned char *)(((uintptr_t)base + 64) & ~(uintptr_t)63);
  p[-1] = (unsigned char)(p - base);
  return p;
}

static void cpu_free(rm_ctx *ctx, void *p, size_t n) {
  unsigned char *d = p;
  rm_host_free(ctx, d - d[-1], (n ? n : 1) + 64);
}

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
#define X(ID, name, family) KERNEL_##family(ID, name)
#include "../../core/ops.def"
#undef X
  },
};
