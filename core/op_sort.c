/* Order statistics and scans along one dimension: min, sort, topk, cumsum.
 *
 * Attrs (dims 0-based, negatives count from the end):
 *   min:    reduce {dim (RM_DIM_ALL: every dim), keepdim}; outputs values, indices
 *   sort:   sort {dim, descending}; outputs values, indices (same shape as x)
 *   topk:   topk {dim, k, largest (false: smallest)}; outputs values, indices
 *           (size k along dim), in sorted order
 *   cumsum: cumsum {dim, reverse (sums from the end)}
 *
 * Order: ascending puts NaN last, descending first (NaN ranks above every number, as
 * in PyTorch); ties keep their original order (stable). min: the first minimum, and
 * the first NaN wins over numbers. Indices are 1-based, int64. cumsum
 * accumulates in float64 on every backend, so float32 results match bit for bit. */
#include <string.h>

#include "ops.h"

/* The dim of sort or topk. */
static int64_t order_dim(rm_op_id op, const rm_attrs *a) {
  return op == RM_OP_TOPK ? a->topk.dim : a->sort.dim;
}

/* x's size along dim (normalised into *d). */

static int sort_dim(rm_ctx *ctx, const char *op, rm_tensor *x, int64_t dim, int *d) {
  if (x->ndim == 0) return rm_fail(ctx, RM_ERR_ARG, "%s: expected at least a 1-d tensor, got a 0-d one", op);
  return rm_check_dim(ctx, op, dim, x->ndim, d);
}

static int min_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  rm_tensor *x = in[0];
  rm_tensor_meta(x, &out[0]);
  bool keep = a->reduce.keepdim;
  int64_t n;
  if (a->reduce.dim == RM_DIM_ALL || x->ndim == 0) {
    n = rm_tensor_numel(x);
    if (keep) for (int k = 0; k < x->ndim; k++) out[0].shape[k] = 1;
    else out[0].ndim = 0;
  } else {
    int d;
    if (rm_check_dim(ctx, "min", a->reduce.dim, x->ndim, &d)) return ctx->err_code;
    n = x->shape[d];
    if (keep) {
      out[0].shape[d] = 1;
    } else {
      for (int k = d; k < x->ndim - 1; k++) out[0].shape[k] = out[0].shape[k + 1];
      out[0].ndim--;
    }
  }
  if (n == 0 && (a->reduce.dim == RM_DIM_ALL || rm_meta_numel(&out[0]) > 0)) {
    char s[96];
    return rm_fail(ctx, RM_ERR_SHAPE, "min: cannot reduce over an empty dimension (input %s)",
                   rm_tensor_shape_str(x, s, sizeof s));
  }
  out[1] = out[0];
  out[1].dtype = RM_I64;
  return RM_OK;
}

static int sort_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  int d;
  if (sort_dim(ctx, "sort", in[0], a->sort.dim, &d)) return ctx->err_code;
  rm_tensor_meta(in[0], &out[0]);
  out[1] = out[0];
  out[1].dtype = RM_I64;
  return RM_OK;
}

static int topk_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  int d;
  if (sort_dim(ctx, "topk", in[0], a->topk.dim, &d)) return ctx->err_code;
  if (a->topk.k < 0 || a->topk.k > in[0]->shape[d])
    return rm_fail(ctx, RM_ERR_ARG, "topk: k = %lld is out of range for dimension %d of size %lld",
                   (long long)a->topk.k, d + 1, (long long)in[0]->shape[d]);
  rm_tensor_meta(in[0], &out[0]);
  out[0].shape[d] = a->topk.k;
  out[1] = out[0];
  out[1].dtype = RM_I64;
  return RM_OK;
}

static int cumsum_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  int d;
  if (sort_dim(ctx, "cumsum", in[0], a->cumsum.dim, &d)) return ctx->err_code;
  rm_tensor_meta(in[0], &out[0]);
  return RM_OK;
}

/* ---- backward ---- */

/* g scattered (added) at the saved 1-based indices along dim d into zeros of x's shape:
 * the gradient of every op here that picks elements (min, sort, topk). */
static int scatter_back(rm_ctx *ctx, rm_node *n, rm_tensor *g, int d, rm_tensor **gin) {
  rm_tensor *x = n->in[0];
  rm_tensor *idx = rm_node_output(ctx, n, 1);
  if (!idx) return ctx->err_code;
  rm_attrs at;
  rm_attrs_init(&at);
  int64_t ks[RM_MAX_DIM];
  int kn;
  if (d < 0) {  /* min over every dim: on the flat view */
    kn = 1;
    ks[0] = 1;
    at.scatter_add.dim = 0;
    at.ndim = 1;
    at.shape[0] = rm_tensor_numel(x);
  } else {
    kn = x->ndim;
    memcpy(ks, idx->shape, sizeof(int64_t) * (size_t)kn);
    at.scatter_add.dim = d;
    at.ndim = x->ndim;
    memcpy(at.shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
  }
  rm_tensor *gk = rm_reshape(ctx, g, kn, ks);
  rm_tensor *ik = gk ? rm_reshape(ctx, idx, kn, ks) : NULL;
  rm_tensor *in[2] = { gk, ik };
  rm_tensor *s = ik ? rm_op1(ctx, RM_OP_SCATTER_ADD, 2, in, &at) : NULL;
  rm_tensor_drop(ctx, gk);
  rm_tensor_drop(ctx, ik);
  if (!s) return ctx->err_code;
  if (d >= 0) { gin[0] = s; return RM_OK; }
  gin[0] = rm_reshape(ctx, s, x->ndim, x->shape);
  rm_tensor_drop(ctx, s);
  return gin[0] ? RM_OK : ctx->err_code;
}

static int min_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *x = n->in[0];
  int d = -1;
  if (n->attrs.reduce.dim != RM_DIM_ALL && x->ndim > 0) rm_check_dim(ctx, "min", n->attrs.reduce.dim, x->ndim, &d);
  if (d >= 0 && !n->attrs.reduce.keepdim) {
    /* the indices keep no dim; put it back as size 1 so that they line up with g */
    int64_t ks[RM_MAX_DIM];
    for (int k = 0; k < x->ndim; k++) ks[k] = k == d ? 1 : x->shape[k];
    rm_tensor *idx = rm_node_output(ctx, n, 1);
    if (!idx) return ctx->err_code;
    rm_tensor *gk = rm_reshape(ctx, g[0], x->ndim, ks);
    rm_tensor *ik = gk ? rm_reshape(ctx, idx, x->ndim, ks) : NULL;
    rm_attrs at;
    rm_attrs_init(&at);
    at.scatter_add.dim = d;
    at.ndim = x->ndim;
    memcpy(at.shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    rm_tensor *in[2] = { gk, ik };
    gin[0] = ik ? rm_op1(ctx, RM_OP_SCATTER_ADD, 2, in, &at) : NULL;
    rm_tensor_drop(ctx, gk);
    rm_tensor_drop(ctx, ik);
    return gin[0] ? RM_OK : ctx->err_code;
  }
  return scatter_back(ctx, n, g[0], d, gin);
}

static int sort_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  int d;
  rm_check_dim(ctx, rm_op_name(n->op), order_dim(n->op, &n->attrs), n->in[0]->ndim, &d);
  return scatter_back(ctx, n, g[0], d, gin);
}

/* The adjoint of a running sum is the running sum the other way. */
static int cumsum_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_attrs at = n->attrs;
  at.cumsum.reverse = !at.cumsum.reverse;
  gin[0] = rm_op1(ctx, RM_OP_CUMSUM, 1, g, &at);
  return gin[0] ? RM_OK : ctx->err_code;
}

/* ---- cost ---- */

static double numel_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return (double)rm_tensor_numel(in[0]);
}

/* n log2 n comparisons per column (the CPU's merge sort). */
static double order_flops(rm_tensor *const *in, int64_t dim) {
  int nd = in[0]->ndim;
  int64_t d = dim < 0 ? dim + nd : dim;
  int64_t n = d >= 0 && d < nd ? in[0]->shape[d] : 1;
  double lg = 1;
  for (int64_t m = n; m > 1; m >>= 1) lg++;
  return (double)rm_tensor_numel(in[0]) * lg;
}

static double sort_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return order_flops(in, a->sort.dim);
}

static double topk_flops(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return order_flops(in, a->topk.dim);
}

/* ---- wrappers ---- */

rm_tensor *rm_cumsum(rm_ctx *ctx, rm_tensor *a, int64_t dim, bool reverse) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.cumsum.dim = dim;
  at.cumsum.reverse = reverse;
  return rm_op1(ctx, RM_OP_CUMSUM, 1, &a, &at);
}

/* ---- definitions ---- */

const rm_op_def rm_opdef_min = { .name = "min", .nin = 1, .nout = 2, .nvis = 2,
  .save_out = RM_NTH(1), .nodiff_out = RM_NTH(1), .index_out = RM_NTH(1), .infer = min_infer, .backward = min_backward, .flops = numel_flops };
const rm_op_def rm_opdef_sort = { .name = "sort", .nin = 1, .nout = 2, .nvis = 2,
  .save_out = RM_NTH(1), .nodiff_out = RM_NTH(1), .index_out = RM_NTH(1), .infer = sort_infer, .backward = sort_backward, .flops = sort_flops };
const rm_op_def rm_opdef_topk = { .name = "topk", .nin = 1, .nout = 2, .nvis = 2,
  .save_out = RM_NTH(1), .nodiff_out = RM_NTH(1), .index_out = RM_NTH(1), .infer = topk_infer, .backward = sort_backward, .flops = topk_flops };
const rm_op_def rm_opdef_cumsum = { .name = "cumsum", .nin = 1, .nout = 1, .nvis = 1,
  .infer = cumsum_infer, .backward = cumsum_backward, .flops = numel_flops };
