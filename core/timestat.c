/* Learned times: a timer's samples, less its spikes, averaged (see timestat.h). */
#include <stdlib.h>

#include "timestat.h"

void rm_timestat_add(rm_ctx *ctx, rm_timestat *s, double seconds) {
  if (s->n == s->cap && s->cap < RM_TIMESTAT_CAP) {
    int32_t cap = s->cap ? 2 * s->cap : 16;
    float *v = rm_host_realloc(ctx, s->v, sizeof *v * (size_t)s->cap, sizeof *v * (size_t)cap);
    if (!v) return;
    s->v = v;
    s->cap = cap;
  }
  if (s->n < s->cap) s->v[s->n++] = (float)seconds;
  else s->v[s->count % s->cap] = (float)seconds;
  s->count++;
  s->dirty = true;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

double rm_timestat_value(rm_timestat *s) {
  if (!s->n) return 0;
  if (s->dirty) {
    qsort(s->v, (size_t)s->n, sizeof *s->v, cmp_float);
    int32_t h = s->n / 2;
    double median = s->n % 2 ? s->v[h] : 0.5 * ((double)s->v[h - 1] + (double)s->v[h]), sum = 0;
    int32_t k = 0;
    for (; k < s->n && s->v[k] <= RM_TIMESTAT_SPIKE * median; k++) sum += s->v[k];
    s->value = sum / k;
    s->dirty = false;
  }
  return s->value;
}

void rm_timestat_clear(rm_timestat *s) {
  s->n = 0;
  s->count = 0;
  s->value = 0;
  s->dirty = false;
}

void rm_timestat_free(rm_ctx *ctx, rm_timestat *s) {
  rm_host_free(ctx, s->v, sizeof *s->v * (size_t)s->cap);
  *s = (rm_timestat){ 0 };
}
