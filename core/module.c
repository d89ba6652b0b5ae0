/* Generic module machinery: lifetime, parameters and children, recursive visits,
 * train/eval, moving parameters between devices and dtypes, and the two container
 * types that have no layer of their own (Sequential, Lua-defined "foreign"). */
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "policy.h"
#include "sequential.h"

rm_module *rm_module_new(rm_ctx *ctx, const rm_module_type *t) {
  rm_module *m = rm_host_calloc(ctx, 1, sizeof *m);
  if (!m) {
    rm_fail(ctx, RM_ERR_OOM, "out of host memory creating a %s module", t->name);
    return NULL;
  }
  m->refcount = 1;
  m->type = t;
  m->training = true;
  return m;
}

void rm_module_retain(rm_module *m) { m->refcount++; }

void rm_module_release(rm_ctx *ctx, rm_module *m) {
  if (!ctx || !m || --m->refcount > 0) return;
  if (m->type->destroy) m->type->destroy(ctx, m);
  if (m->foreign_free) m->foreign_free(ctx, m->foreign_ud);
  if (m->plan && m->plan_free) m->plan_free(ctx, m->plan);
  rm_policy_free(ctx, m);
  for (int i = 0; i < m->nparams; i++)
    if (m->params[i]) rm_tensor_drop(ctx, m->params[i]);
  for (int i = 0; i < m->nchildren; i++) rm_module_release(ctx, m->children[i]);
  rm_host_free(ctx, m->params, sizeof *m->params * (size_t)m->cap_params);
  rm_host_free(ctx, m->param_names, sizeof *m->param_names * (size_t)m->cap_params);
  rm_host_free(ctx, m->children, sizeof *m->children * (size_t)m->cap_children);
  rm_host_free(ctx, m->child_names, sizeof *m->child_names * (size_t)m->cap_children);
  rm_host_free(ctx, m, sizeof *m);
}

int rm_module_forward(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y) {
  if (!ctx || !y) return RM_ERR_ARG;
  *y = NULL;
  if (!m) return rm_fail(ctx, RM_ERR_ARG, "forward: no module");
  if (!x) return rm_fail(ctx, RM_ERR_ARG, "%s: no input", m->type->name);
  if (!m->type->forward) return rm_fail(ctx, RM_ERR_STATE, "%s has no forward", m->type->name);
  int rc = RM_OK;
  if (ctx->forward_depth == 0 && ctx->grad_enabled && !ctx->dry && rm_policy_pending(m, x))
    rc = rm_policy_prepare(ctx, m, x, NULL);
  if (rc) return rc;
  ctx->forward_depth++;
  rc = m->type->forward(ctx, m, x, y);
  ctx->forward_depth--;
  if (rc != RM_OK && *y) rm_tensor_drop(ctx, *y), *y = NULL;
  if (rc == RM_OK && !*y) rc = rm_fail(ctx, RM_ERR_STATE, "%s: forward gave no output", m->type->name);
  return rc;
}

static bool valid_name(const char *name) {
  return name && strlen(name) < RM_NAME_MAX && !strchr(name, '.');
}

/* Grows two parallel arrays (n used of cap, element sizes sa and sb) to newcap, both
 * or neither: new blocks first, so a failing allocator leaves the old ones untouched. */
static int grow_pair(rm_ctx *ctx, void **a, size_t sa, void **b, size_t sb, int n, int cap,
                     int newcap) {
  void *na = rm_host_malloc(ctx, sa * (size_t)newcap);
  void *nb = na ? rm_host_malloc(ctx, sb * (size_t)newcap) : NULL;
  if (!nb) {
    if (na) rm_host_free(ctx, na, sa * (size_t)newcap);
    return RM_ERR_OOM;
  }
  if (n) memcpy(na, *a, sa * (size_t)n), memcpy(nb, *b, sb * (size_t)n);
  if (*a) rm_host_free(ctx, *a, sa * (size_t)cap);
  if (*b) rm_host_free(ctx, *b, sb * (size_t)cap);
  *a = na;
  *b = nb;
  return RM_OK;
}

int rm_module_add_param(rm_ctx *ctx, rm_module *m, const char *name, rm_tensor *t) {
  if (!valid_name(name) || !name[0]) {
    if (t) rm_tensor_drop(ctx, t);
    rm_fail(ctx, RM_ERR_ARG, "%s: a parameter name must be 1 to %d characters without '.'",
            m->type->name, RM_NAME_MAX - 1);
    return -1;
  }
  if (rm_module_param_slot(m, name)) {
    if (t) rm_tensor_drop(ctx, t);
    rm_fail(ctx, RM_ERR_ARG, "%s: there is already a parameter named '%s'", m->type->name, name);
    return -1;
  }
  if (m->nparams == m->cap_params) {
    int cap = m->cap_params ? 2 * m->cap_params : 4;
    if (grow_pair(ctx, (void **)&m->params, sizeof *m->params, (void **)&m->param_names,
                  sizeof *m->param_names, m->nparams, m->cap_params, cap)) {
      if (t) rm_tensor_drop(ctx, t);
      rm_fail(ctx, RM_ERR_OOM, "out of host memory adding a parameter");
      return -1;
    }
    m->cap_params = cap;
  }
  m->params[m->nparams] = t;
  snprintf(m->param_names[m->nparams], RM_NAME_MAX, "%s", name);
  return m->nparams++;
}

rm_tensor **rm_module_param_slot(rm_module *m, const char *name) {
  for (int i = 0; i < m->nparams; i++)
    if (!strcmp(m->param_names[i], name)) return &m->params[i];
  return NULL;
}

/* Does tree contain m (or is it m)? */
static bool contains(const rm_module *tree, const rm_module *m) {
  if (tree == m) return true;
  for (int i = 0; i < tree->nchildren; i++)
    if (contains(tree->children[i], m)) return true;
  return false;
}

int rm_module_add_named_child(rm_ctx *ctx, rm_module *parent, const char *name, rm_module *child) {
  if (!ctx) return RM_ERR_ARG;
  if (!parent) return rm_fail(ctx, RM_ERR_ARG, "add: no module to add to");
  if (!child) return rm_fail(ctx, RM_ERR_ARG, "%s: no module to add", parent->type->name);
  if (!valid_name(name))
    return rm_fail(ctx, RM_ERR_ARG, "%s: a child name must be under %d characters without '.'",
                   parent->type->name, RM_NAME_MAX);
  if (rm_policy_busy(ctx, parent, "add")) return ctx->err_code;
  if (contains(child, parent))
    return rm_fail(ctx, RM_ERR_ARG, "%s: cannot add a module to itself or to one of its children",
                   parent->type->name);
  if (parent->nchildren == parent->cap_children) {
    int cap = parent->cap_children ? 2 * parent->cap_children : 4;
    if (grow_pair(ctx, (void **)&parent->children, sizeof *parent->children,
                  (void **)&parent->child_names, sizeof *parent->child_names, parent->nchildren,
                  parent->cap_children, cap))
      return rm_fail(ctx, RM_ERR_OOM, "out of host memory adding a module");
    parent->cap_children = cap;
  }
  rm_module_retain(child);
  parent->children[parent->nchildren] = child;
  snprintf(parent->child_names[parent->nchildren], RM_NAME_MAX, "%s", name);
  parent->nchildren++;
  /* a policy is a plan for every layer: replanned for the new length */
  return rm_policy_layers_changed(ctx, parent);
}

int rm_module_add_child(rm_ctx *ctx, rm_module *parent, rm_module *child) {
  return rm_module_add_named_child(ctx, parent, "", child);
}

rm_module *rm_module_self_or_child(rm_module *m, const char *name, const rm_module_type *t) {
  if (m->type == t) return m;
  for (int i = 0; i < m->nchildren; i++)
    if (!strcmp(m->child_names[i], name) && m->children[i]->type == t) return m->children[i];
  return NULL;
}

/* ---- recursive visits ---- */

typedef struct visit {
  rm_ctx *ctx;
  rm_param_visit_fn fn;
  void *ud;
  rm_tensor **seen;      /* tensors already visited (shared parameters appear once) */
  int nseen, capseen;
  char name[512];
} visit;

static int visit_rec(visit *v, rm_module *m, size_t plen) {
  for (int i = 0; i < m->nparams; i++) {
    rm_tensor *t = m->params[i];
    if (!t) continue;
    bool dup = false;
    for (int k = 0; k < v->nseen && !dup; k++) dup = v->seen[k] == t;
    if (dup) continue;
    if (v->nseen == v->capseen) {
      int cap = v->capseen ? 2 * v->capseen : 16;
      rm_tensor **s = rm_host_realloc(v->ctx, v->seen, sizeof *s * (size_t)v->capseen, sizeof *s * (size_t)cap);
      if (!s) return rm_fail(v->ctx, RM_ERR_OOM, "out of host memory listing parameters");
      v->seen = s;
      v->capseen = cap;
    }
    v->seen[v->nseen++] = t;
    snprintf(v->name + plen, sizeof v->name - plen, "%s", m->param_names[i]);
    int rc = v->fn(v->ud, v->name, &m->params[i], m);
    if (rc) return rc;
  }
  for (int i = 0; i < m->nchildren; i++) {
    int n;
    if (m->child_names[i][0]) n = snprintf(v->name + plen, sizeof v->name - plen, "%s.", m->child_names[i]);
    else n = snprintf(v->name + plen, sizeof v->name - plen, "%d.", i + 1);
    if (n < 0 || plen + (size_t)n >= sizeof v->name)
      return rm_fail(v->ctx, RM_ERR_ARG, "parameter names nest too deeply");
    int rc = visit_rec(v, m->children[i], plen + (size_t)n);
    if (rc) return rc;
  }
  return RM_OK;
}

int rm_module_visit_params(rm_ctx *ctx, rm_module *m, rm_param_visit_fn fn, void *ud) {
  visit v = { .ctx = ctx, .fn = fn, .ud = ud };
  v.name[0] = 0;
  int rc = visit_rec(&v, m, 0);
  rm_host_free(ctx, v.seen, sizeof *v.seen * (size_t)v.capseen);
  return rc;
}

static int count_visit(void *ud, const char *name, rm_tensor **slot, rm_module *owner) {
  *(int64_t *)ud += rm_tensor_numel(*slot);
  return 0;
}

int64_t rm_module_num_params(rm_ctx *ctx, rm_module *m) {
  int64_t n = 0;
  rm_module_visit_params(ctx, m, count_visit, &n);
  return n;
}

void rm_module_train(rm_module *m, bool training) {
  m->training = training;
  for (int i = 0; i < m->nchildren; i++) rm_module_train(m->children[i], training);
}

static int zero_visit(void *ud, const char *name, rm_tensor **slot, rm_module *owner) {
  rm_tensor *t = *slot;
  if (t->grad) rm_tensor_drop(ud, t->grad), t->grad = NULL;
  return 0;
}

void rm_module_zero_grad(rm_ctx *ctx, rm_module *m) {
  rm_module_visit_params(ctx, m, zero_visit, ctx);
}

/* ---- moving parameters ---- */

/* Copies through host memory with the backends' transfer functions. */
rm_tensor *rm_nn_transfer(rm_ctx *ctx, rm_tensor *t, rm_device dev, rm_category cat) {
  const rm_backend *src_b = rm_backend_get(ctx, t->device);
  const rm_backend *dst_b = src_b ? rm_backend_get(ctx, dev) : NULL;
  if (!dst_b) return NULL;
  rm_tensor *c = rm_contiguous(ctx, t);
  if (!c) return NULL;
  rm_tensor *out = rm_tensor_new(ctx, t->dtype, dev, t->ndim, t->shape, cat);
  size_t n = rm_tensor_nbytes(t);
  int rc = out ? RM_OK : ctx->err_code;
  if (rc == RM_OK && n && !ctx->dry) {
    if (t->device == RM_CPU) {
      rc = dst_b->from_host(ctx, rm_tensor_ptr(out), rm_tensor_ptr(c), n);
    } else if (dev == RM_CPU) {
      rc = src_b->to_host(ctx, rm_tensor_ptr(out), rm_tensor_ptr(c), n);
    } else {
      void *tmp = rm_host_malloc(ctx, n);
      rc = tmp ? src_b->to_host(ctx, tmp, rm_tensor_ptr(c), n) : RM_ERR_OOM;
      if (rc == RM_OK) rc = dst_b->from_host(ctx, rm_tensor_ptr(out), tmp, n);
      rm_host_free(ctx, tmp, n);
    }
    if (rc && !ctx->err[0]) rm_fail(ctx, rc, "copying a tensor from %s to %s failed",
                                    rm_device_name(t->device), rm_device_name(dev));
  }
  rm_tensor_drop(ctx, c);
  if (rc) {
    rm_tensor_drop(ctx, out);
    return NULL;
  }
  return out;
}

/* Moves one tensor: a new leaf on dev with dtype dt, requires_grad, category param. */
static rm_tensor *moved(rm_ctx *ctx, rm_tensor *p, rm_device dev, rm_dtype dt) {
  rm_tensor *t = p;
  rm_tensor_hold(t);
  if (t->dtype != dt) {
    rm_tensor *c = rm_cast(ctx, t, dt);
    rm_tensor_drop(ctx, t);
    t = c;
  }
  if (t && t->device != dev) {
    rm_tensor *c = rm_nn_transfer(ctx, t, dev, RM_CAT_PARAM);
    rm_tensor_drop(ctx, t);
    t = c;
  }
  if (t) t->requires_grad = true;
  return t;
}

typedef struct move_map {
  rm_tensor **from, **to;   /* old -> new, so shared parameters stay shared */
  int n, cap;
} move_map;

static int to_rec(rm_ctx *ctx, rm_module *m, rm_device dev, rm_dtype dt, move_map *map) {
  for (int i = 0; i < m->nparams; i++) {
    rm_tensor *p = m->params[i], *t = NULL;
    if (!p) continue;
    for (int k = 0; k < map->n && !t; k++)
      if (map->from[k] == p) t = map->to[k];
    if (t) {
      rm_tensor_hold(t);
    } else {
      if (p->dtype == dt && p->device == dev) continue;
      if (map->n == map->cap) {
        int cap = map->cap ? 2 * map->cap : 16;
        size_t o = sizeof(rm_tensor *) * (size_t)map->cap, nw = sizeof(rm_tensor *) * (size_t)cap;
        rm_tensor **f = rm_host_realloc(ctx, map->from, o, nw);
        if (f) map->from = f;
        rm_tensor **to = f ? rm_host_realloc(ctx, map->to, o, nw) : NULL;
        if (!to) {
          if (f) map->from = rm_host_realloc(ctx, f, nw, o);
          return rm_fail(ctx, RM_ERR_OOM, "out of host memory moving parameters");
        }
        map->to = to;
        map->cap = cap;
      }
      t = moved(ctx, p, dev, dt);
      if (!t) {
        char what[RM_NAME_MAX + 64];
        snprintf(what, sizeof what, "%s: moving parameter %s", m->type->name, m->param_names[i]);
        return rm_fail_prefix(ctx, what);
      }
      rm_tensor_retain(p);  /* keeps its address from being reused while the map lives */
      map->from[map->n] = p;
      map->to[map->n++] = t;
      rm_tensor_hold(t);
    }
    m->params[i] = t;
    rm_tensor_drop(ctx, p);
  }
  for (int i = 0; i < m->nchildren; i++) {
    int rc = to_rec(ctx, m->children[i], dev, dt, map);
    if (rc) return rc;
  }
  return RM_OK;
}

int rm_module_to(rm_ctx *ctx, rm_module *m, rm_device dev, rm_dtype dt) {
  rm_scope sc;
  rm_scope_enter(ctx, &sc, RM_CAT_PARAM, RM_GRAD_OFF);
  move_map map = { 0 };
  int rc = to_rec(ctx, m, dev, dt, &map);
  for (int k = 0; k < map.n; k++) {
    rm_tensor_drop(ctx, map.to[k]);
    rm_tensor_release(ctx, map.from[k]);
  }
  rm_host_free(ctx, map.from, sizeof(rm_tensor *) * (size_t)map.cap);
  rm_host_free(ctx, map.to, sizeof(rm_tensor *) * (size_t)map.cap);
  rm_scope_leave(ctx, &sc);
  return rc;
}

char *rm_module_describe(const rm_module *m, char *buf, size_t n) {
  char cfg[128] = "";
  if (m->type->describe) m->type->describe(m, cfg, sizeof cfg);
  snprintf(buf, n, "%s(%s)", m->type->name, cfg);
  return buf;
}

/* ---- parameters of built-in types ---- */

/* Runs make() with outputs in category param and grad off, then marks a leaf. */
static void param_begin(rm_ctx *ctx, rm_scope *pm) { rm_scope_enter(ctx, pm, RM_CAT_PARAM, RM_GRAD_OFF); }

static rm_tensor *param_end(rm_ctx *ctx, rm_scope *pm, rm_tensor *t) {
  rm_scope_leave(ctx, pm);
  if (t) t->requires_grad = true;
  return t;
}

rm_tensor *rm_param_uniform(rm_ctx *ctx, int ndim, const int64_t *shape, double bound) {
  rm_scope pm;
  param_begin(ctx, &pm);
  rm_tensor *t = rm_rand(ctx, RM_F32, RM_CPU, ndim, shape);
  if (t) {
    /* u in [0, 1) -> 2 b u - b, in place */
    rm_attrs a;
    rm_attrs_init(&a);
    a.scalar.value = 2 * bound;
    int rc = rm_op_into(ctx, RM_OP_MUL_SCALAR, 1, &t, &a, 1, &t);
    a.scalar.value = -bound;
    if (!rc) rc = rm_op_into(ctx, RM_OP_ADD_SCALAR, 1, &t, &a, 1, &t);
    if (rc) rm_tensor_drop(ctx, t), t = NULL;
  }
  return param_end(ctx, &pm, t);
}

rm_tensor *rm_param_normal(rm_ctx *ctx, int ndim, const int64_t *shape) {
  rm_scope pm;
  param_begin(ctx, &pm);
  return param_end(ctx, &pm, rm_randn(ctx, RM_F32, RM_CPU, ndim, shape));
}

rm_tensor *rm_param_full(rm_ctx *ctx, int ndim, const int64_t *shape, double value) {
  rm_scope pm;
  param_begin(ctx, &pm);
  return param_end(ctx, &pm, rm_full(ctx, RM_F32, RM_CPU, ndim, shape, value));
}

int rm_module_check_features(rm_ctx *ctx, const rm_module *m, const rm_tensor *x, int min_dim,
                             int64_t d) {
  char desc[160], s[96];
  if (x->ndim >= min_dim && x->ndim > 0 && x->shape[x->ndim - 1] == d) return RM_OK;
  rm_module_describe(m, desc, sizeof desc);
  if (x->ndim < min_dim || x->ndim == 0)
    return rm_fail(ctx, RM_ERR_SHAPE, "%s: expected an input with at least %d dimensions, got size %s",
                   desc, min_dim > 1 ? min_dim : 1, rm_tensor_shape_str(x, s, sizeof s));
  return rm_fail(ctx, RM_ERR_SHAPE, "%s: the input has %lld features in its last dimension (size %s), expected %lld",
                 desc, (long long)x->shape[x->ndim - 1], rm_tensor_shape_str(x, s, sizeof s), (long long)d);
}

/* ---- Sequential and Lua-defined modules ---- */

static int sequential_forward(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y) {
  return rm_sequential_forward(ctx, m, x, y);
}

static void sequential_describe(const rm_module *m, char *buf, size_t n) {
  snprintf(buf, n, "%d layers", m->nchildren);
}

const rm_module_type rm_type_sequential = {
  .name = "Sequential", .forward = sequential_forward, .describe = sequential_describe,
};

rm_module *rm_sequential_new(rm_ctx *ctx) { return ctx ? rm_module_new(ctx, &rm_type_sequential) : NULL; }

static int foreign_forward(rm_ctx *ctx, rm_module *m, rm_tensor *x, rm_tensor **y) {
  if (!m->foreign) return rm_fail(ctx, RM_ERR_STATE, "Lua module: no forward function");
  return m->foreign(ctx, m, x, y, m->foreign_ud);
}

const rm_module_type rm_type_foreign = { .name = "Lua", .forward = foreign_forward };

rm_module *rm_foreign_new(rm_ctx *ctx,
                          int (*fn)(rm_ctx *, rm_module *, rm_tensor *, rm_tensor **, void *),
                          void *ud, void (*free_ud)(rm_ctx *, void *)) {
  rm_module *m = rm_module_new(ctx, &rm_type_foreign);
  if (!m) return NULL;
  m->foreign = fn;
  m->foreign_ud = ud;
  m->foreign_free = free_ud;
  return m;
}
