/* Internal header of the Lua binding (lua/ files). Not part of the host API. */
#ifndef REMAT_LREMAT_H
#define REMAT_LREMAT_H

#include <lua.h>
#include <lauxlib.h>

#include "../core/ops.h"
#include "../core/remat.h"

#define RM_TENSOR_MT "remat.Tensor"

/* The userdata of a tensor: a hold on the tensor, NULL once freed; linked into its
 * state's list of handles until collected (lua/ltensor.c: handles made by finalizers
 * while the state closes get no finalizer of their own, and are released from it). */
typedef struct rm_ltensor {
  rm_tensor *t;
  struct rm_ltensor *prev, *next;
} rm_ltensor;

/* The context this lua_State is bound to. */
rm_ctx *rm_lua_ctx(lua_State *L);
/* Raises a Lua error "<fn>: <ctx message>" located at the user's calling line. */
int rm_lua_fail(lua_State *L, const char *fn);
/* Raises a Lua error with a formatted message located at the user's calling line. */
int rm_lua_errorf(lua_State *L, const char *fmt, ...);
/* The tensor at idx; raises a clear error when it is not a tensor or was freed. */
rm_tensor *rm_lua_check_tensor(lua_State *L, int idx, const char *fn);
rm_tensor *rm_lua_test_tensor(lua_State *L, int idx);
/* Pushes a userdata taking over the caller's hold on t (t NULL: raises ctx error). */
void rm_lua_push_tensor(lua_State *L, rm_tensor *t, const char *fn);
/* Sets t's gradient to g (a new hold; NULL clears it), dropping the old one; raises
 * "grad: ..." when g's shape, dtype or device differ from t's. Returns 0. */
int rm_lua_set_grad(lua_State *L, rm_tensor *t, rm_tensor *g);

/* The op id at idx (an integer from C.ops); raises a clear error otherwise. */
rm_op_id rm_lua_check_op(lua_State *L, int idx, const char *fn);
/* Reads op's attributes from the table at idx (nil: none) by the names and types
 * core/ops.def declares; raises "<fn>: ..." naming an unknown name or a wrong type. */
void rm_lua_read_attrs(lua_State *L, int idx, rm_op_id op, rm_attrs *a, const char *fn);

/* A CPU float tensor with t's data: t held, or a copy (bfloat16 widened); raises. */
rm_tensor *rm_lua_on_cpu(lua_State *L, rm_tensor *t, const char *fn);
/* Element i (row-major over the view) of a CPU float32/float64 tensor. */
/* Pushes element i (row-major over the view) of a CPU tensor: a Lua integer for an
 * int32/int64 tensor, a float otherwise. */
void rm_lua_push_elem(lua_State *L, const rm_tensor *t, int64_t i);
/* Writes Lua number/integer value v (at stack index vidx) as element off of host data p
 * of dtype dt: an integer dtype takes a whole value truncated toward zero; NaN, an
 * infinity or a value outside its range raises (naming fn). */
void rm_lua_store_number(lua_State *L, void *p, rm_dtype dt, int64_t off, int vidx, const char *fn);

/* Registration of each binding file's functions into the C table at -1. */
void rm_lua_open_tensor(lua_State *L);
void rm_lua_open_index(lua_State *L); /* after rm_lua_open_tensor (its metatable) */
void rm_lua_open_nn(lua_State *L);
void rm_lua_open_io(lua_State *L);
void rm_lua_open_autograd(lua_State *L);
void rm_lua_open_plan(lua_State *L);
void rm_lua_open_host(lua_State *L);
/* A host allocator that takes memory from L's lua_Alloc (for contexts a state owns). */
rm_host_alloc rm_lua_host_alloc(lua_State *L);
void rm_lua_open_optim(lua_State *L);
void rm_lua_open_dist(lua_State *L);
void rm_lua_open_pool(lua_State *L);

#endif
