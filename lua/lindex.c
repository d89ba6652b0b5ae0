/* Element access and writes from Lua: x[i] and x[{i, j}] (a number for an element,
 * a view otherwise), x[i] = number|tensor, x.grad, #x, the guard that makes == and <
 * on tensors an error, and C.at, C.assign, C.copy_into, C.set_methods. */
#include <string.h>

#include "lremat.h"
#include "../core/backend.h"

/* C.at(t, i1, ..., in) -> the element at 1-based indices (for printing big tensors) */
static int l_at(lua_State *L) {
  rm_tensor *t = rm_lua_check_tensor(L, 1, "at");
  if (lua_gettop(L) - 1 != t->ndim)
    return rm_lua_errorf(L, "at: %d indices for a %d-d tensor", lua_gettop(L) - 1, t->ndim);
  /* indices first: a bad one raises before the CPU copy is held */
  int64_t idx[RM_MAX_DIM];
  for (int d = 0; d < t->ndim; d++) {
    lua_Integer i = luaL_checkinteger(L, d + 2);
    if (i < 1 || i > t->shape[d])
      return rm_lua_errorf(L, "at: index %I is out of range for dimension %d of size %I", (lua_Integer)i, d + 1,
                           (lua_Integer)t->shape[d]);
    idx[d] = i - 1;
  }
  t = rm_lua_on_cpu(L, t, "at");
  int64_t off = 0;
  for (int d = 0; d < t->ndim; d++) off += idx[d] * t->stride[d];
  const void *p = rm_tensor_ptr(t);
  if (rm_dtype_is_int(t->dtype)) lua_pushinteger(L, (lua_Integer)rm_load_i64(p, t->dtype, off));
  else lua_pushnumber(L, rm_load_f64(p, t->dtype, off));
  rm_tensor_drop(rm_lua_ctx(L), t);
  return 1;
}

/* Offset (elements) of row-major linear index i in a view of the given geometry. */
static int64_t geo_offset(int ndim, const int64_t *shape, const int64_t *stride, int64_t i) {
  int64_t off = 0;
  for (int d = ndim - 1; d >= 0; d--) {
    off += (i % shape[d]) * stride[d];
    i /= shape[d];
  }
  return off;
}

/* Writes src (a number, or a tensor broadcastable to dst's shape) into the CPU view dst,
 * through its strides. Raises errors naming fn. */
static void assign(lua_State *L, rm_tensor *dst, int vidx, const char *fn) {
  rm_ctx *ctx = rm_lua_ctx(L);
  if (dst->device != RM_CPU)
    rm_lua_errorf(L, "%s: writing into a %s tensor is not supported yet (write on the cpu, then move it)", fn,
                  rm_device_name(dst->device));
  if (dst->dtype == RM_BF16 || dst->dtype == RM_F16)
    rm_lua_errorf(L, "%s: writing into a %s tensor is not supported", fn, rm_dtype_name(dst->dtype));
  if (rm_tensor_host_ready(ctx, dst)) rm_lua_fail(L, fn);
  int64_t n = rm_tensor_numel(dst);
  char *pd = rm_tensor_ptr(dst);
  rm_tensor_written(dst);
  if (lua_type(L, vidx) == LUA_TNUMBER) {
    if (n > 0) rm_lua_store_number(L, pd, dst->dtype, geo_offset(dst->ndim, dst->shape, dst->stride, 0), vidx, fn);
    for (int64_t i = 1; i < n; i++)
      rm_lua_store_number(L, pd, dst->dtype, geo_offset(dst->ndim, dst->shape, dst->stride, i), vidx, fn);
    return;
  }
  rm_ltensor *b = luaL_testudata(L, vidx, RM_TENSOR_MT);
  if (!b) rm_lua_errorf(L, "%s: expected a number or a tensor to assign, got %s", fn, luaL_typename(L, vidx));
  if (!b->t) rm_lua_errorf(L, "%s: the tensor to assign was freed", fn);
  rm_tensor *src = b->t;
  char s1[96], s2[96];
  if (src->device != RM_CPU)
    rm_lua_errorf(L, "%s: the value is on %s but the target is on cpu", fn, rm_device_name(src->device));
  if (src->dtype == RM_BF16 || src->dtype == RM_F16)
    rm_lua_errorf(L, "%s: cannot read a %s tensor on the cpu", fn, rm_dtype_name(src->dtype));
  if (rm_dtype_is_int(dst->dtype) && !rm_dtype_is_int(src->dtype))
    rm_lua_errorf(L, "%s: cannot write %s values into a %s tensor (convert them with :to('%s') first)", fn,
                  rm_dtype_name(src->dtype), rm_dtype_name(dst->dtype), rm_dtype_name(dst->dtype));
  /* broadcast src to dst's shape: stride 0 on new and size-1 dimensions */
  /* leading size-1 dimensions of src beyond dst's are dropped (x[i] = t{{v}} works) */
  int skip = 0;
  while (src->ndim - skip > dst->ndim && src->shape[skip] == 1) skip++;
  int64_t st[RM_MAX_DIM];
  int off = dst->ndim - (src->ndim - skip);
  bool ok = off >= 0;
  for (int d = 0; ok && d < dst->ndim; d++) {
    if (d < off) { st[d] = 0; continue; }
    int64_t s = src->shape[d - off + skip];
    if (s == dst->shape[d]) st[d] = src->stride[d - off + skip];
    else if (s == 1) st[d] = 0;
    else ok = false;
  }
  if (!ok)
    rm_lua_errorf(L, "%s: cannot assign a tensor of size %s to a view of size %s", fn,
                  rm_tensor_shape_str(src, s1, sizeof s1), rm_tensor_shape_str(dst, s2, sizeof s2));
  if (rm_tensor_host_ready(ctx, src)) rm_lua_fail(L, fn);
  /* a source sharing dst's storage is read from a copy, so overlapping writes are safe */
  rm_tensor *tmp = NULL;
  if (src->storage == dst->storage) {
    tmp = rm_copy(ctx, src);
    if (!tmp) rm_lua_fail(L, fn);
    src = tmp;
    for (int d = off; d < dst->ndim; d++)
      if (st[d]) st[d] = src->stride[d - off + skip];
  }
  const char *ps = rm_tensor_ptr(src);
  for (int64_t i = 0; i < n; i++) {
    int64_t od = geo_offset(dst->ndim, dst->shape, dst->stride, i);
    int64_t os = geo_offset(dst->ndim, dst->shape, st, i);
    if (rm_dtype_is_int(dst->dtype)) rm_store_i64(pd, dst->dtype, od, rm_load_i64(ps, src->dtype, os));
    else rm_store_f64(pd, dst->dtype, od, rm_load_f64(ps, src->dtype, os));
  }
  if (tmp) rm_tensor_drop(ctx, tmp);
}

/* C.assign(dst, value): fills the view dst with a number or a broadcastable tensor */
static int l_assign(lua_State *L) {
  const char *fn = luaL_optstring(L, 3, "fill_");
  rm_tensor *dst = rm_lua_check_tensor(L, 1, fn);
  if (dst->requires_grad && rm_lua_ctx(L)->grad_enabled)
    return rm_lua_errorf(L, "%s: cannot write into a tensor that requires grad (use remat.no_grad or detach)", fn);
  assign(L, dst, 2, fn);
  lua_settop(L, 1);
  return 1;
}

/* C.copy_into(dst, src): copies src into dst with the backend's copy kernel (no
 * allocation) when both have the same shape, dtype and device and dst is contiguous;
 * otherwise through assign (CPU, broadcasting, dtype conversion). Returns dst. */
static int l_copy_into(lua_State *L) {
  rm_tensor *dst = rm_lua_check_tensor(L, 1, "copy_");
  rm_ctx *ctx = rm_lua_ctx(L);
  if (dst->requires_grad && ctx->grad_enabled)
    return rm_lua_errorf(L, "copy_: cannot write into a tensor that requires grad (use remat.no_grad or detach)");
  rm_tensor *src = rm_lua_test_tensor(L, 2);
  if (src && rm_same_shape(src, dst) && src->dtype == dst->dtype && src->device == dst->device &&
      rm_tensor_is_contiguous(dst) && src->storage != dst->storage) {
    if (rm_tensor_host_ready(ctx, dst)) return rm_lua_fail(L, "copy_");
    rm_tensor *in1[1] = { src }, *out1[1] = { dst };
    if (rm_op_into(ctx, RM_OP_COPY, 1, in1, NULL, 1, out1) != RM_OK) return rm_lua_fail(L, "copy_");
  } else {
    assign(L, dst, 2, "copy_");
  }
  lua_settop(L, 1);
  return 1;
}

/* 0-based index along dim 0 from a Lua key (1-based, negative from the end). */
static int64_t check_index(lua_State *L, rm_tensor *t, int kidx, const char *fn) {
  if (t->ndim == 0) rm_lua_errorf(L, "%s: cannot index a 0-d tensor (use :item())", fn);
  int ok;
  lua_Integer i = lua_tointegerx(L, kidx, &ok);
  if (!ok) rm_lua_errorf(L, "%s: the index must be an integer, got %s", fn, lua_tostring(L, kidx));
  int64_t size = t->shape[0];
  int64_t j = i < 0 ? size + i : i - 1;
  if (i == 0 || j < 0 || j >= size)
    rm_lua_errorf(L, "%s: index %I is out of range for dimension 1 of size %I (indices are 1-based)", fn,
                  (lua_Integer)i, (lua_Integer)size);
  return j;
}

/* x[{i, j, ...}]: reads the 1-based (or negative) indices of the table at kidx into
 * idx (0-based), checked against t's sizes; returns how many there are (at most
 * t->ndim: fewer select a sub-tensor, as many give an element). */
static int table_index(lua_State *L, rm_tensor *t, int kidx, int64_t *idx, const char *fn) {
  int n = (int)luaL_len(L, kidx);
  if (n == 0) rm_lua_errorf(L, "%s: x[{}] has no indices", fn);
  if (n > t->ndim)
    rm_lua_errorf(L, "%s: %d indices for a %d-d tensor", fn, n, t->ndim);
  for (int d = 0; d < n; d++) {
    lua_rawgeti(L, kidx, d + 1);
    int ok;
    lua_Integer i = lua_tointegerx(L, -1, &ok);
    if (!ok)
      rm_lua_errorf(L, "%s: index %d must be an integer, got %s (ranges are not supported: use narrow)", fn,
                    d + 1, luaL_typename(L, -1));
    lua_pop(L, 1);
    int64_t size = t->shape[d];
    int64_t j = i < 0 ? size + i : i - 1;
    if (i == 0 || j < 0 || j >= size)
      rm_lua_errorf(L, "%s: index %I is out of range for dimension %d of size %I (indices are 1-based)", fn,
                    (lua_Integer)i, d + 1, (lua_Integer)size);
    idx[d] = j;
  }
  return n;
}

/* The element of t at the 0-based indices idx[0..ndim-1], pushed as a Lua number (an
 * integer for an int32/int64 tensor). */
static int push_element(lua_State *L, rm_tensor *t, const int64_t *idx, const char *fn) {
  rm_ctx *ctx = rm_lua_ctx(L);
  if (rm_tensor_host_ready(ctx, t)) return rm_lua_fail(L, fn);
  int64_t off = t->offset;
  for (int d = 0; d < t->ndim; d++) off += idx[d] * t->stride[d];
  rm_tensor *v = rm_tensor_view_of(ctx, t, 0, t->shape, t->stride, off);
  if (!v) return rm_lua_fail(L, fn);
  rm_lua_push_tensor(L, v, fn);   /* owned by Lua: released even if reading raises */
  rm_tensor *c = rm_lua_on_cpu(L, v, fn);
  rm_lua_push_elem(L, c, 0);
  rm_tensor_drop(ctx, c);
  return 1;
}

/* t with its first n dimensions selected at idx (a view). */
static rm_tensor *select_prefix(lua_State *L, rm_tensor *t, int n, const int64_t *idx, const char *fn) {
  rm_ctx *ctx = rm_lua_ctx(L);
  rm_tensor_hold(t);
  for (int d = 0; d < n; d++) {
    rm_tensor *s = rm_select(ctx, t, 0, idx[d]);
    rm_tensor_drop(ctx, t);
    if (!s) rm_lua_fail(L, fn);
    t = s;
  }
  return t;
}

static const char *const nofreed_check[] = { "free", "is_freed", "type", NULL };

/* __index: x[i] (select along dim 1), x.grad, and methods (a freed tensor raises
 * "<method>: the tensor was freed" as soon as a method is looked up). */
static int t_index(lua_State *L) {
  rm_ltensor *b = luaL_checkudata(L, 1, RM_TENSOR_MT);
  if (lua_type(L, 2) == LUA_TNUMBER) {
    if (!b->t) return rm_lua_errorf(L, "index: the tensor was freed");
    int64_t j = check_index(L, b->t, 2, "index");
    if (b->t->ndim == 1) return push_element(L, b->t, &j, "index");
    rm_lua_push_tensor(L, rm_select(rm_lua_ctx(L), b->t, 0, j), "index");
    return 1;
  }
  if (lua_type(L, 2) == LUA_TTABLE) {
    if (!b->t) return rm_lua_errorf(L, "index: the tensor was freed");
    int64_t idx[RM_MAX_DIM];
    int n = table_index(L, b->t, 2, idx, "index");
    if (n == b->t->ndim) return push_element(L, b->t, idx, "index");
    rm_lua_push_tensor(L, select_prefix(L, b->t, n, idx, "index"), "index");
    return 1;
  }
  if (lua_type(L, 2) != LUA_TSTRING) return 0;
  const char *k = lua_tostring(L, 2);
  if (!b->t) {
    bool exempt = false;
    for (int i = 0; nofreed_check[i]; i++) exempt = exempt || !strcmp(k, nofreed_check[i]);
    lua_pushvalue(L, 2);
    if (!exempt && lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL)
      return rm_lua_errorf(L, "%s: the tensor was freed", k);
    if (!exempt && !strcmp(k, "grad")) return rm_lua_errorf(L, "grad: the tensor was freed");
    lua_pop(L, 1);
  }
  if (!strcmp(k, "grad")) {
    if (!b->t->grad) return 0;
    rm_tensor_hold(b->t->grad);
    rm_lua_push_tensor(L, b->t->grad, "grad");
    return 1;
  }
  lua_pushvalue(L, 2);
  lua_rawget(L, lua_upvalueindex(1));
  return 1;
}

int rm_lua_set_grad(lua_State *L, rm_tensor *t, rm_tensor *g) {
  if (g && (!rm_same_shape(g, t) || g->dtype != t->dtype || g->device != t->device))
    return rm_lua_errorf(L, "grad: the gradient must match the tensor's shape, dtype and device");
  if (g) rm_tensor_hold(g);
  if (t->grad) rm_tensor_drop(rm_lua_ctx(L), t->grad);
  t->grad = g;
  return 0;
}

/* __newindex: x[i] = number|tensor writes into the selected view; x.grad = g|nil. */
static int t_newindex(lua_State *L) {
  rm_ltensor *b = luaL_checkudata(L, 1, RM_TENSOR_MT);
  rm_ctx *ctx = rm_lua_ctx(L);
  int kt = lua_type(L, 2);
  if (kt == LUA_TNUMBER || kt == LUA_TTABLE) {
    if (!b->t) return rm_lua_errorf(L, "index assignment: the tensor was freed");
    if (b->t->requires_grad && ctx->grad_enabled)
      return rm_lua_errorf(L, "index assignment: cannot write into a tensor that requires grad (use remat.no_grad or detach)");
    /* x[i] selects along dim 1; x[{i, j, ...}] selects its first dimensions */
    int64_t idx[RM_MAX_DIM];
    int n = 1;
    if (kt == LUA_TNUMBER) idx[0] = check_index(L, b->t, 2, "index assignment");
    else n = table_index(L, b->t, 2, idx, "index assignment");
    rm_tensor *v = select_prefix(L, b->t, n, idx, "index assignment");
    rm_lua_push_tensor(L, v, "index assignment"); /* owned by Lua: freed even if assign raises */
    int vi = lua_gettop(L);
    assign(L, v, 3, "index assignment");
    rm_ltensor *vb = lua_touserdata(L, vi);
    vb->t = NULL;
    rm_tensor_drop(ctx, v);
    return 0;
  }
  if (lua_type(L, 2) == LUA_TSTRING && !strcmp(lua_tostring(L, 2), "grad")) {
    if (!b->t) return rm_lua_errorf(L, "grad: the tensor was freed");
    rm_tensor *t = b->t, *g = NULL;
    if (!lua_isnil(L, 3)) g = rm_lua_check_tensor(L, 3, "grad");
    return rm_lua_set_grad(L, t, g);
  }
  return rm_lua_errorf(L, "tensor: cannot set field '%s' (only x[i] and x.grad can be assigned)",
                       luaL_tolstring(L, 2, NULL));
}

/* ==, <, <= on tensors would compare handles (or nothing at all): a silent wrong answer
 * in code such as `pred[i] == y[i]` on 2-d tensors. They raise instead and name the
 * elementwise ops (masks) and the whole-tensor test. */
static int t_compare(lua_State *L) {
  return rm_lua_errorf(L, "tensor comparison: tensors cannot be compared with ==, <, <=, > or >= "
                          "(use x:eq(y), x:lt(y), ... for a mask, x:equal(y) for a whole-tensor test, "
                          "or x:item() / x[i] on a 1-d tensor for a number)");
}

/* __len: the size of the first dimension */
static int t_len(lua_State *L) {
  rm_tensor *t = rm_lua_check_tensor(L, 1, "#");
  if (t->ndim == 0) return rm_lua_errorf(L, "#: a 0-d tensor has no length (use :item())");
  lua_pushinteger(L, t->shape[0]);
  return 1;
}

/* C.set_methods(Tensor): installs __index over the Lua method table. */
static int l_set_methods(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_getmetatable(L, RM_TENSOR_MT);
  lua_pushvalue(L, 1);
  lua_pushcclosure(L, t_index, 1);
  lua_setfield(L, -2, "__index");
  return 0;
}

static const luaL_Reg index_mt[] = {
  { "__newindex", t_newindex },
  { "__len", t_len },
  { "__eq", t_compare },
  { "__lt", t_compare },
  { "__le", t_compare },
  { NULL, NULL },
};

static const luaL_Reg index_c[] = {
  { "at", l_at },
  { "assign", l_assign },
  { "copy_into", l_copy_into },
  { "set_methods", l_set_methods },
  { NULL, NULL },
};

void rm_lua_open_index(lua_State *L) {
  luaL_getmetatable(L, RM_TENSOR_MT); /* made by rm_lua_open_tensor */
  luaL_setfuncs(L, index_mt, 0);
  lua_pop(L, 1);
  luaL_setfuncs(L, index_c, 0);
}
