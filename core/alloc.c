/* The accounted allocator: every storage is tagged with a category, live and peak
 * bytes are kept per category and device, and the limit is enforced everywhere. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "alloc.h"

char *rm_format_bytes(size_t b, char *buf, size_t n) {
  static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
  double v = (double)b;
  int u = 0;
  while (v >= 1024.0 && u < 4) { v /= 1024.0; u++; }
  if (u == 0) snprintf(buf, n, "%zu B", b);
  else snprintf(buf, n, "%.2f %s", v, units[u]);
  return buf;
}

bool rm_parse_bytes(const char *s, size_t *out) {
  if (!s) return false;
  while (isspace((unsigned char)*s)) s++;
  char *end;
  double v = strtod(s, &end);
  if (end == s || v < 0 || v != v) return false;
  while (isspace((unsigned char)*end)) end++;
  char unit[8] = { 0 };
  size_t k = 0;
  while (*end && !isspace((unsigned char)*end) && k < sizeof unit - 1)
    unit[k++] = (char)tolower((unsigned char)*end++);
  while (isspace((unsigned char)*end)) end++;
  if (*end) return false;
  double mul;
  if (!strcmp(unit, "") || !strcmp(unit, "b")) mul = 1;
  else if (!strcmp(unit, "k") || !strcmp(unit, "kib")) mul = 1024.0;
  else if (!strcmp(unit, "kb")) mul = 1e3;
  else if (!strcmp(unit, "m") || !strcmp(unit, "mib")) mul = 1024.0 * 1024;
  else if (!strcmp(unit, "mb")) mul = 1e6;
  else if (!strcmp(unit, "g") || !strcmp(unit, "gib")) mul = 1024.0 * 1024 * 1024;
  else if (!strcmp(unit, "gb")) mul = 1e9;
  else if (!strcmp(unit, "t") || !strcmp(unit, "tib")) mul = 1024.0 * 1024 * 1024 * 1024;
  else if (!strcmp(unit, "tb")) mul = 1e12;
  else return false;
  double r = v * mul;
  if (r > 1.8e19) return false;
  *out = (size_t)(r + 0.5);
  return true;
}

static int oom_error(rm_ctx *ctx, rm_device dev, rm_category cat, size_t bytes,
                     const char *why) {
  rm_memstats *m = &ctx->mem[dev];
  char req[32], lim[32], live[32], part[64];
  char list[512] = "";
  size_t at = 0;
  for (int c = 0; c < RM_CAT_COUNT; c++) {
    if (!m->live[c]) continue;
    snprintf(part, sizeof part, "%s%s %s", at ? ", " : "", rm_category_name((rm_category)c),
             rm_format_bytes(m->live[c], live, sizeof live));
    at += (size_t)snprintf(list + at, sizeof list - at, "%s", part);
    if (at >= sizeof list) break;
  }
  rm_format_bytes(m->live_total, live, sizeof live);
  if (m->limit)
    rm_format_bytes(m->limit, lim, sizeof lim);
  else
    snprintf(lim, sizeof lim, "none");
  return rm_fail(ctx, RM_ERR_OOM,
                 "out of memory on %s: %s (%s) for %s; live %s (%s); limit %s",
                 rm_device_name(dev), why, rm_format_bytes(bytes, req, sizeof req),
                 rm_category_name(cat), live, at ? list : "nothing", lim);
}

int rm_memory_room(rm_ctx *ctx, rm_device dev, rm_category cat, double bytes) {
  rm_memstats *m = &ctx->mem[dev];
  if (!m->limit || bytes <= (double)m->limit - (double)m->live_total) return RM_OK;
  return oom_error(ctx, dev, cat, bytes < 1e18 ? (size_t)bytes : (size_t)1e18, "host scratch past the limit");
}

/* Returns NULL (error set) when over the limit or the device refuses. */
static void *try_alloc(rm_ctx *ctx, const rm_backend *b, rm_device dev, rm_category cat,
                       size_t bytes, bool phantom, bool *over) {
  rm_memstats *m = &ctx->mem[dev];
  *over = false;
  if (m->limit && m->live_total + bytes > m->limit) {
    *over = true;
    oom_error(ctx, dev, cat, bytes, "allocation past the limit");
    return NULL;
  }
  if (phantom) return (void *)1; /* accounted, never touched */
  void *p = b->malloc(ctx, bytes ? bytes : 1);
  if (!p) {
    *over = true;
    oom_error(ctx, dev, cat, bytes, "the device could not allocate");
  }
  return p;
}

static rm_storage *storage_new(rm_ctx *ctx, rm_device dev, rm_category cat, size_t bytes,
                               bool phantom) {
  const rm_backend *b = rm_backend_get(ctx, dev);
  if (!b) return NULL;
  rm_memstats *m = &ctx->mem[dev];
  m->n_allocs++;
  if (m->fail_at && --m->fail_at == 0) {
    oom_error(ctx, dev, cat, bytes, "injected failure (fail_at)");
    return NULL;
  }
  rm_storage *s = rm_host_malloc(ctx, sizeof *s);
  if (!s) {
    rm_fail(ctx, RM_ERR_OOM, "out of host memory for a storage header");
    return NULL;
  }
  bool over;
  void *p = try_alloc(ctx, b, dev, cat, bytes, phantom, &over);
  if (!p && over && ctx->reclaim && ctx->reclaim(ctx->reclaim_ud))
    p = try_alloc(ctx, b, dev, cat, bytes, phantom, &over);
  if (!p) {
    rm_host_free(ctx, s, sizeof *s);
    return NULL;
  }
  s->refcount = 1;
  s->device = dev;
  s->category = cat;
  s->bytes = bytes;
  s->phantom = phantom;
  s->data = s->phantom ? NULL : p;
  s->epoch = ctx->dry ? ctx->dry_epoch : 0;
  if (s->epoch) ctx->dry_live[dev][cat] += bytes;
  m->live[cat] += bytes;
  m->live_total += bytes;
  m->reserved = b->reserved ? b->reserved(ctx) : m->reserved + bytes;
  if (m->live[cat] > m->peak[cat]) m->peak[cat] = m->live[cat];
  s->version = 0;
  if (m->live_total > m->peak_total) {
    m->peak_total = m->live_total;
    memcpy(m->peak_live, m->live, sizeof m->peak_live);
  }
  s->tag = -1;
  if (rm_hooked(ctx, RM_HOOK_ALLOC)) rm_hook_fire(ctx, RM_HOOK_ALLOC, &(rm_event){ .storage = s });
  return s;
}

rm_storage *rm_storage_new(rm_ctx *ctx, rm_device dev, rm_category cat, size_t bytes) {
  return storage_new(ctx, dev, cat, bytes, false);
}

rm_storage *rm_storage_new_dry(rm_ctx *ctx, rm_device dev, rm_category cat, size_t bytes) {
  return storage_new(ctx, dev, cat, bytes, ctx->dry);
}

void rm_storage_retain(rm_storage *s) { s->refcount++; }

void rm_storage_release(rm_ctx *ctx, rm_storage *s) {
  if (!s || --s->refcount > 0) return;
  const rm_backend *b = ctx->backend[s->device];
  if (rm_hooked(ctx, RM_HOOK_FREE)) rm_hook_fire(ctx, RM_HOOK_FREE, &(rm_event){ .storage = s });
  if (s->epoch && (!ctx->dry || s->epoch != ctx->dry_epoch)) {
    /* made by a dry run that has ended: its bytes stopped counting then */
    if (s->data) b->free(ctx, s->data, s->bytes);
    rm_host_free(ctx, s, sizeof *s);
    return;
  }
  rm_memstats *m = &ctx->mem[s->device];
  if (s->epoch) ctx->dry_live[s->device][s->category] -= s->bytes;
  m->live[s->category] -= s->bytes;
  m->live_total -= s->bytes;
  if (s->data) b->free(ctx, s->data, s->bytes);
  m->reserved = b->reserved ? b->reserved(ctx) : m->reserved - s->bytes;
  rm_host_free(ctx, s, sizeof *s);
}

void rm_storage_recategorize(rm_ctx *ctx, rm_storage *s, rm_category cat) {
  if (s->category == cat) return;
  if (rm_hooked(ctx, RM_HOOK_FREE)) rm_hook_fire(ctx, RM_HOOK_FREE, &(rm_event){ .storage = s });
  rm_memstats *m = &ctx->mem[s->device];
  if (s->epoch) {
    ctx->dry_live[s->device][s->category] -= s->bytes;
    ctx->dry_live[s->device][cat] += s->bytes;
  }
  m->live[s->category] -= s->bytes;
  m->live[cat] += s->bytes;
  if (m->live[cat] > m->peak[cat]) m->peak[cat] = m->live[cat];
  s->category = cat;
  s->tag = -1;
  if (rm_hooked(ctx, RM_HOOK_ALLOC)) rm_hook_fire(ctx, RM_HOOK_ALLOC, &(rm_event){ .storage = s });
}

void rm_memory_reset_peak(rm_ctx *ctx, rm_device dev) {
  rm_memstats *m = &ctx->mem[dev];
  for (int c = 0; c < RM_CAT_COUNT; c++) m->peak[c] = m->live[c];
  m->peak_total = m->live_total;
  memcpy(m->peak_live, m->live, sizeof m->peak_live);
}

void rm_memory_end_dry(rm_ctx *ctx) {
  for (int d = 0; d < RM_DEVICE_COUNT; d++) {
    rm_memstats *m = &ctx->mem[d];
    for (int c = 0; c < RM_CAT_COUNT; c++) {
      size_t b = ctx->dry_live[d][c];
      m->live[c] -= b;
      m->live_total -= b;
      if (!ctx->backend[d] || !ctx->backend[d]->reserved) m->reserved -= b;
      ctx->dry_live[d][c] = 0;
    }
  }
}

void rm_memory_fail_at(rm_ctx *ctx, uint64_t k) {
  for (int d = 0; d < RM_DEVICE_COUNT; d++) ctx->mem[d].fail_at = k;
}
