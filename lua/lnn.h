/* Module userdata of the Lua binding, for other binding files (checkpoint, plan). */
#ifndef REMAT_LNN_H
#define REMAT_LNN_H

#include "lremat.h"
#include "../core/module.h"

#define RM_MODULE_MT "remat.Module"

/* The module at idx; raises a clear error naming fn when it is not a module. */
rm_module *rm_lua_check_module(lua_State *L, int idx, const char *fn);
/* Pushes the userdata of m (the same one while it lives; retains m for a new one). */
void rm_lua_push_module(lua_State *L, rm_module *m);
/* Runs m on x from Lua: Lua-defined modules inside call back into this thread, and an
 * error raised by one of them is re-raised here with its original value; other errors
 * are raised as "fn: message". Returns the output (a new hold). */
rm_tensor *rm_lua_module_forward(lua_State *L, rm_module *m, rm_tensor *x, const char *fn);
/* For C calls that may run Lua modules (e.g. a planning forward): brackets the call so
 * the callbacks run on L. rm_lua_nn_leave returns the previous thread to restore. */
lua_State *rm_lua_nn_enter(lua_State *L);
void rm_lua_nn_leave(lua_State *L, lua_State *prev);
/* The thread running the current forward or backward (NULL: none). */
lua_State *rm_lua_nn_current(lua_State *L);
/* After a failed core call bracketed by enter/leave: re-raises the original error of a
 * Lua module when there was one, else raises "fn: ctx message". Never returns. */
int rm_lua_nn_fail(lua_State *L, const char *fn);
/* Plans m's size-dependent checkpoint policy for x when it has no plan for x's shape
 * (lua/lplan.c; env NULL: the policy's own). Returns a status (message on the ctx). */
struct rm_step_env;
int rm_lua_checkpoint_prepare(lua_State *L, rm_module *m, rm_tensor *x, const struct rm_step_env *env);

#endif
