/* Tensor userdata: lifetime (__gc, __close, free through one idempotent release),
 * the generic op call used by the Lua library, factories, reading data out, moving
 * between devices. Element access and writes (x[i], x[i] = v) are in lindex.c. */
#include <math.h>
#include <string.h>

#include "lremat.h"
#include "../core/backend.h"

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

/* The userdata remembers the context its tensor belongs to (user value 1), so that a
 * tensor collected after remat was opened again in the same state (busted reloads
 * modules between spec files) is released into its own context. */
/* Every handle of a state, in a list anchored in a userdata made at the state's first
 * open (so it is finalised after every tensor made later). Lua gives objects made by
 * finalizers during lua_close no finalizer; the anchor's releases what they hold. */
static const char HANDLES_KEY = 0;
typedef struct handles {
  rm_ltensor head;
  rm_ctx *ctx;
} handles;

static void unlink_handle(rm_ltensor *b) {
  if (!b->next) return;
  b->prev->next = b->next;
  b->next->prev = b->prev;
  b->prev = b->next = NULL;
}

static int handles_gc(lua_State *L) {
  handles *h = lua_touserdata(L, 1);
  while (h->head.next != &h->head) {
    rm_ltensor *b = h->head.next;
    unlink_handle(b);
    if (b->t) {
      rm_tensor *t = b->t;
      b->t = NULL;
      rm_tensor_drop(h->ctx, t);
    }
  }
  return 0;
}

static void open_handles(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &HANDLES_KEY);
  bool have = lua_touserdata(L, -1) != NULL;
  lua_pop(L, 1);
  if (have) return;
  handles *h = lua_newuserdatauv(L, sizeof *h, 0);
  h->head.t = NULL;
  h->head.prev = h->head.next = &h->head;
  h->ctx = rm_lua_ctx(L);
  lua_newtable(L);
  lua_pushcfunction(L, handles_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &HANDLES_KEY);
}

void rm_lua_push_tensor(lua_State *L, rm_tensor *t, const char *fn) {
  if (!t) rm_lua_fail(L, fn);
  rm_ctx *ctx = rm_lua_ctx(L);
  rm_ltensor *b = lua_newuserdatauv(L, sizeof *b, 1);
  b->t = NULL;
  b->prev = b->next = NULL;
  luaL_setmetatable(L, RM_TENSOR_MT);
  lua_pushlightuserdata(L, ctx);
  lua_setiuservalue(L, -2, 1);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &HANDLES_KEY);
  handles *h = lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (h) {
    b->next = h->head.next;
    b->prev = &h->head;
    h->head.next->prev = b;
    h->head.next = b;
  }
  b->t = t;
}

/* The one release used by __gc, __close and :free(). */
static int t_free(lua_State *L) {
  rm_ltensor *b = luaL_testudata(L, 1, RM_TENSOR_MT);
  if (b) unlink_handle(b);
  if (b && b->t) {
    rm_tensor *t = b->t;
    lua_getiuservalue(L, 1, 1);
    rm_ctx *ctx = lua_touserdata(L, -1);
    lua_pop(L, 1);
    b->t = NULL;
    rm_tensor_drop(ctx ? ctx : rm_lua_ctx(L), t);
  }
  return 0;
}

static int t_is_freed(lua_State *L) {
  rm_ltensor *b = luaL_testudata(L, 1, RM_TENSOR_MT);
  if (!b) return rm_lua_errorf(L, "is_freed: expected a tensor, got %s", luaL_typename(L, 1));
  lua_pushboolean(L, b->t == NULL);
  return 1;
}

/* ---- attrs from Lua, by the names and types ops.def declares ---- */

static void attr_names(lua_State *L, rm_op_id op, luaL_Buffer *b) {
  int n;
  const rm_attr_field *f = rm_op_attrs(op, &n);
  if (n == 0) luaL_addstring(b, "no attributes");
  for (int k = 0; k < n; k++) {
    if (k) luaL_addstring(b, ", ");
    luaL_addstring(b, f[k].name);
  }
}

static void bad_attr_name(lua_State *L, rm_op_id op, const char *fn, const char *key) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  attr_names(L, op, &b);
  luaL_pushresult(&b);
  rm_lua_errorf(L, "%s: unknown attribute '%s' (%s takes %s)", fn, key, rm_op_name(op), lua_tostring(L, -1));
}

static void read_shape(lua_State *L, rm_attrs *a, const char *fn, const char *key) {
  if (!lua_istable(L, -1))
    rm_lua_errorf(L, "%s: attribute '%s' must be a list of integers, got %s", fn, key, luaL_typename(L, -1));
  lua_Integer n = luaL_len(L, -1);
  if (n > RM_MAX_DIM) rm_lua_errorf(L, "%s: at most %d dimensions (got %d)", fn, RM_MAX_DIM, (int)n);
  a->ndim = (int)n;
  for (int k = 0; k < n; k++) {
    lua_rawgeti(L, -1, k + 1);
    int ok;
    lua_Integer v = lua_tointegerx(L, -1, &ok);
    if (!ok || lua_type(L, -1) != LUA_TNUMBER)
      rm_lua_errorf(L, "%s: size %d must be an integer, got %s", fn, k + 1, luaL_typename(L, -1));
    a->shape[k] = v;
    lua_pop(L, 1);
  }
}

void rm_lua_read_attrs(lua_State *L, int idx, rm_op_id op, rm_attrs *a, const char *fn) {
  rm_attrs_init(a);
  if (lua_isnoneornil(L, idx)) return;
  if (!lua_istable(L, idx)) rm_lua_errorf(L, "%s: attributes must be a table, got %s", fn, luaL_typename(L, idx));
  idx = lua_absindex(L, idx);
  int n;
  const rm_attr_field *f = rm_op_attrs(op, &n);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    if (lua_type(L, -2) != LUA_TSTRING)
      rm_lua_errorf(L, "%s: attribute names are strings, got %s", fn, luaL_typename(L, -2));
    const char *key = lua_tostring(L, -2);
    int k = 0;
    while (k < n && strcmp(f[k].name, key)) k++;
    if (k == n) bad_attr_name(L, op, fn, key);
    char *p = (char *)a + f[k].offset;
    int t = lua_type(L, -1), ok = 1;
    switch (f[k].type) {
    case RM_ATTR_INT: {
      int64_t v = (int64_t)lua_tointegerx(L, -1, &ok);
      ok = ok && t == LUA_TNUMBER;
      if (ok) memcpy(p, &v, sizeof v);
      break;
    }
    case RM_ATTR_BOOL:
      ok = t == LUA_TBOOLEAN;
      if (ok) *(bool *)p = lua_toboolean(L, -1);
      break;
    case RM_ATTR_REAL: {
      double v = lua_tonumber(L, -1);
      ok = t == LUA_TNUMBER;
      if (ok) memcpy(p, &v, sizeof v);
      break;
    }
    case RM_ATTR_SHAPE:
      read_shape(L, a, fn, key);
      break;
    }
    if (!ok)
      rm_lua_errorf(L, "%s: attribute '%s' must be %s, got %s", fn, key, rm_attr_type_name(f[k].type),
                    t == LUA_TNUMBER && f[k].type == RM_ATTR_INT ? "a non-integer number" : luaL_typename(L, -1));
    lua_pop(L, 1);
  }
}

rm_op_id rm_lua_check_op(lua_State *L, int idx, const char *fn) {
  int ok;
  lua_Integer id = lua_tointegerx(L, idx, &ok);
  if (!ok || lua_type(L, idx) != LUA_TNUMBER) {
    if (lua_type(L, idx) == LUA_TSTRING)
      rm_lua_errorf(L, "%s: expected an op id (C.ops.%s), got a name", fn, lua_tostring(L, idx));
    rm_lua_errorf(L, "%s: expected an op id (from C.ops), got %s", fn, luaL_typename(L, idx));
  }
  if (id < 0 || id >= RM_OP_COUNT || !rm_op_def_get((rm_op_id)id))
    rm_lua_errorf(L, "%s: unknown op id %I", fn, id);
  return (rm_op_id)id;
}

/* Input k (1-based) of an op at stack index idx: messages count inputs, not stack slots. */
static rm_tensor *check_input(lua_State *L, int idx, int k, const char *fn) {
  rm_ltensor *b = luaL_testudata(L, idx, RM_TENSOR_MT);
  if (!b) {
    if (lua_isnoneornil(L, idx)) rm_lua_errorf(L, "%s: input %d: expected a tensor, got nothing", fn, k);
    rm_lua_errorf(L, "%s: input %d: expected a tensor, got %s", fn, k, luaL_typename(L, idx));
  }
  if (!b->t) rm_lua_errorf(L, "%s: input %d: the tensor was freed", fn, k);
  return b->t;
}

/* C.op(id, attrs, t1, ..., tn) -> outputs; id from C.ops. Inputs may be nil only for
 * variadic ops. */
static int l_op(lua_State *L) {
  rm_op_id op = rm_lua_check_op(L, 1, "remat.op");
  const rm_op_def *def = rm_op_def_get(op);
  char fn[64];
  snprintf(fn, sizeof fn, "remat.%s", def->name);
  rm_attrs a;
  rm_lua_read_attrs(L, 2, op, &a, fn);
  int nin = lua_gettop(L) - 2;
  if (nin > RM_MAX_INPUTS) return rm_lua_errorf(L, "%s: at most %d inputs (got %d)", fn, RM_MAX_INPUTS, nin);
  luaL_checkstack(L, 8, fn);
  rm_tensor *in[RM_MAX_INPUTS];
  for (int i = 0; i < nin; i++) in[i] = check_input(L, i + 3, i + 1, fn);
  rm_tensor *out[RM_MAX_OUTPUTS] = { 0 };
  rm_ctx *ctx = rm_lua_ctx(L);
  if (rm_op_run(ctx, op, nin, in, &a, out) != RM_OK) return rm_lua_fail(L, fn);
  for (int j = 0; j < def->nvis; j++) rm_lua_push_tensor(L, out[j], fn);
  return def->nvis;
}

/* ---- factories and data ---- */

static rm_dtype check_dtype(lua_State *L, int idx, rm_dtype def, const char *fn) {
  if (lua_isnoneornil(L, idx)) return def;
  const char *s = luaL_checkstring(L, idx);
  rm_dtype d;
  if (rm_dtype_parse(s, &d)) return d;
  rm_lua_errorf(L, "%s: unknown dtype '%s' (float32, float64, bfloat16, float16, int32, int64)", fn, s);
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
  if (dt == RM_BF16 || dt == RM_F16)
    return rm_lua_errorf(L, "remat.tensor: %s tensors cannot be filled on the cpu (make a float32 one and convert it with :to)",
                         rm_dtype_name(dt));
  rm_ctx *ctx = rm_lua_ctx(L);
  rm_tensor *t = rm_tensor_new(ctx, dt, RM_CPU, n, shape, RM_CAT_TEMP);
  if (!t) return rm_lua_fail(L, "remat.tensor");
  int64_t numel = rm_tensor_numel(t);
  if ((int64_t)luaL_len(L, 1) != numel) {
    rm_tensor_drop(ctx, t);
    return rm_lua_errorf(L, "remat.tensor: %d values for %d elements", (int)luaL_len(L, 1), (int)numel);
  }
  rm_lua_push_tensor(L, t, "remat.tensor"); /* owned by Lua: released if an element raises */
  for (int64_t i = 0; i < numel; i++) {
    lua_rawgeti(L, 1, i + 1);
    if (lua_type(L, -1) != LUA_TNUMBER)
      return rm_lua_errorf(L, "remat.tensor: element %d is not a number", (int)(i + 1));
    rm_lua_store_number(L, rm_tensor_ptr(t), dt, i, -1, "remat.tensor");
    lua_pop(L, 1);
  }
  return 1;
}

void rm_lua_push_elem(lua_State *L, const rm_tensor *t, int64_t i) {
  int64_t off = 0;
  for (int d = t->ndim - 1; d >= 0; d--) {
    off += (i % t->shape[d]) * t->stride[d];
    i /= t->shape[d];
  }
  if (rm_dtype_is_int(t->dtype)) lua_pushinteger(L, (lua_Integer)rm_load_i64(rm_tensor_ptr(t), t->dtype, off));
  else lua_pushnumber(L, rm_load_f64(rm_tensor_ptr(t), t->dtype, off));
}

void rm_lua_store_number(lua_State *L, void *p, rm_dtype dt, int64_t off, int vidx, const char *fn) {
  if (!rm_dtype_is_int(dt)) {
    rm_store_f64(p, dt, off, lua_tonumber(L, vidx));
    return;
  }
  int64_t v;
  if (lua_isinteger(L, vidx)) {
    v = (int64_t)lua_tointeger(L, vidx);
    if (dt == RM_I32 && (v < INT32_MIN || v > INT32_MAX))
      rm_lua_errorf(L, "%s: %I does not fit in int32", fn, (lua_Integer)v);
  } else if (!rm_float_to_int(lua_tonumber(L, vidx), dt, &v)) {
    rm_lua_errorf(L, "%s: %s has no %s value (NaN, infinite or out of range)", fn, lua_tostring(L, vidx),
                  rm_dtype_name(dt));
  }
  rm_store_i64(p, dt, off, v);
}

/* A CPU float tensor with the data of t: t itself (held) when it already is one, else a
 * copy (bfloat16/float16 are widened to float32 on their device first). */
rm_tensor *rm_lua_on_cpu(lua_State *L, rm_tensor *t, const char *fn) {
  rm_ctx *ctx = rm_lua_ctx(L);
  if (rm_tensor_host_ready(ctx, t)) rm_lua_fail(L, fn);
  bool narrow = t->dtype == RM_BF16 || t->dtype == RM_F16;
  if (t->device == RM_CPU && !narrow) {
    rm_tensor_hold(t);
    return t;
  }
  rm_tensor *src;
  if (narrow) {
    rm_attrs a;
    rm_attrs_init(&a);
    a.cast.dtype = RM_F32;
    src = rm_op1(ctx, RM_OP_CAST, 1, &t, &a);
  } else {
    src = rm_contiguous(ctx, t);
  }
  if (!src) rm_lua_fail(L, fn);
  if (src->device == RM_CPU) return src;
  const rm_backend *b = rm_backend_get(ctx, src->device);
  rm_tensor *out = b ? rm_tensor_new(ctx, src->dtype, RM_CPU, src->ndim, src->shape, RM_CAT_TEMP) : NULL;
  int rc = out ? b->to_host(ctx, rm_tensor_ptr(out), rm_tensor_ptr(src), rm_tensor_nbytes(src)) : (int)ctx->err_code;
  rm_tensor_drop(ctx, src);
  if (rc != RM_OK) {
    if (out) rm_tensor_drop(ctx, out);
    rm_lua_fail(L, fn);
  }
  return out;
}

/* C.flat(t) -> flat table of values (row-major) */
static int l_flat(lua_State *L) {
  rm_tensor *t = rm_lua_on_cpu(L, rm_lua_check_tensor(L, 1, "totable"), "totable");
  int64_t n = rm_tensor_numel(t);
  lua_createtable(L, (int)n, 0);
  for (int64_t i = 0; i < n; i++) {
    rm_lua_push_elem(L, t, i);
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
  t = rm_lua_on_cpu(L, t, "item");
  rm_lua_push_elem(L, t, 0);
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

/* C.is_contiguous(t) */
static int l_is_contiguous(lua_State *L) {
  lua_pushboolean(L, rm_tensor_is_contiguous(rm_lua_check_tensor(L, 1, "is_contiguous")));
  return 1;
}

/* C.strides(t) -> table of strides (elements), offset */
static int l_strides(lua_State *L) {
  rm_tensor *t = rm_lua_check_tensor(L, 1, "stride");
  lua_createtable(L, t->ndim, 0);
  for (int d = 0; d < t->ndim; d++) {
    lua_pushinteger(L, t->stride[d]);
    lua_rawseti(L, -2, d + 1);
  }
  lua_pushinteger(L, t->offset);
  return 2;
}

/* C.same_storage(a, b): whether two tensors view the same storage */
static int l_same_storage(lua_State *L) {
  rm_tensor *a = rm_lua_check_tensor(L, 1, "same_storage");
  rm_tensor *b = rm_lua_check_tensor(L, 2, "same_storage");
  lua_pushboolean(L, a->storage && a->storage == b->storage);
  return 1;
}

/* C.arange(start, step, n, dtype) -> CPU 1-d tensor start, start+step, ... (n values) */
static int l_arange(lua_State *L) {
  double start = luaL_checknumber(L, 1), step = luaL_checknumber(L, 2);
  lua_Integer n = luaL_checkinteger(L, 3);
  rm_dtype dt = check_dtype(L, 4, RM_F32, "remat.arange");
  if (n < 0) n = 0;
  if (dt == RM_BF16 || dt == RM_F16)
    return rm_lua_errorf(L, "remat.arange: %s is not supported on the cpu", rm_dtype_name(dt));
  /* an integer range is computed in integers (exact beyond 2^53) */
  bool ints = rm_dtype_is_int(dt) && lua_isinteger(L, 1) && lua_isinteger(L, 2);
  if (rm_dtype_is_int(dt) && !ints)
    return rm_lua_errorf(L, "remat.arange: an %s range needs whole-number start and step", rm_dtype_name(dt));
  int64_t shape[1] = { n };
  rm_tensor *t = rm_tensor_new(rm_lua_ctx(L), dt, RM_CPU, 1, shape, rm_lua_ctx(L)->category);
  if (!t) return rm_lua_fail(L, "remat.arange");
  rm_lua_push_tensor(L, t, "remat.arange");
  void *p = rm_tensor_ptr(t);
  lua_Integer i0 = ints ? lua_tointeger(L, 1) : 0, di = ints ? lua_tointeger(L, 2) : 0;
  for (int64_t i = 0; i < n; i++) {
    if (ints) {
      int64_t v = (int64_t)((uint64_t)i0 + (uint64_t)i * (uint64_t)di);
      if (dt == RM_I32 && (v < INT32_MIN || v > INT32_MAX))
        return rm_lua_errorf(L, "remat.arange: %I does not fit in int32", (lua_Integer)v);
      rm_store_i64(p, dt, i, v);
    } else {
      rm_store_f64(p, dt, i, start + (double)i * step);
    }
  }
  return 1;
}

/* C.to_device(t, device) -> a copy of t on device (contiguous, same dtype and category).
 * Not differentiable: the copy has no autograd history. */
static int l_to_device(lua_State *L) {
  rm_tensor *t = rm_lua_check_tensor(L, 1, "to");
  rm_device dev = check_device(L, 2, "to");
  rm_ctx *ctx = rm_lua_ctx(L);
  const rm_backend *bdst = rm_backend_get(ctx, dev);
  if (!bdst) return rm_lua_fail(L, dev == RM_CUDA ? "cuda" : "to");
  rm_tensor *src = rm_contiguous(ctx, t);
  if (!src) return rm_lua_fail(L, "to");
  rm_category cat = src->storage ? src->storage->category : ctx->category;
  rm_tensor *out = rm_tensor_new(ctx, src->dtype, dev, src->ndim, src->shape, cat);
  if (!out) {
    rm_tensor_drop(ctx, src);
    return rm_lua_fail(L, "to");
  }
  size_t nb = rm_tensor_nbytes(src);
  int rc = RM_OK;
  if (nb && !ctx->dry) {
    if (src->device == dev) {
      rm_tensor *in1[1] = { src }, *out1[1] = { out };
      rc = rm_op_into(ctx, RM_OP_COPY, 1, in1, NULL, 1, out1);
    } else if (src->device == RM_CPU) {
      rc = bdst->from_host(ctx, rm_tensor_ptr(out), rm_tensor_ptr(src), nb);
    } else {
      const rm_backend *bsrc = rm_backend_get(ctx, src->device);
      rc = bsrc ? bsrc->to_host(ctx, rm_tensor_ptr(out), rm_tensor_ptr(src), nb) : (int)ctx->err_code;
    }
  }
  rm_tensor_drop(ctx, src);
  if (rc != RM_OK) {
    rm_tensor_drop(ctx, out);
    return rm_lua_fail(L, "to");
  }
  rm_lua_push_tensor(L, out, "to");
  return 1;
}

static int push_names(lua_State *L, int n, const char *(*name)(int)) {
  lua_createtable(L, 0, n);
  for (int i = 0; i < n; i++) {
    lua_pushinteger(L, i);
    lua_setfield(L, -2, name(i));
  }
  return 1;
}
static const char *dtype_name_i(int i) { return rm_dtype_name((rm_dtype)i); }
static const char *device_name_i(int i) { return rm_device_name((rm_device)i); }

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
  { "is_contiguous", l_is_contiguous },
  { "strides", l_strides },
  { "same_storage", l_same_storage },
  { "arange", l_arange },
  { "to_device", l_to_device },
  { NULL, NULL },
};

void rm_lua_open_tensor(lua_State *L) {
  open_handles(L);
  luaL_newmetatable(L, RM_TENSOR_MT);
  luaL_setfuncs(L, tensor_mt, 0);
  lua_setfield(L, -2, "Tensor_mt");
  luaL_setfuncs(L, tensor_c, 0);
  push_names(L, RM_DTYPE_COUNT, dtype_name_i);
  lua_setfield(L, -2, "dtypes");
  lua_createtable(L, 0, RM_DTYPE_COUNT + 4); /* C.dtype_of: every spelling -> its dtype's name */
  for (int d = 0; d < RM_DTYPE_COUNT; d++) {
    lua_pushstring(L, rm_dtype_name((rm_dtype)d));
    lua_setfield(L, -2, rm_dtype_name((rm_dtype)d));
  }
  rm_dtype ad;
  for (int i = 0; rm_dtype_alias(i, &ad); i++) {
    lua_pushstring(L, rm_dtype_name(ad));
    lua_setfield(L, -2, rm_dtype_alias(i, &ad));
  }
  lua_setfield(L, -2, "dtype_of");
  push_names(L, RM_DEVICE_COUNT, device_name_i);
  lua_setfield(L, -2, "devices");
  lua_pushinteger(L, RM_MAX_DIM);
  lua_setfield(L, -2, "MAX_DIM");
  lua_createtable(L, 0, RM_OP_COUNT);  /* C.ops: name -> id, for C.op and C.op_into */
  for (int i = 0; i < RM_OP_COUNT; i++) {
    lua_pushinteger(L, i);
    lua_setfield(L, -2, rm_op_name((rm_op_id)i));
  }
  lua_setfield(L, -2, "ops");
}
