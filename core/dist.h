/* Data parallelism in the core: the communicator (the MPI backend, libremat_mpi.so,
 * opened at run time: dist/dist_api.h) and the gradient reducer, which averages the
 * gradients of a set of parameters across ranks from inside backward (it subscribes to
 * RM_HOOK_GRAD_READY and RM_HOOK_BACKWARD_DONE). The Lua binding (lua/ldist.c) is a
 * thin layer over this; a C program uses it directly:
 *
 *   rm_dist d;  rm_dist_init(ctx, &d, 600);            // MPI when started by mpirun
 *   rm_reducer *r = rm_reducer_new(ctx, &d, n, params, 25 << 20);
 *   ... forward; rm_backward(...) returns with averaged gradients ...
 *   rm_reducer_free(r);  rm_dist_finalize(&d);
 *
 * Without mpirun the world is one process (d.api NULL) and collectives are the
 * identity. Ranks are 0-based. Errors: an rm_status with the message on ctx. */
#ifndef REMAT_DIST_H
#define REMAT_DIST_H

#include "tensor.h"

struct rm_dist_api;
typedef struct rm_reducer rm_reducer;

typedef struct rm_dist {
  const struct rm_dist_api *api;  /* NULL: a single process */
  int rank, size, local_rank;
  double timeout;                 /* seconds a collective may wait (<= 0: no limit) */
  bool inited, dirty;             /* dirty: a collective was abandoned after an error */
  uint64_t bytes, calls;          /* payload sent through collectives */
  rm_reducer *active;             /* the reducer hooked into backward, if any */
} rm_dist;

enum { RM_COLL_ALLREDUCE, RM_COLL_BROADCAST, RM_COLL_ALLGATHER, RM_COLL_BARRIER };

/* A single-process communicator, not yet initialised (timeout 600 s). */
void rm_dist_defaults(rm_dist *d);
/* Initialises d (again: nothing): loads the MPI backend when started by an MPI
 * launcher, which is then an error when it cannot be loaded. */
int rm_dist_init(rm_ctx *ctx, rm_dist *d);
/* Ends this rank's part (waits for the others to end too); d is single-process after. */
void rm_dist_finalize(rm_dist *d);
/* One collective (RM_COLL_*) on raw buffers of device dev: n elements of dt, op
 * RM_DIST_SUM or RM_DIST_MAX, root 0-based; `what` names it in errors. Blocking. */
int rm_dist_collective(rm_ctx *ctx, rm_dist *d, int kind, rm_device dev, void *buf, void *recv, int64_t n,
                       rm_dtype dt, int op, int root, const char *what);

/* A reducer over params[0..n-1] (leaves that require grad, each once), in buckets of
 * at most bucket_bytes, hooked into backward and armed: every backward returns with
 * each parameter's gradient averaged across ranks (DDP's semantics). NULL with the
 * error on ctx; d must have more than one rank and no other active reducer. */
rm_reducer *rm_reducer_new(rm_ctx *ctx, rm_dist *d, int n, rm_tensor *const *params, size_t bucket_bytes);
/* Disarmed, backward leaves the gradients to accumulate locally (no_sync); the next
 * armed backward, or rm_reducer_sync, reduces the sum. */
void rm_reducer_arm(rm_reducer *r, bool armed);
/* Reduces the gradients that disarmed backward calls left; nothing when there are none. */
int rm_reducer_sync(rm_reducer *r);
/* Buckets; bucket k's bytes and parameter count; how many buckets the last reduction
 * started during backward (before it finished). */
int rm_reducer_buckets(const rm_reducer *r);
void rm_reducer_bucket(const rm_reducer *r, int k, size_t *bytes, int *params);
int rm_reducer_started_early(const rm_reducer *r);
/* Unhooks and frees r (buffers still written by an abandoned collective are left). */
void rm_reducer_free(rm_reducer *r);

#endif
