/* Parameter-free layers: GELU, ReLU, SiLU, Dropout, Softmax. */
#include <stdio.h>

#include "module.h"

/* ---- activations: cfg_i[0] = the op ---- */

static int act_forward(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y) {
  *y = rm_unary(ctx, (rm_op_id)m->cfg_i[0], x);
  return *y ? RM_OK : ctx->err_code;
}

static void gelu_tanh_describe(const rm_module *m, char *buf, size_t n) { snprintf(buf, n, "approximate='tanh'"); }

static const rm_module_type gelu_type = { .name = "GELU", .forward = act_forward };
static const rm_module_type gelu_tanh_type = { .name = "GELU", .forward = act_forward, .describe = gelu_tanh_describe };
static const rm_module_type relu_type = { .name = "ReLU", .forward = act_forward };
static const rm_module_type silu_type = { .name = "SiLU", .forward = act_forward };

static rm_module *act_new(rm_ctx *ctx, const rm_module_type *t, rm_op_id op) {
  if (!ctx) return NULL;
  rm_module *m = rm_module_new(ctx, t);
  if (m) m->cfg_i[0] = op;
  return m;
}

rm_module *rm_nn_gelu(rm_ctx *ctx) { return act_new(ctx, &gelu_type, RM_OP_GELU); }
rm_module *rm_nn_gelu_tanh(rm_ctx *ctx) { return act_new(ctx, &gelu_tanh_type, RM_OP_GELU_TANH); }
rm_module *rm_nn_relu(rm_ctx *ctx) { return act_new(ctx, &relu_type, RM_OP_RELU); }
rm_module *rm_nn_silu(rm_ctx *ctx) { return act_new(ctx, &silu_type, RM_OP_SILU); }

/* ---- Dropout: cfg_f[0] p ---- */

static int dropout_forward(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y) {
  if (!m->training || m->cfg_f[0] == 0) {
    /* identity: the output is the input itself (a new hold), no op recorded */
    rm_tensor_hold(x);
    *y = x;
    return RM_OK;
  }
  *y = rm_dropout(ctx, x, m->cfg_f[0]);
  return *y ? RM_OK : ctx->err_code;
}

static void dropout_describe(const rm_module *m, char *buf, size_t n) {
  snprintf(buf, n, "p=%g", m->cfg_f[0]);
}

static const rm_module_type dropout_type = {
  .name = "Dropout", .forward = dropout_forward, .describe = dropout_describe,
};

rm_module *rm_nn_dropout(rm_ctx *ctx, double p) {
  if (!(p >= 0 && p < 1)) {
    rm_fail(ctx, RM_ERR_ARG, "Dropout: p must be in [0, 1) (got %g)", p);
    return NULL;
  }
  rm_module *m = rm_module_new(ctx, &dropout_type);
  if (m) m->cfg_f[0] = p;
  return m;
}

/* ---- Softmax: cfg_i[0] dim (0-based, negative from the end) ---- */

static int softmax_forward(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y) {
  *y = rm_softmax(ctx, x, m->cfg_i[0]);
  return *y ? RM_OK : ctx->err_code;
}

static void softmax_describe(const rm_module *m, char *buf, size_t n) {
  /* shown 1-based like the Lua API; negative dims as given */
  long long d = (long long)m->cfg_i[0];
  snprintf(buf, n, "dim=%lld", d < 0 ? d : d + 1);
}

static const rm_module_type softmax_type = {
  .name = "Softmax", .forward = softmax_forward, .describe = softmax_describe,
};

rm_module *rm_nn_softmax(rm_ctx *ctx, int64_t dim) {
  rm_module *m = rm_module_new(ctx, &softmax_type);
  if (m) m->cfg_i[0] = dim;
  return m;
}
