/* Files and datasets: safetensors save/load, IDX reading, row gathering, windows and
 * reproducible random permutations (the C side of remat.save/load and remat.data). */
#include <stdio.h>
#include <string.h>

#include "../core/dataset.h"
#include "../core/safetensors.h"
#include "lremat.h"

#define ST_GUARD_MT "remat.safetensors_guard"

/* Category from a name at idx (def when absent). */
static rm_category check_category(lua_State *L, int idx, rm_category def, const char *fn) {
  if (lua_isnoneornil(L, idx)) return def;
  const char *s = luaL_checkstring(L, idx);
  for (int c = 0; c < RM_CAT_COUNT; c++)
    if (!strcmp(s, rm_category_name((rm_category)c))) return (rm_category)c;
  rm_lua_errorf(L, "%s: unknown memory category '%s' (param, grad, optim, activation, workspace, temp, data)", fn, s);
  return def;
}

/* A file path at idx; one with a NUL byte in it is refused (C would cut it there and
 * read or write another file). */
static const char *check_path(lua_State *L, int idx, const char *fn) {
  size_t n;
  const char *s = luaL_checklstring(L, idx, &n);
  if (strlen(s) != n) rm_lua_errorf(L, "%s: the path contains a NUL byte (\\0)", fn);
  return s;
}

/* Scratch memory owned by a userdata left on the stack (freed by the collector, so a
 * Lua error raised while it is in use leaks nothing). */
static void *scratch(lua_State *L, size_t n) { return lua_newuserdatauv(L, n ? n : 1, 0); }

/* C.save(path, {name = tensor, ...}, {key = "value", ...} or nil) */
static int l_save(lua_State *L) {
  const char *fn = "remat.save";
  const char *path = check_path(L, 1, fn);
  if (!lua_istable(L, 2)) return rm_lua_errorf(L, "%s: expected a table of tensors, got %s", fn, luaL_typename(L, 2));
  bool has_meta = !lua_isnoneornil(L, 3);
  if (has_meta && !lua_istable(L, 3))
    return rm_lua_errorf(L, "%s: metadata must be a table of strings, got %s", fn, luaL_typename(L, 3));
  int n = 0, m = 0;
  for (lua_pushnil(L); lua_next(L, 2); lua_pop(L, 1)) n++;
  if (has_meta)
    for (lua_pushnil(L); lua_next(L, 3); lua_pop(L, 1)) m++;
  const char **names = scratch(L, sizeof(char *) * (size_t)n);
  rm_tensor **ts = scratch(L, sizeof(rm_tensor *) * (size_t)n);
  const char **keys = scratch(L, sizeof(char *) * (size_t)m);
  const char **vals = scratch(L, sizeof(char *) * (size_t)m);
  int i = 0;
  for (lua_pushnil(L); lua_next(L, 2); lua_pop(L, 1), i++) {
    if (lua_type(L, -2) != LUA_TSTRING)
      return rm_lua_errorf(L, "%s: tensor names must be strings, got a %s key", fn, luaL_typename(L, -2));
    names[i] = lua_tostring(L, -2);
    ts[i] = rm_lua_test_tensor(L, -1);
    if (!ts[i]) {
      if (luaL_testudata(L, -1, RM_TENSOR_MT))
        return rm_lua_errorf(L, "%s: tensor '%s' was freed", fn, names[i]);
      return rm_lua_errorf(L, "%s: '%s' is a %s, not a tensor", fn, names[i], luaL_typename(L, -1));
    }
  }
  i = 0;
  if (has_meta)
    for (lua_pushnil(L); lua_next(L, 3); lua_pop(L, 1), i++) {
      if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
        return rm_lua_errorf(L, "%s: metadata must map strings to strings (got %s -> %s)", fn,
                             luaL_typename(L, -2), luaL_typename(L, -1));
      keys[i] = lua_tostring(L, -2);
      vals[i] = lua_tostring(L, -1);
    }
  if (rm_safetensors_save(rm_lua_ctx(L), path, n, names, ts, m, keys, vals) != RM_OK)
    return rm_lua_fail(L, fn);
  return 0;
}

static int st_guard_gc(lua_State *L) {
  rm_safetensors *f = luaL_checkudata(L, 1, ST_GUARD_MT);
  if (f->priv_) rm_safetensors_free(rm_lua_ctx(L), f);
  return 0;
}

/* C.load(path, category) -> {name = tensor}, {key = value}, {name = file dtype} */
static int l_load(lua_State *L) {
  const char *fn = "remat.load";
  const char *path = check_path(L, 1, fn);
  rm_category cat = check_category(L, 2, RM_CAT_PARAM, fn);
  rm_ctx *ctx = rm_lua_ctx(L);
  rm_safetensors *f = lua_newuserdatauv(L, sizeof *f, 0);
  memset(f, 0, sizeof *f);
  luaL_setmetatable(L, ST_GUARD_MT);
  if (rm_safetensors_load(ctx, path, cat, f) != RM_OK) return rm_lua_fail(L, fn);
  int guard = lua_gettop(L);
  lua_createtable(L, 0, f->n);
  lua_createtable(L, 0, f->nmeta);
  lua_createtable(L, 0, f->n);
  for (int i = 0; i < f->n; i++) {
    lua_pushstring(L, f->file_dtype[i]);
    lua_setfield(L, guard + 3, f->names[i]);
    lua_pushstring(L, f->names[i]);
    /* The userdata takes the hold over only once it exists; until then the guard owns it. */
    rm_lua_push_tensor(L, f->tensors[i], fn);
    f->tensors[i] = NULL;
    lua_settable(L, guard + 1);
  }
  for (int i = 0; i < f->nmeta; i++) {
    lua_pushstring(L, f->vals[i]);
    lua_setfield(L, guard + 2, f->keys[i]);
  }
  rm_safetensors_free(ctx, f);
  return 3;
}

/* C.read_idx(path, limit, category) -> tensor */
static int l_read_idx(lua_State *L) {
  const char *path = check_path(L, 1, "remat.read_idx");
  lua_Integer limit = luaL_optinteger(L, 2, 0);
  rm_category cat = check_category(L, 3, RM_CAT_DATA, "remat.read_idx");
  rm_lua_push_tensor(L, rm_idx_read(rm_lua_ctx(L), path, limit, cat), "remat.read_idx");
  return 1;
}

/* Reads 1-based integer indices from a table or tensor at idx, entries
 * start..start+count-1, into 0-based rows[]. */
static void read_rows(lua_State *L, int idx, int64_t start, int64_t count, int64_t *rows, const char *fn) {
  rm_tensor *t = rm_lua_test_tensor(L, idx);
  if (t) {
    if (t->device != RM_CPU || t->ndim != 1 || t->dtype == RM_BF16 || t->dtype == RM_F16)
      rm_lua_errorf(L, "%s: indices must be a 1-D int64, int32, float32 or float64 CPU tensor, or a table", fn);
    if (start + count - 1 > t->shape[0])
      rm_lua_errorf(L, "%s: entries %d..%d are past the %d indices", fn, (int)start, (int)(start + count - 1),
                    (int)t->shape[0]);
    if (rm_tensor_host_ready(rm_lua_ctx(L), t) != RM_OK) rm_lua_fail(L, fn);
    const char *p = rm_tensor_ptr(t);
    for (int64_t k = 0; k < count; k++) {
      int64_t at = (start - 1 + k) * t->stride[0];
      if (rm_dtype_is_int(t->dtype)) {
        rows[k] = rm_load_i64(p, t->dtype, at) - 1;
        continue;
      }
      double v = rm_load_f64(p, t->dtype, at);
      if (v != (double)(int64_t)v) rm_lua_errorf(L, "%s: index %g is not an integer", fn, v);
      rows[k] = (int64_t)v - 1;
    }
    return;
  }
  luaL_checktype(L, idx, LUA_TTABLE);
  for (int64_t k = 0; k < count; k++) {
    int ok;
    lua_rawgeti(L, idx, start + k);
    lua_Integer v = lua_tointegerx(L, -1, &ok);
    if (!ok) {
      rm_lua_errorf(L, "%s: entry %d of the indices is %s, not an integer", fn, (int)(start + k),
                    lua_isnil(L, -1) ? "missing" : luaL_typename(L, -1));
    }
    lua_pop(L, 1);
    rows[k] = (int64_t)v - 1;
  }
}

/* C.take_rows(t, indices or nil, start, count, category) -> new contiguous tensor
 * whose rows are t's rows indices[start .. start+count-1] (1-based), or t's rows
 * start .. start+count-1 when indices is nil. */
static int l_take_rows(lua_State *L) {
  const char *fn = "remat.take_rows";
  rm_tensor *src = rm_lua_check_tensor(L, 1, fn);
  rm_ctx *ctx = rm_lua_ctx(L);
  lua_Integer start = luaL_optinteger(L, 3, 1);
  int64_t avail;
  if (lua_isnoneornil(L, 2)) avail = src->ndim ? src->shape[0] : 0;
  else if (rm_lua_test_tensor(L, 2)) avail = rm_lua_test_tensor(L, 2)->shape[0];
  else if (lua_istable(L, 2)) avail = (int64_t)luaL_len(L, 2);
  else return rm_lua_errorf(L, "%s: indices must be a table, a tensor or nil, got %s", fn, luaL_typename(L, 2));
  if (start < 1) return rm_lua_errorf(L, "%s: start %d must be at least 1", fn, (int)start);
  lua_Integer count = luaL_optinteger(L, 4, avail - start + 1);
  if (count < 0 || start - 1 + count > avail)
    return rm_lua_errorf(L, "%s: %d rows from %d run past the %d available", fn, (int)count, (int)start, (int)avail);
  rm_category cat = check_category(L, 5, ctx->category, fn);
  int64_t *rows = NULL;
  if (!lua_isnoneornil(L, 2)) {
    rows = scratch(L, sizeof(int64_t) * (size_t)count);
    read_rows(L, 2, start, count, rows, fn);
  }
  rm_lua_push_tensor(L, rm_take_rows(ctx, src, rows, start - 1, count, cat), fn);
  return 1;
}

/* C.windows(t, len) -> overlapping-window view (L-len+1, len) of the 1-D tensor t */
static int l_windows(lua_State *L) {
  rm_tensor *t = rm_lua_check_tensor(L, 1, "remat.windows");
  lua_Integer len = luaL_checkinteger(L, 2);
  rm_lua_push_tensor(L, rm_windows(rm_lua_ctx(L), t, len), "remat.windows");
  return 1;
}

static void push_int_table(lua_State *L, const int64_t *v, int64_t n) {
  lua_createtable(L, (int)n, 0);
  for (int64_t i = 0; i < n; i++) {
    lua_pushinteger(L, (lua_Integer)v[i] + 1);
    lua_rawseti(L, -2, i + 1);
  }
}

/* C.randperm(n) -> table: a random permutation of 1..n from remat's generator */
static int l_randperm(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  const char *fn = luaL_optstring(L, 2, "remat.randperm");
  if (n < 0 || n > (lua_Integer)1 << 31) return rm_lua_errorf(L, "%s: size %I is out of range", fn, (lua_Integer)n);
  /* the scratch and the table (about 16 bytes an entry) are host memory: within the limit */
  if (rm_memory_room(rm_lua_ctx(L), RM_CPU, RM_CAT_TEMP, 24.0 * (double)n)) return rm_lua_fail(L, fn);
  int64_t *perm = scratch(L, sizeof(int64_t) * (size_t)n);
  if (rm_randperm(rm_lua_ctx(L), n, perm) != RM_OK) return rm_lua_fail(L, fn);
  push_int_table(L, perm, n);
  return 1;
}

/* C.randint(n, k[, fn]) -> table of k integers uniform in 1..n from remat's generator */
static int l_randint(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1), k = luaL_checkinteger(L, 2);
  const char *fn = luaL_optstring(L, 3, "remat.randint");
  if (k < 0 || k > (lua_Integer)1 << 31) return rm_lua_errorf(L, "%s: count %I is out of range", fn, (lua_Integer)k);
  if (rm_memory_room(rm_lua_ctx(L), RM_CPU, RM_CAT_TEMP, 24.0 * (double)k)) return rm_lua_fail(L, fn);
  int64_t *out = scratch(L, sizeof(int64_t) * (size_t)k);
  if (rm_randint(rm_lua_ctx(L), n, k, out) != RM_OK) return rm_lua_fail(L, fn);
  push_int_table(L, out, k);
  return 1;
}

/* C.memory_room(bytes, fn): raises the out-of-memory error when bytes more would not
 * fit under the CPU limit (checked before work whose size the caller chose). */
static int l_memory_room(lua_State *L) {
  double bytes = luaL_checknumber(L, 1);
  const char *fn = luaL_checkstring(L, 2);
  if (rm_memory_room(rm_lua_ctx(L), RM_CPU, RM_CAT_TEMP, bytes)) return rm_lua_fail(L, fn);
  return 0;
}

/* C.encode_bytes(str, map, category) -> int64 1-D tensor with map[byte] for each byte
 * of str (map: byte value 0..255 -> index). */
static int l_encode_bytes(lua_State *L) {
  const char *fn = "encode";
  size_t n;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &n);
  luaL_checktype(L, 2, LUA_TTABLE);
  rm_category cat = check_category(L, 3, RM_CAT_DATA, fn);
  int64_t lut[256];
  for (int b = 0; b < 256; b++) {
    lua_rawgeti(L, 2, b);
    lut[b] = lua_isinteger(L, -1) ? (int64_t)lua_tointeger(L, -1) : 0;
    lua_pop(L, 1);
  }
  for (size_t i = 0; i < n; i++)
    if (lut[s[i]] == 0) {
      char shown[8] = "";
      if (s[i] >= 0x20 && s[i] < 0x7f) snprintf(shown, sizeof shown, "'%c' ", s[i]);
      return rm_lua_errorf(L, "%s: character %s(byte value %d) at position %d is not in the vocabulary", fn, shown,
                           (int)s[i], (int)i + 1);
    }
  int64_t shape[1] = { (int64_t)n };
  rm_ctx *ctx = rm_lua_ctx(L);
  rm_tensor *t = rm_tensor_new(ctx, RM_I64, RM_CPU, 1, shape, cat);
  if (t && n) {
    int64_t *d = rm_tensor_ptr(t);
    if (d)
      for (size_t i = 0; i < n; i++) d[i] = lut[s[i]];
  }
  rm_lua_push_tensor(L, t, fn);
  return 1;
}

static const luaL_Reg io_c[] = {
  { "save", l_save },
  { "load", l_load },
  { "read_idx", l_read_idx },
  { "take_rows", l_take_rows },
  { "windows", l_windows },
  { "randperm", l_randperm },
  { "randint", l_randint },
  { "memory_room", l_memory_room },
  { "encode_bytes", l_encode_bytes },
  { NULL, NULL },
};

void rm_lua_open_io(lua_State *L) {
  luaL_newmetatable(L, ST_GUARD_MT);
  lua_pushcfunction(L, st_guard_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  luaL_setfuncs(L, io_c, 0);
}
