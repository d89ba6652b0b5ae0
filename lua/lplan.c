/* Checkpoint policies and plans from Lua: a remat.policy value read into the core's
 * description (core/policy.h) and set on a Sequential, plans made from it, dry-run
 * simulation, and the budget DP over a chain described by a table. */
#include <string.h>

#include "lnn.h"
#include "../core/backend.h"
#include "../core/opcost.h"
#include "../core/policy.h"
#include "../core/timestat.h"

static rm_action check_action(lua_State *L, const char *s, int layer) {
  for (int a = 0; a < RM_ACTION_COUNT; a++)
    if (!strcmp(s, rm_action_name((rm_action)a))) return (rm_action)a;
  rm_lua_errorf(L, "checkpoint: layer %d: unknown action '%s' (keep, selective, boundary, recompute)", layer, s);
  return RM_KEEP;
}

/* Lists the op names (for "unknown op" errors). */
static void push_op_names(lua_State *L) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (int i = 0; i < RM_OP_COUNT; i++) {
    const rm_op_def *d = rm_op_def_get((rm_op_id)i);
    if (!d || (d->flags & RM_OPF_INTERNAL)) continue;
    if (i) luaL_addstring(&b, ", ");
    luaL_addstring(&b, rm_op_name((rm_op_id)i));
  }
  luaL_pushresult(&b);
}

/* Reads the layer entry on top of the stack into p->action[i] / p->sel[i]. Returns
 * NULL, or an error message (pushed on the stack) naming the layer. */
static const char *read_layer(lua_State *L, rm_plan *p, int i) {
  if (!lua_istable(L, -1))
    return lua_pushfstring(L, "layer %d: expected a table, got %s", i + 1, luaL_typename(L, -1));
  lua_getfield(L, -1, "action");
  const char *a = lua_tostring(L, -1);
  int act = -1;
  for (int k = 0; a && k < RM_ACTION_COUNT; k++)
    if (!strcmp(a, rm_action_name((rm_action)k))) act = k;
  lua_pop(L, 1);
  if (act < 0)
    return lua_pushfstring(L, "layer %d: unknown action '%s' (keep, selective, boundary, recompute)",
                           i + 1, a ? a : "nil");
  p->action[i] = (rm_action)act;
  if (lua_getfield(L, -1, "ops") == LUA_TTABLE) {
    int m = (int)luaL_len(L, -1);
    for (int k = 1; k <= m; k++) {
      lua_rawgeti(L, -1, k);
      const char *name = lua_tostring(L, -1);
      int op = name ? rm_op_find(name) : -1;
      lua_pop(L, 1);
      if (op < 0) {
        push_op_names(L);
        return lua_pushfstring(L, "unknown op '%s' (known ops: %s)", name ? name : "?", lua_tostring(L, -1));
      }
      rm_opset_add(&p->sel[i], op);
    }
  }
  lua_pop(L, 1);
  return NULL;
}

/* Reads { {action=, ops={...}}, ... } at idx into a new plan of n layers; raises on
 * bad input (freeing the plan first). */
static rm_plan *read_plan(lua_State *L, int idx, int n) {
  luaL_checktype(L, idx, LUA_TTABLE);
  int len = (int)luaL_len(L, idx);
  if (len != n) rm_lua_errorf(L, "checkpoint: the plan has %d layers but the Sequential has %d", len, n);
  rm_ctx *ctx = rm_lua_ctx(L);
  rm_plan *p = rm_plan_new(ctx, n);
  if (!p) rm_lua_fail(L, "checkpoint");
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, idx, i + 1);
    const char *err = read_layer(L, p, i);
    if (err) {
      rm_plan_free(ctx, p);
      rm_lua_errorf(L, "checkpoint: %s", err);
    }
    lua_pop(L, 1);
  }
  return p;
}

typedef struct loss_cb { lua_State *L; int fn; } loss_cb;

/* Calls the Lua loss function (at stack index fn) with y; never raises. */
static int call_loss(rm_ctx *ctx, rm_tensor *y, rm_tensor **loss, void *ud) {
  loss_cb *cb = ud;
  lua_State *L = cb->L;
  lua_pushvalue(L, cb->fn);
  rm_tensor_hold(y);
  rm_lua_push_tensor(L, y, "plan");
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
    rm_fail(ctx, RM_ERR_RUNTIME, "plan: the loss function failed: %s", lua_tostring(L, -1));
    lua_pop(L, 1);
    return RM_ERR_RUNTIME;
  }
  rm_tensor *t = rm_lua_test_tensor(L, -1);
  if (!t) {
    lua_pop(L, 1);
    return rm_fail(ctx, RM_ERR_ARG, "plan: the loss function must return a tensor");
  }
  rm_tensor_hold(t);
  lua_pop(L, 1);
  *loss = t;
  return RM_OK;
}

static void set_num(lua_State *L, const char *k, double v) {
  lua_pushnumber(L, v);
  lua_setfield(L, -2, k);
}

static void set_int(lua_State *L, const char *k, size_t v) {
  lua_pushinteger(L, (lua_Integer)v);
  lua_setfield(L, -2, k);
}

static void push_sim(lua_State *L, rm_ctx *ctx, const rm_tensor *x, const rm_sim *sim);

/* C.plan_simulate(seq, x, plan_table | nil (installed) | false (keep all), loss_fn | nil,
 * want_layers) -> { peak=, base=, flops=, recompute_flops=, layers = {...} } */
static int l_plan_simulate(lua_State *L) {
  rm_module *m = rm_lua_check_module(L, 1, "plan");
  rm_tensor *x = rm_lua_check_tensor(L, 2, "plan");
  rm_ctx *ctx = rm_lua_ctx(L);
  if (rm_check_sequential(ctx, m, "plan")) return rm_lua_fail(L, "plan");
  rm_plan *p = NULL;
  rm_plan *keep = NULL;
  if (lua_istable(L, 3)) p = read_plan(L, 3, m->nchildren);
  else if (lua_isboolean(L, 3) && !lua_toboolean(L, 3)) {
    keep = rm_plan_new(ctx, m->nchildren);
    if (!keep) return rm_lua_fail(L, "plan");
  }
  loss_cb cb = { L, 4 };
  bool has_loss = lua_isfunction(L, 4);
  bool want = lua_toboolean(L, 5);
  rm_sim sim;
  /* The collector stays off during the dry run: a Lua module's intermediates collected
   * there but not in the real step would make the prediction too low. */
  bool gc_on = lua_gc(L, LUA_GCISRUNNING);
  if (gc_on) lua_gc(L, LUA_GCSTOP);
  lua_State *prev = rm_lua_nn_enter(L);
  int rc = rm_plan_simulate(ctx, m, x, p ? p : keep, has_loss ? call_loss : NULL, &cb, want, &sim);
  rm_lua_nn_leave(L, prev);
  if (gc_on) lua_gc(L, LUA_GCRESTART);
  rm_plan_free(ctx, p);
  rm_plan_free(ctx, keep);
  if (rc != RM_OK) return rm_lua_nn_fail(L, "plan");
  push_sim(L, ctx, x, &sim);
  rm_sim_free(ctx, &sim);
  return 1;
}

/* Pushes a simulation as a table (layers when it has them; x: its input, or NULL). */
static void push_sim(lua_State *L, rm_ctx *ctx, const rm_tensor *x, const rm_sim *s_) {
  const rm_sim sim = *s_;
  lua_newtable(L);
  set_int(L, "peak", sim.peak);
  set_int(L, "base", sim.base);
  set_int(L, "loss_peak", sim.loss_peak);
  set_int(L, "held", sim.held);
  set_num(L, "flops", sim.flops);
  set_num(L, "recompute_flops", sim.recompute_flops);
  set_num(L, "recompute_cost", sim.recompute_cost);
  const rm_backend *be = x ? ctx->backend[x->device] : NULL;
  set_num(L, "flops_per_byte", be ? be->flops_per_byte : 0);
  set_int(L, "step_peak", sim.step_peak);
  set_int(L, "end_live", sim.end_live);
  lua_createtable(L, 0, RM_CAT_COUNT);
  for (int c = 0; c < RM_CAT_COUNT; c++) {
    lua_pushinteger(L, (lua_Integer)sim.step_cat[c]);
    lua_setfield(L, -2, rm_category_name((rm_category)c));
  }
  lua_setfield(L, -2, "step_by_category");
  lua_createtable(L, 0, RM_CAT_COUNT);
  for (int c = 0; c < RM_CAT_COUNT; c++) {
    lua_pushinteger(L, (lua_Integer)sim.end_cat[c]);
    lua_setfield(L, -2, rm_category_name((rm_category)c));
  }
  lua_setfield(L, -2, "end_by_category");
  if (sim.layers) {
    lua_createtable(L, sim.n, 0);
    for (int i = 0; i < sim.n; i++) {
      rm_layer_stats *s = &sim.layers[i];
      lua_newtable(L);
      set_num(L, "flops", s->flops);
      set_num(L, "recompute_flops", s->recompute_flops);
      set_num(L, "cost", s->cost);
      set_num(L, "recompute_cost", s->recompute_cost);
      set_int(L, "saved", s->saved);
      set_int(L, "in_bytes", s->in_bytes);
      set_int(L, "out_bytes", s->out_bytes);
      set_int(L, "out_live", s->out_live);
      set_int(L, "fwd_peak", s->fwd_peak);
      set_int(L, "bwd_peak", s->bwd_peak);
      set_int(L, "param_bytes", s->param_bytes);
      lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "layers");
  }
}

static double field(lua_State *L, int idx, const char *k, double def) {
  lua_getfield(L, idx, k);
  double v = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : def;
  lua_pop(L, 1);
  return v;
}

static const char *const chain_fields[] = { "keep_saved", "sel_saved", "fwd", "keep_bwd", "sel_bwd", "in_bytes",
                                            "in_kept", "out_bytes", "cost", "sel_cost" };

static double *chain_slot(rm_chain_layer *c, int f) {
  double *slots[] = { &c->keep_saved, &c->sel_saved, &c->fwd, &c->keep_bwd, &c->sel_bwd, &c->in_bytes,
                      &c->in_kept, &c->out_bytes, &c->cost, &c->sel_cost };
  return slots[f];
}

#define NFIELDS ((int)(sizeof chain_fields / sizeof *chain_fields))

/* Reads a chain table { held=, loss_peak=, {keep_saved=, ...}, ... } into *chain. */
static void read_chain(lua_State *L, int idx, rm_chain *chain) {
  luaL_checktype(L, idx, LUA_TTABLE);
  int n = (int)luaL_len(L, idx);
  rm_chain_layer *c = lua_newuserdatauv(L, sizeof *c * (size_t)(n ? n : 1), 0);
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, idx, i + 1);
    int t = lua_gettop(L);
    luaL_checktype(L, t, LUA_TTABLE);
    for (int f = 0; f < NFIELDS; f++) *chain_slot(&c[i], f) = field(L, t, chain_fields[f], f == NFIELDS - 1 ? -1 : 0);
    c[i].last_cost = field(L, t, "last_cost", -1);
    c[i].param_bytes = field(L, t, "param_bytes", 0);
    lua_pop(L, 1);
  }
  chain->layer = c;
  chain->n = n;
  chain->held = field(L, idx, "held", 0);
  chain->loss_peak = field(L, idx, "loss_peak", 0);
  chain->credit = (rm_credit){ 0 };
  if (lua_getfield(L, idx, "credit") == LUA_TTABLE) {   /* { act =, param =, cold = {7 shares} } */
    int t = lua_gettop(L);
    chain->credit.act = field(L, t, "act", 0);
    chain->credit.param = field(L, t, "param", 0);
    if (lua_getfield(L, t, "cold") == LUA_TTABLE)
      for (int i = 0; i < RM_CREDIT_SIZES; i++) {
        lua_rawgeti(L, -1, i + 1);
        chain->credit.cold[i] = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : 0;
        lua_pop(L, 1);
      }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

/* Reads a C.plan_simulate result (with layers) into sim (layers as userdata on the stack). */
static void read_sim(lua_State *L, int idx, rm_sim *sim) {
  luaL_checktype(L, idx, LUA_TTABLE);
  memset(sim, 0, sizeof *sim);
  sim->held = (size_t)field(L, idx, "held", 0);
  sim->loss_peak = (size_t)field(L, idx, "loss_peak", 0);
  sim->peak = (size_t)field(L, idx, "peak", 0);
  sim->base = (size_t)field(L, idx, "base", 0);
  if (lua_getfield(L, idx, "layers") != LUA_TTABLE) luaL_error(L, "chain_from_sims: a simulation without layers");
  int t = lua_gettop(L);
  int n = (int)luaL_len(L, t);
  rm_layer_stats *ls = lua_newuserdatauv(L, sizeof *ls * (size_t)(n ? n : 1), 0);
  lua_insert(L, t); /* keep the userdata below the layers table */
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, t + 1, i + 1);
    int e = lua_gettop(L);
    ls[i] = (rm_layer_stats){
      .saved = (size_t)field(L, e, "saved", 0), .in_bytes = (size_t)field(L, e, "in_bytes", 0),
      .out_bytes = (size_t)field(L, e, "out_bytes", 0), .out_live = (size_t)field(L, e, "out_live", 0),
      .fwd_peak = (size_t)field(L, e, "fwd_peak", 0), .bwd_peak = (size_t)field(L, e, "bwd_peak", 0),
      .cost = field(L, e, "cost", 0), .recompute_cost = field(L, e, "recompute_cost", 0),
      .param_bytes = (size_t)field(L, e, "param_bytes", 0) };
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  sim->layers = ls;
  sim->n = n;
}

/* C.chain_from_sims(keep_sim, sel_sim | nil) -> chain table (the DP's view of the model) */
static int l_chain_from_sims(lua_State *L) {
  rm_sim keep, sel;
  read_sim(L, 1, &keep);
  bool has_sel = !lua_isnoneornil(L, 2);
  if (has_sel) {
    read_sim(L, 2, &sel);
    if (sel.n != keep.n) return rm_lua_errorf(L, "chain_from_sims: %d and %d layers", keep.n, sel.n);
  }
  rm_chain_layer *c = lua_newuserdatauv(L, sizeof *c * (size_t)(keep.n ? keep.n : 1), 0);
  rm_chain chain;
  rm_chain_from_sims(&keep, has_sel ? &sel : NULL, c, &chain);
  lua_createtable(L, chain.n, 2);
  set_num(L, "held", chain.held);
  set_num(L, "loss_peak", chain.loss_peak);
  for (int i = 0; i < chain.n; i++) {
    lua_createtable(L, 0, NFIELDS);
    for (int f = 0; f < NFIELDS; f++) set_num(L, chain_fields[f], *chain_slot(&c[i], f));
    set_num(L, "last_cost", c[i].last_cost);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static void push_actions(lua_State *L, const rm_action *act, int n) {
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushstring(L, rm_action_name(act[i]));
    lua_rawseti(L, -2, i + 1);
  }
}

/* C.chain_optimal(chain, budget) -> actions (list of names), cost | nil */
static int l_chain_optimal(lua_State *L) {
  rm_chain chain;
  read_chain(L, 1, &chain);
  double budget = luaL_checknumber(L, 2);
  rm_action *act = lua_newuserdatauv(L, sizeof *act * (size_t)(chain.n ? chain.n : 1), 0);
  double cost = 0;
  if (!rm_chain_optimal(rm_lua_ctx(L), &chain, budget, act, &cost)) return 0;
  push_actions(L, act, chain.n);
  lua_pushnumber(L, cost);
  return 2;
}

/* C.chain_min_peak(chain) -> peak, actions: the smallest modelled peak of any plan */
static int l_chain_min_peak(lua_State *L) {
  rm_chain chain;
  read_chain(L, 1, &chain);
  rm_action *act = lua_newuserdatauv(L, sizeof *act * (size_t)(chain.n ? chain.n : 1), 0);
  double peak = 0;
  if (!rm_chain_min_peak(rm_lua_ctx(L), &chain, act, &peak))
    return rm_lua_errorf(L, "chain_min_peak: out of host memory");
  lua_pushnumber(L, peak);
  push_actions(L, act, chain.n);
  return 2;
}

/* C.chain_eval(chain, actions) -> peak, cost */
static int l_chain_eval(lua_State *L) {
  rm_chain chain;
  read_chain(L, 1, &chain);
  int n = chain.n;
  luaL_checktype(L, 2, LUA_TTABLE);
  if ((int)luaL_len(L, 2) != n) return rm_lua_errorf(L, "chain_eval: %d actions for %d layers", (int)luaL_len(L, 2), n);
  rm_action *act = lua_newuserdatauv(L, sizeof *act * (size_t)(n ? n : 1), 0);
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, 2, i + 1);
    act[i] = check_action(L, luaL_checkstring(L, -1), i + 1);
    lua_pop(L, 1);
  }
  double peak, cost;
  rm_chain_eval(&chain, act, &peak, &cost);
  lua_pushnumber(L, peak);
  lua_pushnumber(L, cost);
  return 2;
}

/* C.plan_step_cost(x, sim, keep_sim, actions) -> step time the plan adds (seconds: its
 * replays less the cache credit, as budget() counts it), credit per activation byte,
 * per parameter byte, the cold shares (measured on x's device at first use) */
static int l_plan_step_cost(lua_State *L) {
  rm_tensor *x = rm_lua_check_tensor(L, 1, "plan");
  rm_ctx *ctx = rm_lua_ctx(L);
  rm_sim sim, keep;
  read_sim(L, 2, &sim);
  read_sim(L, 3, &keep);
  luaL_checktype(L, 4, LUA_TTABLE);
  int n = (int)luaL_len(L, 4);
  if (n != sim.n || n != keep.n) return rm_lua_errorf(L, "plan_step_cost: %d actions for %d and %d layers", n, sim.n, keep.n);
  rm_action *act = lua_newuserdatauv(L, sizeof *act * (size_t)(n ? n : 1), 0);
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, 4, i + 1);
    act[i] = check_action(L, luaL_checkstring(L, -1), i + 1);
    lua_pop(L, 1);
  }
  rm_credit cr;
  if (rm_opcost_cache_credit(ctx, x->device, rm_credit_working_set(&keep), &cr)) return rm_lua_fail(L, "plan");
  rm_plan p = { .n = n, .action = act };
  lua_pushnumber(L, rm_plan_step_cost(&sim, &keep, &p, cr));
  lua_pushnumber(L, cr.act);
  lua_pushnumber(L, cr.param);
  lua_createtable(L, RM_CREDIT_SIZES, 0);
  for (int i = 0; i < RM_CREDIT_SIZES; i++) {
    lua_pushnumber(L, cr.cold[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 4;
}

/* C.cache_credit([device [, working_set]]) -> { act =, param = (seconds per byte),
 * cold = { share paid at 1, 2, ... 64 MiB } } (measured at first use) */
static int l_cache_credit(lua_State *L) {
  rm_ctx *ctx = rm_lua_ctx(L);
  const char *dev = luaL_optstring(L, 1, "cpu");
  rm_device d = !strcmp(dev, "cpu") ? RM_CPU : !strcmp(dev, "cuda") ? RM_CUDA : RM_DEVICE_COUNT;
  if (d == RM_DEVICE_COUNT) return rm_lua_errorf(L, "cache_credit: unknown device '%s' (cpu, cuda)", dev);
  lua_Integer ws = luaL_optinteger(L, 2, (lua_Integer)1 << 26);
  if (ws < 0) return rm_lua_errorf(L, "cache_credit: the working set must be >= 0 bytes, got %lld", (long long)ws);
  rm_credit cr;
  if (rm_opcost_cache_credit(ctx, d, (size_t)ws, &cr)) return rm_lua_fail(L, "cache_credit");
  lua_createtable(L, 0, 3);
  set_num(L, "act", cr.act);
  set_num(L, "param", cr.param);
  lua_createtable(L, RM_CREDIT_SIZES, 0);
  for (int i = 0; i < RM_CREDIT_SIZES; i++) {
    lua_pushnumber(L, cr.cold[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "cold");
  return 1;
}

/* C.layer_info(seq) -> { {type=, describe=, param_bytes=}, ... } */
static int l_layer_info(lua_State *L) {
  rm_module *m = rm_lua_check_module(L, 1, "plan");
  lua_createtable(L, m->nchildren, 0);
  for (int i = 0; i < m->nchildren; i++) {
    char buf[128];
    lua_newtable(L);
    lua_pushstring(L, m->children[i]->type->name);
    lua_setfield(L, -2, "type");
    lua_pushstring(L, rm_module_describe(m->children[i], buf, sizeof buf));
    lua_setfield(L, -2, "describe");
    rm_lua_ctx(L);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* C.op_timers(on): starts (clearing the totals) or stops the per-op timers. */
static int l_op_timers(lua_State *L) {
  rm_ctx *ctx = rm_lua_ctx(L);
  if (rm_opcost_profile(ctx, lua_toboolean(L, 1))) return rm_lua_fail(L, "op_timers");
  return 0;
}

/* C.op_timing() -> { [op name] = { seconds =, calls =, replay_seconds =, replay_calls = } } */
static int l_op_timing(lua_State *L) {
  const rm_op_timing *t = rm_opcost_timing(rm_lua_ctx(L));
  lua_newtable(L);
  for (int op = 0; t && op < RM_OP_COUNT; op++) {
    if (!t->calls[op] && !t->replay_calls[op]) continue;
    lua_createtable(L, 0, 4);
    lua_pushnumber(L, t->seconds[op]);
    lua_setfield(L, -2, "seconds");
    lua_pushinteger(L, t->calls[op]);
    lua_setfield(L, -2, "calls");
    lua_pushnumber(L, t->replay_seconds[op]);
    lua_setfield(L, -2, "replay_seconds");
    lua_pushinteger(L, t->replay_calls[op]);
    lua_setfield(L, -2, "replay_calls");
    lua_setfield(L, -2, rm_op_name((rm_op_id)op));
  }
  return 1;
}

/* C.opcost_calibrate(on | nil) -> whether calibration is on (sets it when given);
 * C.opcost_reset() forgets every measured cost. */
static int l_opcost_calibrate(lua_State *L) {
  rm_ctx *ctx = rm_lua_ctx(L);
  if (!lua_isnoneornil(L, 1)) rm_opcost_enable(ctx, lua_toboolean(L, 1));
  lua_pushboolean(L, rm_opcost_enabled(ctx));
  return 1;
}

static void push_cost(rm_op_id op, double seconds, double units, void *ud) {
  lua_State *L = ud;
  lua_createtable(L, 0, 3);
  lua_pushstring(L, rm_op_name(op));
  lua_setfield(L, -2, "op");
  lua_pushnumber(L, seconds);
  lua_setfield(L, -2, "seconds");
  lua_pushnumber(L, units);
  lua_setfield(L, -2, "units");
  lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
}

/* C.plan_simulations() -> how many plans rm_plan_simulate has dry-run on this context */
static int l_plan_simulations(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)rm_lua_ctx(L)->plan_sims);
  return 1;
}

/* C.opcost_entries() -> { {op =, seconds =, units =}, ... }: every measured call */
static int l_opcost_entries(lua_State *L) {
  lua_newtable(L);
  rm_opcost_each(rm_lua_ctx(L), push_cost, L);
  return 1;
}

/* C.timestat_value({seconds, ...}) -> the learned time of those samples, in order
 * (core/timestat.h: their mean less spikes), and how many of them were kept */
static int l_timestat_value(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  rm_ctx *ctx = rm_lua_ctx(L);
  rm_timestat s = { 0 };
  lua_Integer n = luaL_len(L, 1);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, 1, i);
    int ok = 0;
    double v = lua_tonumberx(L, -1, &ok);
    lua_pop(L, 1);
    if (!ok) {
      rm_timestat_free(ctx, &s);
      return rm_lua_errorf(L, "timestat_value: sample %d is not a number", (int)i);
    }
    rm_timestat_add(ctx, &s, v);
  }
  lua_pushnumber(L, rm_timestat_value(&s));
  lua_pushinteger(L, s.n);
  rm_timestat_free(ctx, &s);
  return 2;
}

/* C.opcost_learn(on): per-op costs learned from the timed steps that follow */
static int l_opcost_learn(lua_State *L) {
  rm_opcost_learn(rm_lua_ctx(L), lua_toboolean(L, 1));
  return 0;
}

static int l_opcost_reset(lua_State *L) {
  rm_opcost_reset(rm_lua_ctx(L));
  return 0;
}

/* ---- policies ---- */

/* Pushes plan p as { {action=, ops={names}}, ... }. */
static void push_plan(lua_State *L, const rm_plan *p) {
  lua_createtable(L, p->n, 0);
  for (int i = 0; i < p->n; i++) {
    lua_createtable(L, 0, 2);
    lua_pushstring(L, rm_action_name(p->action[i]));
    lua_setfield(L, -2, "action");
    if (p->action[i] == RM_SELECTIVE) {
      lua_newtable(L);
      int k = 0;
      for (int op = 0; op < RM_OP_COUNT; op++)
        if (rm_opset_has(&p->sel[i], op)) {
          lua_pushstring(L, rm_op_name((rm_op_id)op));
          lua_rawseti(L, -2, ++k);
        }
      lua_setfield(L, -2, "ops");
    }
    lua_rawseti(L, -2, i + 1);
  }
}

/* A policy set from Lua: its decide function (custom policies) and the Lua function
 * that gives the optimizer state a whole-step plan must leave room for. */
typedef struct lpolicy {
  lua_State *main;
  int decide_ref;   /* function(model, keep_sim) -> plan table (LUA_NOREF: none) */
  int extra_ref;    /* function(model) -> bytes (LUA_NOREF: none) */
} lpolicy;

static lua_State *callback_thread(lpolicy *lp) {
  lua_State *cur = rm_lua_nn_current(lp->main);
  return cur ? cur : lp->main;
}

static void lpolicy_free(rm_ctx *ctx, void *ud) {
  lpolicy *lp = ud;
  luaL_unref(lp->main, LUA_REGISTRYINDEX, lp->decide_ref);
  luaL_unref(lp->main, LUA_REGISTRYINDEX, lp->extra_ref);
  rm_host_free(ctx, lp, sizeof *lp);
}

/* Calls the Lua function at ref with the module and, when sim, a simulation; leaves
 * its result on L. Never raises. */
static int call_lua(rm_ctx *ctx, lua_State *L, int ref, rm_module *seq, const rm_sim *sim, rm_tensor *x) {
  if (!lua_checkstack(L, 8)) return rm_fail(ctx, RM_ERR_RUNTIME, "checkpoint: Lua stack overflow");
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  rm_lua_push_module(L, seq);
  if (sim) push_sim(L, ctx, x, sim);
  if (lua_pcall(L, sim ? 2 : 1, 1, 0) != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    rm_fail(ctx, RM_ERR_RUNTIME, "%s", msg ? msg : "error in a Lua policy (not a string)");
    lua_pop(L, 1);
    return RM_ERR_RUNTIME;
  }
  return RM_OK;
}

/* rm_policy_def.decide for custom policies: the Lua function's plan. */
static int lpolicy_decide(rm_ctx *ctx, rm_module *seq, const rm_sim *keep, rm_plan *out, void *ud) {
  lpolicy *lp = ud;
  lua_State *L = callback_thread(lp);
  int top = lua_gettop(L);
  /* the dry run's device is the parameters'; measurements do not need x */
  int rc = call_lua(ctx, L, lp->decide_ref, seq, keep, NULL);
  for (int i = 0; rc == RM_OK && i < out->n; i++) {
    if (!lua_istable(L, -1)) {
      rc = rm_fail(ctx, RM_ERR_RUNTIME, "custom policy: expected a plan table");
      break;
    }
    lua_rawgeti(L, -1, i + 1);
    const char *err = read_layer(L, out, i);
    if (err) rc = rm_fail(ctx, RM_ERR_ARG, "custom policy: %s", err);
    lua_settop(L, top + 1);
  }
  lua_settop(L, top);
  return rc;
}

/* rm_policy_def.step: the optimizer state still to be made, from the Lua function. */
static int lpolicy_step(rm_ctx *ctx, rm_module *seq, rm_step_env *env, void *ud) {
  lpolicy *lp = ud;
  if (lp->extra_ref == LUA_NOREF) return RM_OK;
  lua_State *L = callback_thread(lp);
  int rc = call_lua(ctx, L, lp->extra_ref, seq, NULL, NULL);
  if (rc) return rc;
  lua_Integer v = lua_tointeger(L, -1);
  env->optim_extra = v > 0 ? (size_t)v : 0;
  lua_pop(L, 1);
  return RM_OK;
}

static const char *const kinds[] = { "none", "every", "sqrt", "selective", "budget", "custom", NULL };

/* Reads a policy description { kind=, name=, k=, ops=, bytes=, decide=, extra= } at idx
 * (built by remat.policy) into def. Raises on bad input (nothing to free then). */
static void read_policy(lua_State *L, int idx, rm_policy_def *def) {
  luaL_checktype(L, idx, LUA_TTABLE);
  lua_getfield(L, idx, "kind");
  int kind = luaL_checkoption(L, -1, NULL, kinds);
  lua_pop(L, 1);
  rm_ctx *ctx = rm_lua_ctx(L);
  const char *ops[RM_OP_COUNT];
  rm_policy p = { .kind = (rm_policy_kind)(kind == RM_POLICY_CUSTOM ? RM_POLICY_NONE : kind) };
  lua_getfield(L, idx, "k");
  p.every = (int)luaL_optinteger(L, -1, 0);
  lua_getfield(L, idx, "bytes");
  p.whole_step = lua_isnil(L, -1);
  lua_Integer bytes = luaL_optinteger(L, -1, 0);
  p.budget = bytes > 0 ? (size_t)bytes : 0;
  lua_pop(L, 2);
  lua_getfield(L, idx, "ops");
  if (lua_istable(L, -1)) {
    int n = (int)luaL_len(L, -1);
    if (n > RM_OP_COUNT) rm_lua_errorf(L, "policy: %d op names", n);
    for (int i = 1; i <= n; i++) {
      lua_rawgeti(L, -1, i);
      ops[p.nops++] = lua_tostring(L, -1);   /* anchored by the table */
      lua_pop(L, 1);
    }
    p.ops = ops;
  }
  if (rm_policy_read(ctx, &p, def)) rm_lua_fail(L, "checkpoint");
  lua_pop(L, 1);
  def->kind = kind;
  if (lua_getfield(L, idx, "name") == LUA_TSTRING) snprintf(def->name, sizeof def->name, "remat.policy.%s", lua_tostring(L, -1));
  lua_pop(L, 1);
  bool custom = kind == RM_POLICY_CUSTOM;
  if (custom && lua_getfield(L, idx, "decide") != LUA_TFUNCTION) rm_lua_errorf(L, "checkpoint: a custom policy needs a decide function");
  if (custom) lua_pop(L, 1);
  lpolicy *lp = rm_host_malloc(ctx, sizeof *lp);
  if (!lp) rm_lua_errorf(L, "checkpoint: out of host memory");
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  lp->main = lua_tothread(L, -1);
  lua_pop(L, 1);
  lp->decide_ref = lp->extra_ref = LUA_NOREF;
  if (lua_getfield(L, idx, "decide") == LUA_TFUNCTION) lp->decide_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  else lua_pop(L, 1);
  if (lua_getfield(L, idx, "extra") == LUA_TFUNCTION) lp->extra_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  else lua_pop(L, 1);
  def->decide = custom ? lpolicy_decide : NULL;
  def->step = lpolicy_step;
  def->ud = lp;
  def->free_ud = lpolicy_free;
}

/* C.checkpoint_set(seq, policy_description | nil): sets seq's policy (planned now when
 * it needs no sizes); nil removes it. */
static int l_checkpoint_set(lua_State *L) {
  rm_module *m = rm_lua_check_module(L, 1, "checkpoint");
  rm_ctx *ctx = rm_lua_ctx(L);
  if (lua_isnoneornil(L, 2)) {
    if (rm_policy_set(ctx, m, NULL)) return rm_lua_fail(L, "checkpoint");
    return 0;
  }
  if (rm_check_sequential(ctx, m, "checkpoint")) return rm_lua_fail(L, "checkpoint");
  rm_policy_def def;
  read_policy(L, 2, &def);
  if (rm_policy_set(ctx, m, &def)) return rm_lua_fail(L, "checkpoint");
  return 0;
}

/* C.checkpoint_name(seq) -> the name of seq's policy, or nil (none, or uninstalled) */
static int l_checkpoint_name(lua_State *L) {
  const rm_policy_def *d = rm_policy_get(rm_lua_check_module(L, 1, "checkpoint"));
  if (!d) return 0;
  lua_pushstring(L, d->name);
  return 1;
}

/* The step a plan is made for: the loss function at idx (or nil) and the optimizer
 * state still to be made at idx + 1. */
static rm_step_env read_env(lua_State *L, int idx, loss_cb *cb) {
  rm_step_env env = { 0 };
  if (lua_isfunction(L, idx)) {
    *cb = (loss_cb){ L, idx };
    env.loss = call_loss;
    env.loss_ud = cb;
  }
  lua_Integer extra = luaL_optinteger(L, idx + 1, 0);
  env.optim_extra = extra > 0 ? (size_t)extra : 0;
  return env;
}

/* C.checkpoint_prepare(seq, x, loss_fn | nil, optim_extra) -> the plan seq runs for x
 * (planned now when its policy needs sizes), or nil (no policy) */
static int l_checkpoint_prepare(lua_State *L) {
  rm_module *m = rm_lua_check_module(L, 1, "plan");
  rm_tensor *x = rm_lua_check_tensor(L, 2, "plan");
  loss_cb cb;
  rm_step_env env = read_env(L, 3, &cb);
  if (rm_lua_checkpoint_prepare(L, m, x, &env)) return rm_lua_fail(L, "checkpoint");
  if (!m->plan) return 0;
  push_plan(L, m->plan);
  return 1;
}

/* C.policy_plan(seq, x, policy_description, loss_fn | nil, optim_extra) -> the plan
 * the policy gives seq for x (not installed) */
static int l_policy_plan(lua_State *L) {
  rm_module *m = rm_lua_check_module(L, 1, "plan");
  rm_tensor *x = rm_lua_check_tensor(L, 2, "plan");
  rm_ctx *ctx = rm_lua_ctx(L);
  if (rm_check_sequential(ctx, m, "plan")) return rm_lua_fail(L, "plan");
  loss_cb cb;
  rm_step_env env = read_env(L, 4, &cb);
  rm_policy_def def;
  read_policy(L, 3, &def);
  rm_plan *plan = NULL;
  bool gc_on = lua_gc(L, LUA_GCISRUNNING);
  if (gc_on) lua_gc(L, LUA_GCSTOP);
  lua_State *prev = rm_lua_nn_enter(L);
  int rc = rm_policy_plan(ctx, m, &def, x, &env, &plan);
  rm_lua_nn_leave(L, prev);
  if (gc_on) lua_gc(L, LUA_GCRESTART);
  def.free_ud(ctx, def.ud);
  if (rc) return rm_lua_fail(L, "plan");
  push_plan(L, plan);
  rm_plan_free(ctx, plan);
  return 1;
}

int rm_lua_checkpoint_prepare(lua_State *L, rm_module *m, rm_tensor *x, const rm_step_env *env) {
  /* restarting the collector resets its debt: only around real planning */
  if (!rm_policy_pending(m, x)) return RM_OK;
  rm_ctx *ctx = rm_lua_ctx(L);
  /* the collector stays off during the dry runs, as in plan_simulate */
  bool gc_on = lua_gc(L, LUA_GCISRUNNING);
  if (gc_on) lua_gc(L, LUA_GCSTOP);
  lua_State *prev = rm_lua_nn_enter(L);
  int rc = rm_policy_prepare(ctx, m, x, env);
  rm_lua_nn_leave(L, prev);
  if (gc_on) lua_gc(L, LUA_GCRESTART);
  return rc;
}

static const luaL_Reg fns[] = {
  { "op_timers", l_op_timers },
  { "op_timing", l_op_timing },
  { "opcost_calibrate", l_opcost_calibrate },
  { "opcost_reset", l_opcost_reset },
  { "opcost_entries", l_opcost_entries },
  { "plan_simulations", l_plan_simulations },
  { "opcost_learn", l_opcost_learn },
  { "timestat_value", l_timestat_value },
  { "checkpoint_set", l_checkpoint_set },
  { "checkpoint_name", l_checkpoint_name },
  { "checkpoint_prepare", l_checkpoint_prepare },
  { "policy_plan", l_policy_plan },
  { "plan_simulate", l_plan_simulate },
  { "chain_from_sims", l_chain_from_sims },
  { "chain_optimal", l_chain_optimal },
  { "chain_min_peak", l_chain_min_peak },
  { "chain_eval", l_chain_eval },
  { "layer_info", l_layer_info },
  { "plan_step_cost", l_plan_step_cost },
  { "cache_credit", l_cache_credit },
  { NULL, NULL },
};

void rm_lua_open_plan(lua_State *L) { luaL_setfuncs(L, fns, 0); }
