/* Modules: built-in layers (C), the Sequential container, and Lua-defined modules
 * (a "foreign" forward hook the binding fills in). A module owns its parameters
 * (leaf tensors, requires_grad, category param) and holds its children.
 *
 * Lifetime: modules are refcounted. A parent holds a reference on each child; the
 * binding holds one per userdata. rm_module_release frees the module (its params,
 * children references, type state, foreign data and plan) when the count reaches 0.
 *
 * Forward: rm_module_forward(ctx, m, x, &y) gives y as a new hold (drop it); x is
 * borrowed. Every intermediate is dropped as soon as it has been used. */
#ifndef REMAT_MODULE_H
#define REMAT_MODULE_H

#include "ops.h"

#define RM_NAME_MAX 32          /* parameter and child names ("weight", "attn", ...) */

typedef struct rm_module rm_module;
struct rm_plan;

typedef struct rm_module_type {
  const char *name;             /* "Linear", "Sequential", "Lua", ... */
  /* y: a new hold. x: borrowed. Returns RM_OK or an error status (message on ctx). */
  int (*forward)(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y);
  /* Frees type-specific state (m->state); may be NULL. */
  void (*destroy)(rm_ctx *ctx, rm_module *m);
  /* Writes a one-line description of the configuration ("784 -> 256"); may be NULL. */
  void (*describe)(const rm_module *m, char *buf, size_t n);
} rm_module_type;

struct rm_module {
  int refcount;
  const rm_module_type *type;

  int nparams, cap_params;
  rm_tensor **params;                   /* owned references (params[i] may be NULL: no bias) */
  char (*param_names)[RM_NAME_MAX];

  int nchildren, cap_children;
  rm_module **children;                 /* owned references */
  char (*child_names)[RM_NAME_MAX];     /* "" for Sequential layers: named by index (1-based) */

  bool training;                        /* true after creation (PyTorch's default) */

  /* Configuration of built-in types (meaning documented per type in core/nn_*.c). */
  int64_t cfg_i[4];
  double cfg_f[4];
  void *state;                          /* type-specific; freed by type->destroy */

  /* Lua-defined modules: forward implemented by the binding through this hook. It must
   * never longjmp: Lua errors become rm_fail(...) and a returned status. */
  int (*foreign)(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y, void *ud);
  void *foreign_ud;
  void (*foreign_free)(rm_ctx *ctx, void *ud);  /* called at destruction; may be NULL */

  /* Checkpoint plan (Sequential only; owned by the checkpoint engine). NULL: keep all.
   * plan_free is set by whoever sets plan and is called when the module is freed. */
  struct rm_plan *plan;
  void (*plan_free)(rm_ctx *ctx, struct rm_plan *plan);
  /* Checkpoint policy (Sequential only; core/policy.c): planned when set or, when it
   * needs sizes, at a top-level forward with grad on. NULL: none. */
  struct rm_policy_state *policy;
};

/* ---- generic ---- */

/* New module of type t with refcount 1, training on, no params or children. NULL when
 * host memory runs out (error set). */
rm_module *rm_module_new(rm_ctx *ctx, const rm_module_type *t);
void rm_module_retain(rm_module *m);
void rm_module_release(rm_ctx *ctx, rm_module *m);

/* Runs m on x. y: a new hold. Checks that x is a live tensor. At the top level (not
 * inside another module's forward), with grad on and outside dry runs, first plans a
 * size-dependent checkpoint policy of m for x (rm_policy_prepare). */
int rm_module_forward(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y);

/* Adds a parameter slot taking over the caller's reference on t (t may be NULL: an
 * absent optional parameter). Returns its index, or -1 with the error set. */
int rm_module_add_param(rm_ctx *ctx, rm_module *m, const char *name, rm_tensor *t);
/* Adds child (retained) under name ("" for a Sequential layer). Returns RM_OK or an
 * error (a module cannot contain itself). */
int rm_module_add_named_child(rm_ctx *ctx, rm_module *parent, const char *name, rm_module *child);
int rm_module_add_child(rm_ctx *ctx, rm_module *parent, rm_module *child);
/* Parameter slot by local name, NULL when there is none. */
rm_tensor **rm_module_param_slot(rm_module *m, const char *name);
/* m when it is of type t, else its child named `name` when that is of type t; else NULL
 * (a setting addressed to a module or to the block that holds one). */
rm_module *rm_module_self_or_child(rm_module *m, const char *name, const rm_module_type *t);

/* Visits every parameter (recursively, own parameters first, then children in order),
 * skipping absent ones. name: "weight", "1.weight", "3.attn.qkv.weight". slot: where
 * the module keeps the tensor (a visitor may replace it). Stops at the first nonzero
 * return of fn and returns it. Shared parameters (the same tensor twice) are visited
 * once. */
typedef int (*rm_param_visit_fn)(void *ud, const char *name, rm_tensor **slot, rm_module *owner);
int rm_module_visit_params(rm_ctx *ctx, rm_module *m, rm_param_visit_fn fn, void *ud);
/* Number of parameter elements (recursive). */
int64_t rm_module_num_params(rm_ctx *ctx, rm_module *m);

/* Sets training mode recursively. */
void rm_module_train(rm_module *m, bool training);
/* Drops the .grad of every parameter (recursive). */
void rm_module_zero_grad(rm_ctx *ctx, rm_module *m);
/* Moves/casts every parameter: new tensors on dev with dtype dt replace the old ones
 * (leaves, requires_grad; gradients dropped). Returns RM_OK or an error. */
int rm_module_to(rm_ctx *ctx, rm_module *m, rm_device dev, rm_dtype dt);
/* "Linear(784 -> 256)"-style description into buf; returns buf. */
char *rm_module_describe(const rm_module *m, char *buf, size_t n);

/* ---- helpers for module types (core/nn_*.c) ---- */

/* New parameter tensors (float32, CPU, category param, leaf, requires_grad): uniform in
 * [-bound, bound), standard normal, or filled with value. NULL with the error set. */
rm_tensor *rm_param_uniform(rm_ctx *ctx, int ndim, const int64_t *shape, double bound);
rm_tensor *rm_param_normal(rm_ctx *ctx, int ndim, const int64_t *shape);
rm_tensor *rm_param_full(rm_ctx *ctx, int ndim, const int64_t *shape, double value);
/* A contiguous copy of t on dev in category cat, outside autograd (used to move
 * parameters and loaded values between devices). NULL with the error set. */
rm_tensor *rm_nn_transfer(rm_ctx *ctx, rm_tensor *t, rm_device dev, rm_category cat);
/* Checks that x has at least min_dim dims and d features in its last one; the error
 * names the module (its description) and both sizes. */
int rm_module_check_features(rm_ctx *ctx, const rm_module *m, const rm_tensor *x, int min_dim,
                             int64_t d);

/* ---- constructors (each returns a module with refcount 1, or NULL with the error
 * set). Parameters are float32 on the CPU, initialised as PyTorch does by default from
 * the ctx generator. ---- */

rm_module *rm_sequential_new(rm_ctx *ctx);
/* Lua-defined module: forward through fn(ctx, m, x, y, ud); free(ctx, ud) at the end. */
rm_module *rm_foreign_new(rm_ctx *ctx,
                          int (*fn)(rm_ctx *, rm_module *, rm_tensor *, rm_tensor **, void *),
                          void *ud, void (*free_ud)(rm_ctx *, void *));

/* y = x W^T + b; W (out, in), b (out); both U(-1/sqrt(in), 1/sqrt(in)). */
rm_module *rm_nn_linear(rm_ctx *ctx, int64_t in, int64_t out, bool bias);
/* A Linear's activation: NONE, or GELU_TANH (its forward is the fused linear_gelu op).
 * For an MLP or TransformerBlock, sets it on the MLP's fc1 and drops the MLP's own
 * exact GELU (GELU_TANH), or restores it (NONE). */
typedef enum { RM_ACT_NONE = 0, RM_ACT_GELU_TANH = 1 } rm_activation;
int rm_nn_linear_set_activation(rm_ctx *ctx, rm_module *m, rm_activation act);
int rm_nn_mlp_set_activation(rm_ctx *ctx, rm_module *m, rm_activation act); /* core/nn_block.c */
/* y = W[idx]; W (n, d) ~ N(0, 1); idx holds 1-based indices. */
rm_module *rm_nn_embedding(rm_ctx *ctx, int64_t n, int64_t d);
/* Over the last dim; weight 1, bias 0 when affine. */
rm_module *rm_nn_layernorm(rm_ctx *ctx, int64_t d, double eps, bool affine);
/* Over the last dim; weight 1. The Lua default eps is 1e-6 (the value LLaMA-style models
 * use; PyTorch's own default is the dtype's machine epsilon, which differs per dtype and
 * would make float32 and float64 models disagree). */
rm_module *rm_nn_rmsnorm(rm_ctx *ctx, int64_t d, double eps);
rm_module *rm_nn_gelu(rm_ctx *ctx);
/* GELU's tanh approximation (PyTorch's approximate = "tanh"; GPT-2's). */
rm_module *rm_nn_gelu_tanh(rm_ctx *ctx);
rm_module *rm_nn_relu(rm_ctx *ctx);
rm_module *rm_nn_silu(rm_ctx *ctx);
/* Drops with probability p when training; identity in eval. */
rm_module *rm_nn_dropout(rm_ctx *ctx, double p);
/* dim: 0-based, negative counts from the end. */
rm_module *rm_nn_softmax(rm_ctx *ctx, int64_t dim);
/* Multi-head causal self-attention on (B, T, d): children "qkv" (d -> 3d), "proj" (d -> d). */
rm_module *rm_nn_attention(rm_ctx *ctx, int64_t d, int64_t heads, double dropout);
/* Which computation CausalSelfAttention uses (see core/nn_attention.c): AUTO is the
 * fused "attention" op, or the composed ops while training with dropout. */
typedef enum { RM_ATT_AUTO = 0, RM_ATT_FUSED = 1, RM_ATT_COMPOSED = 2 } rm_att_path;
/* Sets the path of m (a CausalSelfAttention, or a TransformerBlock's "attn" child).
 * Errors: another module type; FUSED with dropout > 0 (fused attention has no dropout). */
int rm_nn_attention_set_path(rm_ctx *ctx, rm_module *m, rm_att_path path);
/* linear "fc1" (d -> hidden) -> gelu -> linear "fc2" (hidden -> d) -> dropout; with the
 * GELU_TANH activation (rm_nn_linear_set_activation), fc1 is linear_gelu and no gelu. */
rm_module *rm_nn_mlp(rm_ctx *ctx, int64_t d, int64_t hidden, double dropout);
/* Pre-norm: x + attn(ln1(x)), then + mlp(ln2(x)); children ln1, attn, ln2, mlp. */
rm_module *rm_nn_block(rm_ctx *ctx, int64_t d, int64_t heads, double dropout);
/* x + inner(x); child "inner" (retained). */
rm_module *rm_nn_residual(rm_ctx *ctx, rm_module *inner);

/* The type objects, to recognise a module's type (m->type == &rm_type_sequential). */
extern const rm_module_type rm_type_sequential, rm_type_foreign;

#endif
