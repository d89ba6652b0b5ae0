/* The communicator and the gradient reducer (core/dist.h). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "dist.h"
#include "ops.h"
#include "plugin.h"
#include "../dist/dist_api.h"

#define MPI_LIB "libremat_mpi.so"

/* ---------------------------------------------------------------- communicator ---- */

void rm_dist_defaults(rm_dist *d) {
  memset(d, 0, sizeof *d);
  d->size = 1;
  d->timeout = 600;
}

/* Whether this process was started by an MPI launcher. */
static bool under_mpirun(void) {
  static const char *const vars[] = { "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", NULL };
  for (int i = 0; vars[i]; i++)
    if (getenv(vars[i])) return true;
  return false;
}

/* Opens libremat_mpi.so (REMAT_MPI_LIB, else where rm_plugin_open looks); NULL with
 * why filled when it cannot. Global: Open MPI's plugins resolve libmpi symbols against
 * the process. */
static const rm_dist_api *load_api(char *why, size_t n) {
  void *h = rm_plugin_open(MPI_LIB, "REMAT_MPI_LIB", RTLD_NOW | RTLD_GLOBAL, why, n);
  if (!h) return NULL;
  rm_dist_api_get_fn get = (rm_dist_api_get_fn)dlsym(h, RM_DIST_API_SYMBOL);
  const rm_dist_api *api = get ? get() : NULL;
  if (!api || api->abi != RM_DIST_ABI) {
    snprintf(why, n, "%s is not a remat MPI backend of this version", MPI_LIB);
    return NULL;   /* the handle stays open: MPI libraries are not safe to unload */
  }
  return api;
}

int rm_dist_init(rm_ctx *ctx, rm_dist *d) {
  if (d->inited) return RM_OK;
  if (under_mpirun()) {
    char why[512];
    const rm_dist_api *api = load_api(why, sizeof why);
    if (!api)
      return rm_fail(ctx, RM_ERR_RUNTIME, "dist.init: started by mpirun but %s cannot be loaded (%s); it is built "
                     "when Open MPI's headers (libopenmpi-dev) are found, and looked for beside remat's library, "
                     "where make install puts it, and on the loader's path; REMAT_MPI_LIB=/path/to/%s names it",
                     MPI_LIB, why, MPI_LIB);
    char err[RM_DIST_ERRLEN];
    if (api->init(&d->rank, &d->size, &d->local_rank, err)) return rm_fail(ctx, RM_ERR_RUNTIME, "dist.init: %s", err);
    d->api = api;
  }
  d->inited = true;
  return RM_OK;
}

void rm_dist_finalize(rm_dist *d) {
  if (d->api && d->inited) d->api->finalize(d->timeout, d->dirty);
  d->inited = false;
  d->api = NULL;
  d->size = 1;
  d->rank = d->local_rank = 0;
}

/* err as the context's message, "dist." in front unless it is there. */
static int dist_fail(rm_ctx *ctx, rm_dist *d, const char *err) {
  d->dirty = true;
  return rm_fail(ctx, RM_ERR_RUNTIME, "%s%s", strncmp(err, "dist.", 5) ? "dist." : "", err);
}

/* Waits for req; on failure marks d dirty and leaves the message in err. */
static int wait_req(rm_dist *d, rm_dist_req *req, const char *what, char *err) {
  int rc = d->api->wait(req, d->timeout, what, err);
  if (rc) d->dirty = true;
  return rc;
}

/* One collective; 0 or a message in err (RM_DIST_ERRLEN bytes). */
static int collective(rm_ctx *ctx, rm_dist *d, int kind, rm_device dev, void *buf, void *recv, int64_t n,
                      rm_dtype dt, int op, int root, const char *what, char *err) {
  if (dev == RM_CUDA) {
    const rm_backend *b = rm_backend_get(ctx, RM_CUDA);
    if (!b) return snprintf(err, RM_DIST_ERRLEN, "%s: %s", what, rm_errmsg(ctx)), 1;
    if (!d->api->gpu_allreduce)
      return snprintf(err, RM_DIST_ERRLEN, "%s: CUDA tensors go through NCCL, and this %s was built without it "
                      "(nccl.h was not found at build time)", what, MPI_LIB), 1;
    if (b->synchronize && b->synchronize(ctx)) return snprintf(err, RM_DIST_ERRLEN, "%s: %s", what, rm_errmsg(ctx)), 1;
    int rc = kind == RM_COLL_ALLREDUCE ? d->api->gpu_allreduce(buf, n, (int)dt, op, d->timeout, err)
           : kind == RM_COLL_BROADCAST ? d->api->gpu_broadcast(buf, n, (int)dt, root, d->timeout, err)
           : d->api->gpu_allgather(buf, recv, n, (int)dt, d->timeout, err);
    if (rc) d->dirty = true;
    return rc;
  }
  rm_dist_req *req = NULL;
  int rc = kind == RM_COLL_ALLREDUCE ? d->api->iallreduce(buf, n, (int)dt, op, &req, err)
         : kind == RM_COLL_BROADCAST ? d->api->ibroadcast(buf, n, (int)dt, root, &req, err)
         : kind == RM_COLL_ALLGATHER ? d->api->iallgather(buf, recv, n, (int)dt, &req, err)
         : d->api->ibarrier(&req, err);
  return rc ? rc : wait_req(d, req, what, err);
}

int rm_dist_collective(rm_ctx *ctx, rm_dist *d, int kind, rm_device dev, void *buf, void *recv, int64_t n,
                       rm_dtype dt, int op, int root, const char *what) {
  if (!d->api) return RM_OK;
  char err[RM_DIST_ERRLEN];
  if (collective(ctx, d, kind, dev, buf, recv, n, dt, op, root, what, err)) return dist_fail(ctx, d, err);
  return RM_OK;
}

/* ---------------------------------------------------------------- gradient reducer ---- */

/* Gradients are averaged in buckets: flat buffers of several parameters' gradients
 * (parameters taken last to first, the order backward finishes them). When the last
 * gradient of a bucket is final (RM_HOOK_GRAD_READY) it is copied in and the bucket's
 * allreduce is started, in bucket order (every rank must start collectives in the same
 * order); at the end of backward the reducer fills what backward did not reach, waits
 * for all of them, and writes the averages back into the parameters' .grad. */

typedef struct slot {
  rm_tensor *p;             /* the parameter (held) */
  rm_tensor *view;          /* its part of the bucket buffer, p's shape */
  int bucket;
  bool ready;
} slot;

typedef struct bucket {
  rm_tensor *buf;           /* flat, category workspace */
  int first, count, nready;
  bool launched;
  rm_dist_req *req;         /* outstanding allreduce (host buckets) */
} bucket;

struct rm_reducer {
  rm_dist *d;
  rm_ctx *ctx;
  int cap;                  /* parameters the arrays below hold */
  slot *slots;
  int nslots;
  bucket *b;
  int nb, next;             /* next: the first bucket not yet launched */
  int early;                /* buckets the last step started during backward */
  int *order;               /* slot indices sorted by parameter pointer (lookup) */
  unsigned char *flags;     /* per slot: this rank has a gradient (reduced with max) */
  bool armed, hooked;
  bool unsynced;            /* a backward under no_sync left gradients to reduce */
  char err[RM_DIST_ERRLEN];
};

static int find_slot(const rm_reducer *r, const rm_tensor *t) {
  int lo = 0, hi = r->nslots - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    const rm_tensor *p = r->slots[r->order[mid]].p;
    if (p == t) return r->order[mid];
    if ((uintptr_t)p < (uintptr_t)t) lo = mid + 1;
    else hi = mid - 1;
  }
  return -1;
}

/* Copies p's gradient into its slot (zeros when it has none); sets the flag. */
static int fill_slot(rm_reducer *r, slot *s) {
  rm_ctx *ctx = r->ctx;
  int i = (int)(s - r->slots);
  r->flags[i] = s->p->grad != NULL;
  if (!s->p->grad) {
    rm_attrs a;
    rm_attrs_init(&a);
    return rm_op_into(ctx, RM_OP_FILL, 0, NULL, &a, 1, &s->view);
  }
  rm_tensor *g = rm_contiguous(ctx, s->p->grad);
  if (!g) return ctx->err_code;
  int rc = rm_op_into(ctx, RM_OP_COPY, 1, &g, NULL, 1, &s->view);
  rm_tensor_drop(ctx, g);
  return rc;
}

static int launch(rm_reducer *r, bucket *b) {
  rm_dist *d = r->d;
  rm_tensor *t = b->buf;
  int64_t n = rm_tensor_numel(t);
  b->launched = true;
  d->bytes += rm_tensor_nbytes(t);
  d->calls++;
  if (t->device == RM_CUDA)
    return collective(r->ctx, d, RM_COLL_ALLREDUCE, RM_CUDA, rm_tensor_ptr(t), NULL, n, t->dtype, RM_DIST_SUM, 0,
                      "dist.allreduce (gradient bucket)", r->err) ? dist_fail(r->ctx, d, r->err) : RM_OK;
  if (d->api->iallreduce(rm_tensor_ptr(t), n, (int)t->dtype, RM_DIST_SUM, &b->req, r->err))
    return dist_fail(r->ctx, d, r->err);
  return RM_OK;
}

/* Starts every bucket that is complete and whose predecessors have started. */
static int launch_ready(rm_reducer *r) {
  while (r->next < r->nb && r->b[r->next].nready == r->b[r->next].count) {
    int rc = launch(r, &r->b[r->next++]);
    if (rc) return rc;
  }
  /* MPI progresses nonblocking collectives only inside MPI calls: nudge them */
  for (int k = 0; k < r->next; k++) {
    int done;
    if (r->b[k].req && r->d->api->test(r->b[k].req, &done, r->err)) return dist_fail(r->ctx, r->d, r->err);
  }
  return RM_OK;
}

/* RM_HOOK_GRAD_READY: a parameter's gradient is final. */
static int on_grad_ready(rm_ctx *ctx, const rm_event *ev, void *ud) {
  rm_reducer *r = ud;
  int i = find_slot(r, ev->tensor);
  if (i < 0 || !r->armed) return RM_OK;
  slot *s = &r->slots[i];
  if (s->ready)
    return rm_fail(ctx, RM_ERR_STATE, "dist.DataParallel: a parameter's gradient was final twice before dp:sync() "
                   "(accumulating over several backward calls: run all but the last inside dp:no_sync(fn))");
  int rc = fill_slot(r, s);
  if (rc) return rc;
  s->ready = true;
  r->b[s->bucket].nready++;
  return launch_ready(r);
}

static void reset_step(rm_reducer *r) {
  for (int i = 0; i < r->nslots; i++) r->slots[i].ready = false;
  for (int k = 0; k < r->nb; k++) {
    r->b[k].nready = 0;
    r->b[k].launched = false;
    r->b[k].req = NULL;
  }
  r->next = 0;
}

/* Averages every gradient across ranks: starts the buckets backward did not reach,
 * waits for all of them, and writes the averages into each parameter's .grad. */
static int reduce_all(rm_reducer *r) {
  rm_ctx *ctx = r->ctx;
  rm_dist *d = r->d;
  r->unsynced = false;
  r->early = r->next;
  for (int i = 0; i < r->nslots; i++) {
    slot *s = &r->slots[i];
    if (s->ready || r->b[s->bucket].launched) continue;
    if (fill_slot(r, s)) return ctx->err_code;
    s->ready = true;
    r->b[s->bucket].nready++;
  }
  if (launch_ready(r)) return ctx->err_code;
  /* which parameters had a gradient on some rank (the others keep none) */
  rm_dist_req *freq = NULL;
  if (d->api->iallreduce(r->flags, r->nslots, RM_DIST_U8, RM_DIST_MAX, &freq, r->err) ||
      wait_req(d, freq, "dist.sync (allreduce of the gradient flags)", r->err))
    return dist_fail(ctx, d, r->err);
  for (int k = 0; k < r->nb; k++) {
    if (!r->b[k].req) continue;
    char what[96];
    snprintf(what, sizeof what, "dist.sync (allreduce of gradient bucket %d of %d)", k + 1, r->nb);
    rm_dist_req *q = r->b[k].req;
    r->b[k].req = NULL;
    if (wait_req(d, q, what, r->err)) return dist_fail(ctx, d, r->err);
  }
  rm_attrs a;
  rm_attrs_init(&a);
  a.scalar.value = 1.0 / d->size;
  int rc = RM_OK;
  for (int i = 0; i < r->nslots && rc == RM_OK; i++) {
    slot *s = &r->slots[i];
    rm_tensor *p = s->p;
    if (!r->flags[i]) continue;
    if (p->grad && !rm_tensor_is_contiguous(p->grad)) {
      rm_tensor_drop(ctx, p->grad);
      p->grad = NULL;
    }
    if (!p->grad) {
      p->grad = rm_tensor_new(ctx, p->dtype, p->device, p->ndim, p->shape, RM_CAT_GRAD);
      if (!p->grad) { rc = ctx->err_code; break; }
    }
    rc = rm_op_into(ctx, RM_OP_MUL_SCALAR, 1, &s->view, &a, 1, &p->grad);
  }
  reset_step(r);
  return rc;
}

/* RM_HOOK_BACKWARD_DONE: as DDP, a backward returns with the averaged gradients
 * (disarmed, they accumulate locally, and the next backward reduces the sum). */
static int on_backward_done(rm_ctx *ctx, const rm_event *ev, void *ud) {
  rm_reducer *r = ud;
  if (ctx->dry || ev->rc != RM_OK) return RM_OK;   /* a planning dry run, or a failed backward */
  if (!r->armed) {
    r->unsynced = true;
    return RM_OK;
  }
  return reduce_all(r);
}

int rm_reducer_sync(rm_reducer *r) { return r->unsynced ? reduce_all(r) : RM_OK; }

void rm_reducer_arm(rm_reducer *r, bool armed) { r->armed = armed; }

int rm_reducer_buckets(const rm_reducer *r) { return r->nb; }

void rm_reducer_bucket(const rm_reducer *r, int k, size_t *bytes, int *params) {
  *bytes = rm_tensor_nbytes(r->b[k].buf);
  *params = r->b[k].count;
}

int rm_reducer_started_early(const rm_reducer *r) { return r->early; }

void rm_reducer_free(rm_reducer *r) {
  if (!r) return;
  rm_ctx *ctx = r->ctx;
  if (r->hooked) {
    rm_hook_remove(ctx, RM_HOOK_GRAD_READY, on_grad_ready, r);
    rm_hook_remove(ctx, RM_HOOK_BACKWARD_DONE, on_backward_done, r);
  }
  if (r->d->active == r) r->d->active = NULL;
  bool outstanding = false;
  for (int k = 0; k < r->nb; k++) outstanding = outstanding || r->b[k].req;
  /* a collective still in flight may write into the buffers: leave them to MPI */
  if (outstanding) r->d->dirty = true;
  for (int i = 0; i < r->nslots; i++) {
    if (r->slots[i].view && !outstanding) rm_tensor_drop(ctx, r->slots[i].view);
    if (r->slots[i].p) rm_tensor_drop(ctx, r->slots[i].p);
  }
  for (int k = 0; k < r->nb; k++)
    if (r->b[k].buf && !outstanding) rm_tensor_drop(ctx, r->b[k].buf);
  size_t n = (size_t)r->cap;
  rm_host_free(ctx, r->slots, n * sizeof *r->slots);
  rm_host_free(ctx, r->b, n * sizeof *r->b);
  rm_host_free(ctx, r->order, n * sizeof *r->order);
  rm_host_free(ctx, r->flags, n);
  rm_host_free(ctx, r, sizeof *r);
}

static int by_ptr(const void *a, const void *b, void *ud) {
  const rm_reducer *r = ud;
  uintptr_t x = (uintptr_t)r->slots[*(const int *)a].p, y = (uintptr_t)r->slots[*(const int *)b].p;
  return x < y ? -1 : x > y;
}

/* Lays the parameters (given first to last) into buckets of at most cap bytes. */
static int build_buckets(rm_reducer *r, int n, rm_tensor *const *params, size_t cap) {
  rm_ctx *ctx = r->ctx;
  const char *fn = "dist.DataParallel";
  for (int i = 0; i < n; i++) {
    rm_tensor *p = params[n - 1 - i];   /* last parameter first */
    if (!p) return rm_fail(ctx, RM_ERR_ARG, "%s: parameter %d is missing", fn, n - i);
    if (!p->requires_grad || p->grad_fn)
      return rm_fail(ctx, RM_ERR_ARG, "%s: parameter %d does not require grad (or is not a leaf)", fn, n - i);
    rm_tensor_hold(p);
    r->slots[i].p = p;
    r->order[i] = i;
    r->nslots = i + 1;
  }
  qsort_r(r->order, (size_t)n, sizeof *r->order, by_ptr, r);
  for (int i = 1; i < n; i++)
    if (r->slots[r->order[i]].p == r->slots[r->order[i - 1]].p)
      return rm_fail(ctx, RM_ERR_ARG, "%s: a parameter appears twice in the list", fn);
  /* group: same dtype and device, at most cap bytes (a bigger parameter gets its own) */
  int start = 0;
  size_t bytes = 0;
  for (int i = 0; i <= n; i++) {
    rm_tensor *p = i < n ? r->slots[i].p : NULL;
    size_t nb = p ? (size_t)rm_tensor_numel(p) * rm_dtype_size(p->dtype) : 0;
    rm_tensor *q = i > start ? r->slots[start].p : NULL;
    bool split = i == n || (q && (p->dtype != q->dtype || p->device != q->device || bytes + nb > cap));
    if (split && i > start) {
      bucket *b = &r->b[r->nb];
      int64_t total = 0;
      for (int k = start; k < i; k++) total += rm_tensor_numel(r->slots[k].p);
      b->buf = rm_tensor_new(ctx, q->dtype, q->device, 1, &total, RM_CAT_WORKSPACE);
      if (!b->buf) return rm_fail_prefix(ctx, fn);
      b->first = start;
      b->count = i - start;
      r->nb++;
      int64_t off = 0;
      for (int k = start; k < i; k++) {
        rm_tensor *pk = r->slots[k].p;
        int64_t st[RM_MAX_DIM];
        rm_contiguous_strides(pk->ndim, pk->shape, st);
        r->slots[k].view = rm_tensor_view_of(ctx, b->buf, pk->ndim, pk->shape, st, off);
        if (!r->slots[k].view) return rm_fail_prefix(ctx, fn);
        r->slots[k].bucket = r->nb - 1;
        off += rm_tensor_numel(pk);
      }
      start = i;
      bytes = 0;
    }
    bytes += nb;
  }
  return RM_OK;
}

rm_reducer *rm_reducer_new(rm_ctx *ctx, rm_dist *d, int n, rm_tensor *const *params, size_t bucket_bytes) {
  const char *fn = "dist.DataParallel";
  if (!d->inited) return rm_fail(ctx, RM_ERR_STATE, "%s: call dist.init() first", fn), NULL;
  if (n < 1) return rm_fail(ctx, RM_ERR_ARG, "%s: the model has no parameters", fn), NULL;
  if (bucket_bytes < 1) return rm_fail(ctx, RM_ERR_ARG, "%s: bucket size must be at least one byte", fn), NULL;
  if (!d->api) return rm_fail(ctx, RM_ERR_STATE, "%s: there is one process (no reducer is needed)", fn), NULL;
  if (d->active)
    return rm_fail(ctx, RM_ERR_STATE, "%s: another model is already wrapped in this Lua state; call :close() on it first",
                   fn), NULL;
  rm_reducer *r = rm_host_calloc(ctx, 1, sizeof *r);
  if (!r) return rm_fail(ctx, RM_ERR_OOM, "%s: out of host memory", fn), NULL;
  r->d = d;
  r->ctx = ctx;
  r->cap = n;
  r->slots = rm_host_calloc(ctx, (size_t)n, sizeof *r->slots);
  r->b = rm_host_calloc(ctx, (size_t)n, sizeof *r->b);
  r->order = rm_host_calloc(ctx, (size_t)n, sizeof *r->order);
  r->flags = rm_host_calloc(ctx, (size_t)n, 1);
  int rc = !r->slots || !r->b || !r->order || !r->flags ? rm_fail(ctx, RM_ERR_OOM, "%s: out of host memory", fn)
                                                        : build_buckets(r, n, params, bucket_bytes);
  if (!rc && (rc = rm_hook_add(ctx, RM_HOOK_GRAD_READY, on_grad_ready, r)) == RM_OK &&
      (rc = rm_hook_add(ctx, RM_HOOK_BACKWARD_DONE, on_backward_done, r)) != RM_OK)
    rm_hook_remove(ctx, RM_HOOK_GRAD_READY, on_grad_ready, r);
  if (rc) {
    rm_reducer_free(r);
    return NULL;
  }
  r->hooked = r->armed = true;
  d->active = r;
  return r;
}
