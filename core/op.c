/* The op registry, rm_op_run (check, allocate, dispatch, record) and replay. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "op.h"
#include "opcost.h"
#include "ops.h"
#include "philox.h"

/* Strong references: every op in ops.def must be defined, and a static link pulls in
 * each family's object file. */
#define X(ID, name, family, set) extern const rm_op_def rm_opdef_##name;
#include "ops.def"

static const rm_op_def *const op_table[RM_OP_COUNT] = {
#define X(ID, name, family, set) [RM_OP_##ID] = &rm_opdef_##name,
#include "ops.def"
};

static const char *const op_names[RM_OP_COUNT] = {
#define X(ID, name, family, set) [RM_OP_##ID] = #name,
#include "ops.def"
};

/* The attribute descriptors: one array per ATTRS set, then each op's set. */
#define RM_AT_DESC(s, f) RM_AT_DESC2(s, RM_AT_ARGS_##f)
#define RM_AT_DESC2(s, tn) RM_AT_DESC3(s, tn)
#define RM_AT_DESC3(s, t, n) { #n, RM_ATTR_##t, RM_AT_OFF_##t(s, n) },
#define RM_AT_ARGS_INT(n) INT, n
#define RM_AT_ARGS_BOOL(n) BOOL, n
#define RM_AT_ARGS_REAL(n) REAL, n
#define RM_AT_ARGS_SHAPE(n) SHAPE, n
#define RM_AT_OFF_INT(s, n) offsetof(rm_attrs, s.n)
#define RM_AT_OFF_BOOL(s, n) offsetof(rm_attrs, s.n)
#define RM_AT_OFF_REAL(s, n) offsetof(rm_attrs, s.n)
#define RM_AT_OFF_SHAPE(s, n) offsetof(rm_attrs, ndim)
#define ATTRS(set, ...)                                                                 \
  static const rm_attr_field attrs_##set[] = { RM_AT_EACH(RM_AT_DESC, set, __VA_ARGS__) }; \
  enum { nattrs_##set = sizeof attrs_##set / sizeof attrs_##set[0] };
#include "ops.def"
#define attrs_none NULL /* ops without attributes */
enum { nattrs_none = 0 };

static const struct { const rm_attr_field *f; int n; } op_attrs[RM_OP_COUNT] = {
#define X(ID, name, family, set) [RM_OP_##ID] = { attrs_##set, nattrs_##set },
#include "ops.def"
};

const rm_attr_field *rm_op_attrs(rm_op_id op, int *n) {
  if ((unsigned)op >= RM_OP_COUNT) { *n = 0; return NULL; }
  *n = op_attrs[op].n;
  return op_attrs[op].f;
}

const char *rm_attr_type_name(rm_attr_type t) {
  static const char *const names[] = { "an integer", "a boolean", "a number", "a list of integers" };
  return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

const rm_op_def *rm_op_def_get(rm_op_id op) {
  return (unsigned)op < RM_OP_COUNT ? op_table[op] : NULL;
}

const char *rm_op_name(rm_op_id op) { return (unsigned)op < RM_OP_COUNT ? op_names[op] : "?"; }

int rm_op_find(const char *name) {
  for (int i = 0; i < RM_OP_COUNT; i++)
    if (!strcmp(op_names[i], name)) return i;
  return -1;
}

void rm_attrs_init(rm_attrs *a) { memset(a, 0, sizeof *a); }

/* ---- infer helpers ---- */

int rm_check_same_device(rm_ctx *ctx, const char *op, int nin, rm_tensor *const *in) {
  for (int i = 1; i < nin; i++)
    if (in[i]->device != in[0]->device)
      return rm_fail(ctx, RM_ERR_DEVICE, "%s: input %d is on %s but input 1 is on %s", op,
                     i + 1, rm_device_name(in[i]->device), rm_device_name(in[0]->device));
  return RM_OK;
}

int rm_check_same_dtype(rm_ctx *ctx, const char *op, int nin, rm_tensor *const *in) {
  for (int i = 1; i < nin; i++)
    if (in[i]->dtype != in[0]->dtype)
      return rm_fail(ctx, RM_ERR_DTYPE, "%s: input %d is %s but input 1 is %s", op, i + 1,
                     rm_dtype_name(in[i]->dtype), rm_dtype_name(in[0]->dtype));
  return RM_OK;
}

int rm_check_index_dtype(rm_ctx *ctx, const char *op, const char *what, const rm_tensor *idx) {
  rm_dtype d = idx->dtype;
  if (d == RM_I32 || d == RM_I64 || d == RM_F32 || d == RM_F64) return RM_OK;
  return rm_fail(ctx, RM_ERR_DTYPE, "%s: %s must be int64, int32 (or whole numbers in float32/float64), got %s",
                 op, what, rm_dtype_name(d));
}

int rm_check_shape(rm_ctx *ctx, const char *op, const char *what, const rm_tensor *t, int n,
                   const int64_t *s) {
  bool ok = t->ndim == n;
  for (int d = 0; ok && d < n; d++) ok = t->shape[d] == s[d];
  if (ok) return RM_OK;
  char s1[96], s2[96];
  return rm_fail(ctx, RM_ERR_SHAPE, "%s: %s has shape %s, expected %s", op, what,
                 rm_tensor_shape_str(t, s1, sizeof s1), rm_shape_str(n, s, s2, sizeof s2));
}

int rm_broadcast_shape(rm_ctx *ctx, const char *op, int na, const int64_t *a, int nb,
                       const int64_t *b, int *nout, int64_t *out) {
  int n = na > nb ? na : nb;
  for (int i = 0; i < n; i++) {
    int64_t da = i < n - na ? 1 : a[i - (n - na)];
    int64_t db = i < n - nb ? 1 : b[i - (n - nb)];
    if (da != db && da != 1 && db != 1) {
      char sa[96], sb[96];
      return rm_fail(ctx, RM_ERR_SHAPE, "%s: shapes %s and %s cannot be broadcast (dimension %d: %lld vs %lld)",
                     op, rm_shape_str(na, a, sa, sizeof sa), rm_shape_str(nb, b, sb, sizeof sb),
                     i + 1, (long long)da, (long long)db);
    }
    out[i] = da == 1 ? db : da;
  }
  *nout = n;
  return RM_OK;
}

int rm_check_dim(rm_ctx *ctx, const char *op, int64_t dim, int ndim, int *out) {
  int64_t d = dim < 0 ? dim + ndim : dim;
  if (d < 0 || d >= (ndim ? ndim : 1))
    return dim < 0 ? rm_fail(ctx, RM_ERR_ARG, "%s: dimension %lld is out of range for a %d-d tensor", op,
                             (long long)dim, ndim)
                   : rm_fail(ctx, RM_ERR_ARG, "%s: dimension %llu is out of range for a %d-d tensor", op,
                             (unsigned long long)dim + 1, ndim);
  *out = (int)d;
  return RM_OK;
}

static int default_infer(rm_ctx *ctx, const rm_op_def *def, int nin, rm_tensor *const *in,
                         rm_meta *out) {
  int rc = rm_check_same_device(ctx, def->name, nin, in);
  if (!rc) rc = rm_check_same_dtype(ctx, def->name, nin, in);
  if (rc) return rc;
  rm_tensor_meta(in[0], &out[0]);
  for (int i = 1; i < nin; i++) {
    int64_t acc[RM_MAX_DIM]; /* the inputs of rm_broadcast_shape must not alias its output */
    memcpy(acc, out[0].shape, sizeof acc);
    rc = rm_broadcast_shape(ctx, def->name, out[0].ndim, acc, in[i]->ndim, in[i]->shape,
                            &out[0].ndim, out[0].shape);
    if (rc) return rc;
  }
  for (int j = 1; j < def->nout; j++) out[j] = out[0];
  return RM_OK;
}

/* ---- execution ---- */

/* A view of t broadcast to shape (stride 0 along new and size-1 dims): how kernels of
 * RM_OPF_BROADCAST ops see their inputs. */
static rm_tensor *broadcast_view(rm_ctx *ctx, rm_tensor *t, int ndim, const int64_t *shape) {
  int64_t st[RM_MAX_DIM];
  int off = ndim - t->ndim;
  for (int d = 0; d < ndim; d++)
    st[d] = d < off || t->shape[d - off] == 1 ? 0 : t->stride[d - off];
  return rm_tensor_view_of(ctx, t, ndim, shape, st, t->offset);
}

/* Whether backend b runs op on data of dtype d; else an error naming both. Integer
 * dtypes are refused for ops the backend does not list in int_ops, with that list. */
static int check_kernel_dtype(rm_ctx *ctx, const rm_backend *b, rm_op_id op, rm_dtype d) {
  const char *name = op_names[op];
  if (!b->supports_dtype[d])
    return rm_fail(ctx, RM_ERR_DTYPE, "%s: %s does not support %s", name, b->name, rm_dtype_name(d));
  if (!rm_dtype_is_int(d) || b->int_ops[op]) return RM_OK;
  char list[512];
  size_t at = 0;
  list[0] = 0;
  for (int k = 0; k < RM_OP_COUNT && at < sizeof list; k++)
    if (b->int_ops[k] && !(op_table[k]->flags & RM_OPF_INTERNAL))
      at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", at ? ", " : "", op_names[k]);
  return rm_fail(ctx, RM_ERR_DTYPE,
                 "%s does not take %s tensors (on %s, integer tensors go to: %s, views, indexing ops and "
                 "conversions; convert first with x:to('float32'))",
                 name, rm_dtype_name(d), b->name, list);
}

/* A dry run skips the kernel; what the kernel would borrow as workspace is a phantom
 * allocation given back at once, so the plan's peak sees it where the kernel takes it
 * (on top of the inputs and outputs). */
static int dry_workspace(rm_ctx *ctx, const rm_backend *b, rm_op_id op, int nin, rm_tensor *const *in,
                         const rm_attrs *a) {
  size_t bytes = b->workspace ? b->workspace(ctx, op, nin, in, a) : 0;
  if (!bytes) return RM_OK;
  rm_storage *s = rm_storage_new_dry(ctx, b->device, RM_CAT_WORKSPACE, bytes);
  if (!s) return ctx->err_code;
  rm_storage_release(ctx, s);
  return RM_OK;
}

/* Runs def's kernel (or view) on in[], producing all nout outputs in outs[] (new refs).
 * Does not record. attrs are used as given (random ops: seed/offset already set). */
static int op_exec(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in,
                   const rm_attrs *a, rm_tensor **outs) {
  const rm_op_def *def = op_table[op];
  int nout = def->nout;
  rm_meta meta[RM_MAX_OUTPUTS];
  /* the inputs' dtypes first: an integer tensor given to a float-only op gets that
   * error, not one about its shape or attributes */
  if (nin > 0 && !(def->flags & RM_OPF_VIEW)) {
    const rm_backend *b = rm_backend_get(ctx, in[0]->device);
    if (!b) return ctx->err_code;
    for (int i = 0; i < nin && i < 32; i++)
      if (!((def->index_in >> i) & 1u) && check_kernel_dtype(ctx, b, op, in[i]->dtype)) return ctx->err_code;
  }
  if (def->flags & RM_OPF_INPLACE)
    return rm_fail(ctx, RM_ERR_ARG, "%s writes into its inputs: run it with op_into (no outputs)", def->name);
  int rc = def->infer ? def->infer(ctx, nin, in, a, meta) : default_infer(ctx, def, nin, in, meta);
  if (rc) return rc;
  for (int j = 0; j < nout; j++) {
    outs[j] = NULL;
    if (rm_meta_numel(&meta[j]) == INT64_MAX) {
      char sh[96];
      return rm_fail(ctx, RM_ERR_SHAPE, "%s: the output size %s is too large", def->name,
                     rm_shape_str(meta[j].ndim, meta[j].shape, sh, sizeof sh));
    }
  }

  if (def->flags & RM_OPF_VIEW) {
    rm_tensor *v = rm_tensor_view_of(ctx, in[0], in[0]->ndim, in[0]->shape, in[0]->stride,
                                     in[0]->offset);
    if (!v) return ctx->err_code;
    rc = def->view(ctx, in[0], a, v);
    if (rc) { rm_tensor_drop(ctx, v); return rc; }
    outs[0] = v;
    return RM_OK;
  }

  rm_device dev = nin > 0 ? in[0]->device : meta[0].device;
  const rm_backend *b = rm_backend_get(ctx, dev);
  if (!b) return ctx->err_code;
  rm_kernel_fn k = b->kernel[op];
  if (!k)
    return rm_fail(ctx, RM_ERR_DEVICE, "%s is not supported on %s", def->name, b->name);
  for (int j = 0; j < nout; j++)
    if (!((def->index_out >> j) & 1u) && check_kernel_dtype(ctx, b, op, meta[j].dtype)) return ctx->err_code;

  rm_tensor *args[RM_MAX_INPUTS];
  int nargs = nin;
  if (nin > RM_MAX_INPUTS) return rm_fail(ctx, RM_ERR_ARG, "%s: at most %d inputs", def->name, RM_MAX_INPUTS);
  for (int i = 0; i < nargs; i++) {
    rm_tensor *t = in[i];
    if (def->flags & RM_OPF_BROADCAST) {
      t = broadcast_view(ctx, t, meta[0].ndim, meta[0].shape);
    } else if (!(def->flags & RM_OPF_STRIDED) && !rm_tensor_is_contiguous(t)) {
      rm_scope sc;
      rm_scope_enter(ctx, &sc, RM_CAT_WORKSPACE, RM_SAME);
      rm_tensor *src = t;
      rc = op_exec(ctx, RM_OP_COPY, 1, &src, a, &t);
      rm_scope_leave(ctx, &sc);
      if (rc) t = NULL;
    } else {
      rm_tensor_hold(t);
    }
    if (!t) {
      for (int q = 0; q < i; q++) rm_tensor_drop(ctx, args[q]);
      return ctx->err_code ? ctx->err_code : RM_ERR_OOM;
    }
    args[i] = t;
  }
  for (int j = 0; j < nout && rc == RM_OK; j++) {
    outs[j] = rm_tensor_new_output(ctx, &meta[j], ctx->category); /* dry run: phantom */
    if (!outs[j]) rc = ctx->err_code;
  }
  if (rc == RM_OK && !ctx->dry) {
    rm_clear_error(ctx);
    rc = k(ctx, nargs, args, nout, outs, a);
    if (rc && !ctx->err[0]) rm_fail(ctx, rc, "%s failed on %s", def->name, b->name);
  } else if (rc == RM_OK) {
    rc = dry_workspace(ctx, b, op, nargs, args, a);
  }
  for (int i = 0; i < nargs; i++) rm_tensor_drop(ctx, args[i]);
  if (rc) {
    for (int j = 0; j < nout; j++) rm_tensor_drop(ctx, outs[j]), outs[j] = NULL;
    return rc;
  }
  return RM_OK;
}

int rm_op_exec(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a,
               rm_tensor **outs) {
  const rm_op_def *def = rm_op_def_get(op);
  if (!def) return rm_fail(ctx, RM_ERR_ARG, "op %s is not implemented", rm_op_name(op));
  if (def->nin >= 0 && nin != def->nin)
    return rm_fail(ctx, RM_ERR_ARG, "%s takes %d inputs (got %d)", def->name, def->nin, nin);
  return op_exec(ctx, op, nin, in, a, outs);
}

/* op_exec under the per-op timers when they run (opcost.h) */
static int timed_exec(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a,
                      rm_tensor **outs) {
  if (!ctx->op_timing || ctx->dry) return op_exec(ctx, op, nin, in, a, outs);
  double t0 = rm_opcost_clock();
  int rc = op_exec(ctx, op, nin, in, a, outs);
  rm_opcost_record(ctx, op, nin, in, a, rm_opcost_clock() - t0);
  return rc;
}

/* One block per node: in, out, gout (tensor pointers), the saved versions, then the
 * per-input flags. */
static size_t node_block_bytes(int nin, int nout) {
  return sizeof(rm_tensor *) * (size_t)(2 * nin + 2 * nout + 1) + sizeof(uint32_t) * (size_t)(nin + nout) +
         (size_t)nin;
}

static bool saves_input(const rm_op_def *def, int i) {
  return def->save_in == RM_NTH_ALL || (i < 32 && (def->save_in >> i) & 1u);
}

/* Whether output j (of dtype d) carries a gradient: a visible, differentiable output
 * of a float dtype (an integer output never requires grad). */
static bool out_diff(const rm_op_def *def, int j, rm_dtype d) {
  return j < def->nvis && !((def->nodiff_out >> j) & 1u) && !rm_dtype_is_int(d);
}

static rm_node *record(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in,
                       const rm_attrs *a, rm_tensor **outs) {
  const rm_op_def *def = op_table[op];
  rm_node *n = rm_host_calloc(ctx, 1, sizeof *n);
  rm_tensor **arr = n ? rm_host_calloc(ctx, node_block_bytes(nin, def->nout), 1) : NULL;
  if (!arr) {
    rm_host_free(ctx, n, sizeof *n);
    rm_fail(ctx, RM_ERR_OOM, "out of host memory recording %s", def->name);
    return NULL;
  }
  n->refcount = 0;
  n->seq = ++ctx->node_seq;
  n->op = op;
  n->attrs = *a;
  n->nin = nin;
  n->nout = def->nout;
  n->in = arr;
  n->out = arr + nin;
  n->gout = arr + nin + def->nout;
  n->ver = (uint32_t *)(arr + 2 * nin + 2 * def->nout + 1);
  n->in_flags = (uint8_t *)(n->ver + nin + def->nout);
  ctx->live_nodes++;
  for (int i = 0; i < nin; i++) {
    rm_tensor_retain(in[i]);
    in[i]->readers++;
    n->in[i] = in[i];
    n->ver[i] = in[i]->storage ? in[i]->storage->version : 0;
    if (in[i]->requires_grad) n->in_flags[i] |= RM_IN_GRAD;
    if (saves_input(def, i)) {
      rm_tensor_use(in[i]);
      n->in_flags[i] |= RM_IN_SAVED;
    }
  }
  for (int j = 0; j < def->nout; j++) {
    rm_tensor *t = outs[j];
    n->out[j] = t;
    n->ver[nin + j] = t->storage ? t->storage->version : 0;
    t->out_index = j;
    bool diff = out_diff(def, j, t->dtype);
    if (diff) {
      t->grad_fn = n;
      t->requires_grad = true;
      n->refcount++;
    } else {
      t->producer = n;
      rm_tensor_retain(t);
    }
    if ((def->save_out >> j) & 1u) {
      rm_tensor_use(t);
      n->saved_out |= 1u << j;
    }
  }
  return n;
}

int rm_op_run(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a,
              rm_tensor **out) {
  const rm_op_def *def = rm_op_def_get(op);
  if (!def) return rm_fail(ctx, RM_ERR_ARG, "op %s is not implemented", rm_op_name(op));
  if (def->nin >= 0 && nin != def->nin)
    return rm_fail(ctx, RM_ERR_ARG, "%s takes %d inputs (got %d)", def->name, def->nin, nin);
  rm_attrs local;
  if (!a) rm_attrs_init(&local), a = &local;
  bool grad = false;
  for (int i = 0; i < nin; i++) {
    if (!in[i]) return rm_fail(ctx, RM_ERR_ARG, "%s: input %d is missing", def->name, i + 1);
    int rc = rm_tensor_data_ready(ctx, in[i]);
    if (rc) return rm_fail_prefix(ctx, def->name);
    if (in[i]->requires_grad) grad = true;
  }
  grad = grad && ctx->grad_enabled && !(def->flags & RM_OPF_NODIFF);
  if (def->flags & RM_OPF_RANDOM) {
    if (a != &local) local = *a, a = &local;
    local.seed = ctx->rng_seed;
    local.offset = ctx->rng_offset;
  }
  rm_tensor *outs[RM_MAX_OUTPUTS];
  int rc = timed_exec(ctx, op, nin, in, a, outs);
  if (rc) return rc;
  if (rm_hooked(ctx, RM_HOOK_OP)) {
    rc = rm_hook_fire(ctx, RM_HOOK_OP, &(rm_event){ .op = op, .nin = nin, .in = in, .attrs = a, .out = outs });
    if (rc) {
      for (int j = 0; j < def->nout; j++) rm_tensor_drop(ctx, outs[j]);
      return rc;
    }
  }
  if (def->flags & RM_OPF_RANDOM && a == &local) {
    int64_t numel = rm_tensor_numel(outs[0]);
    ctx->rng_offset += rm_philox_advance(numel);
  }
  if (grad) { /* an op whose outputs are all integers (a cast to int64) records nothing */
    bool any = false;
    for (int j = 0; j < def->nvis; j++) any = any || out_diff(def, j, outs[j]->dtype);
    grad = any;
  }
  if (grad) {
    rm_node *n = record(ctx, op, nin, in, a, outs);
    if (!n) {
      for (int j = 0; j < def->nout; j++) rm_tensor_drop(ctx, outs[j]);
      return ctx->err_code;
    }
    if (rm_hooked(ctx, RM_HOOK_RECORD) && (rc = rm_hook_fire(ctx, RM_HOOK_RECORD, &(rm_event){ .node = n }))) {
      for (int j = 0; j < def->nout; j++) rm_tensor_drop(ctx, outs[j]); /* frees the node */
      return rc;
    }
  }
  for (int j = 0; j < def->nout; j++) {
    if (j < def->nvis) out[j] = outs[j];
    else rm_tensor_drop(ctx, outs[j]);
  }
  return RM_OK;
}

rm_tensor *rm_op1(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a) {
  rm_tensor *out[RM_MAX_OUTPUTS] = { 0 };
  if (rm_op_run(ctx, op, nin, in, a, out) != RM_OK) return NULL;
  const rm_op_def *def = op_table[op];
  for (int j = 1; j < def->nvis; j++) rm_tensor_drop(ctx, out[j]);
  return out[0];
}

int rm_op_into(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a,
               int nout, rm_tensor *const *out) {
  const rm_op_def *def = rm_op_def_get(op);
  if (!def || (def->flags & RM_OPF_VIEW))
    return rm_fail(ctx, RM_ERR_ARG, "%s cannot write into a tensor", rm_op_name(op));
  rm_attrs local;
  if (!a) rm_attrs_init(&local), a = &local;
  if ((def->nin >= 0 && nin != def->nin) || nin < 0 || nin > RM_MAX_INPUTS)
    return rm_fail(ctx, RM_ERR_ARG, "%s takes %d inputs (got %d)", def->name, def->nin, nin);
  if (nout != def->nout)
    return rm_fail(ctx, RM_ERR_ARG, "%s writes %d outputs (got %d)", def->name, def->nout, nout);
  if (def->flags & RM_OPF_INPLACE && (nin < 1 || nin % def->group))
    return rm_fail(ctx, RM_ERR_ARG, "%s takes its inputs in groups of %d (got %d)", def->name, def->group, nin);
  for (int i = 0; i < nin; i++) {
    if (!in[i]) return rm_fail(ctx, RM_ERR_ARG, "%s: input %d is missing", def->name, i + 1);
    if (rm_tensor_data_ready(ctx, in[i])) return rm_fail_prefix(ctx, def->name);
    if (!(def->flags & (RM_OPF_STRIDED | RM_OPF_BROADCAST)) && !rm_tensor_is_contiguous(in[i]))
      return rm_fail(ctx, RM_ERR_LAYOUT, "%s: input %d is not contiguous", def->name, i + 1);
  }
  for (int j = 0; j < nout; j++) {
    if (!out[j]) return rm_fail(ctx, RM_ERR_ARG, "%s: output %d is missing", def->name, j + 1);
    if (!out[j]->storage) return rm_fail(ctx, RM_ERR_STATE, "%s: output has no data", def->name);
    if (!rm_tensor_is_contiguous(out[j]))
      return rm_fail(ctx, RM_ERR_LAYOUT, "%s: output %d is not contiguous", def->name, j + 1);
  }
  /* the outputs must be what the op would make: kernels size their loops from them
   * (an op without inputs, fill, writes whatever it is given) */
  if (nin > 0) {
    rm_meta meta[RM_MAX_OUTPUTS];
    int rc = def->infer ? def->infer(ctx, nin, in, a, meta) : default_infer(ctx, def, nin, in, meta);
    if (rc) return rc;
    for (int j = 0; j < nout; j++) {
      rm_meta m;
      rm_tensor_meta(out[j], &m);
      bool same = m.ndim == meta[j].ndim && m.dtype == meta[j].dtype && m.device == meta[j].device;
      for (int d = 0; same && d < m.ndim; d++) same = m.shape[d] == meta[j].shape[d];
      if (!same) {
        char s1[96], s2[96];
        return rm_fail(ctx, RM_ERR_SHAPE, "%s: output %d is %s %s on %s, expected %s %s on %s", def->name, j + 1,
                       rm_dtype_name(m.dtype), rm_shape_str(m.ndim, m.shape, s1, sizeof s1), rm_device_name(m.device),
                       rm_dtype_name(meta[j].dtype), rm_shape_str(meta[j].ndim, meta[j].shape, s2, sizeof s2),
                       rm_device_name(meta[j].device));
      }
    }
  }
  const rm_backend *b = rm_backend_get(ctx, nout > 0 ? out[0]->device : in[0]->device);
  if (!b) return ctx->err_code;
  if (!b->kernel[op]) return rm_fail(ctx, RM_ERR_DEVICE, "%s is not supported on %s", def->name, b->name);
  if (def->flags & RM_OPF_INPLACE) /* what it writes are its inputs: their dtypes as outputs' */
    for (int i = 0; i < nin; i++)
      if (check_kernel_dtype(ctx, b, op, in[i]->dtype)) return ctx->err_code;
  if (ctx->dry) return dry_workspace(ctx, b, op, nin, in, a);
  rm_tensor *args[RM_MAX_INPUTS];
  for (int i = 0; i < nin; i++) {
    rm_tensor *t = in[i];
    if (def->flags & RM_OPF_BROADCAST) {
      t = broadcast_view(ctx, t, out[0]->ndim, out[0]->shape);
    } else {
      rm_tensor_hold(t);
    }
    if (!t) { for (int q = 0; q < i; q++) rm_tensor_drop(ctx, args[q]); return ctx->err_code; }
    args[i] = t;
  }
  int rc = b->kernel[op](ctx, nin, args, nout, out, a);
  for (int i = 0; i < nin; i++) rm_tensor_drop(ctx, args[i]);
  for (int j = 0; j < nout; j++) rm_tensor_written(out[j]);
  if (def->flags & RM_OPF_INPLACE)
    for (int i = 0; i < nin; i++)
      if ((def->write_in >> (i % def->group)) & 1u) rm_tensor_written(in[i]);
  return rc;
}

double rm_op_flops(rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a,
                   const rm_meta *out) {
  const rm_op_def *def = rm_op_def_get(op);
  if (!def || (def->flags & RM_OPF_VIEW)) return 0;
  if (def->flops) return def->flops(nin, in, a, out);
  return (double)rm_meta_numel(&out[0]);
}

double rm_op_cost(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a,
                  const rm_meta *out) {
  const rm_op_def *def = rm_op_def_get(op);
  if (!def || (def->flags & RM_OPF_VIEW)) return 0;
  double bytes = 0;
  for (int i = 0; i < nin; i++) bytes += (double)rm_tensor_nbytes(in[i]);
  for (int j = 0; j < def->nout; j++) bytes += (double)rm_meta_numel(&out[j]) * (double)rm_dtype_size(out[j].dtype);
  rm_device dev = nin > 0 ? in[0]->device : out[0].device;
  const rm_backend *b = ctx->backend[dev];
  return rm_op_flops(op, nin, in, a, out) + bytes * (b ? b->flops_per_byte : 0);
}

/* ---- nodes ---- */

void rm_node_retain(rm_node *n) { n->refcount++; }

static void node_free_saved(rm_ctx *ctx, rm_node *n) {
  for (int i = 0; i < n->nin; i++)
    if (rm_node_saved_in(n, i)) {
      rm_tensor_unuse(ctx, n->in[i]);
      n->in_flags[i] &= (uint8_t)~RM_IN_SAVED;
    }
  for (int j = 0; j < n->nout; j++)
    if (((n->saved_out >> j) & 1u) && n->out[j]) rm_tensor_unuse(ctx, n->out[j]);
  n->saved_out = 0;
  if (n->pinned) {
    n->pinned->pins--;
    rm_tensor_drop(ctx, n->pinned);
    n->pinned = NULL;
  }
  for (int j = 0; j < n->nout; j++)
    if (n->gout[j]) rm_tensor_drop(ctx, n->gout[j]), n->gout[j] = NULL;
}

void rm_node_release_saved(rm_ctx *ctx, rm_node *n) { node_free_saved(ctx, n); }

void rm_node_release(rm_ctx *ctx, rm_node *n) {
  if (!n || --n->refcount > 0) return;
  node_free_saved(ctx, n);
  const rm_op_def *def = op_table[n->op];
  for (int j = 0; j < n->nout; j++) {
    rm_tensor *t = n->out[j];
    if (!t) continue;
    bool diff = out_diff(def, j, t->dtype);
    if (!diff) {
      t->producer = NULL;
      rm_tensor_release(ctx, t);
    }
  }
  for (int i = 0; i < n->nin; i++) {
    n->in[i]->readers--;
    rm_tensor_release(ctx, n->in[i]);
  }
  rm_host_free(ctx, n->in, node_block_bytes(n->nin, n->nout));
  rm_host_free(ctx, n, sizeof *n);
  ctx->live_nodes--;
}

/* slot k: input k (k < nin) or output k - nin */
static int check_version(rm_ctx *ctx, rm_node *n, int k) {
  rm_tensor *t = k < n->nin ? n->in[k] : n->out[k - n->nin];
  if (!t || !t->storage || t->storage->version == n->ver[k]) return RM_OK;
  const char *op = rm_op_name(n->op);
  char s[64];
  rm_tensor_shape_str(t, s, sizeof s);
  return rm_fail(ctx, RM_ERR_STATE,
                 "%s %d of %s (a %s tensor) was modified in place after %s saved it for backward "
                 "(fill_, copy_, zero_, x[i] = ..., an optimizer step); its gradient would be wrong. "
                 "Write into a copy, or run the forward again after the write",
                 k < n->nin ? "input" : "output", (k < n->nin ? k : k - n->nin) + 1, op, s, op);
}

int rm_node_check_saved(rm_ctx *ctx, rm_node *n) {
  for (int i = 0; i < n->nin; i++)
    if (rm_node_saved_in(n, i) && check_version(ctx, n, i)) return ctx->err_code;
  for (int j = 0; j < n->nout; j++)
    if ((n->saved_out >> j) & 1u && check_version(ctx, n, n->nin + j)) return ctx->err_code;
  return RM_OK;
}

rm_tensor *rm_node_input(rm_ctx *ctx, rm_node *n, int i) {
  rm_tensor *t = n->in[i];
  if (rm_tensor_data_ready(ctx, t)) return NULL;
  if (rm_node_saved_in(n, i) && check_version(ctx, n, i)) return NULL;
  return t;
}

rm_tensor *rm_node_output(rm_ctx *ctx, rm_node *n, int j) {
  rm_tensor *t = n->out[j];
  if (!t) {
    rm_fail(ctx, RM_ERR_STATE, "%s: output %d was released before backward", rm_op_name(n->op), j + 1);
    return NULL;
  }
  if (rm_tensor_data_ready(ctx, t)) return NULL;
  if ((n->saved_out >> j) & 1u && check_version(ctx, n, n->nin + j)) return NULL;
  return t;
}

/* A replayed input nothing needs is evicted once every node that reads it has been
 * replayed (it is not read again in this replay). Until then, one whose storage is
 * shared (views of it) would free nothing, and evicting it would replay its producer
 * again for the next view (q, k and v of one qkv projection): it waits, at the latest
 * until the outermost replay ends (a reader that is not replayed never reads it). */
static void replay_evict(rm_ctx *ctx, rm_tensor *t, bool fresh) {
  if (t->users != 0 || t->pins != 0 || t->replay_reads < 0) return;
  if (t->replay_reads >= t->readers) {
    rm_tensor_evict(ctx, t);
    return;
  }
  if (!fresh) return;
  if (ctx->replay_depth > 1 && t->storage && t->storage->refcount > 1 && ctx->replay_n < RM_REPLAY_DEFER) {
    rm_tensor_retain(t);
    ctx->replay_defer[ctx->replay_n++] = t;
    return;
  }
  rm_tensor_evict(ctx, t);
}

static int node_recompute(rm_ctx *ctx, rm_node *n, rm_tensor *want);

int rm_node_recompute(rm_ctx *ctx, rm_node *n, rm_tensor *want) {
  ctx->replay_depth++;
  int rc = node_recompute(ctx, n, want);
  if (--ctx->replay_depth == 0) {
    int m = ctx->replay_n;
    ctx->replay_n = 0;
    for (int i = 0; i < m; i++) {
      rm_tensor *t = ctx->replay_defer[i];
      if (t->users == 0 && t->pins == 0) rm_tensor_evict(ctx, t);
      rm_tensor_release(ctx, t);
    }
  }
  return rc;
}

/* The matmul node whose product n, a causal softmax, reads, when the replay can run them
 * as one matmul_softmax: the product is gone, only n reads it, nothing holds it, it is
 * triangular in its result (lower: the part the causal softmax reads) and the backend
 * computes that op without storing it (rm_backend.scores_softmax). Else NULL. */
static rm_node *fusable_product(rm_ctx *ctx, const rm_node *n) {
  if (n->op != RM_OP_SOFTMAX || !n->attrs.softmax.causal) return NULL;
  rm_tensor *s = n->in[0];
  if (s->storage || s->users != 0 || s->pins != 0 || s->readers != 1) return NULL;
  rm_node *m = s->grad_fn ? s->grad_fn : s->producer;
  if (!m || m->op != RM_OP_MATMUL || m->nin != 2 || m->attrs.matmul.tri != RM_TRI_OUT || m->attrs.matmul.upper)
    return NULL;
  const rm_backend *be = rm_backend_get(ctx, s->device);
  return be && be->scores_softmax && be->kernel[RM_OP_MATMUL_SOFTMAX] && be->scores_softmax(ctx, s->dtype) ? m : NULL;
}

/* Rebuilds n's outputs by running op on in (n's own op and inputs, or the fused
 * matmul_softmax on its product's inputs): the inputs made ready and pinned, the
 * outputs n still needs given storage, the inputs evicted once nothing needs them. */
static int replay_as(rm_ctx *ctx, rm_node *n, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a,
                     rm_tensor *want) {
  const rm_op_def *def = op_table[n->op], *run = op_table[op];
  bool fresh[RM_MAX_INPUTS] = { 0 };
  int rc = RM_OK;
  /* each input is pinned once ready: rebuilding a later input replays ops that may
   * otherwise evict an earlier one whose last use has passed (x in sub(x, mean(x))) */
  int ready = 0;
  for (; ready < nin; ready++) {
    fresh[ready] = in[ready]->storage == NULL;
    if ((rc = rm_tensor_data_ready(ctx, in[ready]))) break;
    in[ready]->pins++;
  }
  if (rc) {
    for (int i = 0; i < ready; i++) in[i]->pins--;
    return rc;
  }
  rm_tensor *outs[RM_MAX_OUTPUTS];
  rm_scope sc;
  rm_scope_enter(ctx, &sc, RM_CAT_ACTIVATION, RM_GRAD_OFF);
  rc = timed_exec(ctx, op, nin, in, a, outs);
  rm_scope_leave(ctx, &sc);
  for (int i = 0; i < nin; i++) in[i]->pins--;
  if (rc) return rc;
  rm_meta meta[RM_MAX_OUTPUTS];
  for (int j = 0; j < run->nout; j++) rm_tensor_meta(outs[j], &meta[j]);
  ctx->recompute_flops += rm_op_flops(op, nin, in, a, meta);
  if (rm_hooked(ctx, RM_HOOK_OP))
    rc = rm_hook_fire(ctx, RM_HOOK_OP, &(rm_event){ .op = op, .nin = nin, .in = in, .attrs = a, .out = outs,
                                                   .node = n });
  for (int j = 0; j < def->nout; j++) {
    rm_tensor *t = n->out[j];
    /* an output nothing uses any more (its readers' backward is done) stays released */
    if (t && !t->storage && rc == RM_OK && (t == want || t->users > 0)) {
      if (!rm_same_shape(t, outs[j]) || t->dtype != outs[j]->dtype) {
        char s1[64], s2[64];
        rc = rm_fail(ctx, RM_ERR_STATE,
                     "replay of %s rebuilt its output as %s %s, but the first forward made %s %s",
                     def->name, rm_dtype_name(outs[j]->dtype),
                     rm_tensor_shape_str(outs[j], s1, sizeof s1), rm_dtype_name(t->dtype),
                     rm_tensor_shape_str(t, s2, sizeof s2));
      } else {
        t->storage = outs[j]->storage;
        rm_storage_retain(t->storage);
        t->replay_reads = 0;
        if (!(def->flags & RM_OPF_VIEW)) t->offset = 0;
      }
    }
  }
  for (int j = 0; j < run->nout; j++) rm_tensor_drop(ctx, outs[j]);
  for (int i = 0; i < nin; i++)
    if (in[i]->replay_reads >= 0) in[i]->replay_reads++;
  for (int i = 0; i < nin; i++) replay_evict(ctx, in[i], fresh[i]);
  return rc;
}

/* A causal softmax whose scores are gone runs with their product as one op where the
 * backend fuses them (fusable_product): the scores are never stored, which saves
 * writing and reading them back (on the CPU, 2 MiB a layer of bench/checkpoint.lua's
 * GPT). The bits are the two ops' (matmul_softmax's contract). */
static int node_recompute(rm_ctx *ctx, rm_node *n, rm_tensor *want) {
  rm_node *m = fusable_product(ctx, n);
  if (!m) return replay_as(ctx, n, n->op, n->nin, n->in, &n->attrs, want);
  rm_attrs fa;
  rm_attrs_init(&fa);
  rm_matmul_softmax_join(&m->attrs, &n->attrs, &fa);
  return replay_as(ctx, n, RM_OP_MATMUL_SOFTMAX, m->nin, m->in, &fa, want);
}
