/* Multi-head causal self-attention. cfg_i[0] d, cfg_i[1] heads, cfg_i[2] the attention
 * path (rm_att_path), cfg_f[0] dropout. Children: "qkv" Linear(d, 3d), "proj" Linear(d, d).
 *
 * Two paths compute the same function:
 * - composed: registry ops, so that selective checkpoint policies can name each step
 *   ("matmul", "softmax" with its scale and causal mask, "dropout"); it stores the
 *   (B, heads, T, T) probabilities for backward. Where the backend skips what lies
 *   outside a triangle (rm_backend.tri_products), both products are triangular (matmul's
 *   tri attrs): q k^T only on and below the diagonal, p v reading p there only.
 * - fused: the "attention" op in its packed form, on the qkv projection's (B, T, 3d)
 *   output itself: it never stores the T x T matrix (it keeps its output and a per-row
 *   log-sum-exp, and recomputes the probabilities in backward), reads q, k and v in
 *   place, writes y as (B, T, d) for the output projection, and its backward writes
 *   one (B, T, 3d) gradient (no per-head copies, no select backwards).
 *   It cannot drop attention probabilities, so it requires dropout 0: asking for it
 *   with dropout > 0 is an error, and the automatic choice falls back to the composed
 *   path while training with dropout.
 * The default (RM_ATT_AUTO) is the fused path on every device, except while training
 * with dropout (composed then): it keeps less memory and, on the CPU too, runs faster
 * (its kernels use the BLAS per block of query rows). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "module.h"

/* t = expr, dropping the old t; jumps to fail when expr fails. */
#define STEP(t, expr)                        \
  do {                                       \
    rm_tensor *next_ = (expr);               \
    rm_tensor_drop(ctx, (t));                \
    (t) = next_;                             \
    if (!(t)) goto fail;                     \
  } while (0)

/* Whether this forward takes the fused path. */
static bool use_fused(const rm_module *m, const rm_tensor *x) {
  if (m->cfg_i[2] == RM_ATT_FUSED) return true;
  if (m->cfg_i[2] == RM_ATT_COMPOSED) return false;
  (void)x;
  return !(m->training && m->cfg_f[0] > 0);
}

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
  if (use_fused(m, x)) {
    /* the packed form: reads q, k, v inside qkv, writes y as (B, T, C), and its
     * backward writes one (B, T, 3C) gradient for the projection */
    att = rm_attention_qkv(ctx, qkv, H, true, 1.0 / sqrt((double)D)); /* (B, T, C) */
    rm_tensor_drop(ctx, qkv);
    if (!att) return ctx->err_code;
    rc = rm_module_forward(ctx, m->children[1], att, y);
    rm_tensor_drop(ctx, att);
    return rc;
  }
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
  /* the scores on and below the diagonal only (-inf above it, which the causal softmax
   * never reads), where the backend computes only that part (the CPU's float32 tiles on
   * AVX-512); elsewhere a triangular product costs more than the plain one, whose
   * entries above the diagonal the softmax does not read either */
  const rm_backend *be = rm_backend_get(ctx, q->device);
  const bool tri = be && be->tri_products && be->tri_products(ctx, q->dtype);
  att = tri ? rm_matmul_tri(ctx, q, k, RM_TRI_OUT, false, true) : rm_matmul(ctx, q, k);   /* (B, H, T, T) */
  rm_tensor_drop(ctx, q);
  rm_tensor_drop(ctx, k);
  q = k = NULL;
  if (!att) goto fail;
  /* softmax(causal_mask(scale * scores)) in one op (one pass over the T x T scores) */
  STEP(att, rm_softmax_scaled(ctx, att, 1.0 / sqrt((double)D), true));
  if (m->training && m->cfg_f[0] > 0) STEP(att, rm_dropout(ctx, att, m->cfg_f[0]));
  /* the probabilities are 0 above the diagonal: the tiles skip those terms */
  STEP(att, tri ? rm_matmul_tri(ctx, att, v, RM_TRI_A, false, false) : rm_matmul(ctx, att, v));   /* (B, H, T, D) */
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
  const char *path = m->cfg_i[2] == RM_ATT_FUSED ? ", fused" : m->cfg_i[2] == RM_ATT_COMPOSED ? ", composed" : "";
  if (m->cfg_f[0] > 0)
    snprintf(buf, n, "%lld, heads=%lld, dropout=%g%s", (long long)m->cfg_i[0], (long long)m->cfg_i[1],
             m->cfg_f[0], path);
  else
    snprintf(buf, n, "%lld, heads=%lld%s", (long long)m->cfg_i[0], (long long)m->cfg_i[1], path);
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

int rm_nn_attention_set_path(rm_ctx *ctx, rm_module *m, rm_att_path path) {
  rm_module *att = rm_module_self_or_child(m, "attn", &attention_type);
  if (!att)
    return rm_fail(ctx, RM_ERR_ARG, "fused: %s is not a CausalSelfAttention or TransformerBlock", m->type->name);
  if (path != RM_ATT_AUTO && path != RM_ATT_FUSED && path != RM_ATT_COMPOSED)
    return rm_fail(ctx, RM_ERR_ARG, "fused: unknown attention path %d", (int)path);
  if (path == RM_ATT_FUSED && att->cfg_f[0] > 0)
    return rm_fail(ctx, RM_ERR_ARG, "%s: fused attention cannot apply dropout to the attention probabilities "
                   "(dropout = %g); use dropout = 0 or fused = false", m->type->name, att->cfg_f[0]);
  att->cfg_i[2] = path;
  return RM_OK;
}
