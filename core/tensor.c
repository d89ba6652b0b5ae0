/* Tensor objects: views over storages, reference and data-use counting, eviction. */
#include <stdio.h>
#include <string.h>

#include "op.h"
#include "tensor.h"

void rm_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    stride[i] = s;
    s *= shape[i] > 0 ? shape[i] : 1;
  }
}

static rm_tensor *tensor_alloc(rm_ctx *ctx) {
  rm_tensor *t = rm_host_calloc(ctx, 1, sizeof *t);
  if (!t) {
    rm_fail(ctx, RM_ERR_OOM, "out of host memory for a tensor header");
    return NULL;
  }
  t->refcount = 1;
  t->users = 1;
  t->replay_reads = -1;
  ctx->live_tensors++;
  return t;
}

static rm_tensor *tensor_new(rm_ctx *ctx, rm_dtype dt, rm_device dev, int ndim,
                             const int64_t *shape, rm_category cat, bool output) {
  if (ndim < 0 || ndim > RM_MAX_DIM) {
    rm_fail(ctx, RM_ERR_ARG, "a tensor has at most %d dimensions (got %d)", RM_MAX_DIM, ndim);
    return NULL;
  }
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) {
      rm_fail(ctx, RM_ERR_ARG, "size %lld of dimension %d is negative", (long long)shape[i], i + 1);
      return NULL;
    }
    if (shape[i] && n > ((int64_t)1 << 50) / shape[i]) {
      rm_fail(ctx, RM_ERR_ARG, "tensor of that shape is too large");
      return NULL;
    }
    n *= shape[i];
  }
  rm_tensor *t = tensor_alloc(ctx);
  if (!t) return NULL;
  t->dtype = dt;
  t->device = dev;
  t->ndim = ndim;
  memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
  rm_contiguous_strides(ndim, shape, t->stride);
  size_t bytes = (size_t)n * rm_dtype_size(dt);
  t->storage = output ? rm_storage_new_dry(ctx, dev, cat, bytes) : rm_storage_new(ctx, dev, cat, bytes);
  if (!t->storage) {
    rm_host_free(ctx, t, sizeof *t);
    ctx->live_tensors--;
    return NULL;
  }
  return t;
}

rm_tensor *rm_tensor_new(rm_ctx *ctx, rm_dtype dt, rm_device dev, int ndim,
                         const int64_t *shape, rm_category cat) {
  return tensor_new(ctx, dt, dev, ndim, shape, cat, false);
}

rm_tensor *rm_tensor_new_output(rm_ctx *ctx, const rm_meta *m, rm_category cat) {
  return tensor_new(ctx, m->dtype, m->device, m->ndim, m->shape, cat, true);
}

rm_tensor *rm_tensor_view_of(rm_ctx *ctx, rm_tensor *src, int ndim, const int64_t *shape,
                             const int64_t *stride, int64_t offset) {
  rm_tensor *t = tensor_alloc(ctx);
  if (!t) return NULL;
  t->dtype = src->dtype;
  t->device = src->device;
  t->ndim = ndim;
  memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
  memcpy(t->stride, stride, sizeof(int64_t) * (size_t)ndim);
  t->offset = offset;
  t->storage = src->storage;
  if (t->storage) rm_storage_retain(t->storage);
  return t;
}

rm_tensor *rm_tensor_alias(rm_ctx *ctx, rm_tensor *src) {
  if (rm_tensor_data_ready(ctx, src) != RM_OK) return NULL;
  return rm_tensor_view_of(ctx, src, src->ndim, src->shape, src->stride, src->offset);
}

void rm_tensor_retain(rm_tensor *t) { t->refcount++; }

static void drop_storage(rm_ctx *ctx, rm_tensor *t) {
  if (t->storage) {
    rm_storage_release(ctx, t->storage);
    t->storage = NULL;
  }
  t->replay_reads = -1;
}

void rm_tensor_release(rm_ctx *ctx, rm_tensor *t) {
  if (!t || --t->refcount > 0) return;
  if (t->grad_fn) {
    rm_node *n = t->grad_fn;
    if (n->out[t->out_index] == t) n->out[t->out_index] = NULL;
    t->grad_fn = NULL;
    rm_node_release(ctx, n);
  }
  drop_storage(ctx, t);
  if (t->grad) rm_tensor_drop(ctx, t->grad);
  rm_host_free(ctx, t, sizeof *t);
  ctx->live_tensors--;
}

bool rm_tensor_recomputable(const rm_tensor *t) { return t->grad_fn || t->producer; }

void rm_tensor_use(rm_tensor *t) { t->users++; }

void rm_tensor_unuse(rm_ctx *ctx, rm_tensor *t) {
  if (--t->users == 0 && t->pins == 0 && rm_tensor_recomputable(t)) drop_storage(ctx, t);
}

void rm_tensor_hold(rm_tensor *t) { t->refcount++; t->users++; }

void rm_tensor_drop(rm_ctx *ctx, rm_tensor *t) {
  if (!ctx || !t) return;
  rm_tensor_unuse(ctx, t);
  rm_tensor_release(ctx, t);
}

void rm_tensor_evict(rm_ctx *ctx, rm_tensor *t) {
  if (t->storage && t->pins == 0 && rm_tensor_recomputable(t)) drop_storage(ctx, t);
}

int rm_tensor_data_ready(rm_ctx *ctx, rm_tensor *t) {
  if (t->storage) {
    if (t->storage->phantom && !ctx->dry)
      return rm_fail(ctx, RM_ERR_STATE, "this tensor was made by a planning dry run and holds no data");
    return RM_OK;
  }
  rm_node *n = t->grad_fn ? t->grad_fn : t->producer;
  if (!n)
    return rm_fail(ctx, RM_ERR_STATE, "tensor data was released and cannot be recomputed");
  int rc = rm_node_recompute(ctx, n, t);
  if (rc != RM_OK) return rc;
  if (!t->storage)
    return rm_fail(ctx, RM_ERR_STATE, "replaying %s did not restore a tensor", rm_op_name(n->op));
  return RM_OK;
}

int rm_tensor_host_ready(rm_ctx *ctx, rm_tensor *t) {
  int rc = rm_tensor_data_ready(ctx, t);
  if (rc == RM_OK && t->storage->phantom)
    rc = rm_fail(ctx, RM_ERR_STATE, "tensor values cannot be read during a planning dry run (model:plan, budget policies)");
  return rc;
}

void rm_tensor_written(rm_tensor *t) {
  if (t && t->storage) t->storage->version++;
}

int64_t rm_tensor_numel(const rm_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

bool rm_tensor_is_contiguous(const rm_tensor *t) {
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] == 0) return true; /* no element: any strides will do */
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->stride[i] != s) return false;
    s *= t->shape[i];
  }
  return true;
}

void rm_tensor_meta(const rm_tensor *t, rm_meta *m) {
  m->dtype = t->dtype;
  m->device = t->device;
  m->ndim = t->ndim;
  memcpy(m->shape, t->shape, sizeof m->shape);
}

void *rm_tensor_ptr(const rm_tensor *t) {
  if (!t->storage || !t->storage->data) return NULL;
  return (char *)t->storage->data + (size_t)t->offset * rm_dtype_size(t->dtype);
}

size_t rm_tensor_nbytes(const rm_tensor *t) {
  return (size_t)rm_tensor_numel(t) * rm_dtype_size(t->dtype);
}

bool rm_same_shape(const rm_tensor *a, const rm_tensor *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

char *rm_tensor_shape_str(const rm_tensor *t, char *buf, size_t n) {
  return rm_shape_str(t->ndim, t->shape, buf, n);
}
