/* IDX reading (zlib), row gathering, windows and random permutations. */
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "dataset.h"
#include "philox.h"

#define IDX_CHUNK ((size_t)1 << 20)
#define IDX_MAX_ELEMS ((uint64_t)1 << 32)

/* Reads exactly n bytes (gzread takes an int count); returns the bytes read, or -1. */
static int64_t gz_read_all(gzFile gz, void *buf, size_t n) {
  size_t done = 0;
  while (done < n) {
    size_t want = n - done > (size_t)INT_MAX / 2 ? (size_t)INT_MAX / 2 : n - done;
    int got = gzread(gz, (char *)buf + done, (unsigned)want);
    if (got < 0) return -1;
    if (got == 0) break;
    done += (size_t)got;
  }
  return (int64_t)done;
}

static int gz_fail(rm_ctx *ctx, gzFile gz, const char *path, const char *what) {
  int zerr = 0;
  const char *msg = gzerror(gz, &zerr);
  if (zerr == Z_ERRNO) msg = strerror(errno);
  size_t pn = strlen(path);
  if (msg && !strncmp(msg, path, pn) && !strncmp(msg + pn, ": ", 2)) msg += pn + 2; /* zlib names it too */
  return rm_fail(ctx, RM_ERR_IO, "%s: %s (%s)", path, what, msg && *msg ? msg : "read error");
}

/* Reads the magic and dims; sets *items, *per_item, *is_images. */
static int idx_header(rm_ctx *ctx, gzFile gz, const char *path, uint64_t *items,
                      uint64_t *per_item, bool *is_images) {
  unsigned char h[16];
  int64_t got = gz_read_all(gz, h, 4);
  if (got < 0) return gz_fail(ctx, gz, path, "cannot read the IDX header");
  if (got < 4) return rm_fail(ctx, RM_ERR_IO, "%s: too short for an IDX file", path);
  uint32_t magic = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
  if (magic != 0x801 && magic != 0x803)
    return rm_fail(ctx, RM_ERR_IO,
                   "%s: not an unsigned-byte IDX file of labels (magic 0x00000801) or images (0x00000803): magic is 0x%08x",
                   path, magic);
  int ndim = (int)(magic & 0xff);
  got = gz_read_all(gz, h, (size_t)ndim * 4);
  if (got < 0) return gz_fail(ctx, gz, path, "cannot read the IDX header");
  if (got < ndim * 4) return rm_fail(ctx, RM_ERR_IO, "%s: the file ends inside the IDX header", path);
  uint64_t dims[3];
  for (int d = 0; d < ndim; d++)
    dims[d] = (uint64_t)h[4 * d] << 24 | (uint64_t)h[4 * d + 1] << 16 | (uint64_t)h[4 * d + 2] << 8 |
              h[4 * d + 3];
  *items = dims[0];
  *per_item = ndim == 3 ? dims[1] * dims[2] : 1;
  *is_images = ndim == 3;
  /* each factor first: their product may wrap */
  if (*items > IDX_MAX_ELEMS || *per_item > IDX_MAX_ELEMS ||
      (*per_item && *items > IDX_MAX_ELEMS / *per_item))
    return rm_fail(ctx, RM_ERR_IO, "%s: implausible IDX dimensions (%llu items of %llu bytes)", path,
                   (unsigned long long)*items, (unsigned long long)*per_item);
  return RM_OK;
}

rm_tensor *rm_idx_read(rm_ctx *ctx, const char *path, int64_t limit, rm_category cat) {
  struct stat st;
  if (stat(path, &st) != 0) {
    if (errno == ENOENT) rm_fail(ctx, RM_ERR_IO, "%s not found", path);
    else rm_fail(ctx, RM_ERR_IO, "%s: %s", path, strerror(errno));
    return NULL;
  }
  gzFile gz = gzopen(path, "rb");
  if (!gz) {
    rm_fail(ctx, RM_ERR_IO, "%s: cannot open: %s", path, strerror(errno ? errno : ENOMEM));
    return NULL;
  }
  uint64_t items = 0, per = 0;
  bool images = false;
  rm_tensor *t = NULL;
  unsigned char *buf = NULL;
  if (idx_header(ctx, gz, path, &items, &per, &images) != RM_OK) goto fail;
  bool limited = limit > 0 && (uint64_t)limit < items;
  if (limited) items = (uint64_t)limit;
  int64_t shape[2] = { (int64_t)items, (int64_t)per };
  /* images: float32 in [0, 1]; labels: int64 class indices 1..K */
  t = rm_tensor_new(ctx, images ? RM_F32 : RM_I64, RM_CPU, images ? 2 : 1, shape, cat);
  if (!t) { rm_fail_prefix(ctx, path); goto fail; }
  buf = rm_host_malloc(ctx, IDX_CHUNK);
  if (!buf) { rm_fail(ctx, RM_ERR_OOM, "%s: out of host memory", path); goto fail; }
  float *dst = rm_tensor_ptr(t);
  int64_t *lab = rm_tensor_ptr(t);
  uint64_t total = items * per, done = 0;
  while (done < total) {
    size_t want = total - done < IDX_CHUNK ? (size_t)(total - done) : IDX_CHUNK;
    int64_t got = gz_read_all(gz, buf, want);
    if (got < 0) { gz_fail(ctx, gz, path, "cannot read the data"); goto fail; }
    if ((size_t)got < want) {
      rm_fail(ctx, RM_ERR_IO, "%s: truncated: the header promises %llu items, the data ends inside item %llu", path,
              (unsigned long long)items, (unsigned long long)((done + (uint64_t)got) / per + 1));
      goto fail;
    }
    if (images)
      for (size_t i = 0; i < want; i++) dst[done + i] = (float)buf[i] * (1.0f / 255.0f);
    else
      for (size_t i = 0; i < want; i++) lab[done + i] = (int64_t)buf[i] + 1;
    done += want;
  }
  if (!limited) {
    /* Read past the end: this checks the gzip trailer (CRC, length) and finds data
     * the header does not account for. */
    int extra = gzread(gz, buf, 1);
    int zerr = Z_OK;
    gzerror(gz, &zerr);
    if (extra < 0 || zerr != Z_OK) { gz_fail(ctx, gz, path, "corrupted or truncated file"); goto fail; }
    if (extra > 0) {
      rm_fail(ctx, RM_ERR_IO, "%s: data continues after the %llu items the header promises", path,
              (unsigned long long)items);
      goto fail;
    }
  }
  rm_host_free(ctx, buf, IDX_CHUNK);
  gzclose(gz);
  return t;
fail:
  rm_host_free(ctx, buf, IDX_CHUNK);
  if (t) rm_tensor_drop(ctx, t);
  gzclose(gz);
  return NULL;
}

/* True when each row of t (dims 1..) is one contiguous block. */
static bool rows_contiguous(const rm_tensor *t) {
  int64_t s = 1;
  for (int d = t->ndim - 1; d >= 1; d--) {
    if (t->shape[d] != 1 && t->stride[d] != s) return false;
    s *= t->shape[d];
  }
  return true;
}

rm_tensor *rm_take_rows(rm_ctx *ctx, rm_tensor *src, const int64_t *rows, int64_t first,
                        int64_t n, rm_category cat) {
  char shp[64];
  if (src->device != RM_CPU) {
    rm_fail(ctx, RM_ERR_DEVICE, "take_rows: the source is a %s tensor; datasets live on the CPU",
            rm_device_name(src->device));
    return NULL;
  }
  if (src->ndim < 1) {
    rm_fail(ctx, RM_ERR_SHAPE, "take_rows: the source is a scalar; it needs a first dimension");
    return NULL;
  }
  if (n < 0) {
    rm_fail(ctx, RM_ERR_ARG, "take_rows: negative row count %lld", (long long)n);
    return NULL;
  }
  int64_t N = src->shape[0];
  for (int64_t k = 0; k < n; k++) {
    int64_t r = rows ? rows[k] : first + k;
    if (r < 0 || r >= N) {
      rm_fail(ctx, RM_ERR_ARG, "take_rows: row %lld is out of range for a source of size %s",
              (long long)(r + 1), rm_tensor_shape_str(src, shp, sizeof shp));
      return NULL;
    }
  }
  if (rm_tensor_data_ready(ctx, src) != RM_OK) return NULL;
  int64_t shape[RM_MAX_DIM];
  memcpy(shape, src->shape, sizeof shape);
  shape[0] = n;
  rm_tensor *out = rm_tensor_new(ctx, src->dtype, RM_CPU, src->ndim, shape, cat);
  if (!out) return NULL;
  size_t es = rm_dtype_size(src->dtype);
  int64_t per = 1;
  for (int d = 1; d < src->ndim; d++) per *= src->shape[d];
  if (n == 0 || per == 0) return out;
  const char *base = rm_tensor_ptr(src);
  char *dst = rm_tensor_ptr(out);
  if (!base || !dst) return out; /* dry run: phantom storages */
  bool fast = rows_contiguous(src);
#pragma omp parallel for if (n * per > 1 << 20)
  for (int64_t k = 0; k < n; k++) {
    int64_t r = rows ? rows[k] : first + k;
    const char *from = base + (size_t)(r * src->stride[0]) * es;
    char *to = dst + (size_t)(k * per) * es;
    if (fast) { memcpy(to, from, (size_t)per * es); continue; }
    int64_t idx[RM_MAX_DIM] = { 0 }, off = 0;
    for (int64_t e = 0; e < per; e++) {
      memcpy(to + (size_t)e * es, from + off * (int64_t)es, es);
      for (int d = src->ndim - 1; d >= 1; d--) {
        off += src->stride[d];
        if (++idx[d] < src->shape[d]) break;
        off -= src->stride[d] * src->shape[d];
        idx[d] = 0;
      }
    }
  }
  return out;
}

rm_tensor *rm_windows(rm_ctx *ctx, rm_tensor *src, int64_t len) {
  if (src->ndim != 1) {
    char shp[64];
    rm_fail(ctx, RM_ERR_SHAPE, "windows: expected a 1-D tensor, got size %s", rm_tensor_shape_str(src, shp, sizeof shp));
    return NULL;
  }
  if (len < 1 || len > src->shape[0]) {
    rm_fail(ctx, RM_ERR_ARG, "windows: a window of %lld does not fit in %lld elements", (long long)len,
            (long long)src->shape[0]);
    return NULL;
  }
  if (rm_tensor_data_ready(ctx, src) != RM_OK) return NULL;
  int64_t shape[2] = { src->shape[0] - len + 1, len }, stride[2] = { src->stride[0], src->stride[0] };
  return rm_tensor_view_of(ctx, src, 2, shape, stride, src->offset);
}

/* Draw e (0-based) of a call at generator offset off: 64 random bits from two
 * Philox lanes, the layout rm_rand_normal uses, so offsets advance the same way. */
static uint64_t draw64(uint64_t seed, uint64_t off, int64_t e) {
  uint32_t r[4];
  rm_philox(off / 4 + (uint64_t)e / 2, seed, r);
  int l = (int)(e % 2) * 2;
  return (uint64_t)r[l] << 32 | r[l + 1];
}

/* Uniform in [0, n) from 64 random bits (multiply-shift; bias below 2^-30 here). */
static int64_t below(uint64_t bits, uint64_t n) {
  return (int64_t)(((unsigned __int128)bits * n) >> 64);
}

static void advance(rm_ctx *ctx, int64_t draws) {
  ctx->rng_offset += rm_philox_advance(draws);
}

int rm_randperm(rm_ctx *ctx, int64_t n, int64_t *perm) {
  if (n < 0) return rm_fail(ctx, RM_ERR_ARG, "randperm: negative size %lld", (long long)n);
  uint64_t seed = ctx->rng_seed, off = ctx->rng_offset;
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = below(draw64(seed, off, n - 1 - i), (uint64_t)i + 1);
    int64_t tmp = perm[i];
    perm[i] = perm[j];
    perm[j] = tmp;
  }
  advance(ctx, n);
  return RM_OK;
}

int rm_randint(rm_ctx *ctx, int64_t n, int64_t k, int64_t *out) {
  if (n < 1) return rm_fail(ctx, RM_ERR_ARG, "randint: the range [1, %lld] is empty", (long long)n);
  if (k < 0) return rm_fail(ctx, RM_ERR_ARG, "randint: negative count %lld", (long long)k);
  uint64_t seed = ctx->rng_seed, off = ctx->rng_offset;
  for (int64_t i = 0; i < k; i++) out[i] = below(draw64(seed, off, i), (uint64_t)n);
  advance(ctx, k);
  return RM_OK;
}
