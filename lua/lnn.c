/* Modules in Lua: the "remat.Module" userdata over core modules (built-in layers,
 * Sequential, and Lua-defined modules whose forward the core calls back through the
 * foreign hook), constructors, and the C side of the nn library (lua/remat/nn.lua).
 *
 * Each module userdata holds one reference on its rm_module and has a fields table
 * (its user value) for what Lua code stores on it. A weak cache maps each rm_module to
 * its live userdata, so model[1] == model[1]. A Lua-defined module keeps its fields
 * table (where its forward function lives) in the registry for as long as the core
 * module lives, so a new userdata made for it later sees the same fields. */
#include <string.h>

#include "lnn.h"

static const char STATE_KEY = 's';  /* registry: the nn_state userdata */
static const char CACHE_KEY = 'm';  /* registry: weak table rm_module* -> userdata */

/* Per lua_State binding state shared by every Lua-defined module. */
typedef struct nn_state {
  lua_State *main;   /* main thread: registry work when no call is in progress */
  lua_State *cur;    /* thread running the current forward (NULL: none) */
  int err_ref;       /* registry ref of the error raised by a Lua module (LUA_NOREF) */
  bool no_step_collect; /* remat.memory.step_collect(false): no collection per step */
} nn_state;

typedef struct lmodule {
  rm_module *m;
  rm_ctx *ctx;       /* the context m lives in (remat may be reopened in the same state) */
} lmodule;

/* What a Lua-defined module's foreign hook needs. */
typedef struct lforeign {
  nn_state *st;
  int fields_ref;    /* registry ref of its fields table */
} lforeign;

static nn_state *get_state(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &STATE_KEY);
  nn_state *st = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return st;
}

/* ---- module userdata ---- */

rm_module *rm_lua_check_module(lua_State *L, int idx, const char *fn) {
  lmodule *b = luaL_testudata(L, idx, RM_MODULE_MT);
  if (!b || !b->m) {
    if (lua_isnoneornil(L, idx)) rm_lua_errorf(L, "%s: argument %d: expected a module, got nothing", fn, idx);
    rm_lua_errorf(L, "%s: argument %d: expected a module, got %s", fn, idx, luaL_typename(L, idx));
  }
  return b->m;
}

void rm_lua_push_module(lua_State *L, rm_module *m) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &CACHE_KEY);
  if (lua_rawgetp(L, -1, m) == LUA_TUSERDATA) {
    lua_remove(L, -2);
    return;
  }
  lua_pop(L, 1);
  lmodule *b = lua_newuserdatauv(L, sizeof *b, 1);
  b->m = NULL;
  b->ctx = rm_lua_ctx(L);
  luaL_setmetatable(L, RM_MODULE_MT);
  if (m->type == &rm_type_foreign && m->foreign_ud) {
    lforeign *f = m->foreign_ud;
    lua_rawgeti(L, LUA_REGISTRYINDEX, f->fields_ref);
  } else {
    lua_newtable(L);
  }
  lua_setiuservalue(L, -2, 1);
  rm_module_retain(m);
  b->m = m;
  lua_pushvalue(L, -1);
  lua_rawsetp(L, -3, m);
  lua_remove(L, -2);
}

/* Pushes a new module (taking over the creation reference) or raises the ctx error. */
static int push_new(lua_State *L, rm_module *m, const char *fn) {
  if (!m) return rm_lua_fail(L, fn);
  rm_lua_push_module(L, m);
  rm_module_release(rm_lua_ctx(L), m);
  return 1;
}

static int m_gc(lua_State *L) {
  lmodule *b = luaL_testudata(L, 1, RM_MODULE_MT);
  if (b && b->m) {
    rm_module *m = b->m;
    b->m = NULL;
    rm_module_release(b->ctx, m);
  }
  return 0;
}

/* ---- forward, and Lua-defined modules called from the core ---- */

lua_State *rm_lua_nn_enter(lua_State *L) {
  nn_state *st = get_state(L);
  lua_State *prev = st->cur;
  st->cur = L;
  if (st->err_ref != LUA_NOREF) {
    luaL_unref(L, LUA_REGISTRYINDEX, st->err_ref);
    st->err_ref = LUA_NOREF;
  }
  return prev;
}

void rm_lua_nn_leave(lua_State *L, lua_State *prev) { get_state(L)->cur = prev; }

lua_State *rm_lua_nn_current(lua_State *L) { return get_state(L)->cur; }

int rm_lua_nn_fail(lua_State *L, const char *fn) {
  nn_state *st = get_state(L);
  if (st->err_ref != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, st->err_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, st->err_ref);
    st->err_ref = LUA_NOREF;
    rm_clear_error(rm_lua_ctx(L));
    return lua_error(L);
  }
  return rm_lua_fail(L, fn);
}

rm_tensor *rm_lua_module_forward(lua_State *L, rm_module *m, rm_tensor *x, const char *fn) {
  rm_ctx *ctx = rm_lua_ctx(L);
  lua_State *prev = rm_lua_nn_enter(L);
  rm_tensor *y = NULL;
  int rc = rm_module_forward(ctx, m, x, &y);
  rm_lua_nn_leave(L, prev);
  if (rc) rm_lua_nn_fail(L, fn);
  return y;
}

/* Protected part of a foreign call: self:forward-function(x) -> *out (a new hold).
 * Args: lightuserdata module, input tensor, out slot, context. */
static int foreign_call(lua_State *L) {
  rm_module *m = lua_touserdata(L, 1);
  rm_tensor *x = lua_touserdata(L, 2);
  rm_tensor **out = lua_touserdata(L, 3);
  rm_ctx *ctx = lua_touserdata(L, 4);
  lua_settop(L, 3);
  rm_lua_push_module(L, m);                 /* 4: self */
  lua_getiuservalue(L, 4, 1);               /* 5: fields */
  if (lua_getfield(L, 5, "forward") != LUA_TFUNCTION)
    return luaL_error(L, "Lua module: 'forward' is %s, not a function", luaL_typename(L, -1));
  lua_pushvalue(L, 4);
  rm_tensor_hold(x);
  rm_lua_push_tensor(L, x, "forward");
  lua_pushvalue(L, -1);
  lua_insert(L, 6);                         /* 6: the input's userdata, kept to free it */
  lua_call(L, 2, 1);
  rm_tensor *y = rm_lua_test_tensor(L, -1);
  if (!y) {
    if (luaL_testudata(L, -1, RM_TENSOR_MT))
      return luaL_error(L, "Lua module: forward returned a freed tensor");
    return luaL_error(L, "Lua module: forward must return a tensor, got %s", luaL_typename(L, -1));
  }
  rm_tensor_hold(y);
  *out = y;
  /* The input belongs to the caller (the Sequential loop frees it when its last use
   * has passed): the Lua handle must not keep its data alive until the next GC. */
  rm_ltensor *xb = lua_touserdata(L, 6);
  if (xb->t) {
    rm_tensor *t = xb->t;
    xb->t = NULL;
    rm_tensor_drop(ctx, t);
  }
  return 0;
}

/* The foreign hook: runs the Lua forward on the thread that called into the core,
 * turning any Lua error into a status (never a longjmp through core frames). */
static int foreign_forward(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y, void *ud) {
  lforeign *f = ud;
  nn_state *st = f->st;
  lua_State *L = st->cur ? st->cur : st->main;
  if (!lua_checkstack(L, 8)) return rm_fail(ctx, RM_ERR_RUNTIME, "Lua module: Lua stack overflow");
  int top = lua_gettop(L);
  lua_pushcfunction(L, foreign_call);
  lua_pushlightuserdata(L, m);
  lua_pushlightuserdata(L, x);
  lua_pushlightuserdata(L, y);
  lua_pushlightuserdata(L, ctx);
  int rc = lua_pcall(L, 4, 0, 0);
  if (rc == LUA_OK) {
    lua_settop(L, top);
    return RM_OK;
  }
  if (*y) rm_tensor_drop(ctx, *y), *y = NULL;
  const char *msg = lua_tostring(L, -1);
  rm_fail(ctx, RM_ERR_RUNTIME, "%s", msg ? msg : "error in a Lua module (not a string)");
  /* keep the original error value so the binding re-raises it unchanged */
  if (st->err_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, st->err_ref);
  st->err_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_settop(L, top);
  return RM_ERR_RUNTIME;
}

static void foreign_free(rm_ctx *ctx, void *ud) {
  lforeign *f = ud;
  luaL_unref(f->st->cur ? f->st->cur : f->st->main, LUA_REGISTRYINDEX, f->fields_ref);
  rm_host_free(ctx, f, sizeof *f);
}

/* C.nn_module(fields) -> a Lua-defined module whose fields table is `fields` */
static int l_nn_module(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  rm_ctx *ctx = rm_lua_ctx(L);
  lforeign *f = rm_host_malloc(ctx, sizeof *f);
  if (!f) return rm_lua_errorf(L, "nn.module: out of host memory");
  f->st = get_state(L);
  lua_pushvalue(L, 1);
  f->fields_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  rm_module *m = rm_foreign_new(ctx, foreign_forward, f, foreign_free);
  if (!m) {
    luaL_unref(L, LUA_REGISTRYINDEX, f->fields_ref);
    rm_host_free(ctx, f, sizeof *f);
    return rm_lua_fail(L, "nn.module");
  }
  return push_new(L, m, "nn.module");
}

/* ---- constructors ---- */

static int64_t check_size(lua_State *L, int idx, const char *fn, const char *what) {
  int ok;
  lua_Integer v = lua_tointegerx(L, idx, &ok);
  if (!ok) {
    if (lua_isnoneornil(L, idx)) rm_lua_errorf(L, "%s: %s is missing", fn, what);
    rm_lua_errorf(L, "%s: %s must be an integer, got %s", fn, what,
                  lua_type(L, idx) == LUA_TNUMBER ? "a fraction" : luaL_typename(L, idx));
  }
  if (v < 1) rm_lua_errorf(L, "%s: %s must be >= 1 (got %d)", fn, what, (int)v);
  return v;
}

static double opt_num(lua_State *L, int idx, double def, const char *fn, const char *what) {
  if (lua_isnoneornil(L, idx)) return def;
  if (!lua_isnumber(L, idx)) rm_lua_errorf(L, "%s: %s must be a number, got %s", fn, what, luaL_typename(L, idx));
  return lua_tonumber(L, idx);
}

static bool opt_bool(lua_State *L, int idx, bool def, const char *fn, const char *what) {
  if (lua_isnoneornil(L, idx)) return def;
  if (!lua_isboolean(L, idx)) rm_lua_errorf(L, "%s: %s must be a boolean, got %s", fn, what, luaL_typename(L, idx));
  return lua_toboolean(L, idx);
}

/* The options table of CausalSelfAttention / TransformerBlock at idx ({fused = bool}):
 * the attention path it asks for, or -1 (nil: automatic). `known` lists the keys the
 * table may have. Read before the module is made, so that its errors leak nothing. */
static int attention_path_opt(lua_State *L, int idx, const char *fn, const char *known) {
  if (lua_isnoneornil(L, idx)) return -1;
  if (!lua_istable(L, idx)) rm_lua_errorf(L, "%s: options must be a table, got %s", fn, luaL_typename(L, idx));
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    if (!k || (strcmp(k, "fused") && !(strcmp(k, "approximate") == 0 && strstr(known, "approximate"))))
      rm_lua_errorf(L, "%s: unknown option '%s' (known: %s)", fn, luaL_tolstring(L, -1, NULL), known);
  }
  lua_getfield(L, idx, "fused");
  int path = -1;
  if (!lua_isnil(L, -1)) {
    if (!lua_isboolean(L, -1)) rm_lua_errorf(L, "%s: fused must be a boolean, got %s", fn, luaL_typename(L, -1));
    path = lua_toboolean(L, -1) ? RM_ATT_FUSED : RM_ATT_COMPOSED;
  }
  lua_pop(L, 1);
  return path;
}

/* The GELU variant a table at idx asks for through its `key` field: nil or "none" the
 * exact (erf) GELU, "tanh" the tanh approximation (PyTorch's spellings). */
static bool gelu_tanh_opt(lua_State *L, int idx, const char *fn, const char *key) {
  if (lua_isnoneornil(L, idx)) return false;
  lua_getfield(L, idx, key);
  bool tanh = false;
  if (!lua_isnil(L, -1)) {
    const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    if (v && !strcmp(v, "tanh")) tanh = true;
    else if (!v || strcmp(v, "none"))
      rm_lua_errorf(L, "%s: %s must be 'none' (the exact GELU) or 'tanh', got %s", fn, key,
                    luaL_tolstring(L, -1, NULL));
  }
  lua_pop(L, 1);
  return tanh;
}

/* Checks that the table at idx has only the keys in known (a list, NULL-ended). */
static void only_keys(lua_State *L, int idx, const char *fn, const char *const *known, const char *list) {
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    bool ok = false;
    for (int i = 0; known[i] && !ok; i++)
      ok = lua_type(L, -1) == LUA_TSTRING && !strcmp(lua_tostring(L, -1), known[i]);
    if (!ok) rm_lua_errorf(L, "%s: unknown option '%s' (known: %s)", fn, luaL_tolstring(L, -1, NULL), list);
  }
}

/* Gives m the gelu_tanh activation when gelu_tanh; on error releases m and returns NULL. */
static rm_module *with_activation(rm_ctx *ctx, rm_module *m, bool gelu_tanh) {
  if (m && gelu_tanh && rm_nn_linear_set_activation(ctx, m, RM_ACT_GELU_TANH)) {
    rm_module_release(ctx, m);
    return NULL;
  }
  return m;
}

/* Sets m's attention path (path >= 0); on error releases m and returns NULL. */
static rm_module *with_path(rm_ctx *ctx, rm_module *m, int path) {
  if (m && path >= 0 && rm_nn_attention_set_path(ctx, m, (rm_att_path)path)) {
    rm_module_release(ctx, m);
    return NULL;
  }
  return m;
}

/* C.nn_new(kind, ...) -> module; argument checks name "nn.<kind>" */
static int l_nn_new(lua_State *L) {
  const char *kind = luaL_checkstring(L, 1);
  char fn[64];
  snprintf(fn, sizeof fn, "nn.%s", kind);
  rm_ctx *ctx = rm_lua_ctx(L);
  rm_module *m = NULL;
  if (!strcmp(kind, "Linear")) {
    int64_t in = check_size(L, 2, fn, "in_features"), out = check_size(L, 3, fn, "out_features");
    bool bias = true, act = false;
    if (lua_istable(L, 4)) { /* {bias = bool, activation = "gelu_tanh"} */
      static const char *const keys[] = { "bias", "activation", NULL };
      only_keys(L, 4, fn, keys, "bias, activation");
      lua_getfield(L, 4, "bias");
      bias = opt_bool(L, lua_gettop(L), true, fn, "bias");
      lua_getfield(L, 4, "activation");
      if (!lua_isnil(L, -1)) {
        const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        if (!v || strcmp(v, "gelu_tanh"))
          return rm_lua_errorf(L, "%s: activation must be 'gelu_tanh' (the fused linear_gelu op), got %s", fn,
                               luaL_tolstring(L, -1, NULL));
        act = true;
      }
      lua_pop(L, 2);
    } else {
      bias = opt_bool(L, 4, true, fn, "bias");
    }
    m = with_activation(ctx, rm_nn_linear(ctx, in, out, bias), act);
  } else if (!strcmp(kind, "Embedding")) {
    int64_t n = check_size(L, 2, fn, "the number of embeddings"), d = check_size(L, 3, fn, "the embedding size");
    m = rm_nn_embedding(ctx, n, d);
  } else if (!strcmp(kind, "LayerNorm")) {
    int64_t d = check_size(L, 2, fn, "the size");
    m = rm_nn_layernorm(ctx, d, opt_num(L, 3, 1e-5, fn, "eps"), opt_bool(L, 4, true, fn, "affine"));
  } else if (!strcmp(kind, "RMSNorm")) {
    int64_t d = check_size(L, 2, fn, "the size");
    m = rm_nn_rmsnorm(ctx, d, opt_num(L, 3, 1e-6, fn, "eps"));
  } else if (!strcmp(kind, "GELU")) {
    if (!lua_isnoneornil(L, 2)) { /* {approximate = "none" | "tanh"} */
      static const char *const keys[] = { "approximate", NULL };
      if (!lua_istable(L, 2)) return rm_lua_errorf(L, "%s: options must be a table, got %s", fn, luaL_typename(L, 2));
      only_keys(L, 2, fn, keys, "approximate");
    }
    m = gelu_tanh_opt(L, 2, fn, "approximate") ? rm_nn_gelu_tanh(ctx) : rm_nn_gelu(ctx);
  } else if (!strcmp(kind, "ReLU")) {
    m = rm_nn_relu(ctx);
  } else if (!strcmp(kind, "SiLU")) {
    m = rm_nn_silu(ctx);
  } else if (!strcmp(kind, "Dropout")) {
    m = rm_nn_dropout(ctx, opt_num(L, 2, 0.5, fn, "p"));
  } else if (!strcmp(kind, "Softmax")) {
    int ok;
    lua_Integer d = lua_isnoneornil(L, 2) ? -1 : lua_tointegerx(L, 2, &ok);
    if (!lua_isnoneornil(L, 2) && (!ok || d == 0))
      return rm_lua_errorf(L, "%s: dim must be a nonzero integer (1-based; negative counts from the end)", fn);
    m = rm_nn_softmax(ctx, d > 0 ? d - 1 : d);
  } else if (!strcmp(kind, "CausalSelfAttention")) {
    int64_t d = check_size(L, 2, fn, "the size"), h = check_size(L, 3, fn, "heads");
    double p = opt_num(L, 4, 0, fn, "dropout");
    int path = attention_path_opt(L, 5, fn, "fused");
    m = with_path(ctx, rm_nn_attention(ctx, d, h, p), path);
  } else if (!strcmp(kind, "MLP")) {
    int64_t d = check_size(L, 2, fn, "the size");
    if (lua_isnoneornil(L, 3) && d > INT64_MAX / 4)
      return rm_lua_errorf(L, "%s: the size %I is too large (its default hidden size 4 x size overflows)", fn, (lua_Integer)d);
    int64_t hid = lua_isnoneornil(L, 3) ? 4 * d : check_size(L, 3, fn, "hidden");
    double p = opt_num(L, 4, 0, fn, "dropout");
    bool tanh = false;
    if (!lua_isnoneornil(L, 5)) { /* {approximate = "none" | "tanh"} */
      static const char *const keys[] = { "approximate", NULL };
      if (!lua_istable(L, 5)) return rm_lua_errorf(L, "%s: options must be a table, got %s", fn, luaL_typename(L, 5));
      only_keys(L, 5, fn, keys, "approximate");
      tanh = gelu_tanh_opt(L, 5, fn, "approximate");
    }
    m = with_activation(ctx, rm_nn_mlp(ctx, d, hid, p), tanh);
  } else if (!strcmp(kind, "TransformerBlock")) {
    int64_t d = check_size(L, 2, fn, "the size"), h = check_size(L, 3, fn, "heads");
    double p = opt_num(L, 4, 0, fn, "dropout");
    int path = attention_path_opt(L, 5, fn, "fused, approximate");
    bool tanh = gelu_tanh_opt(L, 5, fn, "approximate");
    m = with_activation(ctx, with_path(ctx, rm_nn_block(ctx, d, h, p), path), tanh);
  } else if (!strcmp(kind, "Residual")) {
    m = rm_nn_residual(ctx, rm_lua_check_module(L, 2, fn));
  } else if (!strcmp(kind, "Sequential")) {
    m = rm_sequential_new(ctx);
  } else {
    return rm_lua_errorf(L, "nn: unknown module type '%s'", kind);
  }
  return push_new(L, m, fn);
}

/* ---- methods' C side ---- */

/* C.module_forward(m, x) -> y; also model(x). A top-level forward with grad on starts
 * a training step: it begins with a full collection (Lua's collector cannot see tensor
 * bytes, so the handles of earlier steps' tensors would otherwise hold memory the
 * step's plan does not know about). With grad on, a checkpoint policy that needs sizes
 * is planned for x first (once per input shape; the core does it for a top-level call
 * too, but here a failure is raised as the policy's own error). */
static int l_forward(lua_State *L) {
  rm_module *m = rm_lua_check_module(L, 1, "forward");
  rm_tensor *x = rm_lua_check_tensor(L, 2, "forward");
  rm_ctx *ctx = rm_lua_ctx(L);
  nn_state *st = get_state(L);
  if (!ctx->dry && ctx->grad_enabled) {
    /* a Sequential called from a Lua module's forward plans its policy too */
    if (!st->cur && !st->no_step_collect) lua_gc(L, LUA_GCCOLLECT);
    if (m->policy && rm_lua_checkpoint_prepare(L, m, x, NULL)) {
      /* the message names what failed; a Lua module's raw error is not re-raised here */
      if (st->err_ref != LUA_NOREF) {
        luaL_unref(L, LUA_REGISTRYINDEX, st->err_ref);
        st->err_ref = LUA_NOREF;
      }
      return rm_lua_fail(L, "checkpoint");
    }
  }
  rm_lua_push_tensor(L, rm_lua_module_forward(L, m, x, "forward"), "forward");
  return 1;
}

/* C.module_add(parent, child [, name]) */
static int l_add(lua_State *L) {
  rm_module *p = rm_lua_check_module(L, 1, "add");
  rm_module *c = rm_lua_check_module(L, 2, "add");
  const char *name = luaL_optstring(L, 3, "");
  if (rm_module_add_named_child(rm_lua_ctx(L), p, name, c)) return rm_lua_fail(L, "add");
  return 0;
}

/* C.module_param(m, name, t) -> the parameter: a copy of t's values in a new leaf
 * tensor (category param, requires_grad) registered under name */
static int l_param(lua_State *L) {
  rm_module *m = rm_lua_check_module(L, 1, "param");
  const char *name = luaL_checkstring(L, 2);
  rm_tensor *t = rm_lua_check_tensor(L, 3, "param");
  rm_ctx *ctx = rm_lua_ctx(L);
  rm_scope sc;
  rm_scope_enter(ctx, &sc, RM_CAT_PARAM, RM_GRAD_OFF);
  rm_tensor *p = rm_copy(ctx, t);
  rm_scope_leave(ctx, &sc);
  if (!p) return rm_lua_fail(L, "param");
  p->requires_grad = true;
  rm_tensor_hold(p);
  if (rm_module_add_param(ctx, m, name, p) < 0) {
    rm_tensor_drop(ctx, p);
    return rm_lua_fail(L, "param");
  }
  rm_lua_push_tensor(L, p, "param");
  return 1;
}

/* C.module_info(m) -> type, description, #children, own parameter elements,
 * total parameter elements, training */
static int l_info(lua_State *L) {
  rm_module *m = rm_lua_check_module(L, 1, "info");
  rm_ctx *ctx = rm_lua_ctx(L);
  char desc[256];
  int64_t own = 0;
  for (int i = 0; i < m->nparams; i++)
    if (m->params[i]) own += rm_tensor_numel(m->params[i]);
  lua_pushstring(L, m->type->name);
  lua_pushstring(L, rm_module_describe(m, desc, sizeof desc));
  lua_pushinteger(L, m->nchildren);
  lua_pushinteger(L, (lua_Integer)own);
  lua_pushinteger(L, (lua_Integer)rm_module_num_params(ctx, m));
  lua_pushboolean(L, m->training);
  return 6;
}

/* C.module_children(m) -> { {name, module}, ... } (name "" for Sequential layers) */
static int l_children(lua_State *L) {
  rm_module *m = rm_lua_check_module(L, 1, "children");
  lua_createtable(L, m->nchildren, 0);
  for (int i = 0; i < m->nchildren; i++) {
    lua_createtable(L, 2, 0);
    lua_pushstring(L, m->child_names[i]);
    lua_rawseti(L, -2, 1);
    rm_lua_push_module(L, m->children[i]);
    lua_rawseti(L, -2, 2);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int push_param_visit(void *ud, const char *name, rm_tensor **slot, rm_module *owner) {
  lua_State *L = ud;
  lua_createtable(L, 2, 0);
  lua_pushstring(L, name);
  lua_rawseti(L, -2, 1);
  rm_tensor_hold(*slot);
  rm_lua_push_tensor(L, *slot, "parameters");
  lua_rawseti(L, -2, 2);
  lua_rawseti(L, -2, (lua_Integer)luaL_len(L, -2) + 1);
  return 0;
}

/* C.module_params(m) -> { {name, tensor}, ... } in registration order, shared once */
static int l_params(lua_State *L) {
  rm_module *m = rm_lua_check_module(L, 1, "parameters");
  lua_newtable(L);
  if (rm_module_visit_params(rm_lua_ctx(L), m, push_param_visit, L)) return rm_lua_fail(L, "parameters");
  return 1;
}

/* C.module_train(m, flag) */
static int l_train(lua_State *L) {
  rm_module_train(rm_lua_check_module(L, 1, "train"), lua_toboolean(L, 2));
  return 0;
}

/* C.module_zero_grad(m) */
static int l_zero_grad(lua_State *L) {
  rm_module_zero_grad(rm_lua_ctx(L), rm_lua_check_module(L, 1, "zero_grad"));
  return 0;
}

/* C.module_to(m, "cuda" | "cpu" | "float64" | "float32" | ...) */
static int l_to(lua_State *L) {
  rm_module *m = rm_lua_check_module(L, 1, "to");
  const char *s = luaL_checkstring(L, 2);
  rm_ctx *ctx = rm_lua_ctx(L);
  /* the target keeps what is not named: the dtype and device of the first parameter */
  rm_dtype dt = RM_F32;
  rm_device dev = RM_CPU;
  lua_pushcfunction(L, l_params);
  lua_pushvalue(L, 1);
  lua_call(L, 1, 1);
  if (lua_rawgeti(L, -1, 1) == LUA_TTABLE) {
    lua_rawgeti(L, -1, 2);
    rm_tensor *p = rm_lua_test_tensor(L, -1);
    if (p) dt = p->dtype, dev = p->device;
    lua_pop(L, 1);
  }
  lua_pop(L, 2);
  bool found = rm_dtype_parse(s, &dt);
  for (int d = 0; d < RM_DEVICE_COUNT && !found; d++)
    if (!strcmp(s, rm_device_name((rm_device)d))) dev = (rm_device)d, found = true;
  if (!found)
    return rm_lua_errorf(L, "to: unknown device or dtype '%s' (cpu, cuda, float32, float64, bfloat16, float16)", s);
  if (rm_module_to(ctx, m, dev, dt)) return rm_lua_fail(L, "to");
  lua_settop(L, 1);
  return 1;
}

/* C.copy_values(dst, src): copies src's values into the existing tensor dst (same
 * shape; dtype and device converted), outside autograd. */
static int l_copy_values(lua_State *L) {
  rm_tensor *dst = rm_lua_check_tensor(L, 1, "load_state_dict");
  rm_tensor *src = rm_lua_check_tensor(L, 2, "load_state_dict");
  rm_ctx *ctx = rm_lua_ctx(L);
  if (!rm_same_shape(dst, src)) {
    char a[96], b[96];
    return rm_lua_errorf(L, "load_state_dict: size %s does not match %s", rm_tensor_shape_str(src, a, sizeof a),
                         rm_tensor_shape_str(dst, b, sizeof b));
  }
  rm_scope sc;
  rm_scope_enter(ctx, &sc, RM_CAT_TEMP, RM_GRAD_OFF);
  rm_tensor *s = src;
  rm_tensor_hold(s);
  if (s->dtype != dst->dtype) {
    rm_tensor *c = rm_cast(ctx, s, dst->dtype);
    rm_tensor_drop(ctx, s);
    s = c;
  }
  int rc = s ? RM_OK : ctx->err_code;
  if (!rc && s->device != dst->device) {
    rm_tensor *c = rm_nn_transfer(ctx, s, dst->device, RM_CAT_TEMP);
    rm_tensor_drop(ctx, s);
    s = c;
    rc = s ? RM_OK : ctx->err_code;
  }
  if (!rc) rc = rm_op_into(ctx, RM_OP_COPY, 1, &s, NULL, 1, &dst);
  rm_tensor_drop(ctx, s);
  rm_scope_leave(ctx, &sc);
  if (rc) return rm_lua_fail(L, "load_state_dict");
  return 0;
}

/* C.nn_loss(kind, a, b): cross_entropy (logits (N,C) with labels (N), or (B,T,C) with
 * (B,T), flattened) or mse */
static int l_loss(lua_State *L) {
  const char *kind = luaL_checkstring(L, 1);
  char fn[64];
  snprintf(fn, sizeof fn, "nn.%s", kind);
  rm_tensor *a = rm_lua_check_tensor(L, 2, fn);
  rm_tensor *b = rm_lua_check_tensor(L, 3, fn);
  rm_ctx *ctx = rm_lua_ctx(L);
  rm_tensor *out;
  if (!strcmp(kind, "mse")) {
    out = rm_mse(ctx, a, b);
  } else if (!strcmp(kind, "cross_entropy")) {
    if (a->ndim > 2) {
      char sa[96], sb[96];
      bool ok = b->ndim == a->ndim - 1;
      for (int d = 0; ok && d < b->ndim; d++) ok = a->shape[d] == b->shape[d];
      if (!ok)
        return rm_lua_errorf(L, "%s: labels of size %s do not match logits of size %s (expected the logits' size without its last dimension)",
                             fn, rm_tensor_shape_str(b, sb, sizeof sb), rm_tensor_shape_str(a, sa, sizeof sa));
      int64_t s2[2] = { rm_tensor_numel(b), a->shape[a->ndim - 1] };
      rm_tensor *a2 = rm_reshape(ctx, a, 2, s2);
      rm_tensor *b2 = a2 ? rm_reshape(ctx, b, 1, s2) : NULL;
      out = b2 ? rm_cross_entropy(ctx, a2, b2) : NULL;
      rm_tensor_drop(ctx, a2);
      rm_tensor_drop(ctx, b2);
    } else {
      out = rm_cross_entropy(ctx, a, b);
    }
  } else {
    return rm_lua_errorf(L, "nn: unknown loss '%s'", kind);
  }
  rm_lua_push_tensor(L, out, fn);
  return 1;
}

/* ---- metatable ---- */

/* m[k]: integer -> child k (1-based); string -> field, method, parameter, child name */
static int m_index(lua_State *L) {
  rm_module *m = rm_lua_check_module(L, 1, "index");
  if (lua_type(L, 2) == LUA_TNUMBER) {
    int ok;
    lua_Integer i = lua_tointegerx(L, 2, &ok);
    if (!ok || i < 1 || i > m->nchildren)
      return rm_lua_errorf(L, "%s[%s]: index out of range (it has %d %s)", m->type->name, lua_tostring(L, 2),
                           m->nchildren, m->nchildren == 1 ? "layer" : "layers");
    rm_lua_push_module(L, m->children[i - 1]);
    return 1;
  }
  lua_getiuservalue(L, 1, 1);
  lua_pushvalue(L, 2);
  if (lua_rawget(L, -2) != LUA_TNIL) return 1;
  lua_pop(L, 2);
  lua_pushvalue(L, 2);
  if (lua_gettable(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
  if (lua_type(L, 2) == LUA_TSTRING) {
    const char *k = lua_tostring(L, 2);
    rm_tensor **slot = rm_module_param_slot(m, k);
    if (slot && *slot) {
      rm_tensor_hold(*slot);
      rm_lua_push_tensor(L, *slot, "index");
      return 1;
    }
    for (int i = 0; i < m->nchildren; i++)
      if (!strcmp(m->child_names[i], k)) {
        rm_lua_push_module(L, m->children[i]);
        return 1;
      }
  }
  lua_pushnil(L);
  return 1;
}

static int m_newindex(lua_State *L) {
  rm_module *m = rm_lua_check_module(L, 1, "newindex");
  if (lua_type(L, 2) == LUA_TNUMBER)
    return rm_lua_errorf(L, "%s: layers cannot be assigned by index (use add)", m->type->name);
  lua_getiuservalue(L, 1, 1);
  lua_pushvalue(L, 2);
  lua_pushvalue(L, 3);
  lua_rawset(L, -3);
  return 0;
}

static int m_len(lua_State *L) {
  lua_pushinteger(L, rm_lua_check_module(L, 1, "#")->nchildren);
  return 1;
}

static int m_call(lua_State *L) { return l_forward(L); }

/* C.step_collect([flag]) -> previous flag: whether each step begins with a collection. */
static int l_step_collect(lua_State *L) {
  nn_state *st = get_state(L);
  lua_pushboolean(L, !st->no_step_collect);
  if (!lua_isnone(L, 1)) st->no_step_collect = !lua_toboolean(L, 1);
  return 1;
}

static int m_eq(lua_State *L) {
  lmodule *a = luaL_testudata(L, 1, RM_MODULE_MT), *b = luaL_testudata(L, 2, RM_MODULE_MT);
  lua_pushboolean(L, a && b && a->m == b->m);
  return 1;
}

static const luaL_Reg module_mt[] = {
  { "__gc", m_gc },
  { "__newindex", m_newindex },
  { "__len", m_len },
  { "__call", m_call },
  { "__eq", m_eq },
  { NULL, NULL },
};

static const luaL_Reg nn_c[] = {
  { "nn_new", l_nn_new },
  { "nn_module", l_nn_module },
  { "nn_loss", l_loss },
  { "module_forward", l_forward },
  { "step_collect", l_step_collect },
  { "module_add", l_add },
  { "module_param", l_param },
  { "module_info", l_info },
  { "module_children", l_children },
  { "module_params", l_params },
  { "module_train", l_train },
  { "module_zero_grad", l_zero_grad },
  { "module_to", l_to },
  { "copy_values", l_copy_values },
  { NULL, NULL },
};

void rm_lua_open_nn(lua_State *L) {
  /* Opening remat again in the same lua_State (a test runner that resets
   * package.loaded) keeps the state and cache: modules made before still point there. */
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &STATE_KEY) != LUA_TUSERDATA) {
    nn_state *st = lua_newuserdatauv(L, sizeof *st, 0);
    lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
    st->main = lua_tothread(L, -1);
    lua_pop(L, 1);
    st->cur = NULL;
    st->err_ref = LUA_NOREF;
    st->no_step_collect = false;
    lua_rawsetp(L, LUA_REGISTRYINDEX, &STATE_KEY);
  }
  lua_pop(L, 1);
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &CACHE_KEY) != LUA_TTABLE) {
    lua_newtable(L);             /* the cache, weak values */
    lua_newtable(L);
    lua_pushliteral(L, "v");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &CACHE_KEY);
  }
  lua_pop(L, 1);

  luaL_newmetatable(L, RM_MODULE_MT);
  luaL_setfuncs(L, module_mt, 0);
  lua_newtable(L);               /* Module: the method table (filled by remat/nn.lua) */
  lua_pushvalue(L, -1);
  lua_setfield(L, -4, "Module");
  lua_pushcclosure(L, m_index, 1);
  lua_setfield(L, -2, "__index");
  lua_setfield(L, -2, "Module_mt");
  luaL_setfuncs(L, nn_c, 0);
}
