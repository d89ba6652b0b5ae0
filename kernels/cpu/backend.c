/* The CPU backend table: host memory and the kernels of kernels/cpu/<family>.c. */
#include <string.h>

#include "cpu.h"

/* One kernel per op, except view ops (no kernel: they only make a new geometry).
 * Strong references, so that a static link pulls in every family's object file. */
#define X(ID, name, family, set) RM_IF_KERNEL(family, RM_CPU_KERNEL(name);)
#include "../../core/ops.def"
#undef X

static int cpu_copy(rm_ctx *ctx, void *dst, const void *src, size_t n) {
  memcpy(dst, src, n);
  return RM_OK;
}

static int cpu_sync(rm_ctx *ctx) { return RM_OK; }

/* Kernel workspace for dry runs (rm_backend.workspace): the attention kernels', a
 * triangular matmul's and matmul_softmax's (matmul's copies of operands BLAS cannot
 * read are not predicted). */
static size_t rm_cpu_workspace(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a) {
  switch (op) {
  case RM_OP_ATTENTION:
  case RM_OP_ATTENTION_BACKWARD:
  case RM_OP_ATTENTION_QKV_BACKWARD: return rm_cpu_attention_workspace(op, nin, in, a);
  case RM_OP_MATMUL:
  case RM_OP_MATMUL_SOFTMAX: return rm_cpu_matmul_workspace(ctx, op, nin, in, a);
  default: return 0;
  }
}

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
  .workspace = rm_cpu_workspace,
  .memory_rates = rm_cpu_memory_rates,
  .tri_products = rm_cpu_tri_products,
  .scores_softmax = rm_cpu_tri_products,   /* the same tiles (kernels/cpu/matmul.c) */
  .supports_dtype = { [RM_F32] = true, [RM_F64] = true, [RM_I32] = true, [RM_I64] = true },
  .int_ops = { [RM_OP_ADD] = true, [RM_OP_SUB] = true, [RM_OP_MUL] = true, [RM_OP_NEG] = true,
               [RM_OP_ABS] = true, [RM_OP_ADD_SCALAR] = true, [RM_OP_MUL_SCALAR] = true,
               [RM_OP_EQ] = true, [RM_OP_NE] = true, [RM_OP_LT] = true, [RM_OP_LE] = true,
               [RM_OP_GT] = true, [RM_OP_GE] = true, [RM_OP_WHERE] = true, [RM_OP_COPY] = true,
               [RM_OP_CAST] = true, [RM_OP_FILL] = true, [RM_OP_SUM] = true, [RM_OP_CONCAT] = true },
  .flops_per_byte = 8.0, /* ~200 GFLOP/s of GEMM over ~25 GB/s of streaming, 2 cores */
  .kernel = {
#define X(ID, name, family, set) RM_IF_KERNEL(family, [RM_OP_##ID] = rm_cpu_##name,)
#include "../../core/ops.def"
#undef X
  },
};
