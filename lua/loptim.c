/* Optimizer support in the binding: running an op's kernel into existing tensors
 * (rm_op_into: the fused sgd_step / adamw_step updates, in-place gradient scaling).
 * remat.optim (Lua) builds the
 * optimizers on these. */
#include <stdio.h>
#include <string.h>

#include "lnn.h"

/* Reads the list of tensors at idx into t[] (at most max); returns how many. `what`
 * names the list. */
static int read_list(lua_State *L, int idx, rm_tensor **t, int max, const char *fn, const char *what) {
  if (!lua_istable(L, idx))
    rm_lua_errorf(L, "%s: %s must be a list of tensors, got %s", fn, what, luaL_typename(L, idx));
  int n = (int)luaL_len(L, idx);
  if (n > max) rm_lua_errorf(L, "%s: at most %d %s (got %d)", fn, max, what, n);
  for (int k = 0; k < n; k++) {
    lua_rawgeti(L, idx, k + 1);
    rm_ltensor *b = luaL_testudata(L, -1, RM_TENSOR_MT);
    if (!b) rm_lua_errorf(L, "%s: %s %d: expected a tensor, got %s", fn, what, k + 1, luaL_typename(L, -1));
    if (!b->t) rm_lua_errorf(L, "%s: %s %d: the tensor was freed", fn, what, k + 1);
    t[k] = b->t;
    lua_pop(L, 1);
  }
  return n;
}

/* C.op_into(id, attrs, {inputs...}, {outputs...}): runs op's kernel writing into the
 * given output tensors (no allocation, no tape; outputs may alias inputs where the op
 * allows it; an op that writes its inputs, adamw_multi_step, takes {} as outputs).
 * Returns nothing; raises the op's error, named, on failure. */
static int l_op_into(lua_State *L) {
  rm_op_id op = rm_lua_check_op(L, 1, "op_into");
  char fn[64];
  snprintf(fn, sizeof fn, "remat.%s", rm_op_name(op));
  rm_attrs a;
  rm_lua_read_attrs(L, 2, op, &a, fn);
  rm_tensor *in[RM_MAX_INPUTS], *out[RM_MAX_OUTPUTS];
  int nin = read_list(L, 3, in, RM_MAX_INPUTS, fn, "inputs");
  int nout = read_list(L, 4, out, RM_MAX_OUTPUTS, fn, "outputs");
  if (nout < 1 && !(rm_op_def_get(op)->flags & RM_OPF_INPLACE))
    return rm_lua_errorf(L, "%s: op_into needs at least one output", fn);
  rm_ctx *ctx = rm_lua_ctx(L);
  if (rm_op_into(ctx, op, nin, in, &a, nout, out) != RM_OK) return rm_lua_fail(L, fn);
  return 0;
}

/* C.tensor_id(t) -> a light userdata naming t's underlying tensor: two handles on the
 * same parameter give the same id (optimizer state is keyed by it). */
static int l_tensor_id(lua_State *L) {
  lua_pushlightuserdata(L, rm_lua_check_tensor(L, 1, "tensor_id"));
  return 1;
}

/* ---- optimizers fused into backward ----
 * One subscriber per context to RM_HOOK_GRAD_READY calls a Lua dispatcher (remat.optim's)
 * with the leaf whose gradient just became final and whether this is a planning dry run;
 * the dispatcher updates the parameter and frees its gradient when a fused optimizer
 * owns it. */
typedef struct fused_hook {
  rm_ctx *ctx;
  lua_State *main;
  int fn_ref;                                       /* the dispatcher */
  bool hooked;
} fused_hook;

static const char FUSED_KEY = 'f';

static int on_grad_ready(rm_ctx *ctx, const rm_event *ev, void *ud) {
  fused_hook *h = ud;
  rm_tensor *leaf = ev->tensor;
  lua_State *L = rm_lua_nn_current(h->main);
  if (!L) L = h->main;
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->fn_ref);
  lua_pushlightuserdata(L, leaf);
  lua_pushboolean(L, ctx->dry);
  if (lua_pcall(L, 2, 0, 0) != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    rm_fail(ctx, RM_ERR_RUNTIME, "%s", msg ? msg : "the fused optimizer failed");
    lua_pop(L, 1);
    return RM_ERR_RUNTIME;
  }
  return RM_OK;
}

static int fused_gc(lua_State *L) {
  fused_hook *h = lua_touserdata(L, 1);
  if (h->hooked) rm_hook_remove(h->ctx, RM_HOOK_GRAD_READY, on_grad_ready, h);
  h->hooked = false;
  return 0;
}

/* C.fused_hook(dispatcher): installs the hook for this state's context (once; a later
 * call replaces the dispatcher). */
static int l_fused_hook(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  rm_ctx *ctx = rm_lua_ctx(L);
  fused_hook *h;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &FUSED_KEY) == LUA_TUSERDATA &&
      ((fused_hook *)lua_touserdata(L, -1))->ctx == ctx) {
    h = lua_touserdata(L, -1);
    luaL_unref(L, LUA_REGISTRYINDEX, h->fn_ref);
  } else {
    h = lua_newuserdatauv(L, sizeof *h, 0);
    memset(h, 0, sizeof *h);
    lua_newtable(L);
    lua_pushcfunction(L, fused_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    h->ctx = ctx;
    lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
    h->main = lua_tothread(L, -1);
    lua_pop(L, 1);
    if (rm_hook_add(ctx, RM_HOOK_GRAD_READY, on_grad_ready, h) != RM_OK) return rm_lua_fail(L, "optim");
    h->hooked = true;
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &FUSED_KEY);
  }
  lua_pushvalue(L, 1);
  h->fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return 0;
}

static const luaL_Reg fns[] = {
  { "fused_hook", l_fused_hook },
  { "op_into", l_op_into },
  { "tensor_id", l_tensor_id },
  { NULL, NULL },
};

void rm_lua_open_optim(lua_State *L) { luaL_setfuncs(L, fns, 0); }
