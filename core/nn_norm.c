/* Normalisation layers over the last dimension: LayerNorm and RMSNorm. */
#include <stdio.h>

#include "module.h"

/* ---- LayerNorm: cfg_i[0] d, cfg_f[0] eps; params weight (1s), bias (0s) when affine ---- */

static int layernorm_forward(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y) {
  if (rm_module_check_features(ctx, m, x, 1, m->cfg_i[0])) return ctx->err_code;
  rm_tensor *w = m->nparams > 0 ? m->params[0] : NULL;
  rm_tensor *b = m->nparams > 1 ? m->params[1] : NULL;
  *y = rm_layernorm(ctx, x, w, b, m->cfg_f[0]);
  return *y ? RM_OK : ctx->err_code;
}

static void layernorm_describe(const rm_module *m, char *buf, size_t n) {
  snprintf(buf, n, "%lld, eps=%g%s", (long long)m->cfg_i[0], m->cfg_f[0], m->nparams ? "" : ", no affine");
}

static const rm_module_type layernorm_type = {
  .name = "LayerNorm", .forward = layernorm_forward, .describe = layernorm_describe,
};

static bool check_norm_args(rm_ctx *ctx, const char *name, int64_t d, double eps) {
  if (d < 1) {
    rm_fail(ctx, RM_ERR_ARG, "%s: the size must be >= 1 (got %lld)", name, (long long)d);
    return false;
  }
  if (!(eps >= 0)) {
    rm_fail(ctx, RM_ERR_ARG, "%s: eps must be >= 0 (got %g)", name, eps);
    return false;
  }
  return true;
}

rm_module *rm_nn_layernorm(rm_ctx *ctx, int64_t d, double eps, bool affine) {
  if (!ctx) return NULL;
  if (!check_norm_args(ctx, "LayerNorm", d, eps)) return NULL;
  rm_module *m = rm_module_new(ctx, &layernorm_type);
  if (!m) return NULL;
  m->cfg_i[0] = d;
  m->cfg_f[0] = eps;
  if (affine) {
    rm_tensor *w = rm_param_full(ctx, 1, &d, 1.0);
    bool ok = w && rm_module_add_param(ctx, m, "weight", w) >= 0;
    rm_tensor *b = ok ? rm_param_full(ctx, 1, &d, 0.0) : NULL;
    ok = ok && b && rm_module_add_param(ctx, m, "bias", b) >= 0;
    if (!ok) {
      rm_module_release(ctx, m);
      return NULL;
    }
  }
  return m;
}

/* ---- RMSNorm: cfg_i[0] d, cfg_f[0] eps; param weight (1s) ---- */

static int rmsnorm_forward(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y) {
  if (rm_module_check_features(ctx, m, x, 1, m->cfg_i[0])) return ctx->err_code;
  *y = rm_rmsnorm(ctx, x, m->params[0], m->cfg_f[0]);
  return *y ? RM_OK : ctx->err_code;
}

static void rmsnorm_describe(const rm_module *m, char *buf, size_t n) {
  snprintf(buf, n, "%lld, eps=%g", (long long)m->cfg_i[0], m->cfg_f[0]);
}

static const rm_module_type rmsnorm_type = {
  .name = "RMSNorm", .forward = rmsnorm_forward, .describe = rmsnorm_describe,
};

rm_module *rm_nn_rmsnorm(rm_ctx *ctx, int64_t d, double eps) {
  if (!check_norm_args(ctx, "RMSNorm", d, eps)) return NULL;
  rm_module *m = rm_module_new(ctx, &rmsnorm_type);
  if (!m) return NULL;
  m->cfg_i[0] = d;
  m->cfg_f[0] = eps;
  rm_tensor *w = rm_param_full(ctx, 1, &d, 1.0);
  if (!w || rm_module_add_param(ctx, m, "weight", w) < 0) {
    rm_module_release(ctx, m);
    return NULL;
  }
  return m;
}
