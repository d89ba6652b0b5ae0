/* Linear and Embedding: the two layers that are a parameter matrix applied to the
 * input (a product, or a row lookup). */
#include <math.h>
#include <stdio.h>

#include "module.h"

/* ---- Linear: cfg_i[0] in, cfg_i[1] out, cfg_i[2] activation (rm_activation);
 * params weight (out, in), bias (out) ---- */

static int linear_forward(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y) {
  if (rm_module_check_features(ctx, m, x, 1, m->cfg_i[0])) return ctx->err_code;
  rm_tensor *b = m->nparams > 1 ? m->params[1] : NULL;
  *y = m->cfg_i[2] == RM_ACT_GELU_TANH ? rm_linear_gelu(ctx, x, m->params[0], b) : rm_linear(ctx, x, m->params[0], b);
  return *y ? RM_OK : ctx->err_code;
}

static void linear_describe(const rm_module *m, char *buf, size_t n) {
  snprintf(buf, n, "%lld -> %lld%s%s", (long long)m->cfg_i[0], (long long)m->cfg_i[1],
           m->nparams > 1 ? "" : ", no bias", m->cfg_i[2] == RM_ACT_GELU_TANH ? ", activation='gelu_tanh'" : "");
}

static const rm_module_type linear_type = {
  .name = "Linear", .forward = linear_forward, .describe = linear_describe,
};

rm_module *rm_nn_linear(rm_ctx *ctx, int64_t in, int64_t out, bool bias) {
  if (!ctx) return NULL;
  if (in < 1 || out < 1) {
    rm_fail(ctx, RM_ERR_ARG, "Linear: sizes must be >= 1 (got %lld -> %lld)", (long long)in, (long long)out);
    return NULL;
  }
  rm_module *m = rm_module_new(ctx, &linear_type);
  if (!m) return NULL;
  m->cfg_i[0] = in;
  m->cfg_i[1] = out;
  /* PyTorch: kaiming_uniform(a = sqrt(5)) on the weight and U(-1/sqrt(in), 1/sqrt(in)) on
   * the bias; both come to a bound of 1/sqrt(in). */
  double bound = 1.0 / sqrt((double)in);
  int64_t ws[2] = { out, in };
  rm_tensor *w = rm_param_uniform(ctx, 2, ws, bound);
  bool ok = w && rm_module_add_param(ctx, m, "weight", w) >= 0;
  if (ok && bias) {
    rm_tensor *b = rm_param_uniform(ctx, 1, &out, bound);
    ok = b && rm_module_add_param(ctx, m, "bias", b) >= 0;
  }
  if (!ok) {
    rm_module_release(ctx, m);
    return NULL;
  }
  return m;
}

int rm_nn_linear_set_activation(rm_ctx *ctx, rm_module *m, rm_activation act) {
  if (act != RM_ACT_NONE && act != RM_ACT_GELU_TANH)
    return rm_fail(ctx, RM_ERR_ARG, "activation: unknown activation %d", (int)act);
  if (m->type == &linear_type) {
    m->cfg_i[2] = act;
    return RM_OK;
  }
  return rm_nn_mlp_set_activation(ctx, m, act);
}

/* ---- Embedding: cfg_i[0] n, cfg_i[1] d; param weight (n, d) ---- */

static int embedding_forward(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y) {
  *y = rm_embedding(ctx, m->params[0], x);
  if (!*y) {
    char desc[96];
    return rm_fail_prefix(ctx, rm_module_describe(m, desc, sizeof desc));
  }
  return RM_OK;
}

static void embedding_describe(const rm_module *m, char *buf, size_t n) {
  snprintf(buf, n, "%lld, %lld", (long long)m->cfg_i[0], (long long)m->cfg_i[1]);
}

static const rm_module_type embedding_type = {
  .name = "Embedding", .forward = embedding_forward, .describe = embedding_describe,
};

rm_module *rm_nn_embedding(rm_ctx *ctx, int64_t n, int64_t d) {
  if (n < 1 || d < 1) {
    rm_fail(ctx, RM_ERR_ARG, "Embedding: sizes must be >= 1 (got %lld, %lld)", (long long)n, (long long)d);
    return NULL;
  }
  rm_module *m = rm_module_new(ctx, &embedding_type);
  if (!m) return NULL;
  m->cfg_i[0] = n;
  m->cfg_i[1] = d;
  int64_t ws[2] = { n, d };
  rm_tensor *w = rm_param_normal(ctx, 2, ws);   /* PyTorch: N(0, 1) */
  if (!w || rm_module_add_param(ctx, m, "weight", w) < 0) {
    rm_module_release(ctx, m);
    return NULL;
  }
  return m;
}
