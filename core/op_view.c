/* View ops: view, transpose, narrow, expand, select, permute, squeeze, unsqueeze. No kernel: the output is a new
 * geometry over the input's storage. Each has a backward rule like any other op. */
#include <string.h>

#include "ops.h"

/* ---- view: attrs shape/ndim (fully resolved) ---- */

static int view_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  rm_meta m = { in[0]->dtype, in[0]->device, a->ndim, { 0 } };
  memcpy(m.shape, a->shape, sizeof m.shape);
  if (rm_meta_numel(&m) != rm_tensor_numel(in[0])) {
    char s1[96], s2[96];
    return rm_fail(ctx, RM_ERR_SHAPE, "view: cannot view a tensor of size %s (%lld elements) as %s",
                   rm_tensor_shape_str(in[0], s1, sizeof s1), (long long)rm_tensor_numel(in[0]),
                   rm_shape_str(a->ndim, a->shape, s2, sizeof s2));
  }
  if (!rm_tensor_is_contiguous(in[0]))
    return rm_fail(ctx, RM_ERR_LAYOUT, "view: the tensor is not contiguous (use reshape or contiguous)");
  out[0] = m;
  return RM_OK;
}

static int view_view(rm_ctx *ctx, rm_tensor *in, const rm_attrs *a, rm_tensor *out) {
  out->ndim = a->ndim;
  memcpy(out->shape, a->shape, sizeof out->shape);
  rm_contiguous_strides(a->ndim, a->shape, out->stride);
  return RM_OK;
}

static int view_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  gin[0] = rm_reshape(ctx, g[0], n->in[0]->ndim, n->in[0]->shape);
  return gin[0] ? RM_OK : ctx->err_code;
}

const rm_op_def rm_opdef_view = {
  .name = "view", .nin = 1, .nout = 1, .nvis = 1, .flags = RM_OPF_VIEW | RM_OPF_STRIDED,
  .infer = view_infer, .view = view_view, .backward = view_backward,
};

/* ---- transpose: dim0, dim1 ---- */

static int transpose_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  int d0, d1;
  if (rm_check_dim(ctx, "transpose", a->transpose.dim0, in[0]->ndim, &d0) ||
      rm_check_dim(ctx, "transpose", a->transpose.dim1, in[0]->ndim, &d1))
    return ctx->err_code;
  rm_tensor_meta(in[0], &out[0]);
  if (in[0]->ndim) {
    int64_t t = out[0].shape[d0];
    out[0].shape[d0] = out[0].shape[d1];
    out[0].shape[d1] = t;
  }
  return RM_OK;
}

static int transpose_view(rm_ctx *ctx, rm_tensor *in, const rm_attrs *a, rm_tensor *out) {
  int d0, d1;
  if (in->ndim == 0) return RM_OK;
  rm_check_dim(ctx, "transpose", a->transpose.dim0, in->ndim, &d0);
  rm_check_dim(ctx, "transpose", a->transpose.dim1, in->ndim, &d1);
  out->shape[d0] = in->shape[d1]; out->shape[d1] = in->shape[d0];
  out->stride[d0] = in->stride[d1]; out->stride[d1] = in->stride[d0];
  return RM_OK;
}

static int transpose_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  gin[0] = rm_transpose(ctx, g[0], n->attrs.transpose.dim0, n->attrs.transpose.dim1);
  return gin[0] ? RM_OK : ctx->err_code;
}

const rm_op_def rm_opdef_transpose = {
  .name = "transpose", .nin = 1, .nout = 1, .nvis = 1, .flags = RM_OPF_VIEW | RM_OPF_STRIDED,
  .infer = transpose_infer, .view = transpose_view, .backward = transpose_backward,
};

/* ---- narrow: dim, start (0-based), length ---- */

static int narrow_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  int d;
  if (in[0]->ndim == 0) return rm_fail(ctx, RM_ERR_ARG, "narrow: cannot narrow a 0-d tensor");
  if (rm_check_dim(ctx, "narrow", a->narrow.dim, in[0]->ndim, &d)) return ctx->err_code;
  int64_t size = in[0]->shape[d], start = a->narrow.start, len = a->narrow.length;
  if (start < 0 || len < 0 || start + len > size)
    return rm_fail(ctx, RM_ERR_ARG, "narrow: start %lld and length %lld are out of range for dimension %d of size %lld",
                   (long long)start + 1, (long long)len, d + 1, (long long)size);
  rm_tensor_meta(in[0], &out[0]);
  out[0].shape[d] = len;
  return RM_OK;
}

static int narrow_view(rm_ctx *ctx, rm_tensor *in, const rm_attrs *a, rm_tensor *out) {
  int d;
  rm_check_dim(ctx, "narrow", a->narrow.dim, in->ndim, &d);
  out->shape[d] = a->narrow.length;
  out->offset = in->offset + a->narrow.start * in->stride[d];
  return RM_OK;
}

static int narrow_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  int d;
  rm_check_dim(ctx, "narrow", n->attrs.narrow.dim, n->in[0]->ndim, &d);
  rm_attrs a;
  rm_attrs_init(&a);
  a.narrow_backward.dim = d;
  a.narrow_backward.start = n->attrs.narrow.start;
  a.narrow_backward.size = n->in[0]->shape[d];
  gin[0] = rm_op1(ctx, RM_OP_NARROW_BACKWARD, 1, g, &a);
  return gin[0] ? RM_OK : ctx->err_code;
}

const rm_op_def rm_opdef_narrow = {
  .name = "narrow", .nin = 1, .nout = 1, .nvis = 1, .flags = RM_OPF_VIEW | RM_OPF_STRIDED,
  .infer = narrow_infer, .view = narrow_view, .backward = narrow_backward,
};

/* ---- expand: shape/ndim (sizes of 1 stretch, new leading dims allowed) ---- */

static int expand_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  int off = a->ndim - in[0]->ndim;
  char s1[96], s2[96];
  if (off < 0)
    return rm_fail(ctx, RM_ERR_SHAPE, "expand: cannot expand %s to fewer dimensions (%s)",
                   rm_tensor_shape_str(in[0], s1, sizeof s1), rm_shape_str(a->ndim, a->shape, s2, sizeof s2));
  for (int d = 0; d < in[0]->ndim; d++)
    if (in[0]->shape[d] != 1 && in[0]->shape[d] != a->shape[d + off])
      return rm_fail(ctx, RM_ERR_SHAPE, "expand: cannot expand %s to %s",
                     rm_tensor_shape_str(in[0], s1, sizeof s1), rm_shape_str(a->ndim, a->shape, s2, sizeof s2));
  out[0].dtype = in[0]->dtype;
  out[0].device = in[0]->device;
  out[0].ndim = a->ndim;
  memcpy(out[0].shape, a->shape, sizeof out[0].shape);
  return RM_OK;
}

static int expand_view(rm_ctx *ctx, rm_tensor *in, const rm_attrs *a, rm_tensor *out) {
  int off = a->ndim - in->ndim;
  out->ndim = a->ndim;
  for (int d = 0; d < a->ndim; d++) {
    out->shape[d] = a->shape[d];
    out->stride[d] = (d < off || in->shape[d - off] == 1) ? 0 : in->stride[d - off];
  }
  return RM_OK;
}

static int expand_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  gin[0] = rm_sum_to(ctx, g[0], n->in[0]->ndim, n->in[0]->shape);
  return gin[0] ? RM_OK : ctx->err_code;
}

const rm_op_def rm_opdef_expand = {
  .name = "expand", .nin = 1, .nout = 1, .nvis = 1, .flags = RM_OPF_VIEW | RM_OPF_STRIDED,
  .infer = expand_infer, .view = expand_view, .backward = expand_backward,
};

/* ---- select: dim, index (0-based); drops the dimension ---- */

static int select_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  int d;
  if (in[0]->ndim == 0) return rm_fail(ctx, RM_ERR_ARG, "select: cannot index a 0-d tensor");
  if (rm_check_dim(ctx, "select", a->select.dim, in[0]->ndim, &d)) return ctx->err_code;
  if (a->select.index < 0 || a->select.index >= in[0]->shape[d])
    return rm_fail(ctx, RM_ERR_ARG, "select: index %lld is out of range for dimension %d of size %lld",
                   (long long)a->select.index + 1, d + 1, (long long)in[0]->shape[d]);
  rm_tensor_meta(in[0], &out[0]);
  for (int k = d; k < in[0]->ndim - 1; k++) out[0].shape[k] = out[0].shape[k + 1];
  out[0].ndim--;
  return RM_OK;
}

static int select_view(rm_ctx *ctx, rm_tensor *in, const rm_attrs *a, rm_tensor *out) {
  int d;
  rm_check_dim(ctx, "select", a->select.dim, in->ndim, &d);
  out->offset = in->offset + a->select.index * in->stride[d];
  for (int k = d; k < in->ndim - 1; k++) {
    out->shape[k] = in->shape[k + 1];
    out->stride[k] = in->stride[k + 1];
  }
  out->ndim = in->ndim - 1;
  return RM_OK;
}

static int select_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  rm_tensor *x = n->in[0];
  int d;
  rm_check_dim(ctx, "select", n->attrs.select.dim, x->ndim, &d);
  int64_t shape[RM_MAX_DIM];
  memcpy(shape, x->shape, sizeof shape);
  shape[d] = 1;
  rm_tensor *g1 = rm_reshape(ctx, g[0], x->ndim, shape);
  if (!g1) return ctx->err_code;
  rm_attrs a;
  rm_attrs_init(&a);
  a.narrow_backward.dim = d;
  a.narrow_backward.start = n->attrs.select.index;
  a.narrow_backward.size = x->shape[d];
  gin[0] = rm_op1(ctx, RM_OP_NARROW_BACKWARD, 1, &g1, &a);
  rm_tensor_drop(ctx, g1);
  return gin[0] ? RM_OK : ctx->err_code;
}

const rm_op_def rm_opdef_select = {
  .name = "select", .nin = 1, .nout = 1, .nvis = 1, .flags = RM_OPF_VIEW | RM_OPF_STRIDED,
  .infer = select_infer, .view = select_view, .backward = select_backward,
};

/* ---- permute: dims (in the shape slot) holds the permutation (out dim k is input dim shape[k]) ---- */

static int permute_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  int nd = in[0]->ndim;
  if (a->ndim != nd)
    return rm_fail(ctx, RM_ERR_ARG, "permute: %d dimensions given for a %d-d tensor", a->ndim, nd);
  bool seen[RM_MAX_DIM] = { false };
  rm_tensor_meta(in[0], &out[0]);
  for (int k = 0; k < nd; k++) {
    int64_t p = a->shape[k];
    if (p < 0 || p >= nd || seen[p])
      return rm_fail(ctx, RM_ERR_ARG, "permute: the dimensions are not a permutation of 1..%d (entry %d is %lld)",
                     nd, k + 1, (long long)p + 1);
    seen[p] = true;
    out[0].shape[k] = in[0]->shape[p];
  }
  return RM_OK;
}

static int permute_view(rm_ctx *ctx, rm_tensor *in, const rm_attrs *a, rm_tensor *out) {
  for (int k = 0; k < a->ndim; k++) {
    out->shape[k] = in->shape[a->shape[k]];
    out->stride[k] = in->stride[a->shape[k]];
  }
  return RM_OK;
}

static int permute_backward(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  int64_t inv[RM_MAX_DIM];
  for (int k = 0; k < n->attrs.ndim; k++) inv[n->attrs.shape[k]] = k;
  gin[0] = rm_permute(ctx, g[0], n->attrs.ndim, inv);
  return gin[0] ? RM_OK : ctx->err_code;
}

const rm_op_def rm_opdef_permute = {
  .name = "permute", .nin = 1, .nout = 1, .nvis = 1, .flags = RM_OPF_VIEW | RM_OPF_STRIDED,
  .infer = permute_infer, .view = permute_view, .backward = permute_backward,
};

/* ---- squeeze: axis {dim} (RM_DIM_ALL: every size-1 dim); a dim of another size stays ---- */

/* Which dims of t squeeze drops (keep[d] false). */
static int squeeze_keep(rm_ctx *ctx, const rm_tensor *t, int64_t dim, bool *keep) {
  for (int d = 0; d < t->ndim; d++) keep[d] = dim == RM_DIM_ALL ? t->shape[d] != 1 : true;
  if (dim != RM_DIM_ALL && t->ndim > 0) {
    int d;
    if (rm_check_dim(ctx, "squeeze", dim, t->ndim, &d)) return ctx->err_code;
    keep[d] = t->shape[d] != 1;
  }
  return RM_OK;
}

static int squeeze_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  bool keep[RM_MAX_DIM];
  if (squeeze_keep(ctx, in[0], a->axis.dim, keep)) return ctx->err_code;
  rm_tensor_meta(in[0], &out[0]);
  int k = 0;
  for (int d = 0; d < in[0]->ndim; d++)
    if (keep[d]) out[0].shape[k++] = in[0]->shape[d];
  out[0].ndim = k;
  return RM_OK;
}

static int squeeze_view(rm_ctx *ctx, rm_tensor *in, const rm_attrs *a, rm_tensor *out) {
  bool keep[RM_MAX_DIM];
  squeeze_keep(ctx, in, a->axis.dim, keep);
  int k = 0;
  for (int d = 0; d < in->ndim; d++)
    if (keep[d]) {
      out->shape[k] = in->shape[d];
      out->stride[k++] = in->stride[d];
    }
  out->ndim = k;
  return RM_OK;
}

/* squeeze and unsqueeze: the gradient is g with the input's shape back. */
static int reshape_back(rm_ctx *ctx, rm_node *n, rm_tensor *const *g, rm_tensor **gin) {
  gin[0] = rm_reshape(ctx, g[0], n->in[0]->ndim, n->in[0]->shape);
  return gin[0] ? RM_OK : ctx->err_code;
}

const rm_op_def rm_opdef_squeeze = {
  .name = "squeeze", .nin = 1, .nout = 1, .nvis = 1, .flags = RM_OPF_VIEW | RM_OPF_STRIDED,
  .infer = squeeze_infer, .view = squeeze_view, .backward = reshape_back,
};

/* ---- unsqueeze: axis {dim}: the position of the new size-1 dim (0..ndim; negatives from the end) ---- */

static int unsqueeze_pos(rm_ctx *ctx, const rm_tensor *t, int64_t dim, int *pos) {
  int64_t p = dim < 0 ? dim + t->ndim + 1 : dim;
  if (p < 0 || p > t->ndim)
    return rm_fail(ctx, RM_ERR_ARG, "unsqueeze: dimension %lld is out of range for a %d-d tensor (1..%d)",
                   (long long)(dim < 0 ? dim : dim + 1), t->ndim, t->ndim + 1);
  if (t->ndim >= RM_MAX_DIM)
    return rm_fail(ctx, RM_ERR_ARG, "unsqueeze: the tensor already has %d dimensions (the most)", RM_MAX_DIM);
  *pos = (int)p;
  return RM_OK;
}

static int unsqueeze_infer(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out) {
  int p;
  if (unsqueeze_pos(ctx, in[0], a->axis.dim, &p)) return ctx->err_code;
  rm_tensor_meta(in[0], &out[0]);
  for (int d = in[0]->ndim; d > p; d--) out[0].shape[d] = out[0].shape[d - 1];
  out[0].shape[p] = 1;
  out[0].ndim++;
  return RM_OK;
}

static int unsqueeze_view(rm_ctx *ctx, rm_tensor *in, const rm_attrs *a, rm_tensor *out) {
  int p;
  unsqueeze_pos(ctx, in, a->axis.dim, &p);
  for (int d = in->ndim; d > p; d--) {
    out->shape[d] = in->shape[d - 1];
    out->stride[d] = in->stride[d - 1];
  }
  out->shape[p] = 1;
  out->stride[p] = p < in->ndim ? in->shape[p] * in->stride[p] : 1;
  out->ndim = in->ndim + 1;
  return RM_OK;
}

const rm_op_def rm_opdef_unsqueeze = {
  .name = "unsqueeze", .nin = 1, .nout = 1, .nvis = 1, .flags = RM_OPF_VIEW | RM_OPF_STRIDED,
  .infer = unsqueeze_infer, .view = unsqueeze_view, .backward = reshape_back,
};

/* ---- wrappers ---- */

rm_tensor *rm_permute(rm_ctx *ctx, rm_tensor *a, int ndim, const int64_t *perm) {
  rm_attrs at;
  rm_attrs_init(&at);
  if (ndim < 0 || ndim > RM_MAX_DIM) {
    rm_fail(ctx, RM_ERR_ARG, "permute: at most %d dimensions", RM_MAX_DIM);
    return NULL;
  }
  at.ndim = ndim;
  memcpy(at.shape, perm, sizeof(int64_t) * (size_t)ndim);
  return rm_op1(ctx, RM_OP_PERMUTE, 1, &a, &at);
}

rm_tensor *rm_squeeze(rm_ctx *ctx, rm_tensor *a, int64_t dim) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.axis.dim = dim;
  return rm_op1(ctx, RM_OP_SQUEEZE, 1, &a, &at);
}

rm_tensor *rm_unsqueeze(rm_ctx *ctx, rm_tensor *a, int64_t dim) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.axis.dim = dim;
  return rm_op1(ctx, RM_OP_UNSQUEEZE, 1, &a, &at);
}

rm_tensor *rm_view(rm_ctx *ctx, rm_tensor *a, int ndim, const int64_t *shape) {
  rm_attrs at;
  rm_attrs_init(&at);
  if (ndim < 0 || ndim > RM_MAX_DIM) {
    rm_fail(ctx, RM_ERR_ARG, "view: at most %d dimensions", RM_MAX_DIM);
    return NULL;
  }
  int infer = -1;
  int64_t known = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == -1) {
      if (infer >= 0) { rm_fail(ctx, RM_ERR_ARG, "view: only one size may be -1"); return NULL; }
      infer = d;
    } else if (shape[d] < 0) {
      rm_fail(ctx, RM_ERR_ARG, "view: size %lld of dimension %d is negative", (long long)shape[d], d + 1);
      return NULL;
    } else {
      known *= shape[d];
    }
    at.shape[d] = shape[d];
  }
  if (infer >= 0) {
    int64_t n = rm_tensor_numel(a);
    if (known == 0 || n % known) {
      char s[96];
      rm_fail(ctx, RM_ERR_SHAPE, "view: cannot infer size -1 for %lld elements into %s", (long long)n,
              rm_shape_str(ndim, shape, s, sizeof s));
      return NULL;
    }
    at.shape[infer] = n / known;
  }
  at.ndim = ndim;
  return rm_op1(ctx, RM_OP_VIEW, 1, &a, &at);
}

rm_tensor *rm_reshape(rm_ctx *ctx, rm_tensor *a, int ndim, const int64_t *shape) {
  if (rm_tensor_is_contiguous(a)) return rm_view(ctx, a, ndim, shape);
  rm_tensor *c = rm_contiguous(ctx, a);
  if (!c) return NULL;
  rm_tensor *v = rm_view(ctx, c, ndim, shape);
  rm_tensor_drop(ctx, c);
  return v;
}

rm_tensor *rm_transpose(rm_ctx *ctx, rm_tensor *a, int64_t d0, int64_t d1) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.transpose.dim0 = d0;
  at.transpose.dim1 = d1;
  return rm_op1(ctx, RM_OP_TRANSPOSE, 1, &a, &at);
}

rm_tensor *rm_narrow(rm_ctx *ctx, rm_tensor *a, int64_t dim, int64_t start, int64_t len) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.narrow.dim = dim;
  at.narrow.start = start;
  at.narrow.length = len;
  return rm_op1(ctx, RM_OP_NARROW, 1, &a, &at);
}

rm_tensor *rm_expand(rm_ctx *ctx, rm_tensor *a, int ndim, const int64_t *shape) {
  rm_attrs at;
  rm_attrs_init(&at);
  if (ndim < 0 || ndim > RM_MAX_DIM) {
    rm_fail(ctx, RM_ERR_ARG, "expand: at most %d dimensions", RM_MAX_DIM);
    return NULL;
  }
  at.ndim = ndim;
  memcpy(at.shape, shape, sizeof(int64_t) * (size_t)ndim);
  return rm_op1(ctx, RM_OP_EXPAND, 1, &a, &at);
}

rm_tensor *rm_select(rm_ctx *ctx, rm_tensor *a, int64_t dim, int64_t index) {
  rm_attrs at;
  rm_attrs_init(&at);
  at.select.dim = dim;
  at.select.index = index;
  return rm_op1(ctx, RM_OP_SELECT, 1, &a, &at);
}
