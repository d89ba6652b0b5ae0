/* Autograd, generator, memory and registry functions of the binding. */
#include <string.h>
#include <time.h>

#include "lremat.h"
#include "lnn.h"
#include "../core/autograd.h"
#include "../core/backend.h"

/* C.requires_grad(t [, flag]) -> t (sets) or flag (gets when no flag is given) */
static int l_requires_grad(lua_State *L) {
  rm_tensor *t = rm_lua_check_tensor(L, 1, "requires_grad");
  if (lua_isnone(L, 2)) {
    lua_pushboolean(L, t->requires_grad);
    return 1;
  }
  bool flag = lua_toboolean(L, 2);
  if (!flag && t->grad_fn)
    return rm_lua_errorf(L, "requires_grad: cannot switch off grad on a tensor computed by %s (use detach)",
                         rm_op_name(t->grad_fn->op));
  if (flag && rm_dtype_is_int(t->dtype))
    return rm_lua_errorf(L, "requires_grad: an %s tensor cannot require grad (only float tensors have gradients)",
                         rm_dtype_name(t->dtype));
  t->requires_grad = flag;
  lua_settop(L, 1);
  return 1;
}

/* C.backward(t [, grad]) */
static int l_backward(lua_State *L) {
  rm_tensor *t = rm_lua_check_tensor(L, 1, "backward");
  rm_tensor *g = lua_isnoneornil(L, 2) ? NULL : rm_lua_check_tensor(L, 2, "backward");
  /* bracketed: an optimizer fused into backward calls back into this thread */
  lua_State *prev = rm_lua_nn_enter(L);
  int rc = rm_backward(rm_lua_ctx(L), t, g);
  rm_lua_nn_leave(L, prev);
  if (rc != RM_OK) return rm_lua_nn_fail(L, "backward");
  return 0;
}

/* C.grad(t) -> gradient tensor or nil */
static int l_grad(lua_State *L) {
  rm_tensor *t = rm_lua_check_tensor(L, 1, "grad");
  if (!t->grad) return 0;
  rm_tensor_hold(t->grad);
  rm_lua_push_tensor(L, t->grad, "grad");
  return 1;
}

/* C.set_grad(t, g or nil) */
static int l_set_grad(lua_State *L) {
  rm_tensor *t = rm_lua_check_tensor(L, 1, "grad");
  rm_tensor *g = lua_isnoneornil(L, 2) ? NULL : rm_lua_check_tensor(L, 2, "grad");
  return rm_lua_set_grad(L, t, g);
}

/* C.detach(t) -> a tensor sharing t's data with no history */
static int l_detach(lua_State *L) {
  rm_tensor *t = rm_lua_check_tensor(L, 1, "detach");
  rm_lua_push_tensor(L, rm_tensor_alias(rm_lua_ctx(L), t), "detach");
  return 1;
}

/* C.grad_enabled([flag]) -> the previous mode: whether ops record on the tape. Setting
 * it is for a switch between coroutines (the stepper); a temporary change inside one
 * is C.scoped. */
static int l_grad_enabled(lua_State *L) {
  rm_ctx *ctx = rm_lua_ctx(L);
  lua_pushboolean(L, ctx->grad_enabled);
  if (!lua_isnone(L, 1)) rm_set_grad_enabled(ctx, lua_toboolean(L, 1));
  return 1;
}

/* C.manual_seed(n): resets the generator (seed n, offset 0) */
static int l_manual_seed(lua_State *L) {
  rm_ctx *ctx = rm_lua_ctx(L);
  lua_Integer s = luaL_checkinteger(L, 1);
  ctx->rng_seed = (uint64_t)s;
  ctx->rng_offset = 0;
  return 0;
}

/* C.rng_state() -> seed, offset ; C.set_rng_state(seed, offset) */
static int l_rng_state(lua_State *L) {
  rm_ctx *ctx = rm_lua_ctx(L);
  lua_pushinteger(L, (lua_Integer)ctx->rng_seed);
  lua_pushinteger(L, (lua_Integer)ctx->rng_offset);
  return 2;
}

static int l_set_rng_state(lua_State *L) {
  rm_ctx *ctx = rm_lua_ctx(L);
  ctx->rng_seed = (uint64_t)luaL_checkinteger(L, 1);
  ctx->rng_offset = (uint64_t)luaL_checkinteger(L, 2);
  return 0;
}

/* C.op_list() -> { {name=, id=, nin=, nout=, nvis=, differentiable=, internal=, view=, random=,
 * index_inputs=, index_outputs=, attrs = { {name=, type=}, ... }}, ... }: attrs as core/ops.def declares them (type:
 * "int", "bool", "real" or "shape"). */
static int l_op_list(lua_State *L) {
  lua_newtable(L);
  for (int i = 0; i < RM_OP_COUNT; i++) {
    const rm_op_def *d = rm_op_def_get((rm_op_id)i);
    lua_newtable(L);
    lua_pushstring(L, rm_op_name((rm_op_id)i));
    lua_setfield(L, -2, "name");
    lua_pushinteger(L, i);
    lua_setfield(L, -2, "id");
    int na;
    const rm_attr_field *f = rm_op_attrs((rm_op_id)i, &na);
    static const char *const types[] = { "int", "bool", "real", "shape" };
    lua_createtable(L, na, 0);
    for (int k = 0; k < na; k++) {
      lua_createtable(L, 0, 2);
      lua_pushstring(L, f[k].name);
      lua_setfield(L, -2, "name");
      lua_pushstring(L, types[f[k].type]);
      lua_setfield(L, -2, "type");
      lua_rawseti(L, -2, k + 1);
    }
    lua_setfield(L, -2, "attrs");
    lua_pushboolean(L, d != NULL);
    lua_setfield(L, -2, "implemented");
    if (d) {
      lua_pushinteger(L, d->nin);
      lua_setfield(L, -2, "nin");
      lua_pushinteger(L, d->nvis);
      lua_setfield(L, -2, "nvis");
      lua_pushboolean(L, !(d->flags & RM_OPF_NODIFF) && d->backward != NULL);
      lua_setfield(L, -2, "differentiable");
      lua_pushboolean(L, (d->flags & RM_OPF_NODIFF) != 0);
      lua_setfield(L, -2, "nodiff");
      lua_pushboolean(L, (d->flags & RM_OPF_INTERNAL) != 0);
      lua_setfield(L, -2, "internal");
      lua_pushboolean(L, (d->flags & RM_OPF_VIEW) != 0);
      lua_setfield(L, -2, "view");
      lua_pushboolean(L, (d->flags & RM_OPF_RANDOM) != 0);
      lua_setfield(L, -2, "random");
      /* 1-based positions of the index inputs / outputs (rm_op_def.index_in/out) */
      const unsigned masks[2] = { d->index_in, d->index_out };
      const char *const keys[2] = { "index_inputs", "index_outputs" };
      for (int m = 0; m < 2; m++) {
        lua_newtable(L);
        for (int k = 0, n = 0; k < 32; k++)
          if ((masks[m] >> k) & 1u) {
            lua_pushinteger(L, k + 1);
            lua_rawseti(L, -2, ++n);
          }
        lua_setfield(L, -2, keys[m]);
      }
    }
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* C.backend_ops(device) -> set of op names with a kernel on that device (or nil, err) */
static int l_device_available(lua_State *L) {
  rm_ctx *ctx = rm_lua_ctx(L);
  const char *dev = luaL_checkstring(L, 1);
  rm_device d = !strcmp(dev, "cuda") ? RM_CUDA : RM_CPU;
  const rm_backend *b = rm_backend_get(ctx, d);
  lua_pushboolean(L, b != NULL);
  if (!b) {
    lua_pushstring(L, rm_errmsg(ctx));
    rm_clear_error(ctx);
    return 2;
  }
  return 1;
}

static int push_cats(lua_State *L, const size_t *v) {
  lua_newtable(L);
  for (int c = 0; c < RM_CAT_COUNT; c++) {
    lua_pushinteger(L, (lua_Integer)v[c]);
    lua_setfield(L, -2, rm_category_name((rm_category)c));
  }
  return 1;
}

/* The device at idx (default cpu); errors name fn, the user's function. */
static rm_device opt_device(lua_State *L, int idx, const char *fn) {
  if (lua_isnoneornil(L, idx)) return RM_CPU;
  if (lua_type(L, idx) != LUA_TSTRING)
    rm_lua_errorf(L, "%s: the device must be \"cpu\" or \"cuda\", got %s", fn, luaL_typename(L, idx));
  const char *dev = lua_tostring(L, idx);
  if (!strcmp(dev, "cpu")) return RM_CPU;
  if (!strcmp(dev, "cuda")) return RM_CUDA;
  rm_lua_errorf(L, "%s: unknown device '%s' (cpu, cuda)", fn, dev);
  return RM_CPU;
}

/* C.memory_stats([device]) -> { live=, peak=, limit=, reserved=, allocs=, by_category=, peak_by_category= } */
static int l_memory_stats(lua_State *L) {
  rm_ctx *ctx = rm_lua_ctx(L);
  rm_memstats *m = &ctx->mem[opt_device(L, 1, "memory.stats")];
  lua_newtable(L);
  lua_pushinteger(L, (lua_Integer)m->live_total);
  lua_setfield(L, -2, "live");
  lua_pushinteger(L, (lua_Integer)m->peak_total);
  lua_setfield(L, -2, "peak");
  if (m->limit) {
    lua_pushinteger(L, (lua_Integer)m->limit);
    lua_setfield(L, -2, "limit");
  }
  lua_pushinteger(L, (lua_Integer)m->reserved);
  lua_setfield(L, -2, "reserved");
  lua_pushinteger(L, (lua_Integer)m->n_allocs);
  lua_setfield(L, -2, "allocs");
  push_cats(L, m->live);
  lua_setfield(L, -2, "by_category");
  push_cats(L, m->peak);
  lua_setfield(L, -2, "peak_by_category");
  lua_pushinteger(L, ctx->live_tensors);
  lua_setfield(L, -2, "tensors");
  lua_pushinteger(L, ctx->live_nodes);
  lua_setfield(L, -2, "nodes");
  return 1;
}

/* C.memory_limit(bytes_or_string_or_nil [, device]) -> previous limit or nil */
static int l_memory_limit(lua_State *L) {
  rm_ctx *ctx = rm_lua_ctx(L);
  rm_device d = opt_device(L, 2, "memory.limit");
  size_t prev = ctx->mem[d].limit, v = 0;
  if (lua_type(L, 1) == LUA_TSTRING) {
    if (!rm_parse_bytes(lua_tostring(L, 1), &v))
      return rm_lua_errorf(L, "memory.limit: cannot read '%s' as a size (examples: 1GiB, 512MiB, 1e9)", lua_tostring(L, 1));
  } else if (lua_isinteger(L, 1) || lua_isnumber(L, 1)) {
    lua_Number n = lua_tonumber(L, 1);
    if (n < 0) return rm_lua_errorf(L, "memory.limit: the limit is negative");
    v = (size_t)n;
  } else if (!lua_isnoneornil(L, 1)) {
    return rm_lua_errorf(L, "memory.limit: expected bytes, a string such as '1GiB', or nil; got %s", luaL_typename(L, 1));
  }
  ctx->mem[d].limit = v;
  if (prev) lua_pushinteger(L, (lua_Integer)prev);
  else lua_pushnil(L);
  return 1;
}

/* C.parse_bytes(s) -> bytes or nil */
static int l_parse_bytes(lua_State *L) {
  size_t v;
  if (lua_type(L, 1) == LUA_TNUMBER) {
    lua_Number n = lua_tonumber(L, 1);
    if (n < 0) return 0;
    lua_pushinteger(L, (lua_Integer)n);
    return 1;
  }
  if (lua_type(L, 1) != LUA_TSTRING || !rm_parse_bytes(lua_tostring(L, 1), &v)) return 0;
  lua_pushinteger(L, (lua_Integer)v);
  return 1;
}

static int l_reset_peak(lua_State *L) {
  rm_memory_reset_peak(rm_lua_ctx(L), opt_device(L, 1, "memory.reset_peak"));
  return 0;
}

/* C.fail_at(k): the k-th allocation from now fails (0: off) */
static int l_fail_at(lua_State *L) {
  lua_Integer k = luaL_checkinteger(L, 1);
  if (k < 0) return rm_lua_errorf(L, "fail_at: k must be >= 0");
  rm_memory_fail_at(rm_lua_ctx(L), (uint64_t)k);
  return 0;
}

static int l_now(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec * 1e-9);
  return 1;
}

/* C.runtime_info() -> { version=, blas=, blas_core=, blas_core_from=, blas_path=,
 * threads=, simd=, blas_generic=, blas_openmp=, omp_wait=, vector_path= } (rm_get_info) */
static int l_runtime_info(lua_State *L) {
  rm_info r;
  if (rm_get_info(rm_lua_ctx(L), &r) != RM_OK) return rm_lua_fail(L, "info");
  lua_createtable(L, 0, 11);
  const struct { const char *k, *v; } str[] = {
    { "version", r.version }, { "blas", r.blas }, { "blas_core", r.blas_core },
    { "blas_core_from", r.blas_core_from }, { "blas_path", r.blas_path }, { "simd", r.simd },
    { "omp_wait", r.omp_wait }, { "vector_path", r.vector_path } };
  for (size_t i = 0; i < sizeof str / sizeof str[0]; i++) {
    lua_pushstring(L, str[i].v);
    lua_setfield(L, -2, str[i].k);
  }
  lua_pushinteger(L, r.threads);
  lua_setfield(L, -2, "threads");
  lua_pushboolean(L, r.blas_generic);
  lua_setfield(L, -2, "blas_generic");
  lua_pushboolean(L, r.blas_openmp);
  lua_setfield(L, -2, "blas_openmp");
  return 1;
}

/* After fn of C.scoped returned, failed or yielded and came back: leaves the scope. */
static int scoped_done(lua_State *L, int status, lua_KContext k) {
  rm_scope *s = lua_touserdata(L, 1);
  if (status != LUA_OK && status != LUA_YIELD) {
    rm_scope_leave(rm_lua_ctx(L), s);
    return lua_error(L);
  }
  rm_scope_leave(rm_lua_ctx(L), s);
  return lua_gettop(L) - 2;
}

/* C.scoped(category or nil, grad or nil, fn, ...) -> fn(...)'s results, with the
 * category of new op outputs and the grad mode set while fn runs (nil: unchanged),
 * and restored however fn ends (its error is raised again). */
static int l_scoped(lua_State *L) {
  int cat = RM_SAME, grad = lua_isnil(L, 2) ? RM_SAME : lua_toboolean(L, 2) ? RM_GRAD_ON : RM_GRAD_OFF;
  if (!lua_isnil(L, 1)) {
    const char *name = luaL_checkstring(L, 1);
    for (int c = 0; c < RM_CAT_COUNT && cat == RM_SAME; c++)
      if (!strcmp(name, rm_category_name((rm_category)c))) cat = c;
    if (cat == RM_SAME) return rm_lua_errorf(L, "unknown memory category '%s'", name);
  }
  luaL_checktype(L, 3, LUA_TFUNCTION);
  rm_scope *s = lua_newuserdatauv(L, sizeof *s, 0);
  lua_replace(L, 1);
  rm_scope_enter(rm_lua_ctx(L), s, cat, grad);
  return scoped_done(L, lua_pcallk(L, lua_gettop(L) - 3, LUA_MULTRET, 0, 0, scoped_done), 0);
}

/* The CUDA backend, or a Lua error saying why it is not available. */
static const rm_backend *cuda_backend(lua_State *L, const char *fn) {
  const rm_backend *b = rm_backend_get(rm_lua_ctx(L), RM_CUDA);
  if (!b) rm_lua_fail(L, fn);
  return b;
}

/* C.cuda_synchronize(): waits for all queued CUDA work */
static int l_cuda_synchronize(lua_State *L) {
  const rm_backend *b = cuda_backend(L, "cuda.synchronize");
  if (b->synchronize && b->synchronize(rm_lua_ctx(L)) != RM_OK) return rm_lua_fail(L, "cuda.synchronize");
  return 0;
}

/* C.cuda_empty_cache() -> bytes given back to the device */
static int l_cuda_empty_cache(lua_State *L) {
  rm_ctx *ctx = rm_lua_ctx(L);
  const rm_backend *b = cuda_backend(L, "cuda.empty_cache");
  size_t n = b->empty_cache ? b->empty_cache(ctx) : 0;
  ctx->mem[RM_CUDA].reserved = b->reserved ? b->reserved(ctx) : ctx->mem[RM_CUDA].reserved;
  lua_pushinteger(L, (lua_Integer)n);
  return 1;
}

/* C.empty_cache([device]) -> bytes of cached blocks given back (CPU or CUDA) */
static int l_empty_cache(lua_State *L) {
  rm_ctx *ctx = rm_lua_ctx(L);
  rm_device d = opt_device(L, 1, "memory.empty_cache");
  const rm_backend *b = rm_backend_get(ctx, d);
  if (!b) return rm_lua_fail(L, "memory.empty_cache");
  size_t n = b->empty_cache ? b->empty_cache(ctx) : 0;
  if (b->reserved) ctx->mem[d].reserved = b->reserved(ctx);
  lua_pushinteger(L, (lua_Integer)n);
  return 1;
}

/* C.cuda_profile([reset]) -> list of { name=, ms=, calls= } (ops with calls, most time
 * first), or nil when timing is off (REMAT_CUDA_PROFILE=1 when CUDA started). */
static int l_cuda_profile(lua_State *L) {
  rm_ctx *ctx = rm_lua_ctx(L);
  const rm_backend *b = cuda_backend(L, "cuda.profile");
  double ms[RM_OP_COUNT];
  int64_t calls[RM_OP_COUNT];
  if (!b->profile || !b->profile(ctx, ms, calls, lua_toboolean(L, 1))) {
    lua_pushnil(L);
    return 1;
  }
  int order[RM_OP_COUNT], n = 0;
  for (int i = 0; i < RM_OP_COUNT; i++)
    if (calls[i] > 0) order[n++] = i;
  for (int i = 1; i < n; i++) /* insertion sort, most time first */
    for (int j = i; j > 0 && ms[order[j]] > ms[order[j - 1]]; j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_createtable(L, 0, 3);
    lua_pushstring(L, rm_op_name((rm_op_id)order[i]));
    lua_setfield(L, -2, "name");
    lua_pushnumber(L, ms[order[i]]);
    lua_setfield(L, -2, "ms");
    lua_pushinteger(L, (lua_Integer)calls[order[i]]);
    lua_setfield(L, -2, "calls");
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* C.cuda_info() -> { name=, total=, free= } */
static int l_cuda_info(lua_State *L) {
  rm_ctx *ctx = rm_lua_ctx(L);
  const rm_backend *b = cuda_backend(L, "cuda.info");
  char name[256] = "";
  size_t total = 0, fr = 0;
  if (b->device_info && b->device_info(ctx, name, sizeof name, &total, &fr) != RM_OK)
    return rm_lua_fail(L, "cuda.info");
  lua_newtable(L);
  lua_pushstring(L, name);
  lua_setfield(L, -2, "name");
  lua_pushinteger(L, (lua_Integer)total);
  lua_setfield(L, -2, "total");
  lua_pushinteger(L, (lua_Integer)fr);
  lua_setfield(L, -2, "free");
  return 1;
}

static const luaL_Reg fns[] = {
  { "cuda_synchronize", l_cuda_synchronize },
  { "cuda_empty_cache", l_cuda_empty_cache },
  { "cuda_info", l_cuda_info },
  { "cuda_profile", l_cuda_profile },
  { "empty_cache", l_empty_cache },
  { "requires_grad", l_requires_grad },
  { "backward", l_backward },
  { "grad", l_grad },
  { "set_grad", l_set_grad },
  { "detach", l_detach },
  { "grad_enabled", l_grad_enabled },
  { "manual_seed", l_manual_seed },
  { "rng_state", l_rng_state },
  { "set_rng_state", l_set_rng_state },
  { "op_list", l_op_list },
  { "device_available", l_device_available },
  { "memory_stats", l_memory_stats },
  { "memory_limit", l_memory_limit },
  { "parse_bytes", l_parse_bytes },
  { "reset_peak", l_reset_peak },
  { "fail_at", l_fail_at },
  { "now", l_now },
  { "runtime_info", l_runtime_info },
  { "scoped", l_scoped },
  { NULL, NULL },
};

void rm_lua_open_autograd(lua_State *L) { luaL_setfuncs(L, fns, 0); }
