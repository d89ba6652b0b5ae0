/* The Lua half of the host API (core/remat.h): finding a state's context, running
 * chunks that return values, running one time slice of a remat.train stepper, and
 * remat.log. Every entry point runs Lua under lua_pcall, so a Lua error becomes a
 * status and a message on the context, never a longjmp through the host. */
#include <math.h>
#include <string.h>

#include "lremat.h"
#include "../core/ctx.h"

/* rm_lua_ctx raises when remat is not open; run it protected to ask instead. */
static int bound_ctx_body(lua_State *L) {
  lua_pushlightuserdata(L, rm_lua_ctx(L));
  return 1;
}

rm_ctx *rm_lua_context(lua_State *L) {
  if (!L) return NULL;
  lua_pushcfunction(L, bound_ctx_body);
  if (lua_pcall(L, 0, 1, 0) != LUA_OK) {
    lua_pop(L, 1);
    return NULL;
  }
  rm_ctx *ctx = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return ctx;
}

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* Pops the error message at the top of L into ctx; returns the status. */
static int take_error(lua_State *L, rm_ctx *ctx, int status, const char *what) {
  const char *msg = lua_tostring(L, -1);
  if (what) rm_fail(ctx, status, "%s: %s", what, msg ? msg : "error");
  else rm_fail(ctx, status, "%s", msg ? msg : "error");
  lua_pop(L, 1);
  return status;
}

int rm_lua_exec(lua_State *L, rm_ctx *ctx, const char *file_or_code, int is_code, int nresults) {
  if (!L || !ctx || !file_or_code) {
    if (ctx) return rm_fail(ctx, RM_ERR_ARG, "rm_lua_exec: NULL state or source");
    return RM_ERR_ARG;
  }
  if (nresults < 0) nresults = LUA_MULTRET;
  int top = lua_gettop(L);
  lua_pushcfunction(L, traceback);
  int rc = is_code ? luaL_loadbuffer(L, file_or_code, strlen(file_or_code), "=(code)")
                   : luaL_loadfile(L, file_or_code);
  if (rc == LUA_OK) rc = lua_pcall(L, 0, nresults, top + 1);
  if (rc != LUA_OK) {
    take_error(L, ctx, rc == LUA_ERRMEM ? RM_ERR_OOM : RM_ERR_RUNTIME, NULL);
    lua_settop(L, top);
    return ctx->err_code;
  }
  lua_remove(L, top + 1); /* the message handler; the results stay */
  return RM_OK;
}

/* slice_body(stepper, budget_ms) -> steps, units, total, ms, loss, done */
static int slice_body(lua_State *L) {
  if (!lua_istable(L, 1)) return luaL_error(L, "the value is a %s, not a remat.train stepper", luaL_typename(L, 1));
  if (lua_getfield(L, 1, "run_for") != LUA_TFUNCTION)
    return luaL_error(L, "the table has no run_for method: not a remat.train stepper");
  lua_pushvalue(L, 1);
  lua_pushvalue(L, 2);
  lua_call(L, 2, 1);
  if (!lua_istable(L, -1)) return luaL_error(L, "run_for returned a %s, not a report table", luaL_typename(L, -1));
  int rep = lua_gettop(L);
  static const char *const fields[] = { "steps", "units", "total", "ms", "loss", "done" };
  for (int i = 0; i < 6; i++) lua_getfield(L, rep, fields[i]);
  return 6;
}

int rm_lua_slice(lua_State *L, rm_ctx *ctx, int idx, double budget_ms, rm_slice *out) {
  if (out) memset(out, 0, sizeof *out);
  if (out) out->loss = NAN;
  if (!L || !ctx) {
    if (ctx) return rm_fail(ctx, RM_ERR_ARG, "rm_lua_slice: NULL state");
    return RM_ERR_ARG;
  }
  if (!(budget_ms >= 0)) return rm_fail(ctx, RM_ERR_ARG, "rm_lua_slice: budget_ms must be >= 0, got %g", budget_ms);
  idx = lua_absindex(L, idx);
  int top = lua_gettop(L);
  if (idx < 1 || idx > top) return rm_fail(ctx, RM_ERR_ARG, "rm_lua_slice: no value at stack index %d", idx);
  lua_pushcfunction(L, traceback);
  lua_pushcfunction(L, slice_body);
  lua_pushvalue(L, idx);
  lua_pushnumber(L, budget_ms);
  int rc = lua_pcall(L, 2, 6, top + 1);
  if (rc != LUA_OK) {
    take_error(L, ctx, rc == LUA_ERRMEM ? RM_ERR_OOM : RM_ERR_RUNTIME, "training slice");
    lua_settop(L, top);
    return ctx->err_code;
  }
  if (out) {
    out->steps = (int)lua_tointeger(L, top + 2);
    out->units = (int)lua_tointeger(L, top + 3);
    out->total = (int64_t)lua_tointeger(L, top + 4);
    out->ms = (double)lua_tonumber(L, top + 5);
    out->loss = lua_isnumber(L, top + 6) ? (double)lua_tonumber(L, top + 6) : NAN;
    out->done = lua_toboolean(L, top + 7);
  }
  lua_settop(L, top);
  return RM_OK;
}

/* A host allocator over a lua_State's own lua_Alloc (looked up at each call, as Lua
 * does), so that a context made by luaopen_remat takes its memory where the host told
 * the state to: ud is the main thread of the state. */
static void *lalloc_alloc(void *ud, size_t n) {
  void *aud;
  lua_Alloc f = lua_getallocf(ud, &aud);
  return f(aud, NULL, 0, n);
}

static void *lalloc_realloc(void *ud, void *p, size_t old_n, size_t new_n) {
  void *aud;
  lua_Alloc f = lua_getallocf(ud, &aud);
  return f(aud, p, p ? old_n : 0, new_n);
}

static void lalloc_free(void *ud, void *p, size_t n) {
  void *aud;
  lua_Alloc f = lua_getallocf(ud, &aud);
  f(aud, p, n, 0);
}

rm_host_alloc rm_lua_host_alloc(lua_State *L) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  lua_State *main = lua_tothread(L, -1);
  lua_pop(L, 1);
  rm_host_alloc a = { lalloc_alloc, lalloc_realloc, lalloc_free, main };
  return a;
}

/* C.log(level, msg): the host's log callback (silent when it has none). */
static int l_log(lua_State *L) {
  lua_Integer level = luaL_checkinteger(L, 1);
  const char *msg = luaL_checkstring(L, 2);
  rm_log(rm_lua_ctx(L), (int)level, "%s", msg);
  return 0;
}

/* C.has_log() -> whether the context has a log callback */
static int l_has_log(lua_State *L) {
  lua_pushboolean(L, rm_lua_ctx(L)->log != NULL);
  return 1;
}

/* __gc of a sentinel made when remat opens into a state: when the state closes, a
 * context that outlives it must not keep the state as its collect-and-retry hook
 * (another state, or the host through C, may use the context afterwards). The
 * context is looked up again: a state-owned one may already be gone. */
static int sentinel_gc(lua_State *L) {
  lua_State *self = *(lua_State **)lua_touserdata(L, 1);
  rm_ctx *ctx = rm_lua_context(L);
  if (ctx && ctx->reclaim_ud == (void *)self) {
    ctx->reclaim = NULL;
    ctx->reclaim_ud = NULL;
  }
  return 0;
}

static const luaL_Reg fns[] = {
  { "log", l_log },
  { "has_log", l_has_log },
  { NULL, NULL },
};

void rm_lua_open_host(lua_State *L) {
  luaL_setfuncs(L, fns, 0);
  lua_State **pp = lua_newuserdatauv(L, sizeof *pp, 0);
  *pp = L; /* the state rm_lua_open made the context's reclaim hook */
  lua_newtable(L);
  lua_pushcfunction(L, sentinel_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  luaL_ref(L, LUA_REGISTRYINDEX);
}
