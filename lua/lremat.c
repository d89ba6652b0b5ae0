/* Opening remat into a lua_State: the context binding, errors located at the user's
 * line, the collect-and-retry hook, and the embedded Lua library. */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <lualib.h>

#include "lremat.h"

extern const char *const rm_lua_sources[][2];

static const char CTX_KEY = 'c';    /* registry: light userdata of the rm_ctx */
static const char OWNER_KEY = 'o';  /* registry: userdata that frees an owned ctx */

rm_ctx *rm_lua_ctx(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &CTX_KEY);
  rm_ctx *ctx = lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (!ctx) luaL_error(L, "remat is not open in this Lua state");
  return ctx;
}

/* Finds the first caller outside remat's own code and pushes "file:line: ". */
static void push_where(lua_State *L) {
  lua_Debug ar;
  for (int level = 1; lua_getstack(L, level, &ar); level++) {
    lua_getinfo(L, "Sl", &ar);
    if (ar.currentline <= 0) continue;
    if (!strncmp(ar.source, "=[remat]", 8)) continue;
    lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.currentline);
    return;
  }
  lua_pushliteral(L, "");
}

int rm_lua_errorf(lua_State *L, const char *fmt, ...) {
  va_list ap;
  push_where(L);
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_concat(L, 2);
  return lua_error(L);
}

int rm_lua_fail(lua_State *L, const char *fn) {
  rm_ctx *ctx = rm_lua_ctx(L);
  const char *msg = rm_errmsg(ctx);
  /* avoid "remat.add: add: ..." when the core message already names the op */
  const char *dot = strrchr(fn, '.');
  const char *base = dot ? dot + 1 : fn;
  size_t bn = strlen(base);
  if (!strncmp(msg, base, bn) && msg[bn] == ':') msg += bn + 2;
  return rm_lua_errorf(L, "%s: %s", fn, msg[0] ? msg : "failed");
}

static bool in_finalizer_guard(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, "remat.no_reclaim");
  bool busy = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return busy;
}

/* Before an allocation fails for lack of memory: a full collection, then retry. */
static bool reclaim(void *ud) {
  lua_State *L = ud;
  if (in_finalizer_guard(L)) return false;
  lua_pushboolean(L, 1);
  lua_setfield(L, LUA_REGISTRYINDEX, "remat.no_reclaim");
  lua_gc(L, LUA_GCCOLLECT);
  lua_gc(L, LUA_GCCOLLECT);
  lua_pushnil(L);
  lua_setfield(L, LUA_REGISTRYINDEX, "remat.no_reclaim");
  return true;
}

static int owner_gc(lua_State *L) {
  rm_ctx **pp = lua_touserdata(L, 1);
  if (*pp) {
    /* The owner is created first and finalised last; drop the binding (when it is
     * still ours) so nothing reaches the dead context. */
    lua_rawgetp(L, LUA_REGISTRYINDEX, &CTX_KEY);
    bool ours = lua_touserdata(L, -1) == *pp;
    lua_pop(L, 1);
    if (ours) {
      lua_pushnil(L);
      lua_rawsetp(L, LUA_REGISTRYINDEX, &CTX_KEY);
    }
    rm_ctx_free(*pp);
    *pp = NULL;
  }
  return 0;
}

static void install_preload(lua_State *L) {
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  for (int i = 0; rm_lua_sources[i][0]; i++) {
    char chunk[128];
    snprintf(chunk, sizeof chunk, "=[remat]/%s", rm_lua_sources[i][0] + 6);
    if (luaL_loadbuffer(L, rm_lua_sources[i][1], strlen(rm_lua_sources[i][1]), chunk) != LUA_OK)
      lua_error(L);
    lua_setfield(L, -2, rm_lua_sources[i][0]);
  }
  lua_pop(L, 1);
}

/* Builds the module table on top of L (protected: called through lua_pcall). */
static int open_module(lua_State *L) {
  rm_ctx *ctx = lua_touserdata(L, 1);
  lua_pushlightuserdata(L, ctx);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &CTX_KEY);
  ctx->reclaim = reclaim;
  ctx->reclaim_ud = L;
  install_preload(L);
  lua_newtable(L); /* the module */
  lua_newtable(L); /* remat._C: the C functions */
  rm_lua_open_tensor(L);
  rm_lua_open_index(L);
  rm_lua_open_nn(L);
  rm_lua_open_io(L);
  rm_lua_open_autograd(L);
  rm_lua_open_plan(L);
  rm_lua_open_host(L);
  rm_lua_open_optim(L);
  rm_lua_open_dist(L);
  rm_lua_open_pool(L);
  lua_setfield(L, -2, "_C");
  lua_pushliteral(L, REMAT_VERSION);
  lua_setfield(L, -2, "version");
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  lua_pushvalue(L, -2);
  lua_setfield(L, -2, "remat");
  lua_pop(L, 1);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "remat.init");
  lua_call(L, 1, 0);
  return 1;
}

/* Opens remat into L bound to ctx (luaopen_remat also reopens a state's own context). */
static int open_into(lua_State *L, rm_ctx *ctx) {
  lua_pushcfunction(L, open_module);
  lua_pushlightuserdata(L, ctx);
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
    rm_fail(ctx, RM_ERR_RUNTIME, "opening remat: %s", lua_tostring(L, -1));
    lua_pop(L, 1);
    return RM_ERR_RUNTIME;
  }
  return RM_OK;
}

/* remat.so is built for Lua 5.4 and links liblua5.4, whose symbols are versioned: its
 * calls always reach liblua5.4. Loaded by another Lua (Debian's lua5.1, LuaJIT: busted
 * runs under whatever `lua` is), they would act on that Lua's state and crash. That
 * Lua's own lua_pushstring is then the process's first, unversioned one; returns it
 * (NULL when it is ours, or none is visible, as in a host that links Lua privately). */
typedef void (*any_pushstring)(lua_State *L, const char *s);
typedef int (*any_error)(lua_State *L);

static void *foreign_lua(Dl_info *who) {
  void *first = dlsym(RTLD_DEFAULT, "lua_pushstring");
  Dl_info ours;
  if (!first || !dladdr(first, who) || !dladdr((void *)lua_pushstring, &ours)) return NULL;
  return who->dli_fbase == ours.dli_fbase ? NULL : first;
}

/* The log of a context remat makes for itself (stock lua5.4, the remat command): a
 * script's remat.log lines go to stderr. A host passes its own context to rm_lua_open,
 * or replaces this one with rm_set_log(rm_lua_context(L), ...). */
static void stderr_log(void *ud, int level, const char *msg) {
  static const char *const names[] = { "info", "warn", "error" };
  fprintf(stderr, "[remat %s] %s\n", level >= 0 && level <= 2 ? names[level] : "log", msg);
}

int rm_lua_open(lua_State *L, rm_ctx *ctx) {
  if (!L || !ctx) {
    if (ctx) return rm_fail(ctx, RM_ERR_ARG, "rm_lua_open: NULL lua_State");
    return RM_ERR_ARG;
  }
  /* one context per state: a second open would rebind the state's tensors and modules */
  lua_rawgetp(L, LUA_REGISTRYINDEX, &CTX_KEY);
  bool bound = lua_touserdata(L, -1) != NULL;
  lua_pop(L, 1);
  if (bound)
    return rm_fail(ctx, RM_ERR_STATE, "rm_lua_open: remat is already open in this lua_State "
                   "(use require \"remat\" or rm_lua_context to reach it)");
  return open_into(L, ctx);
}

int luaopen_remat(lua_State *L) {
  Dl_info who;
  void *push = foreign_lua(&who);
  void *raise = push ? dlsym(RTLD_DEFAULT, "lua_error") : NULL;
  if (push && raise) {
    /* the calling Lua's own functions: lua_pushstring and lua_error exist in every Lua */
    char msg[512];
    snprintf(msg, sizeof msg, "remat: this module was built for %s but was loaded by another Lua (%s); "
             "run it with lua5.4 (busted: lua5.4 \"$(command -v busted)\")", LUA_RELEASE,
             who.dli_fname ? who.dli_fname : "?");
    ((any_pushstring)push)(L, msg);
    return ((any_error)raise)(L);
  }
  /* A second require in the same state (busted insulates each spec file by clearing
   * package.loaded) reuses the context, so tensors made before stay valid. */
  lua_rawgetp(L, LUA_REGISTRYINDEX, &CTX_KEY);
  rm_ctx *ctx = lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (!ctx) {
    rm_ctx **pp = lua_newuserdatauv(L, sizeof *pp, 0);
    *pp = NULL;
    lua_newtable(L);
    lua_pushcfunction(L, owner_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &OWNER_KEY);
    rm_host_alloc a = rm_lua_host_alloc(L); /* the context's memory: L's lua_Alloc */
    *pp = ctx = rm_ctx_new(&a, stderr_log, NULL);
    if (!ctx) return luaL_error(L, "remat: cannot create a context (out of memory)");
  }
  if (open_into(L, ctx) != RM_OK) return luaL_error(L, "%s", rm_errmsg(ctx));
  return 1;
}

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  luaL_traceback(L, L, msg, 1);
  return 1;
}

int rm_lua_run(lua_State *L, rm_ctx *ctx, const char *file_or_code, int is_code) {
  if (!L || !ctx || !file_or_code) {
    if (ctx) return rm_fail(ctx, RM_ERR_ARG, "rm_lua_run: NULL state or source");
    return RM_ERR_ARG;
  }
  int top = lua_gettop(L);
  lua_pushcfunction(L, traceback);
  int rc = is_code ? luaL_loadbuffer(L, file_or_code, strlen(file_or_code), "=(code)")
                   : luaL_loadfile(L, file_or_code);
  if (rc == LUA_OK) rc = lua_pcall(L, 0, 0, top + 1);
  if (rc != LUA_OK) {
    rm_fail(ctx, RM_ERR_RUNTIME, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "error");
    lua_settop(L, top);
    return RM_ERR_RUNTIME;
  }
  lua_settop(L, top);
  return RM_OK;
}
