/* Multi-head causal self-attention, built from registry ops so that selective
 * checkpoint policies can name each step ("linear", "matmul", "mul_scalar",
 * "causal_mask", "softmax", "dropout"). cfg_i[0] d, cfg_i[1] heads, cfg_f[0] dropout.
 * Children: "qkv" Linear(d, 3d), "proj" Linear(d, d). */
#include <math.h>
#include <stdio.h>

#include "module.h"

/* t = expr, dropping the old t; jumps to fail when expr fails. */
#define STEP(t, expr)                        \
  do {                                       \
    rm_tensor *next_ = (expr);               \
    rm_tensor_drop(ctx, (t));                \
    (t) = next_;                             \
    if (!(t)) goto fail;                     \
  } while (0)

static int attention_forward(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y) {
  int64_t C = m->cfg_i[0], H = m->cfg_i[1], D = C / H;
  if (rm_module_check_features(ctx, m, x, 3, C)) return ctx->err_code;
  if (x->ndim != 3) {
    char desc[96], s[96];
    return rm_fail(ctx, RM_ERR_SHAPE, "%s: expected an input of size BxTx%lld, got %s",
                   rm_module_describe(m, desc, sizeof desc), (long long)C,
                   rm_tensor_shape_str(x, s, sizeof s));
  }
  int64_t B = x->shape[0], T = x->shape[1];
  rm_tensor *qkv = NULL, *q = NULL, *k = NULL, *v = NULL, *att = NULL;
  int rc = rm_module_forward(ctx, m->children[0], x, &qkv);      /* (B, T, 3C) */
  if (rc) return rc;
  int64_t s5[5] = { B, T, 3, H, D };
  STEP(qkv, rm_view(ctx, qkv, 5, s5));                           /* (B, T, 3, H, D) */
  /* q, k, v: (B, T, H, D) views of qkv, then (B, H, T, D) */
  if (!(q = rm_select(ctx, qkv, 2, 0)) || !(k = rm_select(ctx, qkv, 2, 1)) ||
      !(v = rm_select(ctx, qkv, 2, 2)))
    goto fail;
  rm_tensor_drop(ctx, qkv);
  qkv = NULL;
  STEP(q, rm_transpose(ctx, q, 1, 2));
  STEP(k, rm_transpose(ctx, k, 1, 2));
  STEP(v, rm_transpose(ctx, v, 1, 2));
  STEP(k, rm_transpose(ctx, k, 2, 3));                           /* (B, H, D, T) */
  att = rm_matmul(ctx, q, k);                                    /* (B, H, T, T) */
  rm_tensor_drop(ctx, q);
  rm_tensor_drop(ctx, k);
  q = k = NULL;
  if (!att) goto fail;
  STEP(att, rm_scalar_op(ctx, RM_OP_MUL_SCALAR, att, 1.0 / sqrt((double)D)));
  STEP(att, rm_causal_mask(ctx, att));
  STEP(att, rm_softmax(ctx, att, -1));
  if (m->training && m->cfg_f[0] > 0) STEP(att, rm_dropout(ctx, att, m->cfg_f[0]));
  STEP(att, rm_matmul(ctx, att, v));                             /* (B, H, T, D) */
  rm_tensor_drop(ctx, v);
  v = NULL;
  STEP(att, rm_transpose(ctx, att, 1, 2));                       /* (B, T, H, D) */
  int64_t s3[3] = { B, T, C };
  STEP(att, rm_reshape(ctx, att, 3, s3));
  rc = rm_module_forward(ctx, m->children[1], att, y);
  rm_tensor_drop(ctx, att);
  return rc;
fail:
  rm_tensor_drop(ctx, qkv);
  rm_tensor_drop(ctx, q);
  rm_tensor_drop(ctx, k);
  rm_tensor_drop(ctx, v);
  rm_tensor_drop(ctx, att);
  return ctx->err_code ? ctx->err_code : RM_ERR_RUNTIME;
}

static void attention_describe(const rm_module *m, char *buf, size_t n) {
  if (m->cfg_f[0] > 0)
    snprintf(buf, n, "%lld, heads=%lld, dropout=%g", (long long)m->cfg_i[0], (long long)m->cfg_i[1], m->cfg_f[0]);
  else
    snprintf(buf, n, "%lld, heads=%lld", (long long)m->cfg_i[0], (long long)m->cfg_i[1]);
}

static const rm_module_type attention_type = {
  .name = "CausalSelfAttention", .forward = attention_forward, .describe = attention_describe,
};

rm_module *rm_nn_attention(rm_ctx *ctx, int64_t d, int64_t heads, double dropout) {
  if (d < 1 || heads < 1 || d % heads) {
    rm_fail(ctx, RM_ERR_ARG, "CausalSelfAttention: the size (%lld) must be a positive multiple of the number of heads (%lld)",
            (long long)d, (long long)heads);
    return NULL;
  }
  if (!(dropout >= 0 && dropout < 1)) {
    rm_fail(ctx, RM_ERR_ARG, "CausalSelfAttention: dropout must be in [0, 1) (got %g)", dropout);
    return NULL;
  }
  rm_module *m = rm_module_new(ctx, &attention_type);
  if (!m) return NULL;
  m->cfg_i[0] = d;
  m->cfg_i[1] = heads;
  m->cfg_f[0] = dropout;
  int rc = RM_OK;
  const char *names[2] = { "qkv", "proj" };
  for (int i = 0; i < 2 && rc == RM_OK; i++) {
    rm_module *lin = rm_nn_linear(ctx, d, i == 0 ? 3 * d : d, true);
    rc = lin ? rm_module_add_named_child(ctx, m, names[i], lin) : (int)ctx->err_code;
    rm_module_release(ctx, lin);
  }
  if (rc) {
    rm_module_release(ctx, m);
    return NULL;
  }
  return m;
}
