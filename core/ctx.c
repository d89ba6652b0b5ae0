/* Context lifetime, errors and the host allocator. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "backend.h"
#include "ctx.h"
#include "opcost.h"

const rm_backend *rm_cuda_backend_load(rm_ctx *ctx);
void rm_cuda_backend_unload(rm_ctx *ctx);

static void *default_alloc(void *ud, size_t n) { return malloc(n); }
static void *default_realloc(void *ud, void *p, size_t o, size_t n) {
  return realloc(p, n);
}
static void default_free(void *ud, void *p, size_t n) { free(p); }

static rm_storage *workspace_new(rm_ctx *ctx, rm_device dev, size_t bytes) {
  return rm_storage_new(ctx, dev, RM_CAT_WORKSPACE, bytes);
}

rm_ctx *rm_ctx_new(const rm_host_alloc *alloc, rm_log_fn log, void *log_ud) {
  rm_host_alloc h = { default_alloc, default_realloc, default_free, NULL };
  if (alloc) {
    if (alloc->alloc) h.alloc = alloc->alloc;
    if (alloc->realloc) h.realloc = alloc->realloc;
    if (alloc->free) h.free = alloc->free;
    h.ud = alloc->ud;
  }
  rm_ctx *ctx = h.alloc(h.ud, sizeof *ctx);
  if (!ctx) return NULL;
  memset(ctx, 0, sizeof *ctx);
  ctx->host = h;
  ctx->log = log;
  ctx->log_ud = log_ud;
  ctx->category = RM_CAT_ACTIVATION;
  ctx->grad_enabled = true;
  ctx->rng_seed = 0x5eed;
  ctx->workspace_new = workspace_new;
  ctx->storage_release = rm_storage_release;
  return ctx;
}

void rm_ctx_free(rm_ctx *ctx) {
  if (!ctx) return;
  for (int d = 0; d < RM_DEVICE_COUNT; d++)
    if (ctx->backend[d] && ctx->backend[d]->shutdown)
      ctx->backend[d]->shutdown(ctx, ctx->backend_state[d]);
  rm_cuda_backend_unload(ctx);
  rm_opcost_free(ctx);
  rm_host_alloc h = ctx->host;
  h.free(h.ud, ctx, sizeof *ctx);
}

const char *rm_errmsg(const rm_ctx *ctx) { return ctx ? ctx->err : "no context"; }

int rm_fail(rm_ctx *ctx, rm_status code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = rm_failv(ctx, code, fmt, ap);
  va_end(ap);
  return rc;
}

int rm_fail_prefix(rm_ctx *ctx, const char *what) {
  char tmp[sizeof ctx->err];
  size_t n = strlen(what);
  if (n > 200) n = 200;
  memcpy(tmp, what, n);
  tmp[n] = ':';
  tmp[n + 1] = ' ';
  size_t rest = strlen(ctx->err);
  if (rest > sizeof tmp - n - 3) rest = sizeof tmp - n - 3;
  memcpy(tmp + n + 2, ctx->err, rest);
  tmp[n + 2 + rest] = 0;
  memcpy(ctx->err, tmp, sizeof tmp);
  return ctx->err_code ? ctx->err_code : RM_ERR_RUNTIME;
}

void rm_clear_error(rm_ctx *ctx) {
  if (!ctx) return;
  ctx->err[0] = 0;
  ctx->err_code = RM_OK;
}

void rm_scope_enter(rm_ctx *ctx, rm_scope *s, int category, int grad) {
  s->category = ctx->category;
  s->grad_enabled = ctx->grad_enabled;
  s->dry = false;
  if (category != RM_SAME) ctx->category = (rm_category)category;
  if (grad != RM_SAME) ctx->grad_enabled = grad != RM_GRAD_OFF;
}

void rm_set_grad_enabled(rm_ctx *ctx, bool on) { ctx->grad_enabled = on; }

int rm_scope_enter_dry(rm_ctx *ctx, rm_scope *s) {
  if (ctx->dry) return rm_fail(ctx, RM_ERR_STATE, "a dry run is already in progress");
  rm_scope_enter(ctx, s, RM_CAT_ACTIVATION, RM_GRAD_ON);
  s->dry = true;
  memcpy(s->mem, ctx->mem, sizeof s->mem);
  s->rng_seed = ctx->rng_seed;
  s->rng_offset = ctx->rng_offset;
  s->recompute_flops = ctx->recompute_flops;
  for (int d = 0; d < RM_DEVICE_COUNT; d++) {
    ctx->mem[d].limit = 0;
    ctx->mem[d].fail_at = 0;
  }
  ctx->dry = true;
  ctx->dry_epoch++;
  ctx->recompute_flops = 0;
  return RM_OK;
}

void rm_scope_leave(rm_ctx *ctx, rm_scope *s) {
  ctx->category = s->category;
  ctx->grad_enabled = s->grad_enabled;
  if (!s->dry) return;
  rm_memory_end_dry(ctx);
  ctx->dry = false;
  for (int d = 0; d < RM_DEVICE_COUNT; d++) {
    rm_memstats *cur = &ctx->mem[d], *was = &s->mem[d];
    /* the dry run's own bytes stopped counting; a peak it made does not stay */
    for (int c = 0; c < RM_CAT_COUNT; c++)
      cur->peak[c] = was->peak[c] > cur->live[c] ? was->peak[c] : cur->live[c];
    if (was->peak_total > cur->live_total) {
      cur->peak_total = was->peak_total;
      memcpy(cur->peak_live, was->peak_live, sizeof cur->peak_live);
    } else {
      cur->peak_total = cur->live_total;
      memcpy(cur->peak_live, cur->live, sizeof cur->peak_live);
    }
    cur->limit = was->limit;
    cur->fail_at = was->fail_at;
    cur->n_allocs = was->n_allocs;
  }
  ctx->rng_seed = s->rng_seed;
  ctx->rng_offset = s->rng_offset;
  ctx->recompute_flops = s->recompute_flops;
}

void *rm_host_malloc(rm_ctx *ctx, size_t n) { return ctx->host.alloc(ctx->host.ud, n ? n : 1); }

void *rm_host_calloc(rm_ctx *ctx, size_t count, size_t n) {
  size_t total = count * n;
  if (n && total / n != count) return NULL;
  void *p = rm_host_malloc(ctx, total);
  if (p) memset(p, 0, total ? total : 1);
  return p;
}

void *rm_host_realloc(rm_ctx *ctx, void *p, size_t old, size_t n) {
  return ctx->host.realloc(ctx->host.ud, p, old, n ? n : 1);
}

void rm_host_free(rm_ctx *ctx, void *p, size_t n) {
  if (p) ctx->host.free(ctx->host.ud, p, n ? n : 1);
}


const rm_backend *rm_backend_get(rm_ctx *ctx, rm_device dev) {
  if ((int)dev < 0 || dev >= RM_DEVICE_COUNT) {
    rm_fail(ctx, RM_ERR_DEVICE, "unknown device %d", (int)dev);
    return NULL;
  }
  if (ctx->backend[dev]) return ctx->backend[dev];
  const rm_backend *b = dev == RM_CPU ? &rm_cpu_backend : rm_cuda_backend_load(ctx);
  if (!b) return NULL;
  void *state = NULL;
  if (b->init && b->init(ctx, &state) != RM_OK) {
    if (dev == RM_CUDA) rm_cuda_backend_unload(ctx); /* the next ask tries afresh */
    return NULL;
  }
  ctx->backend[dev] = b;
  ctx->backend_state[dev] = state;
  return b;
}

int rm_set_memory_limit(rm_ctx *ctx, int device, size_t bytes) {
  if (!ctx) return RM_ERR_ARG;
  if (device < 0 || device >= RM_DEVICE_COUNT)
    return rm_fail(ctx, RM_ERR_DEVICE, "memory limit: unknown device %d", device);
  ctx->mem[device].limit = bytes;
  return RM_OK;
}

size_t rm_memory_live(const rm_ctx *ctx, int device) {
  return (ctx && device >= 0 && device < RM_DEVICE_COUNT) ? ctx->mem[device].live_total : 0;
}

size_t rm_memory_peak(const rm_ctx *ctx, int device) {
  return (ctx && device >= 0 && device < RM_DEVICE_COUNT) ? ctx->mem[device].peak_total : 0;
}
