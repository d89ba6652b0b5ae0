/* Names and sizes of dtypes, devices and categories. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "types.h"

static const char *const dtype_names[RM_DTYPE_COUNT] = { "float32", "float64", "bfloat16", "float16", "int32", "int64" };
static const size_t dtype_sizes[RM_DTYPE_COUNT] = { 4, 8, 2, 2, 4, 8 };
static const char *const device_names[RM_DEVICE_COUNT] = { "cpu", "cuda" };
static const char *const category_names[RM_CAT_COUNT] = {
  "param", "grad", "optim", "activation", "workspace", "temp", "data"
};

const char *rm_dtype_name(rm_dtype d) { return (unsigned)d < RM_DTYPE_COUNT ? dtype_names[d] : "?"; }

static const struct { const char *name; rm_dtype dtype; } dtype_aliases[] = {
  { "float", RM_F32 }, { "double", RM_F64 }, { "half", RM_F16 }, { "bf16", RM_BF16 },
  { "int", RM_I32 }, { "long", RM_I64 },
};

bool rm_dtype_parse(const char *s, rm_dtype *out) {
  for (int d = 0; d < RM_DTYPE_COUNT; d++)
    if (!strcmp(s, dtype_names[d])) return *out = (rm_dtype)d, true;
  for (size_t i = 0; i < sizeof dtype_aliases / sizeof dtype_aliases[0]; i++)
    if (!strcmp(s, dtype_aliases[i].name)) return *out = dtype_aliases[i].dtype, true;
  return false;
}

const char *rm_dtype_alias(int i, rm_dtype *d) {
  if (i < 0 || (size_t)i >= sizeof dtype_aliases / sizeof dtype_aliases[0]) return NULL;
  *d = dtype_aliases[i].dtype;
  return dtype_aliases[i].name;
}
size_t rm_dtype_size(rm_dtype d) { return (unsigned)d < RM_DTYPE_COUNT ? dtype_sizes[d] : 0; }

bool rm_float_to_int(double v, rm_dtype dt, int64_t *out) {
  /* the bounds are powers of two, exact in a double: -2^63 <= v < 2^63 (-2^31, 2^31) */
  double lo = dt == RM_I32 ? -2147483648.0 : -9223372036854775808.0;
  double t = trunc(v);
  if (!(t >= lo && t < -lo)) return false; /* NaN fails both tests */
  *out = (int64_t)t;
  return true;
}

double rm_load_f64(const void *p, rm_dtype dt, int64_t off) {
  switch (dt) {
  case RM_F64: return ((const double *)p)[off];
  case RM_I32: return ((const int32_t *)p)[off];
  case RM_I64: return (double)((const int64_t *)p)[off];
  default: return ((const float *)p)[off];
  }
}

int64_t rm_load_i64(const void *p, rm_dtype dt, int64_t off) {
  switch (dt) {
  case RM_I32: return ((const int32_t *)p)[off];
  case RM_I64: return ((const int64_t *)p)[off];
  default: return (int64_t)rm_load_f64(p, dt, off);
  }
}

void rm_store_f64(void *p, rm_dtype dt, int64_t off, double v) {
  switch (dt) {
  case RM_F64: ((double *)p)[off] = v; break;
  case RM_I32: ((int32_t *)p)[off] = (int32_t)v; break;
  case RM_I64: ((int64_t *)p)[off] = (int64_t)v; break;
  default: ((float *)p)[off] = (float)v; break;
  }
}

void rm_store_i64(void *p, rm_dtype dt, int64_t off, int64_t v) {
  switch (dt) {
  case RM_I32: ((int32_t *)p)[off] = (int32_t)v; break;
  case RM_I64: ((int64_t *)p)[off] = v; break;
  default: rm_store_f64(p, dt, off, (double)v); break;
  }
}

const char *rm_device_name(rm_device d) { return (unsigned)d < RM_DEVICE_COUNT ? device_names[d] : "?"; }
const char *rm_category_name(rm_category c) { return (unsigned)c < RM_CAT_COUNT ? category_names[c] : "?"; }

/* Saturates at INT64_MAX: infer steps may meet shapes whose product does not fit, and
 * rm_op_run refuses those outputs by that value. */
int64_t rm_meta_numel(const rm_meta *m) {
  int64_t n = 1;
  for (int i = 0; i < m->ndim; i++)
    if (__builtin_mul_overflow(n, m->shape[i], &n)) return INT64_MAX;
  return n;
}

char *rm_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
  if (ndim == 0) { snprintf(buf, n, "scalar"); return buf; }
  size_t at = 0;
  buf[0] = 0;
  for (int i = 0; i < ndim && at < n; i++)
    at += (size_t)snprintf(buf + at, n - at, i ? "x%lld" : "%lld", (long long)shape[i]);
  return buf;
}
