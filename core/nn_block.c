/* Composite layers: MLP, TransformerBlock (pre-norm) and Residual. Each drops every
 * intermediate as soon as it has been used. */
#include <stdio.h>
#include <string.h>

#include "module.h"

/* Adds a freshly created child under name, giving up the creation reference. */
static int adopt(rm_ctx *ctx, rm_module *m, const char *name, rm_module *child) {
  if (!child) return ctx->err_code;
  int rc = rm_module_add_named_child(ctx, m, name, child);
  rm_module_release(ctx, child);
  return rc;
}

/* ---- MLP: cfg_i[0] d, cfg_i[1] hidden, cfg_i[2] activation (RM_ACT_GELU_TANH: fc1
 * applies it), cfg_f[0] dropout; children fc1, fc2 ---- */

static int mlp_forward(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y) {
  rm_tensor *h, *g;
  int rc = rm_module_forward(ctx, m->children[0], x, &h);
  if (rc) return rc;
  if (m->cfg_i[2] == RM_ACT_GELU_TANH) {
    g = h;
  } else {
    g = rm_unary(ctx, RM_OP_GELU, h);
    rm_tensor_drop(ctx, h);
  }
  if (!g) return ctx->err_code;
  rc = rm_module_forward(ctx, m->children[1], g, &h);
  rm_tensor_drop(ctx, g);
  if (rc) return rc;
  if (m->training && m->cfg_f[0] > 0) {
    g = rm_dropout(ctx, h, m->cfg_f[0]);
    rm_tensor_drop(ctx, h);
    if (!g) return ctx->err_code;
    h = g;
  }
  *y = h;
  return RM_OK;
}

static void mlp_describe(const rm_module *m, char *buf, size_t n) {
  const char *act = m->cfg_i[2] == RM_ACT_GELU_TANH ? ", approximate='tanh'" : "";
  if (m->cfg_f[0] > 0)
    snprintf(buf, n, "%lld -> %lld -> %lld, dropout=%g%s", (long long)m->cfg_i[0], (long long)m->cfg_i[1],
             (long long)m->cfg_i[0], m->cfg_f[0], act);
  else
    snprintf(buf, n, "%lld -> %lld -> %lld%s", (long long)m->cfg_i[0], (long long)m->cfg_i[1], (long long)m->cfg_i[0], act);
}

static const rm_module_type mlp_type = {
  .name = "MLP", .forward = mlp_forward, .describe = mlp_describe,
};

rm_module *rm_nn_mlp(rm_ctx *ctx, int64_t d, int64_t hidden, double dropout) {
  if (!ctx) return NULL;
  if (d < 1 || hidden < 1) {
    rm_fail(ctx, RM_ERR_ARG, "MLP: sizes must be >= 1 (got %lld, hidden %lld)", (long long)d, (long long)hidden);
    return NULL;
  }
  if (!(dropout >= 0 && dropout < 1)) {
    rm_fail(ctx, RM_ERR_ARG, "MLP: dropout must be in [0, 1) (got %g)", dropout);
    return NULL;
  }
  rm_module *m = rm_module_new(ctx, &mlp_type);
  if (!m) return NULL;
  m->cfg_i[0] = d;
  m->cfg_i[1] = hidden;
  m->cfg_f[0] = dropout;
  int rc = adopt(ctx, m, "fc1", rm_nn_linear(ctx, d, hidden, true));
  if (!rc) rc = adopt(ctx, m, "fc2", rm_nn_linear(ctx, hidden, d, true));
  if (rc) {
    rm_module_release(ctx, m);
    return NULL;
  }
  return m;
}

/* The MLP (m itself, or a TransformerBlock's "mlp" child) gets activation act. */
int rm_nn_mlp_set_activation(rm_ctx *ctx, rm_module *m, rm_activation act) {
  rm_module *mlp = rm_module_self_or_child(m, "mlp", &mlp_type);
  if (!mlp)
    return rm_fail(ctx, RM_ERR_ARG, "activation: %s is not a Linear, MLP or TransformerBlock", m->type->name);
  int rc = rm_nn_linear_set_activation(ctx, mlp->children[0], act);
  if (!rc) mlp->cfg_i[2] = act;
  return rc;
}

/* ---- TransformerBlock: cfg_i[0] d, cfg_i[1] heads, cfg_f[0] dropout;
 * children ln1, attn, ln2, mlp ---- */

/* out = x + f(norm(x)): one pre-norm residual branch. */
static int branch(rm_ctx *ctx, rm_module *norm, rm_module *f, rm_tensor *x, rm_tensor **out) {
  rm_tensor *h, *r;
  int rc = rm_module_forward(ctx, norm, x, &h);
  if (rc) return rc;
  rc = rm_module_forward(ctx, f, h, &r);
  rm_tensor_drop(ctx, h);
  if (rc) return rc;
  *out = rm_add(ctx, x, r);
  rm_tensor_drop(ctx, r);
  return *out ? RM_OK : ctx->err_code;
}

static int block_forward(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y) {
  rm_tensor *x1;
  int rc = branch(ctx, m->children[0], m->children[1], x, &x1);
  if (rc) return rc;
  rc = branch(ctx, m->children[2], m->children[3], x1, y);
  rm_tensor_drop(ctx, x1);
  return rc;
}

static void block_describe(const rm_module *m, char *buf, size_t n) {
  if (m->cfg_f[0] > 0)
    snprintf(buf, n, "%lld, heads=%lld, dropout=%g", (long long)m->cfg_i[0], (long long)m->cfg_i[1], m->cfg_f[0]);
  else
    snprintf(buf, n, "%lld, heads=%lld", (long long)m->cfg_i[0], (long long)m->cfg_i[1]);
}

static const rm_module_type block_type = {
  .name = "TransformerBlock", .forward = block_forward, .describe = block_describe,
};

rm_module *rm_nn_block(rm_ctx *ctx, int64_t d, int64_t heads, double dropout) {
  if (!ctx) return NULL;
  if (d < 1 || heads < 1 || d % heads) {
    rm_fail(ctx, RM_ERR_ARG, "TransformerBlock: the size (%lld) must be a positive multiple of the number of heads (%lld)",
            (long long)d, (long long)heads);
    return NULL;
  }
  if (!(dropout >= 0 && dropout < 1)) {
    rm_fail(ctx, RM_ERR_ARG, "TransformerBlock: dropout must be in [0, 1) (got %g)", dropout);
    return NULL;
  }
  if (d > INT64_MAX / 4) {
    rm_fail(ctx, RM_ERR_ARG, "TransformerBlock: the size %lld is too large (its MLP's 4 x size overflows)", (long long)d);
    return NULL;
  }
  rm_module *m = rm_module_new(ctx, &block_type);
  if (!m) return NULL;
  m->cfg_i[0] = d;
  m->cfg_i[1] = heads;
  m->cfg_f[0] = dropout;
  int rc = adopt(ctx, m, "ln1", rm_nn_layernorm(ctx, d, 1e-5, true));
  if (!rc) rc = adopt(ctx, m, "attn", rm_nn_attention(ctx, d, heads, dropout));
  if (!rc) rc = adopt(ctx, m, "ln2", rm_nn_layernorm(ctx, d, 1e-5, true));
  if (!rc) rc = adopt(ctx, m, "mlp", rm_nn_mlp(ctx, d, 4 * d, dropout));
  if (rc) {
    rm_module_release(ctx, m);
    return NULL;
  }
  return m;
}

/* ---- Residual: x + inner(x); child "inner" ---- */

static int residual_forward(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y) {
  rm_tensor *r;
  int rc = rm_module_forward(ctx, m->children[0], x, &r);
  if (rc) return rc;
  *y = rm_add(ctx, x, r);
  rm_tensor_drop(ctx, r);
  if (!*y) {
    char desc[96];
    return rm_fail_prefix(ctx, rm_module_describe(m, desc, sizeof desc));
  }
  return RM_OK;
}

static void residual_describe(const rm_module *m, char *buf, size_t n) {
  rm_module_describe(m->children[0], buf, n);
}

static const rm_module_type residual_type = {
  .name = "Residual", .forward = residual_forward, .describe = residual_describe,
};

rm_module *rm_nn_residual(rm_ctx *ctx, rm_module *inner) {
  if (!inner) {
    rm_fail(ctx, RM_ERR_ARG, "Residual: no inner module");
    return NULL;
  }
  rm_module *m = rm_module_new(ctx, &residual_type);
  if (!m) return NULL;
  if (rm_module_add_named_child(ctx, m, "inner", inner)) {
    rm_module_release(ctx, m);
    return NULL;
  }
  return m;
}
