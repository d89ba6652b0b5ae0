/* Tensors: a view (dtype, device, shape, strides, offset) over a refcounted storage,
 * plus what autograd and the checkpoint engine need.
 *
 * Two counts: `refcount` keeps the object alive (handles, tape edges); `users` counts
 * those that need its data (handles, saved-for-backward slots, engine pins). A tensor
 * that can be recomputed (it has a producing node) drops its storage when users falls
 * to 0; the checkpoint engine may also evict it early. rm_tensor_data_ready()
 * rematerialises an evicted tensor by replaying the tape. */
#ifndef REMAT_TENSOR_H
#define REMAT_TENSOR_H

#include "alloc.h"

struct rm_tensor {
  int refcount;
  int users;              /* data users; see above */
  int pins;               /* engine holds: a pinned tensor is never evicted */
  int readers;            /* recorded nodes that read it (replays may read it again) */
  int replay_reads;       /* restored by a replay: readers replayed since (else -1) */
  rm_storage *storage;    /* NULL: released or evicted (recomputable) */
  rm_dtype dtype;
  rm_device device;
  int ndim;
  int64_t shape[RM_MAX_DIM];
  int64_t stride[RM_MAX_DIM];  /* in elements */
  int64_t offset;              /* in elements */

  bool requires_grad;
  rm_tensor *grad;        /* leaf gradient (category grad) */
  rm_node *grad_fn;       /* strong: node that produced this differentiable output */
  rm_node *producer;      /* weak: node that produced this non-differentiable output */
  int out_index;          /* which output of grad_fn/producer */
  int pending;            /* leaves, during a backward: edges yet to deliver a gradient */
};

/* New contiguous tensor, data uninitialised. refcount 1, users 1. */
rm_tensor *rm_tensor_new(rm_ctx *ctx, rm_dtype dt, rm_device dev, int ndim,
                         const int64_t *shape, rm_category cat);
/* An op output of shape m: in a dry run a phantom (rm_storage_new_dry). */
rm_tensor *rm_tensor_new_output(rm_ctx *ctx, const rm_meta *m, rm_category cat);
/* New tensor object viewing src's storage with the given geometry (refcount 1, users 1). */
rm_tensor *rm_tensor_view_of(rm_ctx *ctx, rm_tensor *src, int ndim, const int64_t *shape,
                             const int64_t *stride, int64_t offset);
/* A new tensor object sharing t's data, with no autograd history (x:detach()). */
rm_tensor *rm_tensor_alias(rm_ctx *ctx, rm_tensor *t);

void rm_tensor_retain(rm_tensor *t);
void rm_tensor_release(rm_ctx *ctx, rm_tensor *t);
/* Data-use counting (see the header comment). */
void rm_tensor_use(rm_tensor *t);
void rm_tensor_unuse(rm_ctx *ctx, rm_tensor *t);
/* Handle = retain + use; what a holder that reads the data takes and gives back. */
void rm_tensor_hold(rm_tensor *t);
void rm_tensor_drop(rm_ctx *ctx, rm_tensor *t);

/* Makes sure t has its data, recomputing it from the tape when it was evicted. */
int rm_tensor_data_ready(rm_ctx *ctx, rm_tensor *t);
/* As rm_tensor_data_ready, and errors when there is no real data behind t (a tensor
 * of a planning dry run): for code that reads or writes the bytes themselves. */
int rm_tensor_host_ready(rm_ctx *ctx, rm_tensor *t);
/* Drops t's storage if it can be recomputed and nothing pins it. */
void rm_tensor_evict(rm_ctx *ctx, rm_tensor *t);
bool rm_tensor_recomputable(const rm_tensor *t);

/* Marks an in-place write into t's storage (its version moves on), so that a backward
 * or a replay that needs the old values errors instead of using the new ones. */
void rm_tensor_written(rm_tensor *t);

int64_t rm_tensor_numel(const rm_tensor *t);
bool rm_tensor_is_contiguous(const rm_tensor *t);
void rm_tensor_meta(const rm_tensor *t, rm_meta *m);
/* Pointer to element 0 of the view (storage data + offset). */
void *rm_tensor_ptr(const rm_tensor *t);
size_t rm_tensor_nbytes(const rm_tensor *t);
void rm_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride);
bool rm_same_shape(const rm_tensor *a, const rm_tensor *b);
/* Shape as "2x3" into buf. */
char *rm_tensor_shape_str(const rm_tensor *t, char *buf, size_t n);

#endif
