/* Indexing: index_select, gather, concat, embedding, causal_mask, and the backward
 * helpers index_add, scatter_add, narrow_backward. Dims are 0-based. Index
 * tensors hold 1-based values: int64, int32, or whole numbers in float32/float64
 * (whatever the data's dtype); their range is checked by the kernels, which see the
 * values.
 *
 * Attrs of every op in this file:
 *   index_select(x, idx)      axis {dim}; idx 1-D
 *   gather(x, idx)            axis {dim}; idx has x's ndim, sizes <= x's off dim
 *   concat(t1, ..., tn)       axis {dim} (variadic)
 *   embedding(weight, idx)    none; weight (V, D), idx any shape -> (idx..., D)
 *   causal_mask(scores)       {zeros}: false: fill -inf above the diagonal; true: 0 (the
 *                             backward of the mask is the same mask with zeros)
 *   index_add(src, idx)       {dim, size of dim in the output}; idx 1-D of
 *                             length src.shape[dim]; out = zeros, then
 *                             out.select(dim, idx[k]) += src.select(dim, k)
 *   scatter_add(src, idx)     {dim, shape = the output shape}; idx has src's shape;
 *                             out = zeros, out[.., idx[p], ..] += src[p] along dim
 *   narrow_backward(g)        {dim, start (0-based), size (the full size of dim)}:
 *                             zeros of the full shape with g in the window */
#include <stdio.h>
#include <string.h>

#include "ops.h"

static rm_tensor *with_dim(rm_ctx *ctx, rm_op_id op, rm_tensor *a, int64_t dim, rm_tensor *idx) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.axis.dim = dim;
  rm_tensor *in[2] = { a, idx };
  return rm_op1(ctx, op, 2, in, &at);
}

rm_tensor *rm_index_select(rm_ctx *ctx, rm_tensor *a, int64_t dim, rm_tensor *idx) {
  return with_dim(ctx, RM_OP_INDEX_SELECT, a, dim, idx);
}

rm_tensor *rm_gather(rm_ctx *ctx, rm_tensor *a, int64_t dim, rm_tensor *idx) {
  return with_dim(ctx, RM_OP_GATHER, a, dim, idx);
}

rm_tensor *rm_concat(rm_ctx *ctx, int n, rm_tensor *const *ts, int64_t dim) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.axis.dim = dim;
  return rm_op1(ctx, RM_OP_CONCAT, n, ts, &at);
}

rm_tensor *rm_embedding(rm_ctx *ctx, rm_tensor *weight, rm_tensor *idx) {
  rm_tensor *in[2] = { weight, idx };
  return rm_op1(ctx, RM_OP_EMBEDDING, 2, in, NULL);
}

rm_tensor *rm_causal_mask(rm_ctx *ctx, rm_tensor *scores) {
  return rm_op1(ctx, RM_OP_CAUSAL_MASK, 1, &scores, NULL);
}

/* ---- shared checks ---- */

/* An index tensor: on x's device, an integer or float dtype (float values must be
 * whole numbers; the kernels check). */
static int check_index(rm_ctx *ctx, const char *op, rm_tensor *x, rm_tensor *idx, const char *what) {
  if (idx->device != x->device)
    return rm_fail(ctx, RM_ERR_DEVICE, "%s: the %s are on %s but the data is on %s", op, what,
                   rm_device_name(idx->device), rm_device_name(x->device));
  char w[32];
  snprintf(w, sizeof w, "the %s", what);
  return rm_check_index_dtype(ctx, op, w, idx);
}

/* Normalises dim for an op that needs at least one dimension. */
static int data_dim(rm_ctx *ctx, const char *op, rm_tensor *x, int64_t dim, int *d) {
  if (x->ndim == 0) return rm_fail(ctx, RM_ERR_SHAPE, "%s: cannot index a 0-d tensor", op);
  return rm_check_dim(ctx, op, dim, x->ndim, d);
}

/* Runs index_add(src, idx) into a zero tensor of size `size` along dim d. */
static rm_tensor *index_add(rm_ctx *ctx, rm_tensor *src, rm_tensor *idx, int d, int64_t size) {
  rm_attrs a;
  rm_attrs_init(&a);
  a.index_add.dim = d;
  a.index_add.size = size;
  rm_tensor *in[2] = { src, idx };
  return rm_op1(ctx, RM_OP_INDEX_ADD, 2, in, &a);
}

static double flops_src(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out) {
  return (double)rm_tensor_numel(in[0]);
}

/* ---- index_select ---- */

static int index_select_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  rm_tensor *x = in[0], *idx = in[1];
  int d;
  char s[96];
  if (data_dim(ctx, "index_select", x, a->axis.dim, &d)) return ctx->err_code;
  if (check_index(ctx, "index_select", x, idx, "indices")) return ctx->err_code;
  if (idx->ndim != 1)
    return rm_fail(ctx, RM_ERR_SHAPE, "index_select: the indices must be 1-D, got %s",
                   rm_tensor_shape_str(idx, s, sizeof s));
  rm_tensor_meta(x, &out[0]);
  out[0].shape[d] = idx->shape[0];
  return RM_OK;
}

static int index_select_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  if (!rm_node_needs_grad(n, 0)) return RM_OK;
  int d;
  if (rm_check_dim(ctx, "index_select", n->attrs.axis.dim, n->in[0]->ndim, &d)) return ctx->err_code;
  rm_tensor *idx = rm_node_input(ctx, n, 1);
  if (!idx) return ctx->err_code;
  gin[0] = index_add(ctx, g[0], idx, d, n->in[0]->shape[d]);
  return gin[0] ? RM_OK : ctx->err_code;
}

const rm_op_def rm_opdef_index_select = {
  .name = "index_select", .nin = 2, .nout = 1, .nvis = 1, .save_in = RM_NTH(1), .index_in = RM_NTH(1),
  .infer = index_select_infer, .backward = index_select_backward,
};

/* ---- gather ---- */

static int gather_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  rm_tensor *x = in[0], *idx = in[1];
  int d;
  char s1[96], s2[96];
  if (data_dim(ctx, "gather", x, a->axis.dim, &d)) return ctx->err_code;
  if (check_index(ctx, "gather", x, idx, "indices")) return ctx->err_code;
  if (idx->ndim != x->ndim)
    return rm_fail(ctx, RM_ERR_SHAPE, "gather: the indices (%s) must have as many dimensions as the input (%s)",
                   rm_tensor_shape_str(idx, s1, sizeof s1), rm_tensor_shape_str(x, s2, sizeof s2));
  for (int k = 0; k < x->ndim; k++)
    if (k != d && idx->shape[k] > x->shape[k])
      return rm_fail(ctx, RM_ERR_SHAPE,
                     "gather: the indices (%s) are larger than the input (%s) in dimension %d (only dimension %d may differ)",
                     rm_tensor_shape_str(idx, s1, sizeof s1), rm_tensor_shape_str(x, s2, sizeof s2), k + 1, d + 1);
  rm_tensor_meta(idx, &out[0]);
  out[0].dtype = x->dtype;
  return RM_OK;
}

static int gather_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  if (!rm_node_needs_grad(n, 0)) return RM_OK;
  rm_tensor *x = n->in[0];
  int d;
  if (rm_check_dim(ctx, "gather", n->attrs.axis.dim, x->ndim, &d)) return ctx->err_code;
  rm_tensor *idx = rm_node_input(ctx, n, 1);
  if (!idx) return ctx->err_code;
  rm_attrs a;
  rm_attrs_init(&a);
  a.scatter_add.dim = d;
  a.ndim = x->ndim;
  memcpy(a.shape, x->shape, sizeof a.shape);
  rm_tensor *in[2] = { g[0], idx };
  gin[0] = rm_op1(ctx, RM_OP_SCATTER_ADD, 2, in, &a);
  return gin[0] ? RM_OK : ctx->err_code;
}

const rm_op_def rm_opdef_gather = {
  .name = "gather", .nin = 2, .nout = 1, .nvis = 1, .save_in = RM_NTH(1), .index_in = RM_NTH(1),
  .infer = gather_infer, .backward = gather_backward,
};

/* ---- concat ---- */

static int concat_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  if (nin < 1) return rm_fail(ctx, RM_ERR_ARG, "concat: needs at least one tensor");
  if (rm_check_same_device(ctx, "concat", nin, in) || rm_check_same_dtype(ctx, "concat", nin, in))
    return ctx->err_code;
  int d;
  if (in[0]->ndim == 0) return rm_fail(ctx, RM_ERR_SHAPE, "concat: cannot concatenate 0-d tensors");
  if (rm_check_dim(ctx, "concat", a->axis.dim, in[0]->ndim, &d)) return ctx->err_code;
  rm_tensor_meta(in[0], &out[0]);
  char s1[96], s2[96];
  for (int i = 1; i < nin; i++) {
    bool ok = in[i]->ndim == in[0]->ndim;
    for (int k = 0; ok && k < in[0]->ndim; k++)
      ok = k == d || in[i]->shape[k] == in[0]->shape[k];
    if (!ok)
      return rm_fail(ctx, RM_ERR_SHAPE, "concat: tensor %d is %s but tensor 1 is %s (sizes must match except in dimension %d)",
                     i + 1, rm_tensor_shape_str(in[i], s1, sizeof s1), rm_tensor_shape_str(in[0], s2, sizeof s2), d + 1);
    out[0].shape[d] += in[i]->shape[d];
  }
  return RM_OK;
}

static int concat_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  int d;
  if (rm_check_dim(ctx, "concat", n->attrs.axis.dim, n->in[0]->ndim, &d)) return ctx->err_code;
  int64_t start = 0;
  for (int i = 0; i < n->nin; i++) {
    int64_t len = n->in[i]->shape[d];
    if (rm_node_needs_grad(n, i)) {
      rm_tensor *w = rm_narrow(ctx, g[0], d, start, len);
      gin[i] = w ? rm_contiguous(ctx, w) : NULL;
      rm_tensor_drop(ctx, w);
      if (!gin[i]) return ctx->err_code;
    }
    start += len;
  }
  return RM_OK;
}

const rm_op_def rm_opdef_concat = {
  .name = "concat", .nin = -1, .nout = 1, .nvis = 1,
  .infer = concat_infer, .backward = concat_backward,
};

/* ---- embedding ---- */

static int embedding_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  rm_tensor *w = in[0], *idx = in[1];
  char s[96];
  if (w->ndim != 2)
    return rm_fail(ctx, RM_ERR_SHAPE, "embedding: the weight must be 2-D (vocabulary x dim), got %s",
                   rm_tensor_shape_str(w, s, sizeof s));
  if (check_index(ctx, "embedding", w, idx, "indices")) return ctx->err_code;
  if (idx->ndim + 1 > RM_MAX_DIM)
    return rm_fail(ctx, RM_ERR_SHAPE, "embedding: the indices have %d dimensions (at most %d)", idx->ndim,
                   RM_MAX_DIM - 1);
  out[0].dtype = w->dtype;
  out[0].device = w->device;
  out[0].ndim = idx->ndim + 1;
  memcpy(out[0].shape, idx->shape, sizeof(int64_t) * (size_t)idx->ndim);
  out[0].shape[idx->ndim] = w->shape[1];
  return RM_OK;
}

static int embedding_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  if (!rm_node_needs_grad(n, 0)) return RM_OK;
  rm_tensor *w = n->in[0];
  rm_tensor *idx = rm_node_input(ctx, n, 1);
  if (!idx) return ctx->err_code;
  int64_t count = rm_tensor_numel(idx);
  int64_t gshape[2] = { count, w->shape[1] };
  rm_tensor *g2 = rm_reshape(ctx, g[0], 2, gshape);
  rm_tensor *i1 = g2 ? rm_reshape(ctx, idx, 1, &count) : NULL;
  gin[0] = i1 ? index_add(ctx, g2, i1, 0, w->shape[0]) : NULL;
  rm_tensor_drop(ctx, g2);
  rm_tensor_drop(ctx, i1);
  return gin[0] ? RM_OK : ctx->err_code;
}

const rm_op_def rm_opdef_embedding = {
  .name = "embedding", .nin = 2, .nout = 1, .nvis = 1, .save_in = RM_NTH(1), .index_in = RM_NTH(1),
  .infer = embedding_infer, .backward = embedding_backward,
};

/* ---- causal_mask ---- */

static int causal_mask_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  rm_tensor *x = in[0];
  char s[96];
  if (x->ndim < 2 || x->shape[x->ndim - 1] != x->shape[x->ndim - 2])
    return rm_fail(ctx, RM_ERR_SHAPE, "causal_mask: the scores must be (..., T, T), got %s",
                   rm_tensor_shape_str(x, s, sizeof s));
  rm_tensor_meta(x, &out[0]);
  return RM_OK;
}

static int causal_mask_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_attrs a;
  rm_attrs_init(&a);
  a.causal_mask.zeros = true;
  gin[0] = rm_op1(ctx, RM_OP_CAUSAL_MASK, 1, g, &a);
  return gin[0] ? RM_OK : ctx->err_code;
}

const rm_op_def rm_opdef_causal_mask = {
  .name = "causal_mask", .nin = 1, .nout = 1, .nvis = 1,
  .infer = causal_mask_infer, .backward = causal_mask_backward,
};

/* ---- index_add (backward of index_select and embedding) ---- */

static int index_add_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  rm_tensor *src = in[0], *idx = in[1];
  int d;
  char s1[96], s2[96];
  if (data_dim(ctx, "index_add", src, a->index_add.dim, &d)) return ctx->err_code;
  if (check_index(ctx, "index_add", src, idx, "indices")) return ctx->err_code;
  if (idx->ndim != 1 || idx->shape[0] != src->shape[d])
    return rm_fail(ctx, RM_ERR_SHAPE, "index_add: the indices (%s) must be 1-D with one index per slice of the source (%s) along dimension %d",
                   rm_tensor_shape_str(idx, s1, sizeof s1), rm_tensor_shape_str(src, s2, sizeof s2), d + 1);
  if (a->index_add.size < 0)
    return rm_fail(ctx, RM_ERR_ARG, "index_add: output size %lld is negative", (long long)a->index_add.size);
  rm_tensor_meta(src, &out[0]);
  out[0].shape[d] = a->index_add.size;
  return RM_OK;
}

const rm_op_def rm_opdef_index_add = {
  .name = "index_add", .nin = 2, .nout = 1, .nvis = 1, .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL,
  .index_in = RM_NTH(1),
  .infer = index_add_infer, .flops = flops_src,
};

/* ---- scatter_add (backward of gather) ---- */

static int scatter_add_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  rm_tensor *src = in[0], *idx = in[1];
  int d;
  char s1[96], s2[96];
  if (data_dim(ctx, "scatter_add", src, a->scatter_add.dim, &d)) return ctx->err_code;
  if (check_index(ctx, "scatter_add", src, idx, "indices")) return ctx->err_code;
  if (!rm_same_shape(idx, src) || idx->ndim != src->ndim)
    return rm_fail(ctx, RM_ERR_SHAPE, "scatter_add: the indices (%s) must have the source's shape (%s)",
                   rm_tensor_shape_str(idx, s1, sizeof s1), rm_tensor_shape_str(src, s2, sizeof s2));
  if (a->ndim != src->ndim)
    return rm_fail(ctx, RM_ERR_SHAPE, "scatter_add: the output shape %s must have the source's %d dimensions",
                   rm_shape_str(a->ndim, a->shape, s1, sizeof s1), src->ndim);
  for (int k = 0; k < src->ndim; k++)
    if (a->shape[k] < 0 || (k != d && src->shape[k] > a->shape[k]))
      return rm_fail(ctx, RM_ERR_SHAPE, "scatter_add: the source (%s) does not fit the output %s in dimension %d",
                     rm_tensor_shape_str(src, s1, sizeof s1), rm_shape_str(a->ndim, a->shape, s2, sizeof s2), k + 1);
  rm_tensor_meta(src, &out[0]);
  memcpy(out[0].shape, a->shape, sizeof out[0].shape);
  return RM_OK;
}

const rm_op_def rm_opdef_scatter_add = {
  .name = "scatter_add", .nin = 2, .nout = 1, .nvis = 1, .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL,
  .index_in = RM_NTH(1),
  .infer = scatter_add_infer, .flops = flops_src,
};

/* ---- narrow_backward (backward of narrow and select) ---- */

static int narrow_backward_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  rm_tensor *g = in[0];
  int d;
  if (data_dim(ctx, "narrow_backward", g, a->narrow_backward.dim, &d)) return ctx->err_code;
  int64_t start = a->narrow_backward.start, size = a->narrow_backward.size;
  if (start < 0 || start + g->shape[d] > size)
    return rm_fail(ctx, RM_ERR_ARG, "narrow_backward: window %lld..%lld does not fit in size %lld of dimension %d",
                   (long long)start + 1, (long long)(start + g->shape[d]), (long long)size, d + 1);
  rm_tensor_meta(g, &out[0]);
  out[0].shape[d] = size;
  return RM_OK;
}

const rm_op_def rm_opdef_narrow_backward = {
  .name = "narrow_backward", .nin = 1, .nout = 1, .nvis = 1, .flags = RM_OPF_NODIFF | RM_OPF_INTERNAL,
  .infer = narrow_backward_infer,
};
