/* The op registry and the one entry point every op goes through (rm_op_run).
 *
 * Each op: a name, its arity, an infer step (checks inputs, gives output shapes), a
 * kernel per backend (core/backend.h), a backward rule written with other ops (so it
 * runs on every backend), what its backward needs saved, and a cost model.
 *
 * Index values are 1-based, as Lua users expect. Ops that produce them (argmax, the
 * indices of max, min, sort and topk) give int64 tensors; ops that take them (gather,
 * index_select, embedding, index_add, scatter_add, cross_entropy labels) take int32,
 * int64, or whole numbers in a float32/float64 tensor. */
#ifndef REMAT_OP_H
#define REMAT_OP_H

#include "tensor.h"

#define RM_MAX_INPUTS 256   /* inputs of one op call (variadic concat) */
#define RM_MAX_OUTPUTS 8    /* outputs of one op, visible and extras (rm_op_def.nout) */

typedef enum {
#define X(ID, name, family, set) RM_OP_##ID,
#include "ops.def"
  RM_OP_COUNT
} rm_op_id;

/* Op attributes: the sets declared in ops.def, one struct each in a union, read as
 * a->set.field (a->reduce.dim, a->norm.eps); see ops.def for how they are declared.
 * RM_AT_EACH(m, set, f1, ..., fn) expands m(set, fk) for each field (up to 12). */
#define RM_AT_PICK(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, N, ...) N
#define RM_AT_EACH(m, s, ...)                                                              \
  RM_AT_PICK(__VA_ARGS__, RM_AT_12, RM_AT_11, RM_AT_10, RM_AT_9, RM_AT_8, RM_AT_7, RM_AT_6, \
             RM_AT_5, RM_AT_4, RM_AT_3, RM_AT_2, RM_AT_1)(m, s, __VA_ARGS__)
#define RM_AT_1(m, s, x) m(s, x)
#define RM_AT_2(m, s, x, ...) m(s, x) RM_AT_1(m, s, __VA_ARGS__)
#define RM_AT_3(m, s, x, ...) m(s, x) RM_AT_2(m, s, __VA_ARGS__)
#define RM_AT_4(m, s, x, ...) m(s, x) RM_AT_3(m, s, __VA_ARGS__)
#define RM_AT_5(m, s, x, ...) m(s, x) RM_AT_4(m, s, __VA_ARGS__)
#define RM_AT_6(m, s, x, ...) m(s, x) RM_AT_5(m, s, __VA_ARGS__)
#define RM_AT_7(m, s, x, ...) m(s, x) RM_AT_6(m, s, __VA_ARGS__)
#define RM_AT_8(m, s, x, ...) m(s, x) RM_AT_7(m, s, __VA_ARGS__)
#define RM_AT_9(m, s, x, ...) m(s, x) RM_AT_8(m, s, __VA_ARGS__)
#define RM_AT_10(m, s, x, ...) m(s, x) RM_AT_9(m, s, __VA_ARGS__)
#define RM_AT_11(m, s, x, ...) m(s, x) RM_AT_10(m, s, __VA_ARGS__)
#define RM_AT_12(m, s, x, ...) m(s, x) RM_AT_11(m, s, __VA_ARGS__)
#define RM_AT_DECL(s, f) RM_AT_DECL_##f
#define RM_AT_DECL_INT(n) int64_t n;
#define RM_AT_DECL_BOOL(n) bool n;
#define RM_AT_DECL_REAL(n) double n;
#define RM_AT_DECL_SHAPE(n)           /* the shared slot below */

typedef struct rm_attrs {
  union {
#define ATTRS(set, ...) struct { RM_AT_EACH(RM_AT_DECL, set, __VA_ARGS__) } set;
#include "ops.def"
  };
  uint64_t seed, offset;      /* random ops: drawn from the ctx generator by rm_op_run,
                                 replayed as recorded */
  int ndim;                   /* SHAPE fields (view, expand, fill, rand, sum_to, ...) */
  int64_t shape[RM_MAX_DIM];
} rm_attrs;

/* An attribute as ops.def declares it: what the binding reads by name. */
typedef enum { RM_ATTR_INT, RM_ATTR_BOOL, RM_ATTR_REAL, RM_ATTR_SHAPE } rm_attr_type;
typedef struct rm_attr_field {
  const char *name;
  rm_attr_type type;
  size_t offset;              /* into rm_attrs (SHAPE: of ndim; the sizes follow in shape) */
} rm_attr_field;

enum {
  RM_OPF_VIEW = 1,        /* no kernel: `view` builds the output over the input's storage */
  RM_OPF_STRIDED = 2,     /* kernel takes strided inputs (no contiguous copy first) */
  RM_OPF_BROADCAST = 4,   /* inputs are broadcast to the output shape (stride-0 views) */
  RM_OPF_RANDOM = 8,      /* draws from the generator: attrs seed/offset recorded */
  RM_OPF_NODIFF = 16,     /* not differentiable: outputs never require grad */
  RM_OPF_INTERNAL = 32,   /* a backward helper, not part of the user-facing API */
  RM_OPF_INPLACE = 64,    /* no outputs: the kernel writes into its inputs (write_in); run
                             only by rm_op_into with nout 0 */
};

/* save_in, save_out and nodiff_out name inputs / outputs by position: RM_NTH(0) |
 * RM_NTH(2) is the first and the third; RM_NTH_ALL every one (variadic inputs). */
#define RM_NTH(i) (1u << (i))
#define RM_NTH_ALL (~0u)

typedef struct rm_op_def {
  const char *name;
  int nin;                /* -1: variadic (concat) */
  int nout;               /* outputs; the first `nvis` are returned to the caller, the */
  int nvis;               /* rest are extras kept for backward (e.g. layernorm's mean) */
  unsigned flags;
  unsigned save_in;       /* RM_NTH(i): backward reads input i (RM_NTH_ALL: every input) */
  unsigned save_out;      /* RM_NTH(j): backward reads output j */
  unsigned nodiff_out;    /* RM_NTH(j): visible output j is not differentiable (indices) */
  unsigned index_in;      /* RM_NTH(i): input i holds index values (its infer checks the */
  unsigned index_out;     /* dtype); output j is int64 indices. Every other input and
                             output must be a dtype the backend declares for the op */
  /* RM_OPF_INPLACE ops: the inputs come in groups of `group` (a multi-tensor op: one
   * group per tensor), RM_NTH(i) in write_in: the kernel writes input i of each group.
   * One launch then updates any number of tensors (up to RM_MAX_INPUTS / group) while
   * the op keeps RM_MAX_OUTPUTS outputs at most (it has none). */
  unsigned write_in;
  int group;
  /* Checks inputs and attrs, fills out[0..nout-1]. NULL: elementwise default (one
   * input: same meta; several: broadcast shape, all dtypes and devices equal). */
  int (*infer)(rm_ctx *ctx, int nin, rm_tensor *const *in, const rm_attrs *a, rm_meta *out);
  /* View ops only: set out's shape/stride/offset over in[0]'s storage. */
  int (*view)(rm_ctx *ctx, rm_tensor *in, const rm_attrs *a, rm_tensor *out);
  /* Gradients of the inputs from gradients of the visible outputs (gout[j] may be
   * NULL: no gradient flowed there). Sets gin[i] (a new reference, input i's shape)
   * for each i with rm_node_needs_grad(n, i); leaves others NULL. */
  int (*backward)(rm_ctx *ctx, rm_node *n, rm_tensor *const *gout, rm_tensor **gin);
  /* Floating-point operations of one forward call (NULL: one per output element). */
  double (*flops)(int nin, rm_tensor *const *in, const rm_attrs *a, const rm_meta *out);
} rm_op_def;

/* A recorded op on the tape. */
struct rm_node {
  int refcount;
  uint64_t seq;             /* recording order: reverse seq is a valid backward order */
  rm_op_id op;
  rm_attrs attrs;
  int nin, nout;
  rm_tensor **in;           /* strong: graph edges (data held only when saved) */
  rm_tensor **out;          /* differentiable outputs: weak; extras: strong */
  rm_tensor **gout;         /* gradients accumulated during backward */
  uint8_t *in_flags;        /* per input: RM_IN_GRAD, RM_IN_SAVED (any number of inputs) */
  unsigned saved_out;       /* RM_NTH(j): this node holds a use of output j's data */
  uint32_t *ver;            /* storage versions of in[0..nin-1], out[0..nout-1] when recorded */
  rm_tensor *pinned;        /* a boundary input held (pinned) until this node's backward */
  bool done;                /* backward already ran (second backward is an error) */
  bool visited;             /* backward's graph walk: reached (cleared after the walk) */
};

const rm_op_def *rm_op_def_get(rm_op_id op);
/* Looks up an op by name (a linear search: for policies and the binding's table of
 * ids, not per call); returns -1 when unknown. */
int rm_op_find(const char *name);
const char *rm_op_name(rm_op_id op);
/* op's attributes (*n of them; NULL and 0 for an unknown op). */
const rm_attr_field *rm_op_attrs(rm_op_id op, int *n);
const char *rm_attr_type_name(rm_attr_type t);
void rm_attrs_init(rm_attrs *a);

/* Runs op on in[0..nin-1]: checks, allocates outputs (category ctx->category),
 * dispatches to the backend, and records a node when grad mode is on and an input
 * requires grad. out[0..nvis-1] receive new references (refcount 1, users 1).
 * Returns RM_OK or an error with a message naming the op. */
int rm_op_run(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in,
              const rm_attrs *a, rm_tensor **out);
/* Runs op's kernel writing into existing tensors out[] (no allocation, no tape): for
 * in-place updates (optimizers, gradient accumulation). Elementwise ops may alias.
 * An RM_OPF_INPLACE op takes nout 0 and writes the inputs its write_in names. */
int rm_op_into(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a,
               int nout, rm_tensor *const *out);
/* Runs op's kernel on in[] into new outputs outs[0..nout-1] (all of them, extras
 * included; new references): no grad recording, no hooks, attrs used as given (random
 * ops: their recorded seed and offset). For measuring an op alone (opcost.c). */
int rm_op_exec(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a,
               rm_tensor **outs);
/* Shorthand for one-output ops: returns the output, or NULL with the error set. */
rm_tensor *rm_op1(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a);

/* Cost model: FLOPs and output bytes of op on the given inputs. */
double rm_op_flops(rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a,
                   const rm_meta *out);

/* Roofline cost of op: FLOPs + bytes read and written x the device's flops_per_byte
 * (0 when the backend is not loaded). The planner's currency is seconds (opcost.h),
 * measured per call; this prices what could not be measured. */
double rm_op_cost(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a,
                  const rm_meta *out);

/* For backward rules: input i / output j of n with its data ready (rematerialised if
 * it was evicted). Borrowed reference; NULL with an error set on failure. */
rm_tensor *rm_node_input(rm_ctx *ctx, rm_node *n, int i);
rm_tensor *rm_node_output(rm_ctx *ctx, rm_node *n, int j);
enum { RM_IN_GRAD = 1, RM_IN_SAVED = 2 };   /* rm_node.in_flags */
static inline bool rm_node_needs_grad(const rm_node *n, int i) { return n->in_flags[i] & RM_IN_GRAD; }
/* Whether n holds a use of input i's data for its backward. */
static inline bool rm_node_saved_in(const rm_node *n, int i) { return n->in_flags[i] & RM_IN_SAVED; }

/* Errors (naming the tensor and n's op) when data n saved for backward was written in
 * place since n recorded it: its backward, or a replay, would use the new values. */
int rm_node_check_saved(rm_ctx *ctx, rm_node *n);

void rm_node_retain(rm_node *n);
/* Gives back what n holds for its backward (saved data, accumulated gradients). */
void rm_node_release_saved(rm_ctx *ctx, rm_node *n);
void rm_node_release(rm_ctx *ctx, rm_node *n);
/* Runs n's forward again from its inputs and gives its outputs back their data: want,
 * and those still in use (an output nobody reads any more stays released). */
int rm_node_recompute(rm_ctx *ctx, rm_node *n, rm_tensor *want);

/* Helpers for infer steps. */
/* Checks that idx can hold index values: int32, int64, float32 or float64. */
int rm_check_index_dtype(rm_ctx *ctx, const char *op, const char *what, const rm_tensor *idx);
int rm_check_same_device(rm_ctx *ctx, const char *op, int nin, rm_tensor *const *in);
int rm_check_same_dtype(rm_ctx *ctx, const char *op, int nin, rm_tensor *const *in);
/* Checks that t has shape s (n dims); RM_ERR_SHAPE "op: what has shape AxB, expected CxD". */
int rm_check_shape(rm_ctx *ctx, const char *op, const char *what, const rm_tensor *t, int n,
                   const int64_t *s);
/* Broadcast shapes a and b (numpy rules) into out; error names op and both shapes. */
int rm_broadcast_shape(rm_ctx *ctx, const char *op, int na, const int64_t *a, int nb,
                       const int64_t *b, int *nout, int64_t *out);
/* Normalises a 0-based dim (negatives count from the end); error if out of range. */
int rm_check_dim(rm_ctx *ctx, const char *op, int64_t dim, int ndim, int *out);

#endif
