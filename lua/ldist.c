/* remat.dist's C side: loading the communication backend (libremat_mpi.so, see
 * dist/dist_api.h), collectives on tensors, and the gradient reducer that data
 * parallelism hooks into backward (RM_HOOK_GRAD_READY).
 *
 * Without mpirun (or without libremat_mpi.so when not under mpirun) the world is one
 * process and every collective is the identity. Ranks are 0-based here and 1-based in
 * the Lua API. The per-Lua-state state is a userdata in the registry; MPI itself is
 * process-wide. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lremat.h"
#include "../core/backend.h"
#include "../core/plugin.h"
#include "../dist/dist_api.h"

#define STATE_MT "remat.dist.State"
#define REDUCER_MT "remat.dist.Reducer"
#define MPI_LIB "libremat_mpi.so"

static const char STATE_KEY = 'd';

typedef struct reducer reducer;

typedef struct dist_state {
  const rm_dist_api *api;   /* NULL: a single process */
  int rank, size, local_rank;
  double timeout;           /* seconds a collective may wait (<= 0: no limit) */
  bool inited, dirty;       /* dirty: a collective was abandoned after an error */
  uint64_t bytes, calls;    /* payload sent through collectives */
  reducer *active;          /* the reducer hooked into backward, if any */
} dist_state;

/* ---------------------------------------------------------------- state ---- */

static int state_gc(lua_State *L) {
  dist_state *ds = luaL_checkudata(L, 1, STATE_MT);
  if (ds->api && ds->inited) ds->api->finalize(ds->timeout, ds->dirty);
  ds->inited = false;
  return 0;
}

static dist_state *get_state(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &STATE_KEY) == LUA_TUSERDATA) {
    dist_state *ds = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return ds;
  }
  lua_pop(L, 1);
  dist_state *ds = lua_newuserdatauv(L, sizeof *ds, 0);
  memset(ds, 0, sizeof *ds);
  ds->size = 1;
  ds->timeout = 600;
  if (luaL_newmetatable(L, STATE_MT)) {
    lua_pushcfunction(L, state_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &STATE_KEY);
  return ds;
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

/* C.dist_init([timeout]) -> rank, world_size, local_rank (1-based), backend name */
static int l_init(lua_State *L) {
  dist_state *ds = get_state(L);
  if (!lua_isnoneornil(L, 1)) ds->timeout = luaL_checknumber(L, 1);
  if (!ds->inited) {
    if (under_mpirun()) {
      char why[512];
      const rm_dist_api *api = load_api(why, sizeof why);
      if (!api)
        return rm_lua_errorf(L, "dist.init: started by mpirun but libremat_mpi.so cannot be loaded (%s); "
                                "it is built when Open MPI's headers (libopenmpi-dev) are found, and looked for "
                                "beside remat's library, where make install puts it, and on the loader's path; "
                                "REMAT_MPI_LIB=/path/to/libremat_mpi.so names it", why);
      char err[RM_DIST_ERRLEN];
      if (api->init(&ds->rank, &ds->size, &ds->local_rank, err)) return rm_lua_errorf(L, "dist.init: %s", err);
      ds->api = api;
    }
    ds->inited = true;
  }
  lua_pushinteger(L, ds->rank + 1);
  lua_pushinteger(L, ds->size);
  lua_pushinteger(L, ds->local_rank + 1);
  lua_pushstring(L, ds->api ? "mpi" : "none");
  return 4;
}

static dist_state *check_inited(lua_State *L, const char *fn) {
  dist_state *ds = get_state(L);
  if (!ds->inited) rm_lua_errorf(L, "%s: call dist.init() first", fn);
  return ds;
}

/* C.dist_set_timeout(seconds) */
static int l_set_timeout(lua_State *L) {
  get_state(L)->timeout = luaL_checknumber(L, 1);
  return 0;
}

/* C.dist_stats() -> bytes, calls: payload sent through collectives since the reset */
static int l_stats(lua_State *L) {
  dist_state *ds = get_state(L);
  lua_pushinteger(L, (lua_Integer)ds->bytes);
  lua_pushinteger(L, (lua_Integer)ds->calls);
  return 2;
}

static int l_reset_stats(lua_State *L) {
  dist_state *ds = get_state(L);
  ds->bytes = ds->calls = 0;
  return 0;
}

/* C.dist_abort(msg [, grace_seconds]): posts msg to every rank and ends the job
 * (MPI_Abort). Returns false when there is no job to end (a single process). */
static int l_abort(lua_State *L) {
  dist_state *ds = get_state(L);
  const char *msg = luaL_checkstring(L, 1);
  double grace = luaL_optnumber(L, 2, 2.0);
  if (ds->api && ds->inited) ds->api->abort_job(msg, grace, 1);
  lua_pushboolean(L, 0);
  return 1;
}

/* C.dist_finalize(): ends this rank's part (waits for the others to end too). */
static int l_finalize(lua_State *L) {
  dist_state *ds = get_state(L);
  if (ds->api && ds->inited) ds->api->finalize(ds->timeout, ds->dirty);
  ds->inited = false;
  ds->api = NULL;
  ds->size = 1;
  ds->rank = ds->local_rank = 0;
  return 0;
}

/* ---------------------------------------------------------------- collectives ---- */

enum { K_ALLREDUCE, K_BROADCAST, K_ALLGATHER, K_BARRIER };

/* Waits for req; on failure marks the state dirty and copies the message into err. */
static int wait_req(dist_state *ds, rm_dist_req *req, const char *what, char *err) {
  int rc = ds->api->wait(req, ds->timeout, what, err);
  if (rc) ds->dirty = true;
  return rc;
}

/* Runs one collective on raw buffers of a tensor's device; 0 or a message in err. */
static int run_collective(rm_ctx *ctx, dist_state *ds, int kind, rm_device dev, void *buf, void *recv,
                          int64_t n, rm_dtype dt, int op, int root, const char *what, char *err) {
  if (dev == RM_CUDA) {
    const rm_backend *b = rm_backend_get(ctx, RM_CUDA);
    if (!b) return snprintf(err, RM_DIST_ERRLEN, "%s: %s", what, rm_errmsg(ctx)), 1;
    if (!ds->api->gpu_allreduce)
      return snprintf(err, RM_DIST_ERRLEN, "%s: CUDA tensors go through NCCL, and this %s was built without it "
                      "(nccl.h was not found at build time)", what, MPI_LIB), 1;
    if (b->synchronize && b->synchronize(ctx)) return snprintf(err, RM_DIST_ERRLEN, "%s: %s", what, rm_errmsg(ctx)), 1;
    int rc = kind == K_ALLREDUCE ? ds->api->gpu_allreduce(buf, n, (int)dt, op, ds->timeout, err)
           : kind == K_BROADCAST ? ds->api->gpu_broadcast(buf, n, (int)dt, root, ds->timeout, err)
           : ds->api->gpu_allgather(buf, recv, n, (int)dt, ds->timeout, err);
    if (rc) ds->dirty = true;
    return rc;
  }
  rm_dist_req *req = NULL;
  int rc = kind == K_ALLREDUCE ? ds->api->iallreduce(buf, n, (int)dt, op, &req, err)
         : kind == K_BROADCAST ? ds->api->ibroadcast(buf, n, (int)dt, root, &req, err)
         : kind == K_ALLGATHER ? ds->api->iallgather(buf, recv, n, (int)dt, &req, err)
         : ds->api->ibarrier(&req, err);
  return rc ? rc : wait_req(ds, req, what, err);
}

/* The data of t, contiguous and ready, for a collective named fn. */
static void *tensor_buf(lua_State *L, rm_tensor *t, const char *fn) {
  if (!rm_tensor_is_contiguous(t))
    rm_lua_errorf(L, "%s: the tensor must be contiguous (use :contiguous() and assign the result back)", fn);
  if (rm_tensor_data_ready(rm_lua_ctx(L), t)) rm_lua_fail(L, fn);
  if (t->dtype != RM_F32 && t->dtype != RM_F64 && t->device == RM_CPU)
    rm_lua_errorf(L, "%s: %s tensors cannot be sent from the cpu", fn, rm_dtype_name(t->dtype));
  return rm_tensor_ptr(t);
}

static int raise_err(lua_State *L, const char *err) {
  if (!strncmp(err, "dist.", 5)) return rm_lua_errorf(L, "%s", err);
  return rm_lua_errorf(L, "dist.%s", err);
}

/* C.dist_barrier() */
static int l_barrier(lua_State *L) {
  dist_state *ds = check_inited(L, "dist.barrier");
  if (!ds->api) return 0;
  char err[RM_DIST_ERRLEN];
  if (run_collective(rm_lua_ctx(L), ds, K_BARRIER, RM_CPU, NULL, NULL, 0, RM_F32, 0, 0, "dist.barrier", err))
    return raise_err(L, err);
  return 0;
}

/* C.dist_allreduce(t, op): in place; op "sum", "mean" or "max". Returns t. */
static int l_allreduce(lua_State *L) {
  const char *fn = "dist.allreduce";
  dist_state *ds = check_inited(L, fn);
  rm_tensor *t = rm_lua_check_tensor(L, 1, fn);
  const char *ops = luaL_optstring(L, 2, "sum");
  int op = !strcmp(ops, "max") ? RM_DIST_MAX : RM_DIST_SUM;
  if (strcmp(ops, "sum") && strcmp(ops, "mean") && strcmp(ops, "max"))
    return rm_lua_errorf(L, "%s: unknown op '%s' (sum, mean, max)", fn, ops);
  void *buf = tensor_buf(L, t, fn);
  rm_ctx *ctx = rm_lua_ctx(L);
  if (ds->api) {
    char err[RM_DIST_ERRLEN];
    if (run_collective(ctx, ds, K_ALLREDUCE, t->device, buf, NULL, rm_tensor_numel(t), t->dtype, op, 0, fn, err))
      return raise_err(L, err);
    ds->bytes += rm_tensor_nbytes(t);
    ds->calls++;
  }
  if (!strcmp(ops, "mean") && ds->size > 1) {
    rm_attrs a;
    rm_attrs_init(&a);
    a.scalar.value = 1.0 / ds->size;
    if (rm_op_into(ctx, RM_OP_MUL_SCALAR, 1, &t, &a, 1, &t)) return rm_lua_fail(L, fn);
  }
  lua_settop(L, 1);
  return 1;
}

/* C.dist_broadcast(t, root): in place from root (1-based). Returns t. */
static int l_broadcast(lua_State *L) {
  const char *fn = "dist.broadcast";
  dist_state *ds = check_inited(L, fn);
  rm_tensor *t = rm_lua_check_tensor(L, 1, fn);
  lua_Integer root = luaL_optinteger(L, 2, 1);
  if (root < 1 || root > ds->size)
    return rm_lua_errorf(L, "%s: root %d is not a rank (1..%d)", fn, (int)root, ds->size);
  void *buf = tensor_buf(L, t, fn);
  if (ds->api) {
    char err[RM_DIST_ERRLEN];
    if (run_collective(rm_lua_ctx(L), ds, K_BROADCAST, t->device, buf, NULL, rm_tensor_numel(t), t->dtype, 0,
                       (int)root - 1, fn, err))
      return raise_err(L, err);
    ds->bytes += rm_tensor_nbytes(t);
    ds->calls++;
  }
  lua_settop(L, 1);
  return 1;
}

/* C.dist_all_gather(t) -> a new tensor: every rank's t concatenated along the first
 * dimension, in rank order (a 0-d tensor gives a 1-d one of world_size elements). */
static int l_all_gather(lua_State *L) {
  const char *fn = "dist.all_gather";
  dist_state *ds = check_inited(L, fn);
  rm_tensor *t = rm_lua_check_tensor(L, 1, fn);
  void *buf = tensor_buf(L, t, fn);
  rm_ctx *ctx = rm_lua_ctx(L);
  int64_t shape[RM_MAX_DIM];
  int nd = t->ndim ? t->ndim : 1;
  for (int d = 0; d < t->ndim; d++) shape[d] = t->shape[d];
  if (!t->ndim) shape[0] = 1;
  shape[0] *= ds->size;
  rm_tensor *out = rm_tensor_new(ctx, t->dtype, t->device, nd, shape, ctx->category);
  if (!out) return rm_lua_fail(L, fn);
  char err[RM_DIST_ERRLEN];
  int rc = 0;
  if (ds->api) {
    rc = run_collective(ctx, ds, K_ALLGATHER, t->device, buf, rm_tensor_ptr(out), rm_tensor_numel(t), t->dtype, 0, 0,
                        fn, err);
    ds->bytes += rm_tensor_nbytes(t);
    ds->calls++;
  } else if (rm_op_into(ctx, RM_OP_COPY, 1, &t, NULL, 1, &out)) {
    rm_tensor_drop(ctx, out);
    return rm_lua_fail(L, fn);
  }
  if (rc) {
    if (!ds->dirty) rm_tensor_drop(ctx, out);   /* else MPI may still write into it */
    return raise_err(L, err);
  }
  rm_lua_push_tensor(L, out, fn);
  return 1;
}

/* ---------------------------------------------------------------- gradient reducer ---- */

/* Gradients are averaged in buckets: flat buffers of several parameters' gradients
 * (parameters taken last to first, the order backward finishes them). When the last
 * gradient of a bucket is final (RM_HOOK_GRAD_READY) it is copied in and the bucket's
 * allreduce is started, in bucket order (every rank must start collectives in the same
 * order); sync() fills what backward did not reach, waits for all of them, and writes
 * the averages back into the parameters' .grad. */

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

struct reducer {
  dist_state *ds;
  rm_ctx *ctx;
  slot *slots;
  int nslots;
  bucket *b;
  int nb, next;             /* next: the first bucket not yet launched */
  int early;                /* buckets the last step started during backward */
  int *order;               /* slot indices sorted by parameter pointer (lookup) */
  unsigned char *flags;     /* per slot: this rank has a gradient (reduced with max) */
  bool armed, hooked, leaked;
  bool unsynced;            /* a backward under no_sync left gradients to reduce */
  char err[RM_DIST_ERRLEN];
};

static int find_slot(const reducer *r, const rm_tensor *t) {
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

static int fail_r(reducer *r, const char *what) {
  r->ds->dirty = true;
  return rm_fail(r->ctx, RM_ERR_RUNTIME, "%s: %s", what, r->err);
}

/* Copies p's gradient into its slot (zeros when it has none); sets the flag. */
static int fill_slot(reducer *r, slot *s) {
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

static int launch(reducer *r, bucket *b) {
  dist_state *ds = r->ds;
  rm_tensor *t = b->buf;
  int64_t n = rm_tensor_numel(t);
  b->launched = true;
  ds->bytes += rm_tensor_nbytes(t);
  ds->calls++;
  if (t->device == RM_CUDA)
    return run_collective(r->ctx, ds, K_ALLREDUCE, RM_CUDA, rm_tensor_ptr(t), NULL, n, t->dtype, RM_DIST_SUM, 0,
                          "dist.allreduce (gradient bucket)", r->err) ? fail_r(r, "dist") : RM_OK;
  if (ds->api->iallreduce(rm_tensor_ptr(t), n, (int)t->dtype, RM_DIST_SUM, &b->req, r->err)) return fail_r(r, "dist");
  return RM_OK;
}

/* Starts every bucket that is complete and whose predecessors have started. */
static int launch_ready(reducer *r) {
  while (r->next < r->nb && r->b[r->next].nready == r->b[r->next].count) {
    int rc = launch(r, &r->b[r->next++]);
    if (rc) return rc;
  }
  /* MPI progresses nonblocking collectives only inside MPI calls: nudge them */
  for (int k = 0; k < r->next; k++) {
    int done;
    if (r->b[k].req && r->ds->api->test(r->b[k].req, &done, r->err)) return fail_r(r, "dist");
  }
  return RM_OK;
}

/* RM_HOOK_GRAD_READY: a parameter's gradient is final. */
static int on_grad_ready(rm_ctx *ctx, const rm_event *ev, void *ud) {
  reducer *r = ud;
  int i = find_slot(r, ev->tensor);
  if (i < 0) return RM_OK;
  if (!r->armed) return RM_OK;
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

static void reset_step(reducer *r) {
  for (int i = 0; i < r->nslots; i++) r->slots[i].ready = false;
  for (int k = 0; k < r->nb; k++) {
    r->b[k].nready = 0;
    r->b[k].launched = false;
    r->b[k].req = NULL;
  }
  r->next = 0;
}

static reducer *check_reducer(lua_State *L, int idx) {
  reducer **pp = luaL_checkudata(L, idx, REDUCER_MT);
  if (!*pp) rm_lua_errorf(L, "dist.DataParallel: it was closed");
  return *pp;
}

static int on_backward_done(rm_ctx *ctx, const rm_event *ev, void *ud);

static void unhook(reducer *r) {
  if (r->hooked) {
    rm_hook_remove(r->ctx, RM_HOOK_GRAD_READY, on_grad_ready, r);
    rm_hook_remove(r->ctx, RM_HOOK_BACKWARD_DONE, on_backward_done, r);
  }
  r->hooked = false;
  if (r->ds->active == r) r->ds->active = NULL;
}

static void reducer_free(reducer *r) {
  rm_ctx *ctx = r->ctx;
  unhook(r);
  bool outstanding = false;
  for (int k = 0; k < r->nb; k++) outstanding = outstanding || r->b[k].req;
  /* a collective still in flight may write into the buffers: leave them to MPI */
  if (outstanding) r->ds->dirty = true;
  for (int i = 0; i < r->nslots; i++) {
    if (r->slots[i].view && !outstanding) rm_tensor_drop(ctx, r->slots[i].view);
    if (r->slots[i].p) rm_tensor_drop(ctx, r->slots[i].p);
  }
  for (int k = 0; k < r->nb; k++)
    if (r->b[k].buf && !outstanding) rm_tensor_drop(ctx, r->b[k].buf);
  free(r->slots);
  free(r->b);
  free(r->order);
  free(r->flags);
  free(r);
}

static int reducer_gc(lua_State *L) {
  reducer **pp = luaL_checkudata(L, 1, REDUCER_MT);
  if (*pp) reducer_free(*pp);
  *pp = NULL;
  return 0;
}

static int by_ptr(const void *a, const void *b, void *ud) {
  const reducer *r = ud;
  uintptr_t x = (uintptr_t)r->slots[*(const int *)a].p, y = (uintptr_t)r->slots[*(const int *)b].p;
  return x < y ? -1 : x > y;
}

/* Lays the parameters (given first to last) into buckets of at most cap bytes. */
static int build_buckets(lua_State *L, reducer *r, int n, size_t cap) {
  rm_ctx *ctx = r->ctx;
  const char *fn = "dist.DataParallel";
  r->slots = calloc((size_t)n, sizeof *r->slots);
  r->b = calloc((size_t)n, sizeof *r->b);
  r->order = calloc((size_t)n, sizeof *r->order);
  r->flags = calloc((size_t)n, 1);
  if (!r->slots || !r->b || !r->order || !r->flags) return rm_lua_errorf(L, "%s: out of host memory", fn);
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, 1, n - i);   /* last parameter first */
    rm_tensor *p = rm_lua_check_tensor(L, -1, fn);
    lua_pop(L, 1);
    if (!p->requires_grad || p->grad_fn)
      return rm_lua_errorf(L, "%s: parameter %d does not require grad (or is not a leaf)", fn, n - i);
    rm_tensor_hold(p);
    r->slots[i].p = p;
    r->order[i] = i;
    r->nslots = i + 1;
  }
  qsort_r(r->order, (size_t)n, sizeof *r->order, by_ptr, r);
  for (int i = 1; i < n; i++)
    if (r->slots[r->order[i]].p == r->slots[r->order[i - 1]].p)
      return rm_lua_errorf(L, "%s: a parameter appears twice in the list", fn);
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
      if (!b->buf) return rm_lua_fail(L, fn);
      b->first = start;
      b->count = i - start;
      int64_t off = 0;
      for (int k = start; k < i; k++) {
        rm_tensor *pk = r->slots[k].p;
        int64_t st[RM_MAX_DIM];
        rm_contiguous_strides(pk->ndim, pk->shape, st);
        r->slots[k].view = rm_tensor_view_of(ctx, b->buf, pk->ndim, pk->shape, st, off);
        if (!r->slots[k].view) return rm_lua_fail(L, fn);
        r->slots[k].bucket = r->nb;
        off += rm_tensor_numel(pk);
      }
      r->nb++;
      start = i;
      bytes = 0;
    }
    bytes += nb;
  }
  return 0;
}

/* C.dist_reducer(params, bucket_bytes) -> reducer hooked into backward */
static int l_reducer(lua_State *L) {
  const char *fn = "dist.DataParallel";
  dist_state *ds = check_inited(L, fn);
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_Integer cap = luaL_checkinteger(L, 2);
  int n = (int)luaL_len(L, 1);
  if (n < 1) return rm_lua_errorf(L, "%s: the model has no parameters", fn);
  if (cap < 1) return rm_lua_errorf(L, "%s: bucket size must be at least one byte", fn);
  if (!ds->api) return rm_lua_errorf(L, "%s: there is one process (no reducer is needed)", fn);
  if (ds->active)
    return rm_lua_errorf(L, "%s: another model is already wrapped in this Lua state; call :close() on it first", fn);
  rm_ctx *ctx = rm_lua_ctx(L);
  reducer **pp = lua_newuserdatauv(L, sizeof *pp, 1);
  *pp = NULL;
  if (luaL_newmetatable(L, REDUCER_MT)) {
    lua_pushcfunction(L, reducer_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &STATE_KEY);   /* keeps the state alive as long as us */
  lua_setiuservalue(L, -2, 1);
  reducer *r = calloc(1, sizeof *r);
  if (!r) return rm_lua_errorf(L, "%s: out of host memory", fn);
  r->ds = ds;
  r->ctx = ctx;
  *pp = r;
  build_buckets(L, r, n, (size_t)cap);
  if (rm_hook_add(ctx, RM_HOOK_GRAD_READY, on_grad_ready, r) ||
      rm_hook_add(ctx, RM_HOOK_BACKWARD_DONE, on_backward_done, r)) {
    rm_hook_remove(ctx, RM_HOOK_GRAD_READY, on_grad_ready, r);
    return rm_lua_fail(L, fn);
  }
  r->hooked = r->armed = true;
  ds->active = r;
  return 1;
}

/* A failed collective of the reducer: its message on the context. */
static int sync_fail(reducer *r) {
  r->ds->dirty = true;
  return rm_fail(r->ctx, RM_ERR_RUNTIME, "%s%s", strncmp(r->err, "dist.", 5) ? "dist." : "", r->err);
}

/* Averages every gradient across ranks: starts the buckets backward did not reach,
 * waits for all of them, and writes the averages into each parameter's .grad. */
static int reducer_sync(reducer *r) {
  rm_ctx *ctx = r->ctx;
  dist_state *ds = r->ds;
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
  if (ds->api->iallreduce(r->flags, r->nslots, RM_DIST_U8, RM_DIST_MAX, &freq, r->err) ||
      wait_req(ds, freq, "dist.sync (allreduce of the gradient flags)", r->err))
    return sync_fail(r);
  for (int k = 0; k < r->nb; k++) {
    if (!r->b[k].req) continue;
    char what[96];
    snprintf(what, sizeof what, "dist.sync (allreduce of gradient bucket %d of %d)", k + 1, r->nb);
    rm_dist_req *q = r->b[k].req;
    r->b[k].req = NULL;
    if (wait_req(ds, q, what, r->err)) return sync_fail(r);
  }
  rm_attrs a;
  rm_attrs_init(&a);
  a.scalar.value = 1.0 / ds->size;
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
 * (inside no_sync they accumulate locally, and the next backward reduces the sum). */
static int on_backward_done(rm_ctx *ctx, const rm_event *ev, void *ud) {
  reducer *r = ud;
  if (ctx->dry || ev->rc != RM_OK) return RM_OK;   /* a planning dry run, or a failed backward */
  if (!r->armed) {
    r->unsynced = true;
    return RM_OK;
  }
  return reducer_sync(r);
}

/* C.dist_reducer_sync(r): reduces gradients that backward left unreduced (backward
 * calls all inside no_sync); nothing otherwise, since backward already reduced. */
static int l_reducer_sync(lua_State *L) {
  reducer *r = check_reducer(L, 1);
  if (r->unsynced && reducer_sync(r)) return rm_lua_errorf(L, "%s", rm_errmsg(r->ctx));
  return 0;
}

/* C.dist_reducer_arm(r, flag): off, backward leaves the gradients to accumulate. */
static int l_reducer_arm(lua_State *L) {
  reducer *r = check_reducer(L, 1);
  r->armed = lua_toboolean(L, 2);
  return 0;
}

/* C.dist_reducer_close(r): unhooks and frees the buffers. */
static int l_reducer_close(lua_State *L) { return reducer_gc(L); }

/* C.dist_reducer_info(r) -> { buckets = { {bytes =, params =}, ... }, bytes = } */
static int l_reducer_info(lua_State *L) {
  reducer *r = check_reducer(L, 1);
  lua_newtable(L);
  lua_newtable(L);
  size_t total = 0;
  for (int k = 0; k < r->nb; k++) {
    lua_newtable(L);
    size_t nb = rm_tensor_nbytes(r->b[k].buf);
    total += nb;
    lua_pushinteger(L, (lua_Integer)nb);
    lua_setfield(L, -2, "bytes");
    lua_pushinteger(L, r->b[k].count);
    lua_setfield(L, -2, "params");
    lua_rawseti(L, -2, k + 1);
  }
  lua_setfield(L, -2, "buckets");
  lua_pushinteger(L, r->early);
  lua_setfield(L, -2, "started_during_backward");
  lua_pushinteger(L, (lua_Integer)total);
  lua_setfield(L, -2, "bytes");
  return 1;
}

static const luaL_Reg fns[] = {
  { "dist_init", l_init },
  { "dist_set_timeout", l_set_timeout },
  { "dist_stats", l_stats },
  { "dist_reset_stats", l_reset_stats },
  { "dist_abort", l_abort },
  { "dist_finalize", l_finalize },
  { "dist_barrier", l_barrier },
  { "dist_allreduce", l_allreduce },
  { "dist_broadcast", l_broadcast },
  { "dist_all_gather", l_all_gather },
  { "dist_reducer", l_reducer },
  { "dist_reducer_sync", l_reducer_sync },
  { "dist_reducer_arm", l_reducer_arm },
  { "dist_reducer_close", l_reducer_close },
  { "dist_reducer_info", l_reducer_info },
  { NULL, NULL },
};

void rm_lua_open_dist(lua_State *L) { luaL_setfuncs(L, fns, 0); }
