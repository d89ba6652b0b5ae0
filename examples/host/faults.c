/* A host that misbehaves on purpose (spec/faults_spec.lua runs it, under ASan in
 * `make check-mem`):
 *
 *   faults alloc [stride] [first]   its host allocator fails twice in a row, at every
 *                                   stride-th allocation of opening remat, building a
 *                                   model and training it; each run must end with a
 *                                   status (never a crash) and give every byte back
 *   faults nulls                    NULL at every argument of every host entry point
 *   faults close                    tensors made by finalizers while the state closes
 *                                   are given back too
 *
 * Prints one summary line; exits 0 when every run held. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <lauxlib.h>
#include <lualib.h>
#include <remat.h>

#include "common.h"

/* A counting allocator (common.h) whose calls number fail_at and fail_at + 1 fail. */
typedef struct faulty {
  counter c;
  unsigned long calls, fail_at, failed;
} faulty;

static int should_fail(faulty *f) {
  f->calls++;
  if (f->fail_at && (f->calls == f->fail_at || f->calls == f->fail_at + 1)) {
    f->failed++;
    return 1;
  }
  return 0;
}

static void *faulty_alloc(void *ud, size_t n) {
  faulty *f = ud;
  return should_fail(f) ? NULL : count_alloc(&f->c, n);
}

static void *faulty_realloc(void *ud, void *p, size_t o, size_t n) {
  faulty *f = ud;
  return should_fail(f) ? NULL : count_realloc(&f->c, p, o, n);
}

static void faulty_free(void *ud, void *p, size_t n) { count_free(&((faulty *)ud)->c, p, n); }

/* Builds a model (built-in layers, a Lua layer, named children, a checkpoint policy)
 * and trains it a few steps with AdamW; saves nothing. */
static const char *const SCRIPT =
  "local nn = remat.nn\n"
  "remat.manual_seed(3)\n"
  "local half = nn.module{ forward = function(_, h) return h * 0.5 end }\n"
  "local model = nn.Sequential{ nn.Linear(6, 8), nn.GELU(), half, nn.LayerNorm(8), nn.Linear(8, 3) }\n"
  "local mlp = nn.MLP(3, 2)\n"
  "model:add(mlp)\n"
  "model:checkpoint(remat.policy.every(2))\n"
  "local opt = remat.optim.AdamW(model:parameters(), { lr = 1e-2, weight_decay = 0.01 })\n"
  "local x, y = remat.randn(5, 6), remat.tensor{ 1, 2, 3, 1, 2 }\n"
  "for _ = 1, 2 do\n"
  "  local loss = nn.cross_entropy(model(x), y)\n"
  "  loss:backward(); opt:step(); opt:zero_grad()\n"
  "end\n"
  "local sd = model:state_dict()\n"
  "return sd ~= nil\n";

/* One run with failures at fail_at and fail_at + 1 (0: none). Returns the number of
 * allocator calls made; *bad is set when the run crashed into a leak or a bad size. */
static unsigned long run_once(unsigned long fail_at, int *bad, int *failed_status) {
  faulty f;
  memset(&f, 0, sizeof f);
  f.c.name = "host";
  f.fail_at = fail_at;
  rm_host_alloc a = { faulty_alloc, faulty_realloc, faulty_free, &f };
  rm_ctx *ctx = rm_ctx_new(&a, NULL, NULL);
  int rc = RM_ERR_OOM;
  if (ctx) {
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    rc = rm_lua_open(L, ctx);
    if (rc == RM_OK) {
      lua_setglobal(L, "remat");
      rc = rm_lua_exec(L, ctx, SCRIPT, 1, 0);
    }
    if (rc != RM_OK && !rm_errmsg(ctx)[0]) {
      fprintf(stderr, "faults: run %lu failed (status %d) without a message\n", fail_at, rc);
      *bad = 1;
    }
    lua_close(L);
    rm_ctx_free(ctx);
  }
  if (f.c.live || f.c.blocks || f.c.bad_sizes) {
    fprintf(stderr, "faults: failing allocation %lu: %zu bytes in %zu blocks not given back, %lu frees of a wrong size\n",
            fail_at, f.c.live, f.c.blocks, f.c.bad_sizes);
    *bad = 1;
  }
  *failed_status = rc != RM_OK;
  return f.calls;
}

static int alloc_mode(unsigned long stride, unsigned long first) {
  int bad = 0, failed;
  unsigned long total = run_once(0, &bad, &failed);
  if (bad || failed) {
    fprintf(stderr, "faults: the run without failures did not succeed\n");
    return 1;
  }
  unsigned long points = 0, errors = 0;
  for (unsigned long k = first ? first : 1; k <= total; k += stride) {
    run_once(k, &bad, &failed);
    points++;
    errors += (unsigned long)failed;
  }
  printf("alloc: %lu allocator calls per run, %lu failure points (stride %lu), %lu ended with an error status, %s\n",
         total, points, stride, errors, bad ? "SOME LEAKED OR CRASHED" : "every byte given back");
  return bad;
}

/* Every host entry point with NULL in each pointer argument: each must refuse. */
static int nulls_mode(void) {
  int bad = 0, calls = 0;
#define EXPECT(cond) do { calls++; if (!(cond)) { fprintf(stderr, "faults: %s failed\n", #cond); bad = 1; } } while (0)
  rm_ctx *ctx = rm_ctx_new(NULL, NULL, NULL);
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  uint64_t s, o;
  rm_slice sl;
  rm_ctx_free(NULL); calls++;
  EXPECT(rm_set_log(NULL, NULL, NULL) == RM_ERR_ARG);
  rm_log(NULL, RM_LOG_INFO, "x"); calls++;
  EXPECT(rm_errmsg(NULL) != NULL);
  EXPECT(rm_errcode(NULL) == RM_ERR_ARG);
  rm_clear_error(NULL); calls++;
  EXPECT(rm_status_name(-1) != NULL && rm_status_name(1000) != NULL);
  EXPECT(rm_set_memory_limit(NULL, 0, 1) == RM_ERR_ARG);
  EXPECT(rm_set_memory_limit(ctx, -1, 1) != RM_OK && rm_set_memory_limit(ctx, 99, 1) != RM_OK);
  EXPECT(rm_memory_limit(NULL, 0) == 0 && rm_memory_live(NULL, 0) == 0 && rm_memory_peak(NULL, 0) == 0);
  EXPECT(rm_memory_limit(ctx, 99) == 0 && rm_memory_live(ctx, -1) == 0 && rm_memory_peak(ctx, 99) == 0);
  EXPECT(rm_manual_seed(NULL, 1) == RM_ERR_ARG);
  EXPECT(rm_rng_state(NULL, &s, &o) == RM_ERR_ARG);
  EXPECT(rm_rng_state(ctx, NULL, NULL) == RM_OK);
  EXPECT(rm_lua_open(NULL, ctx) == RM_ERR_ARG);
  EXPECT(rm_lua_open(L, NULL) == RM_ERR_ARG);
  EXPECT(rm_lua_open(NULL, NULL) == RM_ERR_ARG);
  EXPECT(rm_lua_context(NULL) == NULL);
  EXPECT(rm_lua_context(L) == NULL);
  EXPECT(rm_lua_run(NULL, ctx, "return 1", 1) == RM_ERR_ARG);
  EXPECT(rm_lua_run(L, NULL, "return 1", 1) == RM_ERR_ARG);
  EXPECT(rm_lua_run(L, ctx, NULL, 1) == RM_ERR_ARG);
  EXPECT(rm_lua_exec(NULL, ctx, "return 1", 1, 0) == RM_ERR_ARG);
  EXPECT(rm_lua_exec(L, NULL, "return 1", 1, 0) == RM_ERR_ARG);
  EXPECT(rm_lua_exec(L, ctx, NULL, 1, 0) == RM_ERR_ARG);
  EXPECT(rm_lua_slice(NULL, ctx, 1, 1, &sl) == RM_ERR_ARG);
  EXPECT(rm_lua_slice(L, NULL, 1, 1, &sl) == RM_ERR_ARG);
  EXPECT(rm_lua_slice(L, ctx, 1, 1, NULL) != RM_OK);     /* nothing at index 1 */
  EXPECT(rm_lua_slice(L, ctx, 1, NAN, &sl) != RM_OK);
  /* models, tensors and policies from C */
  int64_t shape[2] = { 2, 3 };
  rm_policy pol = { .kind = RM_POLICY_EVERY, .every = 1 };
  rm_tensor *y = NULL;
  EXPECT(!rm_sequential_new(NULL) && !rm_nn_linear(NULL, 2, 2, true) && !rm_nn_layernorm(NULL, 2, 1e-5, true));
  EXPECT(!rm_nn_gelu(NULL) && !rm_nn_relu(NULL) && !rm_nn_mlp(NULL, 2, 4, 0) && !rm_nn_block(NULL, 4, 2, 0));
  EXPECT(!rm_tensor_filled(NULL, 0, 2, shape, 1) && !rm_tensor_filled(ctx, 0, 2, NULL, 1) && !rm_tensor_filled(ctx, 7, 2, shape, 1));
  rm_module_release(NULL, NULL); rm_module_release(ctx, NULL); rm_tensor_drop(NULL, NULL); rm_tensor_drop(ctx, NULL); calls += 4;
  EXPECT(rm_module_add_child(NULL, NULL, NULL) == RM_ERR_ARG && rm_module_add_child(ctx, NULL, NULL) == RM_ERR_ARG);
  EXPECT(rm_module_forward(NULL, NULL, NULL, &y) == RM_ERR_ARG && rm_module_forward(ctx, NULL, NULL, &y) == RM_ERR_ARG);
  EXPECT(rm_module_forward(ctx, NULL, NULL, NULL) == RM_ERR_ARG);
  EXPECT(rm_backward(NULL, NULL, NULL) == RM_ERR_ARG && rm_backward(ctx, NULL, NULL) == RM_ERR_ARG);
  EXPECT(rm_checkpoint(NULL, NULL, &pol) == RM_ERR_ARG && rm_checkpoint(ctx, NULL, &pol) == RM_ERR_ARG);
  EXPECT(rm_checkpoint_plan(NULL, NULL, NULL) == RM_ERR_ARG && rm_checkpoint_plan(ctx, NULL, NULL) == RM_ERR_ARG);
  EXPECT(rm_checkpoint_predict(NULL, NULL, NULL, NULL, NULL) == RM_ERR_ARG);
  EXPECT(rm_checkpoint_predict(ctx, NULL, NULL, NULL, NULL) == RM_ERR_ARG && rm_checkpoint_action(NULL, 0) == NULL);
  EXPECT(rm_memory_category_peak(NULL, 0, "activation") == 0 && rm_memory_category_peak(ctx, 0, NULL) == 0);
  EXPECT(rm_memory_category_peak(ctx, 0, "nope") == 0 && rm_memory_restart_peak(NULL, 0) == RM_ERR_ARG);
  EXPECT(rm_memory_restart_peak(ctx, 9) != RM_OK && rm_checkpoint_measured_costs(NULL, 0) == RM_ERR_ARG);
  rm_module *seq = rm_sequential_new(ctx), *lin = rm_nn_linear(ctx, 3, 3, true);
  EXPECT(rm_checkpoint(ctx, seq, NULL) == RM_ERR_ARG && rm_checkpoint(ctx, lin, &pol) == RM_ERR_ARG);
  EXPECT(rm_module_add_child(ctx, seq, NULL) == RM_ERR_ARG && rm_module_add_child(ctx, seq, lin) == RM_OK);
  EXPECT(rm_checkpoint_plan(ctx, seq, NULL) == RM_ERR_ARG && rm_checkpoint_action(seq, 0) == NULL);
  /* every(1) on one layer: that layer is the last segment, which keeps (core/policy.c) */
  EXPECT(rm_checkpoint(ctx, seq, &pol) == RM_OK && !strcmp(rm_checkpoint_action(seq, 0), "keep"));
  EXPECT(rm_checkpoint_action(seq, 1) == NULL && rm_checkpoint_action(seq, -1) == NULL);
  pol.every = 0;
  EXPECT(rm_checkpoint(ctx, seq, &pol) == RM_ERR_ARG);
  rm_module_release(ctx, lin);
  rm_module_release(ctx, seq);
  /* opened once: a second open is refused, and the first keeps working */
  EXPECT(rm_lua_open(L, ctx) == RM_OK);
  lua_setglobal(L, "remat");
  EXPECT(rm_lua_open(L, ctx) == RM_ERR_STATE);
  EXPECT(rm_lua_exec(L, ctx, "return remat.zeros(2):sum():item() == 0", 1, 1) == RM_OK && lua_toboolean(L, -1));
  lua_settop(L, 0);
  EXPECT(rm_lua_context(L) == ctx);
  lua_close(L);
  rm_ctx_free(ctx);
  printf("nulls: %d calls, %s\n", calls, bad ? "SOME FAILED" : "all refused cleanly");
  return bad;
}

/* Finalizers that make tensors, run by lua_close: every byte must still come back. */
static int close_mode(void) {
  faulty f;
  memset(&f, 0, sizeof f);
  rm_host_alloc a = { faulty_alloc, faulty_realloc, faulty_free, &f };
  rm_ctx *ctx = rm_ctx_new(&a, NULL, NULL);
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  int rc = rm_lua_open(L, ctx);
  if (rc == RM_OK) {
    lua_setglobal(L, "remat");
    rc = rm_lua_exec(L, ctx,
                     "kept = {}\n"
                     "for i = 1, 4 do\n"
                     "  setmetatable({}, { __gc = function() kept[i] = remat.zeros(1000, 4) end })\n"
                     "end\n", 1, 0);
  }
  lua_close(L);
  size_t live = rm_memory_live(ctx, 0);
  rm_ctx_free(ctx);
  int bad = rc != RM_OK || live || f.c.live || f.c.blocks;
  printf("close: %s (tensor bytes live after lua_close %zu, host bytes %zu in %zu blocks)\n",
         bad ? "SOME NOT GIVEN BACK" : "every byte given back", live, f.c.live, f.c.blocks);
  return bad;
}

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "alloc")) {
    unsigned long stride = argc >= 3 ? strtoul(argv[2], NULL, 10) : 1;
    unsigned long first = argc >= 4 ? strtoul(argv[3], NULL, 10) : 1;
    return alloc_mode(stride ? stride : 1, first);
  }
  if (argc >= 2 && !strcmp(argv[1], "nulls")) return nulls_mode();
  if (argc >= 2 && !strcmp(argv[1], "close")) return close_mode();
  fprintf(stderr, "usage: faults alloc [stride] [first] | faults nulls | faults close\n");
  return 2;
}
