/* The CPU backend table: host memory and the kernels of kernels/cpu/<family>.c. */
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
#define KERNEL_sort KERNEL_ANY
#define KERNEL_conv KERNEL_ANY
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
#define DECL_sort DECL_ANY
#define DECL_conv DECL_ANY

#define X(ID, name, family, set) DECL_##family(ID, name)
#include "../../core/ops.def"
#undef X

static int cpu_copy(rm_ctx *ctx, void *dst, const void *src, size_t n) {
  memcpy(dst, src, n);
  return RM_OK;
}

static int cpu_sync(rm_ctx *ctx) { return RM_OK; }

const rm_backend rm_cpu_backend = {
  .name = "cpu",
  .device = RM_CPU,
  .init = rm_cpu_init,
  .shutdown = rm_cpu_shutdown,
  .malloc = rm_cpu_malloc,
  .free = rm_cpu_free,
  .reserved = rm_cpu_reserved,
  .empty_cache = rm_cpu_empty_cache,
  .to_host = cpu_copy,
  .from_host = cpu_copy,
  .synchronize = cpu_sync,
  .runtime_info = rm_cpu_runtime_info,
  .supports_dtype = { [RM_F32] = true, [RM_F64] = true },
  .flops_per_byte = 8.0, /* ~200 GFLOP/s of GEMM over ~25 GB/s of streaming, 2 cores */
  .kernel = {
#define X(ID, name, family, set) KERNEL_##family(ID, name)
#include "../../core/ops.def"
#undef X
  },
};
