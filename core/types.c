/* Names and sizes of dtypes, devices and categories. */
#include <stdio.h>
#include <string.h>

#include "types.h"

static const char *const dtype_names[RM_DTYPE_COUNT] = { "float32", "float64", "bfloat16", "float16" };
static const size_t dtype_sizes[RM_DTYPE_COUNT] = { 4, 8, 2, 2 };
static const char *const device_names[RM_DEVICE_COUNT] = { "cpu", "cuda" };
static const char *const category_names[RM_CAT_COUNT] = {
  "param", "grad", "optim", "activation", "workspace", "temp", "data"
};

const char *rm_dtype_name(rm_dtype d) { return (unsigned)d < RM_DTYPE_COUNT ? dtype_names[d] : "?"; }
size_t rm_dtype_size(rm_dtype d) { return (unsigned)d < RM_DTYPE_COUNT ? dtype_sizes[d] : 0; }
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
