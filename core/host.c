/* The parts of the host API (core/remat.h) that are not the context's lifetime:
 * logging, error codes, limits and the generator, all read or written on one ctx. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "ctx.h"

int rm_set_log(rm_ctx *ctx, rm_log_fn log, void *log_ud) {
  if (!ctx) return RM_ERR_ARG;
  ctx->log = log;
  ctx->log_ud = log_ud;
  return RM_OK;
}

/* Formats into a stack buffer: logging must not allocate (it may report that the
 * allocator failed). Longer messages are cut. */
void rm_log(rm_ctx *ctx, int level, const char *fmt, ...) {
  if (!ctx || !ctx->log) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  ctx->log(ctx->log_ud, level, buf);
}

int rm_get_info(rm_ctx *ctx, rm_info *info) {
  memset(info, 0, sizeof *info);
  snprintf(info->version, sizeof info->version, "%s", REMAT_VERSION);
  const rm_backend *cpu = rm_backend_get(ctx, RM_CPU);
  if (!cpu) return ctx->err_code;
  return cpu->runtime_info ? cpu->runtime_info(ctx, info) : RM_OK;
}

int rm_errcode(const rm_ctx *ctx) { return ctx ? ctx->err_code : RM_ERR_ARG; }

const char *rm_status_name(int status) {
  switch (status) {
  case RM_OK: return "ok";
  case RM_ERR_ARG: return "bad argument";
  case RM_ERR_SHAPE: return "shape mismatch";
  case RM_ERR_DTYPE: return "dtype mismatch";
  case RM_ERR_DEVICE: return "device error";
  case RM_ERR_OOM: return "out of memory";
  case RM_ERR_IO: return "i/o error";
  case RM_ERR_STATE: return "invalid state";
  case RM_ERR_RUNTIME: return "runtime error";
  case RM_ERR_LAYOUT: return "layout mismatch";
  default: return "unknown status";
  }
}

size_t rm_memory_limit(const rm_ctx *ctx, int device) {
  return (ctx && device >= 0 && device < RM_DEVICE_COUNT) ? ctx->mem[device].limit : 0;
}

size_t rm_memory_category_peak(const rm_ctx *ctx, int device, const char *category) {
  if (!ctx || !category || device < 0 || device >= RM_DEVICE_COUNT) return 0;
  for (int c = 0; c < RM_CAT_COUNT; c++)
    if (!strcmp(category, rm_category_name((rm_category)c))) return ctx->mem[device].peak[c];
  return 0;
}

int rm_memory_restart_peak(rm_ctx *ctx, int device) {
  if (!ctx) return RM_ERR_ARG;
  if (device < 0 || device >= RM_DEVICE_COUNT) return rm_fail(ctx, RM_ERR_DEVICE, "memory: no device %d", device);
  rm_memory_reset_peak(ctx, (rm_device)device);
  return RM_OK;
}

int rm_manual_seed(rm_ctx *ctx, uint64_t seed) {
  if (!ctx) return RM_ERR_ARG;
  ctx->rng_seed = seed;
  ctx->rng_offset = 0;
  return RM_OK;
}

int rm_rng_state(const rm_ctx *ctx, uint64_t *seed, uint64_t *offset) {
  if (!ctx) return RM_ERR_ARG;
  if (seed) *seed = ctx->rng_seed;
  if (offset) *offset = ctx->rng_offset;
  return RM_OK;
}
