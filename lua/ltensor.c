/* Tensor userdata: lifetime (__gc, __close, free through one idempotent release),
 * the generic op call used by the Lua library, factories, and data access. */
#include <math.h>
#include <string.h>

#include "lremat.h"

rm_tensor *rm_lua_test_tensor(lua_State *L, int idx) {
  rm_ltensor *b = luaL_testudata(L, idx, RM_TENSOR_MT);
  return b ? b->t : NULL;
}

rm_tensor *rm_lua_check_tensor(lua_State *L, int idx, const char *fn) {
  rm_ltensor *b = luaL_testudata(L, idx, RM_TENSOR_MT);
  if (!b) {
    if (lua_isnoneornil(L, idx))
      rm_lua_errorf(L, "%s: argument %d: expected a tensor, got nothing", fn, idx);
    rm_lua_errorf(L, "%s: argument %d: expected a tensor, got %s", fn, idx, luaL_typename(L, idx));
  }
  if (!b->t) rm_lua_errorf(L, "%s: argument %d: the tensor was freed", fn, idx);
  return b->t;
}

void rm_lua_push_tensor(lua_State *L, rm_tensor *t, const char *fn) {
  if (!t) rm_lua_fail(L, fn);
  rm_ltensor *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->t = NULL;
  luaL_setmetatable(L, RM_TENSOR_MT);
  b->t = t;
}

/* The one release used by __gc, __close and :free(). */
static int t_free(lua_State *L) {
  rm_ltensor *b = luaL_testudata(L, 1, RM_TENSOR_MT);
  if (b && b->t) {
    rm_tensor *t = b->t;
    b->t = NULL;
    rm_tensor_drop(rm_lua_ctx(L), t);
  }
  return 0;
}

static int t_is_freed(lua_State *L) {
  rm_ltensor *b = luaL_checkudata(L, 1, RM_TENSOR_MT);
  lua_pushboolean(L, b->t == NULL);
  return 1;
}

/* ---- attrs from Lua: { i = {...}, f = {...}, shape = {...}, seed =, offset = } ---- */

static void read_attrs(lua_State *L, int idx, rm_attrs *a, const char *fn) {
  rm_attrs_init(a);
  if (lua_isnoneornil(L, idx)) return;
  luaL_checktype(L, idx, LUA_TTABLE);
  if (lua_getfield(L, idx, "i") == LUA_TTABLE)
    for (int k = 0; k < 4; k++) {
      lua_rawgeti(L, -1, k + 1);
      if (!lua_isnil(L, -1)) {
        int ok;
        lua_Integer v = lua_tointegerx(L, -1, &ok);
        if (!ok) rm_lua_errorf(L, "%s: expected an integer, got %s", fn, luaL_typename(L, -1));
        a->i[k] = v;
      }
      lua_pop(L, 1);
    }
  lua_pop(L, 1);
  if (lua_getfield(L, idx, "f") == LUA_TTABLE)
    for (int k = 0; k < 4; k++) {
      lua_rawgeti(L, -1, k + 1);
      if (!lua_isnil(L, -1)) {
        if (!lua_isnumber(L, -1)) rm_lua_errorf(L, "%s: expected a number, got %s", fn, luaL_typename(L, -1));
        a->f[k] = lua_tonumber(L, -1);
      }
      lua_pop(L, 1);
    }
  lua_pop(L, 1);
  if (lua_getfield(L, idx, "shape") == LUA_TTABLE) {
    int n = (int)luaL_len(L, -1);
    if (n > RM_MAX_DIM) rm_lua_errorf(L, "%s: at most %d dimensions (got %d)", fn, RM_MAX_DIM, n);
    a->ndim = n;
    for (int k = 0; k < n; k++) {
      lua_rawgeti(L, -1, k + 1);
      int ok;
      lua_Integer v = lua_tointegerx(L, -1, &ok);
      if (!ok) rm_lua_errorf(L, "%s: size %d must be an integer, got %s", fn, k + 1, luaL_typename(L, -1));
      a->shape[k] = v;
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);
}

/* C.op(name, attrs, t1, ..., tn) -> outputs. Inputs may be nil only for variadic. */
static int l_op(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  int op = rm_op_find(name);
  if (op < 0) return rm_lua_errorf(L, "remat: unknown op '%s'", name);
  const rm_op_def *def = rm_op_def_get((rm_op_id)op);
  if (!def) return rm_lua_errorf(L, "remat.%s: not implemented", name);
  char fn[64];
  snprintf(fn, sizeof fn, "remat.%s", name);
  rm_attrs a;
  read_attrs(L, 2, &a, fn);
  int nin = lua_gettop(L) - 2;
  if (nin > 64) return rm_lua_errorf(L, "%s: too many inputs", fn);
  rm_tensor *in[64];
  for (int i = 0; i < nin; i++) in[i] = rm_lua_check_tensor(L, i + 3, fn);
  rm_tensor *out[8] = { 0 };
  rm_ctx *ctx = rm_lua_ctx(L);
  if (rm_op_run(ctx, (rm_op_id)op, nin, in, &a, out) != RM_OK) return rm_lua_fail(L, fn);
  for (int j = 0; j < def->nvis; j++) rm_lua_push_tensor(L, out[j], fn);
  return def->nvis;
}

/* ---- factories and data ---- */

static rm_dtype check_dtype(lua_State *L, int idx, rm_dtype def, const char *fn) {
  if (lua_isnoneornil(L, idx)) return def;
  const char *s = luaL_checkstring(L, idx);
  for (int d = 0; d < RM_DTYPE_COUNT; d++)
    if (!strcmp(s, rm_dtype_name((rm_dtype)d))) return (rm_dtype)d;
  if (!strcmp(s, "float")) return RM_F32;
  if (!strcmp(s, "double")) return RM_F64;
  rm_lua_errorf(L, "%s: unknown dtype '%s' (float32, float64, bfloat16, float16)", fn, s);
  return RM_F32;
}

static rm_device check_device(lua_State *L, int idx, const char *fn) {
  if (lua_isnoneornil(L, idx)) return RM_CPU;
  const char *s = luaL_checkstring(L, idx);
  for (int d = 0; d < RM_DEVICE_COUNT; d++)
    if (!strcmp(s, rm_device_name((rm_device)d))) return (rm_device)d;
  rm_lua_errorf(L, "%s: unknown device '%s' (cpu, cuda)", fn, s);
  return RM_CPU;
}

/* Reads a shape table at idx into shape; returns ndim. */
static int check_shape(lua_State *L, int idx, int64_t *shape, const char *fn) {
  luaL_checktype(L, idx, LUA_TTABLE);
  int n = (int)luaL_len(L, idx);
  if (n > RM_MAX_DIM) rm_lua_errorf(L, "%s: at most %d dimensions (got %d)", fn, RM_MAX_DIM, n);
  for (int k = 0; k < n; k++) {
    lua_rawgeti(L, idx, k + 1);
    int ok;
    lua_Integer v = lua_tointegerx(L, -1, &ok);
    if (!ok) rm_lua_errorf(L, "%s: size %d must be an integer, got %s", fn, k + 1, luaL_typename(L, -1));
    if (v < 0) rm_lua_errorf(L, "%s: size %d is negative (%d)", fn, k + 1, (int)v);
    shape[k] = v;
    lua_pop(L, 1);
  }
  return n;
}

/* C.full(shape, value, dtype, device) */
static int l_full(lua_State *L) {
  int64_t shape[RM_MAX_DIM];
  int n = check_shape(L, 1, shape, "remat.full");
  double v = luaL_checknumber(L, 2);
  rm_dtype dt = check_dtype(L, 3, RM_F32, "remat.full");
  rm_device dev = check_device(L, 4, "remat.full");
  rm_ctx *ctx = rm_lua_ctx(L);
  rm_lua_push_tensor(L, rm_full(ctx, dt, dev, n, shape, v), "remat.full");
  return 1;
}

/* C.from_table(flat_values, shape, dtype) */
static int l_from_table(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  int64_t shape[RM_MAX_DIM];
  int n = check_shape(L, 2, shape, "remat.tensor");
  rm_dtype dt = check_dtype(L, 3, RM_F32, "remat.tensor");
  rm_ctx *ctx = rm_lua_ctx(L);
  rm_tensor *t = rm_tensor_new(ctx, dt, RM_CPU, n, shape, RM_CAT_TEMP);
  if (!t) return rm_lua_fail(L, "remat.tensor");
  int64_t numel = rm_tensor_numel(t);
  if ((int64_t)luaL_len(L, 1) != numel) {
    rm_tensor_drop(ctx, t);
    return rm_lua_errorf(L, "remat.tensor: %d values for %d elements", (int)luaL_len(L, 1), (int)numel);
  }
  for (int64_t i = 0; i < numel; i++) {
    lua_rawgeti(L, 1, i + 1);
    int ok;
    double v = lua_tonumberx(L, -1, &ok);
    lua_pop(L, 1);
    if (!ok) {
      rm_tensor_drop(ctx, t);
      return rm_lua_errorf(L, "remat.tensor: element %d is not a number", (int)(i + 1));
    }
    if (dt == RM_F64) ((double *)rm_tensor_ptr(t))[i] = v;
    else ((float *)rm_tensor_ptr(t))[i] = (float)v;
  }
  rm_lua_push_tensor(L, t, "remat.tensor");
  return 1;
}

/* Reads element i (row-major over the view) of a CPU tensor. */
static double elem(const rm_tensor *t, int64_t i) {
  int64_t off = 0;
  for (int d = t->ndim - 1; d >= 0; d--) {
    off += (i % t->shape[d]) * t->stride[d];
    i /= t->shape[d];
  }
  if (t->dtype == RM_F64) return ((const double *)rm_tensor_ptr(t))[off];
  return ((const float *)rm_tensor_ptr(t))[off];
}

/* A CPU tensor with the data of t (t itself, held, when already on the CPU). */
static rm_tensor *on_cpu(lua_State *L, rm_tensor *t, const char *fn) {
  rm_ctx *ctx = rm_lua_ctx(L);
  if (rm_tensor_data_ready(ctx, t)) rm_lua_fail(L, fn);
  if (t->device == RM_CPU && t->dtype != RM_BF16 && t->dtype != RM_F16) {
    rm_tensor_hold(t);
    return t;
  }
  rm_lua_errorf(L, "%s: reading a %s tensor on %s is not supported", fn, rm_dtype_name(t->dtype),
                rm_device_name(t->device));
  return NULL;
}

/* C.flat(t) -> flat table of values (row-major) */
static int l_flat(lua_State *L) {
  rm_tensor *t = on_cpu(L, rm_lua_check_tensor(L, 1, "totable"), "totable");
  int64_t n = rm_tensor_numel(t);
  lua_createtable(L, (int)n, 0);
  for (int64_t i = 0; i < n; i++) {
    lua_pushnumber(L, elem(t, i));
    lua_rawseti(L, -2, i + 1);
  }
  rm_tensor_drop(rm_lua_ctx(L), t);
  return 1;
}

/* C.item(t) */
static int l_item(lua_State *L) {
  rm_tensor *t = rm_lua_check_tensor(L, 1, "item");
  if (rm_tensor_numel(t) != 1) {
    char s[64];
    return rm_lua_errorf(L, "item: the tensor has %d elements (size %s), not 1", (int)rm_tensor_numel(t),
                         rm_tensor_shape_str(t, s, sizeof s));
  }
  t = on_cpu(L, t, "item");
  lua_pushnumber(L, elem(t, 0));
  rm_tensor_drop(rm_lua_ctx(L), t);
  return 1;
}

/* C.info(t) -> shape table, dtype, device, requires_grad */
static int l_info(lua_State *L) {
  rm_tensor *t = rm_lua_check_tensor(L, 1, "shape");
  lua_createtable(L, t->ndim, 0);
  for (int d = 0; d < t->ndim; d++) {
    lua_pushinteger(L, t->shape[d]);
    lua_rawseti(L, -2, d + 1);
  }
  lua_pushstring(L, rm_dtype_name(t->dtype));
  lua_pushstring(L, rm_device_name(t->device));
  lua_pushboolean(L, t->requires_grad);
  return 4;
}

static const luaL_Reg tensor_mt[] = {
  { "__gc", t_free },
  { "__close", t_free },
  { NULL, NULL },
};

static const luaL_Reg tensor_c[] = {
  { "op", l_op },
  { "free", t_free },
  { "is_freed", t_is_freed },
  { "full", l_full },
  { "from_table", l_from_table },
  { "flat", l_flat },
  { "item", l_item },
  { "info", l_info },
  { NULL, NULL },
};

void rm_lua_open_tensor(lua_State *L) {
  luaL_newmetatable(L, RM_TENSOR_MT);
  luaL_setfuncs(L, tensor_mt, 0);
  lua_setfield(L, -2, "Tensor_mt");
  luaL_setfuncs(L, tensor_c, 0);
}
