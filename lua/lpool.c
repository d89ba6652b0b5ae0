/* The caching block pool (core/blockpool.h), exposed for its specs: the CUDA backend
 * carves device memory with it, and this binding drives the same code over a fake
 * address space on the CPU, with a segment limit to exercise the out-of-memory path.
 * C.pool_new(limit) -> pool; pool:alloc(bytes) -> address | nil; pool:free(address)
 * -> bool; pool:trim(bytes) -> bytes given back; pool:stats() -> table;
 * pool:check() -> nil | what is wrong. */
#include <stdint.h>

#include "lremat.h"
#include "../core/blockpool.h"
#include "../core/ctx.h"

#define POOL_MT "remat.pool"

typedef struct lpool {
  rm_pool pool;
  rm_ctx *ctx;
  uint64_t next;      /* the fake address space: segments are never reused */
  size_t limit, held; /* segment bytes allowed and taken */
  bool open;
} lpool;

static void *seg_alloc(void *ud, size_t n) {
  lpool *lp = ud;
  if (n > lp->limit - lp->held) return NULL;
  lp->held += n;
  void *p = (void *)(uintptr_t)lp->next;
  lp->next += n + RM_POOL_ALIGN; /* a gap: a block running past its segment shows */
  return p;
}

static void seg_free(void *ud, void *p, size_t n) {
  lpool *lp = ud;
  lp->held -= n;
}

static void *host_alloc(void *ud, size_t n) {
  lpool *lp = ud;
  return lp->ctx->host.alloc(lp->ctx->host.ud, n);
}

static void host_free(void *ud, void *p, size_t n) {
  lpool *lp = ud;
  lp->ctx->host.free(lp->ctx->host.ud, p, n);
}

static lpool *check_pool(lua_State *L) {
  lpool *lp = luaL_checkudata(L, 1, POOL_MT);
  if (!lp->open) luaL_error(L, "pool: used after it was closed");
  return lp;
}

static int pool_new(lua_State *L) {
  lua_Integer limit = luaL_checkinteger(L, 1);
  luaL_argcheck(L, limit >= 0, 1, "limit must be >= 0");
  lpool *lp = lua_newuserdatauv(L, sizeof *lp, 0);
  lp->ctx = rm_lua_ctx(L);
  lp->next = (uint64_t)1 << 40;
  lp->limit = (size_t)limit;
  lp->held = 0;
  rm_pool_cfg cfg = {seg_alloc, seg_free, host_alloc, host_free, lp};
  rm_pool_init(&lp->pool, &cfg);
  lp->open = true;
  luaL_setmetatable(L, POOL_MT);
  return 1;
}

static int pool_alloc(lua_State *L) {
  lpool *lp = check_pool(L);
  lua_Integer n = luaL_checkinteger(L, 2);
  luaL_argcheck(L, n >= 0, 2, "bytes must be >= 0");
  void *p = rm_pool_alloc(&lp->pool, (size_t)n);
  if (p) lua_pushinteger(L, (lua_Integer)(uintptr_t)p);
  else lua_pushnil(L);
  return 1;
}

static int pool_free(lua_State *L) {
  lpool *lp = check_pool(L);
  lua_pushboolean(L, rm_pool_free(&lp->pool, (void *)(uintptr_t)luaL_checkinteger(L, 2)));
  return 1;
}

static int pool_trim(lua_State *L) {
  lpool *lp = check_pool(L);
  lua_Integer want = luaL_optinteger(L, 2, -1);
  lua_pushinteger(L, (lua_Integer)rm_pool_trim(&lp->pool, want < 0 ? SIZE_MAX : (size_t)want));
  return 1;
}

static int pool_stats(lua_State *L) {
  lpool *lp = check_pool(L);
  rm_pool_stats s;
  rm_pool_stats_get(&lp->pool, &s);
  lua_createtable(L, 0, 8);
#define FIELD(name) (lua_pushinteger(L, (lua_Integer)s.name), lua_setfield(L, -2, #name))
  FIELD(reserved);
  FIELD(free_bytes);
  FIELD(live_bytes);
  FIELD(segments);
  FIELD(live_blocks);
  FIELD(free_blocks);
  FIELD(largest_free);
#undef FIELD
  lua_pushinteger(L, (lua_Integer)lp->held);
  lua_setfield(L, -2, "backend_held");
  return 1;
}

static int pool_check(lua_State *L) {
  lpool *lp = check_pool(L);
  const char *why = rm_pool_check(&lp->pool);
  if (why) lua_pushstring(L, why);
  else lua_pushnil(L);
  return 1;
}

static int pool_gc(lua_State *L) {
  lpool *lp = luaL_checkudata(L, 1, POOL_MT);
  if (lp->open) rm_pool_destroy(&lp->pool);
  lp->open = false;
  return 0;
}

void rm_lua_open_pool(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"alloc", pool_alloc}, {"free", pool_free},   {"trim", pool_trim},
      {"stats", pool_stats}, {"check", pool_check}, {"close", pool_gc},
      {NULL, NULL}};
  if (luaL_newmetatable(L, POOL_MT)) {
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, pool_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, pool_gc);
    lua_setfield(L, -2, "__close");
  }
  lua_pop(L, 1);
  lua_pushcfunction(L, pool_new);
  lua_setfield(L, -2, "pool_new");
}
