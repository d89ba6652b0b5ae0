/* remat.dist's binding: the communicator and the gradient reducer of core/dist.h
 * (data parallelism hooks into backward there), and collectives on tensors.
 *
 * Without mpirun (or without libremat_mpi.so when not under mpirun) the world is one
 * process and every collective is the identity. Ranks are 0-based in C and 1-based in
 * the Lua API. The per-Lua-state communicator is a userdata in the registry; MPI itself
 * is process-wide. */
#include <stdio.h>
#include <string.h>

#include "lremat.h"
#include "../core/dist.h"
#include "../dist/dist_api.h"

#define STATE_MT "remat.dist.State"
#define REDUCER_MT "remat.dist.Reducer"

static const char STATE_KEY = 'd';

/* ---------------------------------------------------------------- state ---- */

static int state_gc(lua_State *L) {
  rm_dist *ds = luaL_checkudata(L, 1, STATE_MT);
  rm_dist_finalize(ds);
  return 0;
}

static rm_dist *get_state(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &STATE_KEY) == LUA_TUSERDATA) {
    rm_dist *ds = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return ds;
  }
  lua_pop(L, 1);
  rm_dist *ds = lua_newuserdatauv(L, sizeof *ds, 0);
  rm_dist_defaults(ds);
  if (luaL_newmetatable(L, STATE_MT)) {
    lua_pushcfunction(L, state_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &STATE_KEY);
  return ds;
}

/* The context's message, raised as it is (it names the dist function). */
static int raise_ctx(lua_State *L) { return rm_lua_errorf(L, "%s", rm_errmsg(rm_lua_ctx(L))); }

/* C.dist_init([timeout]) -> rank, world_size, local_rank (1-based), backend name */
static int l_init(lua_State *L) {
  rm_dist *ds = get_state(L);
  if (!lua_isnoneornil(L, 1)) ds->timeout = luaL_checknumber(L, 1);
  if (rm_dist_init(rm_lua_ctx(L), ds)) return raise_ctx(L);
  lua_pushinteger(L, ds->rank + 1);
  lua_pushinteger(L, ds->size);
  lua_pushinteger(L, ds->local_rank + 1);
  lua_pushstring(L, ds->api ? "mpi" : "none");
  return 4;
}

static rm_dist *check_inited(lua_State *L, const char *fn) {
  rm_dist *ds = get_state(L);
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
  rm_dist *ds = get_state(L);
  lua_pushinteger(L, (lua_Integer)ds->bytes);
  lua_pushinteger(L, (lua_Integer)ds->calls);
  return 2;
}

static int l_reset_stats(lua_State *L) {
  rm_dist *ds = get_state(L);
  ds->bytes = ds->calls = 0;
  return 0;
}

/* C.dist_abort(msg [, grace_seconds]): posts msg to every rank and ends the job
 * (MPI_Abort). Returns false when there is no job to end (a single process). */
static int l_abort(lua_State *L) {
  rm_dist *ds = get_state(L);
  const char *msg = luaL_checkstring(L, 1);
  double grace = luaL_optnumber(L, 2, 2.0);
  if (ds->api && ds->inited) ds->api->abort_job(msg, grace, 1);
  lua_pushboolean(L, 0);
  return 1;
}

/* C.dist_finalize(): ends this rank's part (waits for the others to end too). */
static int l_finalize(lua_State *L) {
  rm_dist_finalize(get_state(L));
  return 0;
}

/* ---------------------------------------------------------------- collectives ---- */

/* The data of t, contiguous and ready, for a collective named fn. */
static void *tensor_buf(lua_State *L, rm_tensor *t, const char *fn) {
  if (!rm_tensor_is_contiguous(t))
    rm_lua_errorf(L, "%s: the tensor must be contiguous (use :contiguous() and assign the result back)", fn);
  if (rm_tensor_data_ready(rm_lua_ctx(L), t)) rm_lua_fail(L, fn);
  if (t->dtype != RM_F32 && t->dtype != RM_F64 && t->device == RM_CPU)
    rm_lua_errorf(L, "%s: %s tensors cannot be sent from the cpu", fn, rm_dtype_name(t->dtype));
  return rm_tensor_ptr(t);
}

/* C.dist_barrier() */
static int l_barrier(lua_State *L) {
  rm_dist *ds = check_inited(L, "dist.barrier");
  if (!ds->api) return 0;
  if (rm_dist_collective(rm_lua_ctx(L), ds, RM_COLL_BARRIER, RM_CPU, NULL, NULL, 0, RM_F32, 0, 0, "dist.barrier"))
    return raise_ctx(L);
  return 0;
}

/* C.dist_allreduce(t, op): in place; op "sum", "mean" or "max". Returns t. */
static int l_allreduce(lua_State *L) {
  const char *fn = "dist.allreduce";
  rm_dist *ds = check_inited(L, fn);
  rm_tensor *t = rm_lua_check_tensor(L, 1, fn);
  const char *ops = luaL_optstring(L, 2, "sum");
  int op = !strcmp(ops, "max") ? RM_DIST_MAX : RM_DIST_SUM;
  if (strcmp(ops, "sum") && strcmp(ops, "mean") && strcmp(ops, "max"))
    return rm_lua_errorf(L, "%s: unknown op '%s' (sum, mean, max)", fn, ops);
  void *buf = tensor_buf(L, t, fn);
  rm_ctx *ctx = rm_lua_ctx(L);
  if (ds->api) {
    if (rm_dist_collective(ctx, ds, RM_COLL_ALLREDUCE, t->device, buf, NULL, rm_tensor_numel(t), t->dtype, op, 0, fn))
      return raise_ctx(L);
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
  rm_dist *ds = check_inited(L, fn);
  rm_tensor *t = rm_lua_check_tensor(L, 1, fn);
  lua_Integer root = luaL_optinteger(L, 2, 1);
  if (root < 1 || root > ds->size)
    return rm_lua_errorf(L, "%s: root %d is not a rank (1..%d)", fn, (int)root, ds->size);
  void *buf = tensor_buf(L, t, fn);
  if (ds->api) {
    if (rm_dist_collective(rm_lua_ctx(L), ds, RM_COLL_BROADCAST, t->device, buf, NULL, rm_tensor_numel(t), t->dtype,
                           0, (int)root - 1, fn))
      return raise_ctx(L);
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
  rm_dist *ds = check_inited(L, fn);
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
  int rc = 0;
  if (ds->api) {
    rc = rm_dist_collective(ctx, ds, RM_COLL_ALLGATHER, t->device, buf, rm_tensor_ptr(out), rm_tensor_numel(t),
                            t->dtype, 0, 0, fn);
    ds->bytes += rm_tensor_nbytes(t);
    ds->calls++;
  } else if (rm_op_into(ctx, RM_OP_COPY, 1, &t, NULL, 1, &out)) {
    rm_tensor_drop(ctx, out);
    return rm_lua_fail(L, fn);
  }
  if (rc) {
    if (!ds->dirty) rm_tensor_drop(ctx, out);   /* else MPI may still write into it */
    return raise_ctx(L);
  }
  rm_lua_push_tensor(L, out, fn);
  return 1;
}

/* ---------------------------------------------------------------- gradient reducer ---- */

static rm_reducer *check_reducer(lua_State *L, int idx) {
  rm_reducer **pp = luaL_checkudata(L, idx, REDUCER_MT);
  if (!*pp) rm_lua_errorf(L, "dist.DataParallel: it was closed");
  return *pp;
}

static int reducer_gc(lua_State *L) {
  rm_reducer **pp = luaL_checkudata(L, 1, REDUCER_MT);
  rm_reducer_free(*pp);
  *pp = NULL;
  return 0;
}

/* C.dist_reducer(params, bucket_bytes) -> reducer hooked into backward */
static int l_reducer(lua_State *L) {
  const char *fn = "dist.DataParallel";
  rm_dist *ds = check_inited(L, fn);
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_Integer cap = luaL_checkinteger(L, 2);
  int n = (int)luaL_len(L, 1);
  if (cap < 1) return rm_lua_errorf(L, "%s: bucket size must be at least one byte", fn);
  rm_tensor **params = lua_newuserdatauv(L, (size_t)(n > 0 ? n : 1) * sizeof *params, 0);
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, 1, i + 1);
    params[i] = rm_lua_check_tensor(L, -1, fn);
    lua_pop(L, 1);
  }
  rm_reducer **pp = lua_newuserdatauv(L, sizeof *pp, 1);
  *pp = NULL;
  if (luaL_newmetatable(L, REDUCER_MT)) {
    lua_pushcfunction(L, reducer_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &STATE_KEY);   /* keeps the state alive as long as us */
  lua_setiuservalue(L, -2, 1);
  *pp = rm_reducer_new(rm_lua_ctx(L), ds, n, params, (size_t)cap);
  if (!*pp) return raise_ctx(L);
  return 1;
}

/* C.dist_reducer_sync(r): reduces gradients that backward left unreduced (backward
 * calls all inside no_sync); nothing otherwise, since backward already reduced. */
static int l_reducer_sync(lua_State *L) {
  if (rm_reducer_sync(check_reducer(L, 1))) return raise_ctx(L);
  return 0;
}

/* C.dist_reducer_arm(r, flag): off, backward leaves the gradients to accumulate. */
static int l_reducer_arm(lua_State *L) {
  rm_reducer_arm(check_reducer(L, 1), lua_toboolean(L, 2));
  return 0;
}

/* C.dist_reducer_close(r): unhooks and frees the buffers. */
static int l_reducer_close(lua_State *L) { return reducer_gc(L); }

/* C.dist_reducer_info(r) -> { buckets = { {bytes =, params =}, ... }, bytes =,
 * started_during_backward = } */
static int l_reducer_info(lua_State *L) {
  rm_reducer *r = check_reducer(L, 1);
  lua_newtable(L);
  lua_newtable(L);
  size_t total = 0;
  for (int k = 0; k < rm_reducer_buckets(r); k++) {
    size_t nb;
    int np;
    rm_reducer_bucket(r, k, &nb, &np);
    lua_newtable(L);
    total += nb;
    lua_pushinteger(L, (lua_Integer)nb);
    lua_setfield(L, -2, "bytes");
    lua_pushinteger(L, np);
    lua_setfield(L, -2, "params");
    lua_rawseti(L, -2, k + 1);
  }
  lua_setfield(L, -2, "buckets");
  lua_pushinteger(L, rm_reducer_started_early(r));
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
