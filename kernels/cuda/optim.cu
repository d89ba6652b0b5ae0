/* CUDA kernels for the optimizer steps (semantics and attrs: core/op_optim.c), fused
 * and in place: each thread reads its element of every input before writing the
 * (possibly aliased) outputs. Scalars are formed in double on the host and applied in
 * the tensor's arithmetic type, as the CPU kernels (and PyTorch) do.
 *
 * rm_op_into runs no infer step, and this library cannot call core's, so the kernels
 * check the arguments themselves (counts, shapes, dtypes, contiguity) before touching
 * memory: a bad in-place call is an error, never a stray write.
 *
 * Mixed precision: a float32 param may take a bfloat16 grad. That is how a bfloat16
 * model trains (lua/remat/optim.lua): the optimizer keeps a float32 master copy of each
 * bfloat16 parameter and float32 state, steps the master with the model's bfloat16
 * gradient, and writes the rounded master back into the model (a cast). Updating the
 * bfloat16 weights themselves would lose every update below half an ulp (2^-9 of the
 * weight), and v = beta2 v would round back to v. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "cuda_common.cuh"

static bool same_shape(const rm_tensor *a, const rm_tensor *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

static int check_step(rm_ctx *ctx, const char *op, int want_in, int want_out, int nin,
                      rm_tensor *const *in, int nout, rm_tensor *const *out) {
  static const char *const names[] = { "param", "grad", "state 1", "state 2", "state 3" };
  if (nin != want_in || nout != want_out)
    return cu_fail(ctx, RM_ERR_ARG, "%s: takes %d inputs and %d outputs (got %d and %d)", op, want_in,
                   want_out, nin, nout);
  for (int i = 0; i < nin; i++) {
    bool dt_ok = in[i]->dtype == in[0]->dtype || (i == 1 && in[0]->dtype == RM_F32 && in[i]->dtype == RM_BF16);
    if (!dt_ok || in[i]->device != in[0]->device || !same_shape(in[i], in[0]))
      return cu_fail(ctx, RM_ERR_ARG, "%s: %s must have param's shape, dtype and device", op, names[i]);
    if (!cu_contig(in[i])) return cu_fail(ctx, RM_ERR_ARG, "%s: input %d must be contiguous", op, i + 1);
  }
  for (int j = 0; j < nout; j++)
    if (!same_shape(out[j], in[0]) || out[j]->dtype != in[0]->dtype || out[j]->device != in[0]->device ||
        !cu_contig(out[j]))
      return cu_fail(ctx, RM_ERR_ARG, "%s: output %d must be a contiguous tensor like param", op, j + 1);
  return RM_OK;
}

template <class T, class G>
__global__ void sgd_kernel(const T *pp, const G *pg, const T *pbi, T *po, T *pb, int64_t n, double lr_,
                           double mom_, double wd_, double keep_, bool nesterov, bool first) {
  typedef typename cu_acc<T>::type A;
  const A lr = (A)lr_, mom = (A)mom_, wd = (A)wd_, keep = (A)keep_;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    A p = cu_ld(pp + i), d = cu_ld(pg + i);
    if (wd != 0) d = d + wd * p;
    if (mom != 0) {
      A b = first ? d : cu_ld(pbi + i) * mom + keep * d;
      d = nesterov ? d + mom * b : b;
      cu_sv(pb + i, b);
    } else if (pb != pbi) {
      pb[i] = pbi[i];
    }
    cu_sv(po + i, p - lr * d);
  }
}

RM_CUDA_KERNEL(sgd_step) {
  if (check_step(ctx, "sgd_step", 3, 2, nin, in, nout, out)) return ctx->err_code;
  int64_t n = cu_numel(in[0]);
  if (!n) return RM_OK;
  cudaStream_t st = cu_st(ctx)->stream;
  if (in[1]->dtype != in[0]->dtype) /* float32 master, bfloat16 grad */
    sgd_kernel<float, __nv_bfloat16><<<cu_blocks(n), CU_THREADS, 0, st>>>(
        (const float *)cu_ptr(in[0]), (const __nv_bfloat16 *)cu_ptr(in[1]), (const float *)cu_ptr(in[2]),
        (float *)cu_ptr(out[0]), (float *)cu_ptr(out[1]), n, a->sgd.lr, a->sgd.momentum, a->sgd.weight_decay,
        1.0 - a->sgd.dampening, a->sgd.nesterov, a->sgd.first);
  else
    CU_DISPATCH(ctx, "sgd_step", in[0]->dtype,
                sgd_kernel<T, T><<<cu_blocks(n), CU_THREADS, 0, st>>>(
                    (const T *)cu_ptr(in[0]), (const T *)cu_ptr(in[1]), (const T *)cu_ptr(in[2]),
                    (T *)cu_ptr(out[0]), (T *)cu_ptr(out[1]), n, a->sgd.lr, a->sgd.momentum, a->sgd.weight_decay,
                    1.0 - a->sgd.dampening, a->sgd.nesterov, a->sgd.first));
  return CU_LAUNCHED(ctx, "sgd_step kernel");
}

/* PyTorch's lerp: start + w (end - start), from the other end when w >= 0.5. */
template <class A> __device__ __forceinline__ A lerp_(A s, A e, A w) {
  return w < (A)0.5 ? s + w * (e - s) : e - (e - s) * ((A)1 - w);
}

/* AdamW's scalars, formed in double on the host (adamw_consts) and rounded to the
 * arithmetic type on the device, the same way for both kernels below. */
typedef struct adamw_consts {
  double w1, beta2, c2, eps, step_size, bc2_sqrt, decay, wd;
  bool decoupled;
} adamw_consts;

static adamw_consts adamw_consts_of(const rm_attrs *a) {
  double lr = a->adamw.lr, b1 = a->adamw.beta1, b2 = a->adamw.beta2, wd = a->adamw.weight_decay;
  double bc1 = 1.0 - pow(b1, (double)a->adamw.step), bc2 = 1.0 - pow(b2, (double)a->adamw.step);
  adamw_consts k = { 1.0 - b1, b2, 1.0 - b2, a->adamw.eps, lr / bc1, sqrt(bc2), 1.0 - lr * wd, wd, a->adamw.decoupled };
  return k;
}

/* One element of the update, in place or not (every input read before any write). */
template <class T, class G>
__device__ __forceinline__ void adamw_elem(const T *pp, const G *pg, const T *pmi, const T *pvi, T *po, T *pm, T *pv,
                                           int64_t i, const adamw_consts &k) {
  typedef typename cu_acc<T>::type A;
  const A w1 = (A)k.w1, beta2 = (A)k.beta2, c2 = (A)k.c2, eps = (A)k.eps, step_size = (A)k.step_size;
  const A bc2_sqrt = (A)k.bc2_sqrt, decay = (A)k.decay, wd = (A)k.wd;
  A p = cu_ld(pp + i), g = cu_ld(pg + i), m = cu_ld(pmi + i), v = cu_ld(pvi + i);
  if (k.decoupled) p = p * decay;
  else if (wd != 0) g = g + wd * p;
  m = lerp_(m, g, w1);
  v = v * beta2 + c2 * g * g;
  A denom = sqrt(v) / bc2_sqrt + eps;
  cu_sv(pm + i, m);
  cu_sv(pv + i, v);
  cu_sv(po + i, p + (-step_size) * (m / denom));
}

template <class T, class G>
__global__ void adamw_kernel(const T *pp, const G *pg, const T *pmi, const T *pvi, T *po, T *pm, T *pv,
                             int64_t n, adamw_consts k) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    adamw_elem<T, G>(pp, pg, pmi, pvi, po, pm, pv, i, k);
}

/* ---- adamw_multi_step: one launch for up to ADAMW_MULTI_MAX tensors ----
 * The table of tensors (pointers, sizes, and the first block of the grid that works on
 * each) is the launch's parameter block: the driver copies it to the device with the
 * launch (constant memory, read by every block), so there is no separate copy, no
 * allocation and no synchronisation. 64 entries of 48 bytes fit the 4 KB a kernel's
 * parameters may take. Each block updates ADAMW_MULTI_CHUNK elements of one tensor; it
 * finds its tensor by a binary search of the first blocks. The per-element code is
 * adamw_elem, so the results are adamw_step's bits.
 * Estimate (from bytes, not measured) at GPT-2 small (124M float32 master weights with
 * float32 m and v, bfloat16 grads, 148 parameter tensors, H100/H200): the update moves
 * 124M x 26 bytes = 3.2 GB, ~1 ms at ~3.3 TB/s either way; what goes is 148 launches
 * (~3-5 us each with their host-side setup) becoming 3 (~0.5 ms a step), and the tail
 * of the many small tensors (biases, layernorm weights) that leave most SMs idle. */
#define ADAMW_MULTI_MAX 64
#define ADAMW_MULTI_CHUNK 8192

typedef struct adamw_part {
  void *p, *m, *v;
  const void *g;
  int64_t n, block0;
} adamw_part;

typedef struct adamw_table {
  adamw_part part[ADAMW_MULTI_MAX];
  int nparts;
} adamw_table;

template <class T, class G>
__global__ void adamw_multi_kernel(const adamw_table tab, adamw_consts k) {
  int64_t b = blockIdx.x;
  int lo = 0, hi = tab.nparts - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (tab.part[mid].block0 <= b) lo = mid;
    else hi = mid - 1;
  }
  const adamw_part &q = tab.part[lo];
  int64_t start = (b - q.block0) * ADAMW_MULTI_CHUNK;
  int64_t end = start + ADAMW_MULTI_CHUNK < q.n ? start + ADAMW_MULTI_CHUNK : q.n;
  T *p = (T *)q.p, *m = (T *)q.m, *v = (T *)q.v;
  const G *g = (const G *)q.g;
  for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) adamw_elem<T, G>(p, g, m, v, p, m, v, i, k);
}

RM_CUDA_KERNEL(adamw_multi_step) {
  int K = nin / 4;
  if (nin % 4 || K < 1 || K > ADAMW_MULTI_MAX || nout != 0)
    return cu_fail(ctx, RM_ERR_ARG, "adamw_multi_step: takes 1 to %d (param, grad, m, v) groups and no outputs",
                   ADAMW_MULTI_MAX);
  rm_dtype pt = in[0]->dtype, gt = in[1]->dtype;
  adamw_table tab;
  memset(&tab, 0, sizeof tab);
  int64_t blocks = 0;
  for (int q = 0; q < K; q++) {
    rm_tensor *const *t = in + 4 * q;
    for (int i = 0; i < 4; i++)
      if (!cu_contig(t[i]) || t[i]->dtype != (i == 1 ? gt : pt) || cu_numel(t[i]) != cu_numel(t[0]))
        return cu_fail(ctx, RM_ERR_ARG, "adamw_multi_step: group %d: every tensor contiguous, of its param's size, "
                       "one param and one grad dtype", q + 1);
    int64_t n = cu_numel(t[0]);
    if (!n) continue;
    adamw_part *part = &tab.part[tab.nparts++];
    part->p = cu_ptr(t[0]), part->g = cu_ptr(t[1]), part->m = cu_ptr(t[2]), part->v = cu_ptr(t[3]);
    part->n = n;
    part->block0 = blocks;
    blocks += (n + ADAMW_MULTI_CHUNK - 1) / ADAMW_MULTI_CHUNK;
  }
  if (!blocks) return RM_OK;
  if (blocks > INT_MAX) return cu_fail(ctx, RM_ERR_SHAPE, "adamw_multi_step: %lld blocks", (long long)blocks);
  adamw_consts k = adamw_consts_of(a);
  cudaStream_t st = cu_st(ctx)->stream;
  if (gt != pt) { /* float32 master, bfloat16 grad */
    if (pt != RM_F32 || gt != RM_BF16) return cu_bad_dtype(ctx, "adamw_multi_step", gt);
    adamw_multi_kernel<float, __nv_bfloat16><<<(unsigned)blocks, 256, 0, st>>>(tab, k);
  } else
    CU_DISPATCH(ctx, "adamw_multi_step", pt, adamw_multi_kernel<T, T><<<(unsigned)blocks, 256, 0, st>>>(tab, k));
  return CU_LAUNCHED(ctx, "adamw_multi_step kernel");
}

RM_CUDA_KERNEL(adamw_step) {
  if (check_step(ctx, "adamw_step", 4, 3, nin, in, nout, out)) return ctx->err_code;
  int64_t n = cu_numel(in[0]);
  if (!n) return RM_OK;
  adamw_consts k = adamw_consts_of(a);
  cudaStream_t st = cu_st(ctx)->stream;
  if (in[1]->dtype != in[0]->dtype) /* float32 master, bfloat16 grad */
    adamw_kernel<float, __nv_bfloat16><<<cu_blocks(n), CU_THREADS, 0, st>>>(
        (const float *)cu_ptr(in[0]), (const __nv_bfloat16 *)cu_ptr(in[1]), (const float *)cu_ptr(in[2]),
        (const float *)cu_ptr(in[3]), (float *)cu_ptr(out[0]), (float *)cu_ptr(out[1]), (float *)cu_ptr(out[2]),
        n, k);
  else
    CU_DISPATCH(ctx, "adamw_step", in[0]->dtype,
                adamw_kernel<T, T><<<cu_blocks(n), CU_THREADS, 0, st>>>(
                    (const T *)cu_ptr(in[0]), (const T *)cu_ptr(in[1]), (const T *)cu_ptr(in[2]),
                    (const T *)cu_ptr(in[3]), (T *)cu_ptr(out[0]), (T *)cu_ptr(out[1]), (T *)cu_ptr(out[2]),
                    n, k));
  return CU_LAUNCHED(ctx, "adamw_step kernel");
}

/* torch.optim.RMSprop; an unused state (buf without momentum, grad_avg when not
 * centered) is copied to its output only when that is another tensor. */
template <class T, class G>
__global__ void rmsprop_kernel(const T *pp, const G *pg, const T *psi, const T *pbi, const T *pai, T *po, T *ps,
                               T *pb, T *pa, int64_t n, double lr_, double alpha_, double eps_, double mom_,
                               double wd_, bool centered) {
  typedef typename cu_acc<T>::type A;
  const A lr = (A)lr_, alpha = (A)alpha_, c = (A)(1.0 - alpha_), eps = (A)eps_, mom = (A)mom_, wd = (A)wd_;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    A p = cu_ld(pp + i), g = cu_ld(pg + i);
    if (wd != 0) g = g + wd * p;
    A s = cu_ld(psi + i) * alpha + c * g * g;
    A avg;
    if (centered) {
      A ga = lerp_(cu_ld(pai + i), g, c);
      avg = sqrt(s + (A)-1 * ga * ga) + eps;
      cu_sv(pa + i, ga);
    } else {
      avg = sqrt(s) + eps;
      if (pa != pai) pa[i] = pai[i];
    }
    cu_sv(ps + i, s);
    if (mom != 0) {
      A b = cu_ld(pbi + i) * mom + g / avg;
      cu_sv(pb + i, b);
      cu_sv(po + i, p + (-lr) * b);
    } else {
      if (pb != pbi) pb[i] = pbi[i];
      cu_sv(po + i, p + (-lr) * (g / avg));
    }
  }
}

RM_CUDA_KERNEL(rmsprop_step) {
  if (check_step(ctx, "rmsprop_step", 5, 4, nin, in, nout, out)) return ctx->err_code;
  int64_t n = cu_numel(in[0]);
  if (!n) return RM_OK;
  double wd = a->rmsprop.weight_decay;
  bool centered = a->rmsprop.centered;
  cudaStream_t st = cu_st(ctx)->stream;
  if (in[1]->dtype != in[0]->dtype) /* float32 master, bfloat16 grad */
    rmsprop_kernel<float, __nv_bfloat16><<<cu_blocks(n), CU_THREADS, 0, st>>>(
        (const float *)cu_ptr(in[0]), (const __nv_bfloat16 *)cu_ptr(in[1]), (const float *)cu_ptr(in[2]),
        (const float *)cu_ptr(in[3]), (const float *)cu_ptr(in[4]), (float *)cu_ptr(out[0]),
        (float *)cu_ptr(out[1]), (float *)cu_ptr(out[2]), (float *)cu_ptr(out[3]), n, a->rmsprop.lr,
        a->rmsprop.alpha, a->rmsprop.eps, a->rmsprop.momentum, wd, centered);
  else
    CU_DISPATCH(ctx, "rmsprop_step", in[0]->dtype,
                rmsprop_kernel<T, T><<<cu_blocks(n), CU_THREADS, 0, st>>>(
                    (const T *)cu_ptr(in[0]), (const T *)cu_ptr(in[1]), (const T *)cu_ptr(in[2]),
                    (const T *)cu_ptr(in[3]), (const T *)cu_ptr(in[4]), (T *)cu_ptr(out[0]), (T *)cu_ptr(out[1]),
                    (T *)cu_ptr(out[2]), (T *)cu_ptr(out[3]), n, a->rmsprop.lr, a->rmsprop.alpha,
                    a->rmsprop.eps, a->rmsprop.momentum, wd, centered));
  return CU_LAUNCHED(ctx, "rmsprop_step kernel");
}
