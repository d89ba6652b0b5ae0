/* A backend is a table of function pointers, one per device. core/ never calls a
 * kernel directly: it looks the kernel up here. kernels/cpu and kernels/cuda each fill
 * one table. A NULL kernel means the backend does not support that op. */
#ifndef REMAT_BACKEND_H
#define REMAT_BACKEND_H

#include "op.h"

/* A kernel computes out[] from in[] (already allocated, shapes checked by the op's
 * infer step). Inputs are contiguous unless the op has RM_OPF_STRIDED. */
typedef int (*rm_kernel_fn)(rm_ctx *ctx, int nin, rm_tensor *const *in,
                            int nout, rm_tensor *const *out, const rm_attrs *a);

/* RM_IF_KERNEL(family, code...): code, unless family (an X entry's in core/ops.def) is
 * `view`, whose ops have no kernel. Backends wrap each op's kernel declaration and
 * table entry in it, so that no list of families is kept anywhere but ops.def. */
#define RM_IF_KERNEL(family, ...) RM_IFK_CAT(RM_IFK_, RM_IFK_IS_VIEW(family))(__VA_ARGS__)
#define RM_IFK_CAT(a, b) RM_IFK_CAT_(a, b)
#define RM_IFK_CAT_(a, b) a##b
#define RM_IFK_IS_VIEW(family) RM_IFK_SECOND(RM_IFK_PROBE_##family, 0, ~)
#define RM_IFK_SECOND(...) RM_IFK_SECOND_(__VA_ARGS__)
#define RM_IFK_SECOND_(a, b, ...) b
#define RM_IFK_PROBE_view ~, 1
#define RM_IFK_0(...) __VA_ARGS__
#define RM_IFK_1(...)

typedef struct rm_backend {
  const char *name;
  rm_device device;
  /* Per-context setup/teardown (device handles, caches); may be NULL. */
  int (*init)(rm_ctx *ctx, void **state);
  void (*shutdown)(rm_ctx *ctx, void *state);
  /* Raw device memory; the accounted allocator in core/alloc.c sits on top. */
  void *(*malloc)(rm_ctx *ctx, size_t bytes);
  void (*free)(rm_ctx *ctx, void *p, size_t bytes);
  /* Copies between host memory and this device (n bytes). */
  int (*to_host)(rm_ctx *ctx, void *dst, const void *src, size_t n);
  int (*from_host)(rm_ctx *ctx, void *dst, const void *src, size_t n);
  int (*synchronize)(rm_ctx *ctx);
  /* Caching devices: bytes held from the device (live + cached), giving the cache
   * back (returns bytes released), device name and memory. NULL where meaningless. */
  size_t (*reserved)(rm_ctx *ctx);
  size_t (*empty_cache)(rm_ctx *ctx);
  int (*device_info)(rm_ctx *ctx, char *name, size_t n, size_t *total, size_t *free_bytes);
  /* What runs this device's work (rm_get_info); NULL where there is nothing to say. */
  int (*runtime_info)(rm_ctx *ctx, rm_info *info);
  /* Timing mode (CUDA: REMAT_CUDA_PROFILE=1): fills ms[op] and calls[op] (RM_OP_COUNT
   * entries) with the device time per op since the last reset; returns 0 when the mode
   * is off. NULL where meaningless. */
  int (*profile)(rm_ctx *ctx, double *ms, int64_t *calls, bool reset);
  /* Kernel workspace one call of op takes at its peak (bytes, category workspace), for
   * dry runs: they skip the kernels, so without it a plan would miss what the kernels
   * borrow (attention's score blocks: 256 MiB on CUDA). in[] as the kernel would get
   * them. NULL, or 0 for an op: nothing predicted. */
  size_t (*workspace)(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a);
  /* Seconds per byte that data costs more from memory than from cache, measured on the
   * scratch block buf (bytes long, the working set in question): written and read back
   * (*roundtrip), and read (*read). NULL where not measured (the credit is then 0). */
  int (*memory_rates)(rm_ctx *ctx, void *buf, size_t bytes, double *roundtrip, double *read);
  /* Whether matmul's triangular products (ops.def) in dtype dt skip what lies outside
   * the triangle; elsewhere they are the plain product plus a masked copy or fill, so
   * a caller with a choice (the composed attention) takes the plain product. NULL: never. */
  bool (*tri_products)(rm_ctx *ctx, rm_dtype dt);
  /* Whether matmul_softmax (ops.def) of a product triangular in its result (lower) under
   * a causal softmax takes the softmax of each block of scores as it computes them,
   * never storing the product (dtype dt). A replay of a dropped causal softmax whose
   * scores nothing else reads then runs as that one op (core/op.c). NULL: never. */
  bool (*scores_softmax)(rm_ctx *ctx, rm_dtype dt);
  bool supports_dtype[RM_DTYPE_COUNT];
  /* The ops whose kernels take int32/int64 data (inputs other than index inputs, and
   * outputs other than index outputs: rm_op_def.index_in/index_out); every other op
   * given an integer tensor is refused by rm_op_run, naming the op and the dtype. */
  bool int_ops[RM_OP_COUNT];
  /* Machine balance: FLOPs the device does in the time it moves one byte. The cost of
   * replaying an op is FLOPs + bytes moved x this (a roofline estimate): memory-bound
   * ops (softmax, gelu, dropout) cost what their bytes cost, not their few FLOPs. */
  double flops_per_byte;
  rm_kernel_fn kernel[RM_OP_COUNT];
} rm_backend;

extern const rm_backend rm_cpu_backend;

#endif
