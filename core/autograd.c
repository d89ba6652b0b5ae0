/* Backward: walk the nodes reachable from the root in reverse recording order. */
#include <stdlib.h>
#include <string.h>

#include "autograd.h"
#include "ops.h"

int rm_accumulate(rm_ctx *ctx, rm_tensor **acc, rm_tensor *g, rm_category cat) {
  rm_scope sc;
  rm_scope_enter(ctx, &sc, cat, RM_SAME);
  int rc = RM_OK;
  if (!*acc) {
    /* g becomes the accumulator without a copy when nothing else holds it; a storage of
     * another category (a parameter's gradient, made in backward's activation scope)
     * changes category when g is all that uses it. A node's gradient may also share g
     * with others (add gives its two inputs one gradient): the sum below then never
     * writes into a shared accumulator. A leaf's .grad is always its own. */
    rm_storage *s = g->storage;
    bool own = g->refcount == 1, shareable = cat != RM_CAT_GRAD;
    if (s && (own || shareable) && rm_tensor_is_contiguous(g) &&
        (s->category == cat || (own && s->refcount == 1 && rm_tensor_nbytes(g) == s->bytes))) {
      rm_storage_recategorize(ctx, s, cat);
      rm_tensor_hold(g);
      *acc = g;
    } else {
      *acc = rm_copy(ctx, g);
      if (!*acc) rc = ctx->err_code;
    }
  } else {
    rm_tensor *in[2] = { *acc, g };
    /* a leaf's .grad sums in place (handles to it see the sum); a node's gradient may
     * be shared (see above) and is then not ours to write */
    if (rm_tensor_is_contiguous(*acc) && (cat == RM_CAT_GRAD || (*acc)->refcount == 1)) {
      rc = rm_op_into(ctx, RM_OP_ADD, 2, in, NULL, 1, acc);
    } else {   /* rm_op_into writes only contiguous tensors: a new sum replaces acc */
      rm_tensor *sum = rm_add(ctx, *acc, g);
      if (!sum) rc = ctx->err_code;
      else { rm_tensor_drop(ctx, *acc); *acc = sum; }
    }
  }
  rm_scope_leave(ctx, &sc);
  return rc;
}

static int by_seq_desc(const void *a, const void *b) {
  const rm_node *x = *(rm_node *const *)a, *y = *(rm_node *const *)b;
  return x->seq < y->seq ? 1 : x->seq > y->seq ? -1 : 0;
}

/* Nodes reachable from root, sorted newest first. */
static int collect(rm_ctx *ctx, rm_node *root, rm_node ***out, size_t *count, size_t *capacity) {
  size_t cap = 64, n = 0, top = 0;
  rm_node **list = rm_host_malloc(ctx, cap * sizeof *list);
  rm_node **stack = rm_host_malloc(ctx, cap * sizeof *stack);
  size_t scap = cap;
  if (!list || !stack) goto oom;
  /* visited marks are cleared again below */
  stack[top++] = root;
  root->visited = true;
  while (top) {
    rm_node *nd = stack[--top];
    if (n == cap) {
      rm_node **nl = rm_host_realloc(ctx, list, cap * sizeof *list, 2 * cap * sizeof *list);
      if (!nl) goto oom;
      list = nl;
      cap *= 2;
    }
    list[n++] = nd;
    for (int i = 0; i < nd->nin; i++) {
      rm_node *p = nd->in[i]->grad_fn;
      if (!p || !rm_node_needs_grad(nd, i) || p->visited) continue;
      p->visited = true;
      if (top == scap) {
        rm_node **ns = rm_host_realloc(ctx, stack, scap * sizeof *stack, 2 * scap * sizeof *stack);
        if (!ns) goto oom;
        stack = ns;
        scap *= 2;
      }
      stack[top++] = p;
    }
  }
  for (size_t k = 0; k < n; k++) list[k]->visited = false;
  rm_host_free(ctx, stack, scap * sizeof *stack);
  qsort(list, n, sizeof *list, by_seq_desc);
  *out = list;
  *count = n;
  *capacity = cap;
  return RM_OK;
oom:
  rm_host_free(ctx, list, cap * sizeof *list);
  rm_host_free(ctx, stack, scap * sizeof *stack);
  return rm_fail(ctx, RM_ERR_OOM, "backward: out of host memory");
}

static int run_node(rm_ctx *ctx, rm_node *n) {
  const rm_op_def *def = rm_op_def_get(n->op);
  bool any = false;
  for (int j = 0; j < n->nout; j++) any = any || n->gout[j];
  if (!any) return RM_OK;
  if (!def->backward)
    return rm_fail(ctx, RM_ERR_STATE, "backward: %s has no backward rule", def->name);
  rm_tensor *gin[RM_MAX_INPUTS];
  memset(gin, 0, sizeof gin[0] * (size_t)n->nin);
  if (rm_node_check_saved(ctx, n)) return rm_fail_prefix(ctx, "backward");
  /* rematerialise what the backward reads before it allocates anything: a replay then
   * peaks on top of what the layer keeps, not on top of half-made gradients */
  int rc = RM_OK;
  for (int i = 0; i < n->nin && rc == RM_OK; i++)
    if (rm_node_saved_in(n, i)) rc = rm_tensor_data_ready(ctx, n->in[i]);
  for (int j = 0; j < n->nout && rc == RM_OK; j++)
    if (((n->saved_out >> j) & 1u) && n->out[j]) rc = rm_tensor_data_ready(ctx, n->out[j]);
  if (rc == RM_OK) rc = def->backward(ctx, n, n->gout, gin);
  if (rc) rm_fail_prefix(ctx, def->name);
  for (int i = 0; i < n->nin; i++) {
    if (!gin[i]) continue;
    rm_tensor *x = n->in[i];
    if (rc == RM_OK && (gin[i]->ndim != x->ndim || !rm_same_shape(gin[i], x))) {
      char s1[64], s2[64];
      rc = rm_fail(ctx, RM_ERR_STATE, "backward: %s gave a gradient of shape %s for an input of shape %s",
                   def->name, rm_tensor_shape_str(gin[i], s1, sizeof s1), rm_tensor_shape_str(x, s2, sizeof s2));
    }
    if (rc == RM_OK && rm_node_needs_grad(n, i)) {
      if (x->grad_fn)
        rc = rm_accumulate(ctx, &x->grad_fn->gout[x->out_index], gin[i], ctx->category);
      else if (x->requires_grad)
        rc = rm_accumulate(ctx, &x->grad, gin[i], RM_CAT_GRAD);
    }
    rm_tensor_drop(ctx, gin[i]);
  }
  return rc;
}

static bool is_leaf_edge(const rm_node *n, int i) {
  return rm_node_needs_grad(n, i) && !n->in[i]->grad_fn && n->in[i]->requires_grad;
}

/* Counts, per leaf, the edges of this backward that will deliver a gradient to it. */
static void count_leaf_edges(rm_node **list, size_t count, int delta) {
  for (size_t k = 0; k < count; k++)
    for (int i = 0; i < list[k]->nin; i++)
      if (is_leaf_edge(list[k], i)) list[k]->in[i]->pending += delta;
}

/* After n's backward: leaves that received their last gradient are final. */
static int leaves_done(rm_ctx *ctx, rm_node *n) {
  int rc = RM_OK;
  for (int i = 0; i < n->nin; i++) {
    if (!is_leaf_edge(n, i)) continue;
    rm_tensor *x = n->in[i];
    if (--x->pending == 0 && x->grad && rc == RM_OK && rm_hooked(ctx, RM_HOOK_GRAD_READY))
      rc = rm_hook_fire(ctx, RM_HOOK_GRAD_READY, &(rm_event){ .tensor = x });
  }
  return rc;
}

int rm_backward(rm_ctx *ctx, rm_tensor *root, rm_tensor *grad) {
  if (!ctx) return RM_ERR_ARG;
  if (!root) return rm_fail(ctx, RM_ERR_ARG, "backward: no tensor");
  if (!root->requires_grad)
    return rm_fail(ctx, RM_ERR_STATE, "backward: the tensor does not require grad (no op on it was recorded)");
  if (!grad && rm_tensor_numel(root) != 1) {
    char s[64];
    return rm_fail(ctx, RM_ERR_SHAPE, "backward: a gradient is needed for a non-scalar tensor of size %s",
                   rm_tensor_shape_str(root, s, sizeof s));
  }
  if (grad && !rm_same_shape(grad, root))
    return rm_fail(ctx, RM_ERR_SHAPE, "backward: gradient shape does not match the tensor");
  rm_scope sc;
  rm_scope_enter(ctx, &sc, RM_CAT_ACTIVATION, RM_GRAD_OFF);
  int rc = RM_OK;
  rm_tensor *seed = grad;
  if (seed) rm_tensor_hold(seed);
  else seed = rm_full_like(ctx, root, 1.0);
  if (!seed) { rc = ctx->err_code; goto out; }
  if (!root->grad_fn) {
    rc = rm_accumulate(ctx, &root->grad, seed, RM_CAT_GRAD);
    rm_tensor_drop(ctx, seed);
    goto out;
  }
  rm_node **list = NULL;
  size_t count = 0, cap = 0;
  rc = collect(ctx, root->grad_fn, &list, &count, &cap);
  if (rc) { rm_tensor_drop(ctx, seed); goto out; }
  for (size_t k = 0; k < count && rc == RM_OK; k++)
    if (list[k]->done)
      rc = rm_fail(ctx, RM_ERR_STATE, "backward: the graph was already used by a backward (its saved data is gone); run the forward again");
  if (rc == RM_OK) {
    for (size_t k = 0; k < count; k++) rm_node_retain(list[k]);
    count_leaf_edges(list, count, 1);
    rc = rm_accumulate(ctx, &root->grad_fn->gout[root->out_index], seed, ctx->category);
    for (size_t k = 0; k < count && rc == RM_OK; k++) {
      rm_event ev = { .node = list[k] };
      if (rm_hooked(ctx, RM_HOOK_NODE_BEFORE)) rc = rm_hook_fire(ctx, RM_HOOK_NODE_BEFORE, &ev);
      if (rc == RM_OK) rc = run_node(ctx, list[k]);
      if (rc == RM_OK && rm_hooked(ctx, RM_HOOK_NODE_AFTER)) rc = rm_hook_fire(ctx, RM_HOOK_NODE_AFTER, &ev);
      if (rc == RM_OK) rc = leaves_done(ctx, list[k]);
      else count_leaf_edges(list + k, 1, -1);
      rm_node_release_saved(ctx, list[k]);
      list[k]->done = true;
    }
    for (size_t k = 0; k < count; k++) {
      if (rc && !list[k]->done) count_leaf_edges(list + k, 1, -1);
      if (rc) rm_node_release_saved(ctx, list[k]);
      rm_node_release(ctx, list[k]);
    }
  }
  rm_tensor_drop(ctx, seed);
  rm_host_free(ctx, list, cap * sizeof *list);
out:
  rm_scope_leave(ctx, &sc);
  if (rm_hooked(ctx, RM_HOOK_BACKWARD_DONE)) {
    int hrc = rm_hook_fire(ctx, RM_HOOK_BACKWARD_DONE, &(rm_event){ .tensor = root, .rc = rc });
    if (rc == RM_OK) rc = hrc;
  }
  return rc;
}
