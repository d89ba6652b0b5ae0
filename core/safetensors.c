/* safetensors: atomic writer, strict reader (the header JSON is read with core/json.h).
 * See safetensors.h for the format and the guarantees. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "json.h"
#include "ops.h"
#include "safetensors.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

#define CHUNK_BYTES ((size_t)1 << 20)
#define ULL(x) ((unsigned long long)(x))

/* Every dtype the format defines, so that a file using one remat cannot hold gets
 * "cannot load dtype F8_E4M3" rather than "unknown dtype". remat: the dtype it loads
 * as. Integers and booleans (labels, token ids, masks written by PyTorch or NumPy) load
 * as int64 (I64, U32, U64) or int32 (I32 and the narrower ones, BOOL as 0/1); a U64
 * value beyond int64's range is an error rather than a wrapped one. */
static const struct { const char *name; unsigned size; int remat; } st_dtypes[] = {
  { "F32", 4, RM_F32 }, { "F64", 8, RM_F64 }, { "BF16", 2, RM_F32 }, { "F16", 2, RM_F32 },
  { "I64", 8, RM_I64 }, { "I32", 4, RM_I32 }, { "I16", 2, RM_I32 }, { "I8", 1, RM_I32 },
  { "U64", 8, RM_I64 }, { "U32", 4, RM_I64 }, { "U16", 2, RM_I32 }, { "U8", 1, RM_I32 },
  { "BOOL", 1, RM_I32 }, { "F8_E4M3", 1, -1 }, { "F8_E5M2", 1, -1 }, { "C64", 8, -1 },
};
#define N_ST_DTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))

static const char *st_name_of(rm_dtype d) {
  switch (d) {
  case RM_F32: return "F32";
  case RM_F64: return "F64";
  case RM_BF16: return "BF16";
  case RM_F16: return "F16";
  case RM_I32: return "I32";
  case RM_I64: return "I64";
  default: return NULL;
  }
}

/* ---------------------------------------------------------------- writing ---- */

typedef struct sbuf {
  rm_ctx *ctx;
  char *p;
  size_t len, cap;
  bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *q = rm_host_realloc(b->ctx, b->p, b->cap, cap);
    if (!q) { b->oom = true; return; }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* A JSON string literal for s (already checked to be valid UTF-8). */
static void sb_json_string(sbuf *b, const char *s) {
  sb_put(b, "\"", 1);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    char esc[8];
    if (*c == '"' || *c == '\\') { esc[0] = '\\'; esc[1] = (char)*c; sb_put(b, esc, 2); }
    else if (*c < 0x20) { snprintf(esc, sizeof esc, "\\u%04x", *c); sb_put(b, esc, 6); }
    else sb_put(b, (const char *)c, 1);
  }
  sb_put(b, "\"", 1);
}

static int check_name(rm_ctx *ctx, const char *path, const char *what, const char *s) {
  if (!s) return rm_fail(ctx, RM_ERR_ARG, "%s: a %s is missing (NULL)", path, what);
  size_t n = strlen(s);
  if (rm_utf8_valid_prefix((const unsigned char *)s, n) != n)
    return rm_fail(ctx, RM_ERR_ARG, "%s: %s '%s' is not valid UTF-8", path, what, s);
  return RM_OK;
}

static int cmp_name_idx(const void *a, const void *b, void *names) {
  const char *const *nm = names;
  return strcmp(nm[*(const int *)a], nm[*(const int *)b]);
}

/* Sorts idx[0..n) so that names[idx[i]] ascend (glibc qsort_r: no shared state). */
static void sort_by_name(int *idx, int n, const char *const *names) {
  for (int i = 0; i < n; i++) idx[i] = i;
  qsort_r(idx, (size_t)n, sizeof *idx, cmp_name_idx, (void *)names);
}

static int write_all(rm_ctx *ctx, FILE *f, const void *p, size_t n, const char *path) {
  if (n && fwrite(p, 1, n, f) != n)
    return rm_fail(ctx, RM_ERR_IO, "%s: write failed: %s", path, strerror(errno ? errno : EIO));
  return RM_OK;
}

/* Writes t's logical row-major bytes, whatever its strides and device. */
static int write_tensor(rm_ctx *ctx, FILE *f, rm_tensor *t, char *chunk, const char *path,
                        const char *name) {
  int64_t numel = rm_tensor_numel(t);
  size_t es = rm_dtype_size(t->dtype);
  if (numel == 0) return RM_OK;
  if (rm_tensor_data_ready(ctx, t) != RM_OK) return rm_fail_prefix(ctx, name);
  if (!rm_tensor_ptr(t))
    return rm_fail(ctx, RM_ERR_STATE, "%s: tensor '%s' has no data (dry run?)", path, name);
  if (t->device != RM_CPU) {
    const rm_backend *be = rm_backend_get(ctx, t->device);
    if (!be) return rm_fail_prefix(ctx, path);
    rm_scope sc;
    rm_scope_enter(ctx, &sc, RM_SAME, RM_GRAD_OFF);
    rm_tensor *c = rm_contiguous(ctx, t);
    rm_scope_leave(ctx, &sc);
    if (!c) return rm_fail_prefix(ctx, path);
    size_t total = rm_tensor_nbytes(c), at = 0;
    int rc = RM_OK;
    while (rc == RM_OK && at < total) {
      size_t len = total - at < CHUNK_BYTES ? total - at : CHUNK_BYTES;
      rc = be->to_host(ctx, chunk, (const char *)rm_tensor_ptr(c) + at, len);
      if (rc == RM_OK) rc = write_all(ctx, f, chunk, len, path);
      at += len;
    }
    rm_tensor_drop(ctx, c);
    return rc;
  }
  if (rm_tensor_is_contiguous(t)) return write_all(ctx, f, rm_tensor_ptr(t), (size_t)numel * es, path);
  /* A strided CPU view: walk its elements in row-major order with an odometer. */
  const char *base = rm_tensor_ptr(t);
  int64_t idx[RM_MAX_DIM] = { 0 }, off = 0;
  size_t fill = 0;
  for (int64_t e = 0; e < numel; e++) {
    memcpy(chunk + fill, base + off * (int64_t)es, es);
    fill += es;
    if (fill + es > CHUNK_BYTES) {
      if (write_all(ctx, f, chunk, fill, path) != RM_OK) return ctx->err_code;
      fill = 0;
    }
    for (int d = t->ndim - 1; d >= 0; d--) {
      off += t->stride[d];
      if (++idx[d] < t->shape[d]) break;
      off -= t->stride[d] * t->shape[d];
      idx[d] = 0;
    }
  }
  return write_all(ctx, f, chunk, fill, path);
}

/* Builds the header JSON (padded with spaces to a multiple of 8) into b. */
static void build_header(sbuf *b, int n, const int *order, const char *const *names,
                         rm_tensor *const *ts, int nmeta, const int *morder,
                         const char *const *keys, const char *const *vals) {
  char num[64];
  uint64_t at = 0;
  sb_str(b, "{");
  if (nmeta > 0) {
    sb_str(b, "\"__metadata__\":{");
    for (int k = 0; k < nmeta; k++) {
      if (k) sb_str(b, ",");
      sb_json_string(b, keys[morder[k]]);
      sb_str(b, ":");
      sb_json_string(b, vals[morder[k]]);
    }
    sb_str(b, "}");
    if (n > 0) sb_str(b, ",");
  }
  for (int k = 0; k < n; k++) {
    rm_tensor *t = ts[order[k]];
    if (k) sb_str(b, ",");
    sb_json_string(b, names[order[k]]);
    sb_str(b, ":{\"dtype\":\"");
    sb_str(b, st_name_of(t->dtype));
    sb_str(b, "\",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      snprintf(num, sizeof num, d ? ",%lld" : "%lld", (long long)t->shape[d]);
      sb_str(b, num);
    }
    uint64_t bytes = (uint64_t)rm_tensor_nbytes(t);
    snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", ULL(at), ULL(at + bytes));
    sb_str(b, num);
    at += bytes;
  }
  sb_str(b, "}");
  while (!b->oom && b->len % 8) sb_put(b, " ", 1);
}

/* Makes the rename durable: fsync the directory that holds path (best effort). */
static void sync_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char dir[4096];
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else if ((size_t)(slash - path) < sizeof dir) snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  else return;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) { fsync(fd); close(fd); }
}

static int check_save_args(rm_ctx *ctx, const char *path, int n, const char *const *names,
                           rm_tensor *const *ts, int nmeta, const char *const *keys,
                           const char *const *vals, const int *order, const int *morder) {
  for (int i = 0; i < n; i++) {
    if (check_name(ctx, path, "tensor name", names[i]) != RM_OK) return ctx->err_code;
    if (!strcmp(names[i], "__metadata__"))
      return rm_fail(ctx, RM_ERR_ARG, "%s: '__metadata__' is reserved and cannot name a tensor", path);
    if (!ts[i]) return rm_fail(ctx, RM_ERR_ARG, "%s: tensor '%s' is missing (NULL)", path, names[i]);
    if (!st_name_of(ts[i]->dtype))
      return rm_fail(ctx, RM_ERR_DTYPE, "%s: tensor '%s' has an unsupported dtype", path, names[i]);
  }
  for (int i = 1; i < n; i++)
    if (!strcmp(names[order[i]], names[order[i - 1]]))
      return rm_fail(ctx, RM_ERR_ARG, "%s: tensor name '%s' is given twice", path, names[order[i]]);
  for (int i = 0; i < nmeta; i++) {
    if (check_name(ctx, path, "metadata key", keys[i]) != RM_OK) return ctx->err_code;
    if (check_name(ctx, path, "metadata value", vals[i]) != RM_OK) return ctx->err_code;
  }
  for (int i = 1; i < nmeta; i++)
    if (!strcmp(keys[morder[i]], keys[morder[i - 1]]))
      return rm_fail(ctx, RM_ERR_ARG, "%s: metadata key '%s' is given twice", path, keys[morder[i]]);
  return RM_OK;
}

/* Opens a fresh temp file next to path (O_EXCL, so two writers never share one). */
static FILE *open_temp(rm_ctx *ctx, const char *path, char *tmp, size_t tmpn) {
  int fd = -1;
  for (int k = 0; k < 1000; k++) {
    snprintf(tmp, tmpn, "%s.tmp-%ld-%d", path, (long)getpid(), k);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) break;
  }
  if (fd < 0) {
    rm_fail(ctx, RM_ERR_IO, "%s: cannot create a temporary file next to it: %s", path, strerror(errno));
    return NULL;
  }
  FILE *f = fdopen(fd, "wb");
  if (!f) {
    rm_fail(ctx, RM_ERR_IO, "%s: cannot open a temporary file: %s", path, strerror(errno));
    close(fd);
    unlink(tmp);
  }
  return f;
}

/* Removes the temp files of saves to path whose process is gone (killed mid-save):
 * "<name>.tmp-<pid>-<k>" next to path with no process <pid> on this machine. Best
 * effort: a temp file of a live process, or one that cannot be checked, stays. */
static void remove_stale_temps(const char *path) {
  char dir[4096];
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  size_t dn = slash ? (size_t)(slash - path) : 0;
  if (dn + 2 > sizeof dir) return;
  if (!slash) strcpy(dir, ".");
  else if (dn == 0) strcpy(dir, "/");
  else memcpy(dir, path, dn), dir[dn] = 0;
  DIR *d = opendir(dir);
  if (!d) return;
  size_t bn = strlen(base);
  struct dirent *e;
  while ((e = readdir(d))) {
    const char *name = e->d_name;
    if (strncmp(name, base, bn) || strncmp(name + bn, ".tmp-", 5)) continue;
    char *end;
    long pid = strtol(name + bn + 5, &end, 10);
    if (pid <= 0 || *end != '-' || pid == (long)getpid()) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
    char full[4096 + 256];
    snprintf(full, sizeof full, "%s/%s", dir, name);
    unlink(full);
  }
  closedir(d);
}

int rm_safetensors_save(rm_ctx *ctx, const char *path, int n, const char *const *names,
                        rm_tensor *const *ts, int nmeta, const char *const *keys,
                        const char *const *vals) {
  if (!path || !*path) return rm_fail(ctx, RM_ERR_ARG, "save: the path is empty");
  if (n < 0 || nmeta < 0 || (n && (!names || !ts)) || (nmeta && (!keys || !vals)))
    return rm_fail(ctx, RM_ERR_ARG, "%s: bad arguments to save", path);
  int rc = RM_OK;
  size_t tmpn = strlen(path) + 48;
  int *order = rm_host_malloc(ctx, sizeof(int) * (size_t)(n + nmeta + 1));
  char *chunk = rm_host_malloc(ctx, CHUNK_BYTES);
  char *tmp = rm_host_malloc(ctx, tmpn);
  sbuf hdr = { ctx, NULL, 0, 0, false };
  FILE *f = NULL;
  if (!order || !chunk || !tmp) {
    rc = rm_fail(ctx, RM_ERR_OOM, "%s: out of host memory", path);
    goto done;
  }
  int *morder = order + n;
  if (n) sort_by_name(order, n, names);
  if (nmeta) sort_by_name(morder, nmeta, keys);
  rc = check_save_args(ctx, path, n, names, ts, nmeta, keys, vals, order, morder);
  if (rc != RM_OK) goto done;
  build_header(&hdr, n, order, names, ts, nmeta, morder, keys, vals);
  if (hdr.oom) {
    rc = rm_fail(ctx, RM_ERR_OOM, "%s: out of host memory for the header", path);
    goto done;
  }
  f = open_temp(ctx, path, tmp, tmpn);
  if (!f) { rc = ctx->err_code; goto done; }
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hdr.len >> (8 * i));
  rc = write_all(ctx, f, len8, 8, path);
  if (rc == RM_OK) rc = write_all(ctx, f, hdr.p, hdr.len, path);
  for (int k = 0; rc == RM_OK && k < n; k++)
    rc = write_tensor(ctx, f, ts[order[k]], chunk, path, names[order[k]]);
  if (rc == RM_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0))
    rc = rm_fail(ctx, RM_ERR_IO, "%s: write failed: %s", path, strerror(errno));
  if (fclose(f) != 0 && rc == RM_OK)
    rc = rm_fail(ctx, RM_ERR_IO, "%s: write failed: %s", path, strerror(errno));
  f = NULL;
  if (rc == RM_OK && rename(tmp, path) != 0)
    rc = rm_fail(ctx, RM_ERR_IO, "%s: cannot rename the temporary file into place: %s", path,
                 strerror(errno));
  if (rc == RM_OK) sync_dir(path), remove_stale_temps(path);
  else unlink(tmp);
done:
  rm_host_free(ctx, hdr.p, hdr.cap);
  rm_host_free(ctx, tmp, tmpn);
  rm_host_free(ctx, chunk, CHUNK_BYTES);
  rm_host_free(ctx, order, sizeof(int) * (size_t)(n + nmeta + 1));
  return rc;
}

/* ---------------------------------------------------------------- reading ---- */

typedef struct st_entry {
  const char *name;
  int dt;                       /* index into st_dtypes */
  int ndim;
  int64_t shape[RM_MAX_DIM];
  uint64_t begin, end;
} st_entry;

typedef struct st_priv {
  char *hdr;
  size_t hdr_size;
  st_entry *ent;
  size_t nent, ent_cap;
  const char **kv;              /* metadata (key, value) pairs */
  size_t nmeta, kv_cap;
  size_t out_n, out_m;          /* entries allocated in the rm_safetensors arrays */
} st_priv;

static int grow(rm_ctx *ctx, void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return RM_OK;
  size_t nc = *cap ? *cap * 2 : 16;
  while (nc < need) nc *= 2;
  void *q = rm_host_realloc(ctx, *p, *cap * elem, nc * elem);
  if (!q) return rm_fail(ctx, RM_ERR_OOM, "out of host memory reading a safetensors header");
  *p = q;
  *cap = nc;
  return RM_OK;
}

static int parse_metadata(rm_json *j, st_priv *pv) {
  if (rm_json_take_null(j)) return RM_OK;
  if (rm_json_expect(j, '{') != RM_OK) return j->ctx->err_code;
  int count = 0, r;
  while ((r = rm_json_next(j, '}', &count)) > 0) {
    const char *k, *v;
    if (rm_json_string(j, &k) != RM_OK || rm_json_expect(j, ':') != RM_OK) return j->ctx->err_code;
    rm_json_skip_ws(j);
    if (j->p < j->end && *j->p != '"') return rm_json_fail(j, "a __metadata__ value is not a string");
    if (rm_json_string(j, &v) != RM_OK) return j->ctx->err_code;
    /* kept as (key, value) pairs in one array */
    if (grow(j->ctx, (void **)&pv->kv, &pv->kv_cap, 2 * pv->nmeta + 2, sizeof *pv->kv) != RM_OK)
      return j->ctx->err_code;
    pv->kv[2 * pv->nmeta] = k;
    pv->kv[2 * pv->nmeta + 1] = v;
    pv->nmeta++;
  }
  return r < 0 ? j->ctx->err_code : RM_OK;
}

/* One tensor entry: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}. */
static int parse_entry(rm_json *j, st_entry *e) {
  rm_ctx *ctx = j->ctx;
  bool have_dt = false, have_shape = false, have_off = false;
  if (rm_json_expect(j, '{') != RM_OK) return ctx->err_code;
  int count = 0, r;
  while ((r = rm_json_next(j, '}', &count)) > 0) {
    const char *key;
    if (rm_json_string(j, &key) != RM_OK || rm_json_expect(j, ':') != RM_OK) return ctx->err_code;
    if (!strcmp(key, "dtype")) {
      const char *dt;
      if (have_dt) return rm_json_fail(j, "\"dtype\" given twice");
      have_dt = true;
      if (rm_json_string(j, &dt) != RM_OK) return ctx->err_code;
      e->dt = -1;
      for (int k = 0; k < N_ST_DTYPES; k++)
        if (!strcmp(dt, st_dtypes[k].name)) e->dt = k;
      if (e->dt < 0)
        return rm_fail(ctx, RM_ERR_IO, "%s: tensor '%s' has an unknown dtype '%s'", j->path, e->name, dt);
    } else if (!strcmp(key, "shape")) {
      if (have_shape) return rm_json_fail(j, "\"shape\" given twice");
      have_shape = true;
      uint64_t v[RM_MAX_DIM];
      if (rm_json_uints(j, v, RM_MAX_DIM, &e->ndim) != RM_OK) return ctx->err_code;
      if (e->ndim > RM_MAX_DIM)
        return rm_fail(ctx, RM_ERR_IO, "%s: tensor '%s' has more than %d dimensions", j->path, e->name, RM_MAX_DIM);
      for (int d = 0; d < e->ndim; d++) e->shape[d] = (int64_t)v[d];
    } else if (!strcmp(key, "data_offsets")) {
      if (have_off) return rm_json_fail(j, "\"data_offsets\" given twice");
      have_off = true;
      uint64_t v[2];
      int n;
      if (rm_json_uints(j, v, 2, &n) != RM_OK) return ctx->err_code;
      if (n != 2) return rm_json_fail(j, "data_offsets needs exactly 2 numbers");
      e->begin = v[0];
      e->end = v[1];
    } else if (rm_json_skip_value(j, 2) != RM_OK) {
      return ctx->err_code;
    }
  }
  if (r < 0) return ctx->err_code;
  const char *missing = !have_dt ? "dtype" : !have_shape ? "shape" : !have_off ? "data_offsets" : NULL;
  if (missing)
    return rm_fail(ctx, RM_ERR_IO, "%s: tensor '%s' has no \"%s\"", j->path, e->name, missing);
  return RM_OK;
}

static int parse_header(rm_json *j, st_priv *pv) {
  bool have_meta = false;
  if (rm_json_expect(j, '{') != RM_OK) return j->ctx->err_code;
  int count = 0, r;
  while ((r = rm_json_next(j, '}', &count)) > 0) {
    const char *name;
    if (rm_json_string(j, &name) != RM_OK || rm_json_expect(j, ':') != RM_OK) return j->ctx->err_code;
    if (!strcmp(name, "__metadata__")) {
      if (have_meta) return rm_json_fail(j, "__metadata__ given twice");
      have_meta = true;
      if (parse_metadata(j, pv) != RM_OK) return j->ctx->err_code;
      continue;
    }
    if (grow(j->ctx, (void **)&pv->ent, &pv->ent_cap, pv->nent + 1, sizeof *pv->ent) != RM_OK)
      return j->ctx->err_code;
    st_entry *e = &pv->ent[pv->nent++];
    memset(e, 0, sizeof *e);
    e->name = name;
    if (parse_entry(j, e) != RM_OK) return j->ctx->err_code;
  }
  if (r < 0) return j->ctx->err_code;
  rm_json_skip_ws(j);
  if (j->p != j->end) return rm_json_fail(j, "unexpected data after the header object");
  return RM_OK;
}

static int cmp_ent_offset(const void *a, const void *b) {
  const st_entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

/* Checks one entry's shape, dtype and offsets against the data section (len bytes). */
static int check_entry(rm_ctx *ctx, const char *path, const st_entry *e, uint64_t len) {
  char shp[128];
  rm_shape_str(e->ndim, e->shape, shp, sizeof shp);
  uint64_t size = st_dtypes[e->dt].size;
  int64_t numel = 1;
  for (int d = 0; d < e->ndim; d++) {
    if (e->shape[d] && numel > INT64_MAX / e->shape[d])
      return rm_fail(ctx, RM_ERR_IO, "%s: tensor '%s' has an impossibly large shape", path, e->name);
    numel *= e->shape[d];
  }
  if ((uint64_t)numel > UINT64_MAX / size)
    return rm_fail(ctx, RM_ERR_IO, "%s: tensor '%s' has an impossibly large shape", path, e->name);
  uint64_t need = (uint64_t)numel * size;
  if (e->begin > e->end)
    return rm_fail(ctx, RM_ERR_IO, "%s: tensor '%s' has data_offsets [%llu, %llu] that end before they begin",
                   path, e->name, ULL(e->begin), ULL(e->end));
  if (e->end > len)
    return rm_fail(ctx, RM_ERR_IO,
                   "%s: tensor '%s' has data_offsets [%llu, %llu] past the end of the data (%llu bytes; truncated file?)",
                   path, e->name, ULL(e->begin), ULL(e->end), ULL(len));
  if (e->end - e->begin != need)
    return rm_fail(ctx, RM_ERR_IO,
                   "%s: tensor '%s' has data_offsets [%llu, %llu] (%llu bytes) but a %s tensor of shape %s needs %llu bytes",
                   path, e->name, ULL(e->begin), ULL(e->end), ULL(e->end - e->begin),
                   st_dtypes[e->dt].name, shp, ULL(need));
  return RM_OK;
}

/* Sorts entries by offset and checks that they tile the data section exactly (the
 * format forbids overlaps and holes), that names are distinct and dtypes loadable. */
static int check_layout(rm_ctx *ctx, const char *path, st_priv *pv, uint64_t len, int *idx,
                        const char **names, const char **keys) {
  for (size_t i = 0; i < pv->nent; i++)
    if (check_entry(ctx, path, &pv->ent[i], len) != RM_OK) return ctx->err_code;
  if (pv->nent) qsort(pv->ent, pv->nent, sizeof *pv->ent, cmp_ent_offset);
  uint64_t pos = 0;
  for (size_t i = 0; i < pv->nent; i++) {
    const st_entry *e = &pv->ent[i];
    if (e->begin < pos)
      return rm_fail(ctx, RM_ERR_IO, "%s: tensor '%s' overlaps tensor '%s' in the data", path, e->name,
                     pv->ent[i - 1].name);
    if (e->begin > pos)
      return rm_fail(ctx, RM_ERR_IO, "%s: %llu bytes before tensor '%s' belong to no tensor", path,
                     ULL(e->begin - pos), e->name);
    pos = e->end;
  }
  if (pos != len)
    return rm_fail(ctx, RM_ERR_IO, "%s: the last %llu bytes of the file belong to no tensor", path,
                   ULL(len - pos));
  int n = (int)pv->nent;
  for (int i = 0; i < n; i++) names[i] = pv->ent[i].name;
  sort_by_name(idx, n, names);
  for (int i = 1; i < n; i++)
    if (!strcmp(names[idx[i]], names[idx[i - 1]]))
      return rm_fail(ctx, RM_ERR_IO, "%s: tensor name '%s' appears twice", path, names[idx[i]]);
  int m = (int)pv->nmeta;
  sort_by_name(idx, m, keys);
  for (int i = 1; i < m; i++)
    if (!strcmp(keys[idx[i]], keys[idx[i - 1]]))
      return rm_fail(ctx, RM_ERR_IO, "%s: metadata key '%s' appears twice", path, keys[idx[i]]);
  for (int i = 0; i < n; i++) {
    const st_entry *e = &pv->ent[i];
    if (st_dtypes[e->dt].remat < 0)
      return rm_fail(ctx, RM_ERR_DTYPE, "%s: tensor '%s' has dtype %s, which remat cannot load (F32, F64, F16, BF16, integers, BOOL)",
                     path, e->name, st_dtypes[e->dt].name);
  }
  return RM_OK;
}

static float half_to_float(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu, bits;
  if (e == 0) {
    float v = (float)m * (1.0f / 16777216.0f); /* zero or subnormal: m * 2^-24 */
    return s ? -v : v;
  }
  if (e == 31) bits = s | 0x7F800000u | (m << 13);
  else bits = s | ((e + 112) << 23) | (m << 13);
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static float bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* Reads an integer or boolean entry (little-endian) into t's int32/int64 values. */
static int read_integers(rm_ctx *ctx, FILE *f, const char *path, const st_entry *e, rm_tensor *t,
                         uint16_t *chunk) {
  const char *dt = st_dtypes[e->dt].name;
  unsigned size = st_dtypes[e->dt].size;
  bool is_signed = dt[0] == 'I';
  unsigned char *buf = (unsigned char *)chunk;
  void *dst = rm_tensor_ptr(t);
  uint64_t n = (e->end - e->begin) / size, done = 0, per = CHUNK_BYTES / size;
  while (done < n) {
    size_t k = (size_t)(n - done < per ? n - done : per);
    if (fread(buf, size, k, f) != k)
      return rm_fail(ctx, RM_ERR_IO, "%s: the file ended inside tensor '%s' (did it change while loading?)",
                     path, e->name);
    for (size_t i = 0; i < k; i++) {
      uint64_t u = 0;
      for (unsigned b = 0; b < size; b++) u |= (uint64_t)buf[i * size + b] << (8 * b);
      int64_t v;
      if (is_signed) {
        /* sign-extend from size bytes */
        uint64_t sign = (uint64_t)1 << (8 * size - 1);
        v = size == 8 ? (int64_t)u : (int64_t)((u ^ sign) - sign);
      } else {
        if (u > (uint64_t)INT64_MAX)
          return rm_fail(ctx, RM_ERR_DTYPE, "%s: tensor '%s' (%s) holds %llu at element %llu, beyond int64's range",
                         path, e->name, dt, ULL(u), ULL(done + i + 1));
        v = (int64_t)u;
      }
      rm_store_i64(dst, t->dtype, (int64_t)(done + i), v);
    }
    done += k;
  }
  return RM_OK;
}

/* Reads one entry's bytes (at file offset `at`) into t, converting 16-bit floats. */
static int read_entry(rm_ctx *ctx, FILE *f, const char *path, const st_entry *e, uint64_t at,
                      rm_tensor *t, uint16_t *chunk) {
  uint64_t bytes = e->end - e->begin;
  if (!bytes) return RM_OK;
  if (fseeko(f, (off_t)at, SEEK_SET) != 0)
    return rm_fail(ctx, RM_ERR_IO, "%s: cannot seek to tensor '%s': %s", path, e->name, strerror(errno));
  const char *dt = st_dtypes[e->dt].name;
  bool half = !strcmp(dt, "F16"), bf = !strcmp(dt, "BF16");
  if (dt[0] == 'I' || dt[0] == 'U' || !strcmp(dt, "BOOL")) return read_integers(ctx, f, path, e, t, chunk);
  if (!half && !bf) {
    if (fread(rm_tensor_ptr(t), 1, bytes, f) != bytes)
      return rm_fail(ctx, RM_ERR_IO, "%s: the file ended inside tensor '%s' (did it change while loading?)",
                     path, e->name);
    return RM_OK;
  }
  float *dst = rm_tensor_ptr(t);
  uint64_t n = bytes / 2, done = 0, per = CHUNK_BYTES / 2;
  while (done < n) {
    size_t k = (size_t)(n - done < per ? n - done : per);
    if (fread(chunk, 2, k, f) != k)
      return rm_fail(ctx, RM_ERR_IO, "%s: the file ended inside tensor '%s' (did it change while loading?)",
                     path, e->name);
    for (size_t i = 0; i < k; i++) dst[done + i] = half ? half_to_float(chunk[i]) : bf16_to_float(chunk[i]);
    done += k;
  }
  return RM_OK;
}

/* Allocates out's arrays and tensors, then reads every tensor's data. */
static int load_data(rm_ctx *ctx, FILE *f, const char *path, rm_category cat, uint64_t data_at,
                     uint64_t data_len, rm_safetensors *out, st_priv *pv) {
  size_t n = pv->nent, m = pv->nmeta, nidx = (n > m ? n : m) + 1;
  pv->out_n = n;
  pv->out_m = m;
  out->names = rm_host_calloc(ctx, n + 1, sizeof *out->names);
  out->tensors = rm_host_calloc(ctx, n + 1, sizeof *out->tensors);
  out->file_dtype = rm_host_calloc(ctx, n + 1, sizeof *out->file_dtype);
  out->keys = rm_host_calloc(ctx, m + 1, sizeof *out->keys);
  out->vals = rm_host_calloc(ctx, m + 1, sizeof *out->vals);
  int *idx = rm_host_malloc(ctx, sizeof(int) * nidx);
  uint16_t *chunk = rm_host_malloc(ctx, CHUNK_BYTES);
  int rc = RM_OK;
  if (!out->names || !out->tensors || !out->file_dtype || !out->keys || !out->vals || !idx || !chunk)
    rc = rm_fail(ctx, RM_ERR_OOM, "%s: out of host memory", path);
  for (size_t i = 0; rc == RM_OK && i < m; i++) {
    out->keys[i] = pv->kv[2 * i];
    out->vals[i] = pv->kv[2 * i + 1];
  }
  if (rc == RM_OK) rc = check_layout(ctx, path, pv, data_len, idx, out->names, out->keys);
  rm_host_free(ctx, idx, sizeof(int) * nidx);
  if (rc == RM_OK) out->nmeta = (int)m;
  for (size_t i = 0; rc == RM_OK && i < n; i++) {
    const st_entry *e = &pv->ent[i];
    out->file_dtype[i] = st_dtypes[e->dt].name;
    out->tensors[i] = rm_tensor_new(ctx, (rm_dtype)st_dtypes[e->dt].remat, RM_CPU, e->ndim, e->shape, cat);
    if (!out->tensors[i]) { rc = rm_fail_prefix(ctx, path); break; }
    out->n = (int)i + 1;
    rc = read_entry(ctx, f, path, e, data_at + e->begin, out->tensors[i], chunk);
  }
  rm_host_free(ctx, chunk, CHUNK_BYTES);
  return rc;
}

void rm_safetensors_free(rm_ctx *ctx, rm_safetensors *f) {
  st_priv *pv = f->priv_;
  if (f->tensors)
    for (int i = 0; i < f->n; i++)
      if (f->tensors[i]) rm_tensor_drop(ctx, f->tensors[i]);
  if (pv) {
    size_t n = pv->out_n + 1, m = pv->out_m + 1;
    rm_host_free(ctx, f->names, n * sizeof *f->names);
    rm_host_free(ctx, f->tensors, n * sizeof *f->tensors);
    rm_host_free(ctx, f->file_dtype, n * sizeof *f->file_dtype);
    rm_host_free(ctx, f->keys, m * sizeof *f->keys);
    rm_host_free(ctx, f->vals, m * sizeof *f->vals);
    rm_host_free(ctx, pv->ent, pv->ent_cap * sizeof *pv->ent);
    rm_host_free(ctx, pv->kv, pv->kv_cap * sizeof *pv->kv);
    rm_host_free(ctx, pv->hdr, pv->hdr_size + 1);
    rm_host_free(ctx, pv, sizeof *pv);
  }
  memset(f, 0, sizeof *f);
}

static uint64_t le64(const unsigned char *b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
  return v;
}

/* Opens path and reads + parses its header into pv; sets *data_at, *data_len. */
static int read_header(rm_ctx *ctx, FILE *f, const char *path, st_priv *pv, uint64_t *data_at,
                       uint64_t *data_len) {
  struct stat st;
  if (fstat(fileno(f), &st) != 0)
    return rm_fail(ctx, RM_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode)) return rm_fail(ctx, RM_ERR_IO, "%s: not a regular file", path);
  uint64_t size = (uint64_t)st.st_size;
  unsigned char len8[8];
  if (size < 8 || fread(len8, 1, 8, f) != 8)
    return rm_fail(ctx, RM_ERR_IO, "%s: not a safetensors file: %llu bytes, too short for the 8-byte header length",
                   path, ULL(size));
  uint64_t hn = le64(len8);
  if (hn > RM_ST_MAX_HEADER)
    return rm_fail(ctx, RM_ERR_IO, "%s: header length %llu is over the %u-byte limit (not a safetensors file, or corrupted)",
                   path, ULL(hn), RM_ST_MAX_HEADER);
  if (hn > size - 8)
    return rm_fail(ctx, RM_ERR_IO, "%s: header length %llu is more than the %llu bytes that follow it (truncated file?)",
                   path, ULL(hn), ULL(size - 8));
  if (hn < 2) return rm_fail(ctx, RM_ERR_IO, "%s: header length %llu is too short for a header", path, ULL(hn));
  pv->hdr = rm_host_malloc(ctx, (size_t)hn + 1);
  if (!pv->hdr) return rm_fail(ctx, RM_ERR_OOM, "%s: out of host memory for a %llu-byte header", path, ULL(hn));
  pv->hdr_size = (size_t)hn;
  if (fread(pv->hdr, 1, (size_t)hn, f) != hn)
    return rm_fail(ctx, RM_ERR_IO, "%s: the file ended inside the header", path);
  pv->hdr[hn] = 0;
  size_t ok = rm_utf8_valid_prefix((const unsigned char *)pv->hdr, (size_t)hn);
  if (ok != hn)
    return rm_fail(ctx, RM_ERR_IO, "%s: corrupted header: invalid UTF-8 at byte %llu", path, ULL(8 + ok));
  rm_json j = { ctx, path, pv->hdr, pv->hdr + hn, pv->hdr, 8 };
  if (parse_header(&j, pv) != RM_OK) return ctx->err_code;
  *data_at = 8 + hn;
  *data_len = size - 8 - hn;
  return RM_OK;
}

int rm_safetensors_load(rm_ctx *ctx, const char *path, rm_category cat, rm_safetensors *out) {
  memset(out, 0, sizeof *out);
  if (!path || !*path) return rm_fail(ctx, RM_ERR_ARG, "load: the path is empty");
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (errno == ENOENT) return rm_fail(ctx, RM_ERR_IO, "%s: no such file", path);
    return rm_fail(ctx, RM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  }
  st_priv *pv = rm_host_calloc(ctx, 1, sizeof *pv);
  int rc;
  if (!pv) {
    rc = rm_fail(ctx, RM_ERR_OOM, "%s: out of host memory", path);
  } else {
    out->priv_ = pv;
    uint64_t data_at = 0, data_len = 0;
    rc = read_header(ctx, f, path, pv, &data_at, &data_len);
    if (rc == RM_OK) rc = load_data(ctx, f, path, cat, data_at, data_len, out, pv);
  }
  fclose(f);
  if (rc != RM_OK) rm_safetensors_free(ctx, out);
  return rc;
}
