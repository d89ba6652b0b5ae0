/* Two remat contexts in one process, each with its own lua_State, allocator, log and
 * memory limit: checks that memory statistics, limits, the random generator, errors
 * and logs do not mix; that an error in a training script (or inside a stepper's
 * loop) comes back to the host as a status and a message while the host keeps going;
 * that collect-and-retry works inside a stepper's coroutine; that a state opened with
 * luaL_requiref gets a context of its own; and that every byte taken from each host
 * allocator comes back. Prints one line per check; exits 0 when all pass.
 * Nothing is written to stderr unless a check fails. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

#include <remat.h>

#include "common.h" /* the counting allocator */

/* Each context's log lands in its own buffer. */
typedef struct logbuf {
  char text[4096];
  int n;
} logbuf;

static void to_buf(void *ud, int level, const char *msg) {
  logbuf *b = ud;
  b->n++;
  size_t at = strlen(b->text);
  snprintf(b->text + at, sizeof b->text - at, "%d:%s\n", level, msg);
}

static int failures = 0;

static void check(int cond, const char *what, const char *detail) {
  printf("%s %s\n", cond ? "ok  " : "FAIL", what);
  if (!cond) {
    failures++;
    fprintf(stderr, "two_contexts: FAILED: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  }
}

static lua_State *open_state(rm_ctx *ctx) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  if (rm_lua_open(L, ctx) != RM_OK) {
    fprintf(stderr, "two_contexts: %s\n", rm_errmsg(ctx));
    exit(1);
  }
  lua_setglobal(L, "remat");
  return L;
}

/* Runs code expected to succeed and return one number. */
static double eval(lua_State *L, rm_ctx *ctx, const char *code) {
  if (rm_lua_exec(L, ctx, code, 1, 1) != RM_OK) {
    check(0, code, rm_errmsg(ctx));
    return NAN;
  }
  double v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

static int luaopen_under_pcall(lua_State *L) {
  luaL_requiref(L, "remat", luaopen_remat, 1);
  return 0;
}

int main(void) {
  counter ca = { 0 }, cb = { 0 };
  logbuf la = { { 0 }, 0 }, lb = { { 0 }, 0 };
  rm_host_alloc aa = { count_alloc, count_realloc, count_free, &ca },
                ab = { count_alloc, count_realloc, count_free, &cb };
  rm_ctx *A = rm_ctx_new(&aa, to_buf, &la), *B = rm_ctx_new(&ab, to_buf, &lb);
  check(A && B && A != B, "two contexts created", NULL);
  check(ca.allocs >= 1 && cb.allocs >= 1, "each context allocates through its own host allocator", NULL);
  lua_State *LA = open_state(A), *LB = open_state(B);
  check(rm_lua_context(LA) == A && rm_lua_context(LB) == B, "rm_lua_context finds each state's context", NULL);

  /* limits */
  const size_t MiB = 1024 * 1024;
  rm_set_memory_limit(A, 0, 1 * MiB);
  rm_set_memory_limit(B, 0, 64 * MiB);
  check(rm_memory_limit(A, 0) == 1 * MiB && rm_memory_limit(B, 0) == 64 * MiB, "different limits", NULL);
  check(eval(LA, A, "return remat.memory.stats().limit") == (double)MiB &&
        eval(LB, B, "return remat.memory.stats().limit") == 64.0 * MiB,
        "each state sees its own context's limit", NULL);

  /* memory statistics */
  eval(LA, A, "a1 = remat.zeros(128 * 1024) return 0");        /* 512 KiB */
  eval(LB, B, "b1 = remat.zeros(4 * 256 * 1024) return 0");    /* 4 MiB: over A's limit, under B's */
  check(rm_memory_live(A, 0) == 512 * 1024, "A's live bytes count A's tensor only", NULL);
  check(rm_memory_live(B, 0) == 4 * MiB, "B's live bytes count B's tensor only", NULL);
  check(eval(LB, B, "return remat.memory.stats().live") == 4.0 * MiB, "remat.memory.stats in B agrees", NULL);

  /* errors: an allocation past A's limit fails in A only */
  int rc = rm_lua_run(LA, A, "a2 = remat.zeros(4 * 256 * 1024)", 1);
  check(rc == RM_ERR_RUNTIME && strstr(rm_errmsg(A), "out of memory") && strstr(rm_errmsg(A), "limit 1.00 MiB"),
        "an allocation past A's limit fails with A's limit in the message", rm_errmsg(A));
  check(rm_errmsg(B)[0] == 0 && rm_errcode(B) == RM_OK, "B has no error", rm_errmsg(B));
  check(rm_memory_live(A, 0) == 512 * 1024, "A's statistics unchanged by the failure", NULL);

  /* a training-script error: status and message to the host, the state keeps working */
  rc = rm_lua_run(LA, A, "local x = remat.randn(2, 3); local y = x:matmul(remat.randn(4, 5))", 1);
  check(rc != RM_OK && strstr(rm_errmsg(A), "matmul") != NULL, "a script error returns a status and a message", rm_errmsg(A));
  check(rm_errmsg(B)[0] == 0, "the error stays on A", NULL);
  rm_clear_error(A);
  check(eval(LA, A, "return (remat.ones(2, 2) + 1):sum():item()") == 8.0 && rm_errcode(A) == RM_OK,
        "A runs another script fine afterwards", NULL);
  rc = rm_lua_run(LA, A, "this is not lua", 1);
  check(rc != RM_OK && strstr(rm_errmsg(A), "(code):1:") != NULL, "a syntax error is a status too", rm_errmsg(A));
  check(rm_lua_run(LA, A, "/nonexistent/train.lua", 0) != RM_OK && strstr(rm_errmsg(A), "nonexistent"),
        "a missing script file is a status", rm_errmsg(A));

  /* an error inside a stepper's loop, at its third step */
  const char *stepper =
    "local nn = remat.nn\n"
    "local m = nn.Sequential{ nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3) }\n"
    "local opt = remat.optim.SGD(m:parameters(), { lr = 0.05 })\n"
    "local n = 0\n"
    "return remat.train.stepper{ model = m, optimizer = opt, budget_ms = 1000, steps = 5,\n"
    "  data = function() n = n + 1\n"
    "    return remat.randn(4, 8), remat.tensor{ 1, 2, 3, n == 3 and 9 or 1 } end }\n";
  rm_slice s;
  check(rm_lua_exec(LA, A, stepper, 1, 1) == RM_OK, "a stepper script returns its stepper", rm_errmsg(A));
  rc = rm_lua_slice(LA, A, -1, 1e9, &s);
  check(rc != RM_OK && s.steps == 0 && strstr(rm_errmsg(A), "out of range"),
        "an error in the stepper's loop comes back from rm_lua_slice", rm_errmsg(A));
  check(strstr(rm_errmsg(A), "training slice") != NULL, "the message says it was the training slice", rm_errmsg(A));
  check(rm_lua_slice(LA, A, -1, 1.0, &s) != RM_OK, "a failed stepper keeps failing (it does not restart)", NULL);
  lua_pop(LA, 1);
  rm_clear_error(A);
  check(rm_lua_exec(LA, A, "local remat = remat\n"
                           "local x, y = remat.randn(16, 4), remat.tensor{1,2,3,4,1,2,3,4,1,2,3,4,1,2,3,4}\n"
                           "local m = remat.nn.Linear(4, 4)\n"
                           "return remat.train.stepper{ model = m, optimizer = remat.optim.SGD(m:parameters(), { lr = 0.1 }),\n"
                           "  data = function() return x, y end, steps = 3 }", 1, 1) == RM_OK,
        "a new stepper in the same state", rm_errmsg(A));
  int steps = 0, slices = 0;
  do {
    rc = rm_lua_slice(LA, A, -1, 0.0, &s);
    steps += s.steps;
    slices++;
  } while (rc == RM_OK && !s.done && slices < 10);
  check(rc == RM_OK && s.done && steps == 3 && s.total == 3 && slices == 3 && isfinite(s.loss),
        "it trains: one step per zero-budget slice, done after its 3 steps", rm_errmsg(A));
  lua_pop(LA, 1);
  check(rm_lua_slice(LA, A, 1, 1.0, &s) == RM_ERR_ARG, "rm_lua_slice on an empty stack index is RM_ERR_ARG", NULL);
  lua_pushinteger(LA, 3);
  check(rm_lua_slice(LA, A, -1, 1.0, &s) == RM_ERR_RUNTIME && strstr(rm_errmsg(A), "not a remat.train stepper"),
        "rm_lua_slice on a non-stepper is an error, not a crash", rm_errmsg(A));
  lua_pop(LA, 1);

  /* collect-and-retry from inside a stepper's coroutine: 40 unfreed 1 MiB tensors
   * under A's 1 MiB limit (+512 KiB held) only fit if the collector runs */
  rm_set_memory_limit(A, 0, 2 * MiB);
  check(rm_lua_exec(LA, A, "return remat.train.stepper(function(yield)\n"
                           "  for i = 1, 40 do local t = remat.zeros(256 * 1024); yield(i) end end)", 1, 1) == RM_OK &&
        rm_lua_slice(LA, A, -1, 1e9, &s) == RM_OK && s.total == 40,
        "collect-and-retry works inside a stepper's coroutine", rm_errmsg(A));
  lua_pop(LA, 1);

  /* the random generator */
  rm_manual_seed(A, 42);
  rm_manual_seed(B, 42);
  double a_first = eval(LA, A, "return remat.randn(8):sum():item()");
  double a_second = eval(LA, A, "return remat.randn(8):sum():item()");
  double b_first = eval(LB, B, "return remat.randn(8):sum():item()");
  uint64_t sa, oa, sb, ob;
  rm_rng_state(A, &sa, &oa);
  rm_rng_state(B, &sb, &ob);
  check(a_first == b_first && a_second != a_first, "same seed, same first draw; A's second draw does not move B", NULL);
  check(oa > ob && sa == 42 && sb == 42, "generator offsets advance per context", NULL);
  rm_manual_seed(A, 7);
  rm_rng_state(B, &sb, NULL);
  check(sb == 42, "reseeding A leaves B's seed", NULL);

  /* logs */
  la.n = lb.n = 0;
  la.text[0] = lb.text[0] = 0;
  rm_log(A, RM_LOG_WARN, "from the host to A %d", 1);
  eval(LB, B, "remat.log('from a script in B', 2) remat.log.warn('careful') return 0");
  check(la.n == 1 && strstr(la.text, "1:from the host to A 1") && !strstr(la.text, "script"),
        "rm_log reaches A's callback only", la.text);
  check(lb.n == 2 && strstr(lb.text, "0:from a script in B\t2") && strstr(lb.text, "1:careful"),
        "remat.log reaches B's callback only", lb.text);

  /* luaL_requiref: a context of its own, owned by the state */
  lua_State *LC = luaL_newstate();
  luaL_openlibs(LC);
  lua_pushcfunction(LC, luaopen_under_pcall);
  check(lua_pcall(LC, 0, 0, 0) == LUA_OK, "luaL_requiref(L, \"remat\", luaopen_remat, 1) under lua_pcall", NULL);
  rm_ctx *C = rm_lua_context(LC);
  check(C && C != A && C != B, "it has a context of its own", NULL);
  size_t live_a = rm_memory_live(A, 0), live_b = rm_memory_live(B, 0);
  check(luaL_dostring(LC, "c1 = remat.zeros(1000)") == LUA_OK, "it runs remat", NULL);
  check(rm_memory_live(C, 0) == 4000 && rm_memory_live(A, 0) == live_a && rm_memory_live(B, 0) == live_b,
        "its memory is counted apart", NULL);
  lua_close(LC);
  check(rm_lua_context(LA) == A, "closing it leaves the others alone", NULL);

  lua_close(LA);
  lua_close(LB);
  check(rm_memory_live(A, 0) == 0 && rm_memory_live(B, 0) == 0, "closing the states frees every tensor", NULL);
  rm_ctx_free(A);
  rm_ctx_free(B);
  check(ca.live == 0 && ca.blocks == 0 && ca.bad_sizes == 0 && ca.allocs == ca.frees,
        "A's host allocator got every byte back, each free with its size", NULL);
  check(cb.live == 0 && cb.blocks == 0 && cb.bad_sizes == 0 && cb.allocs == cb.frees,
        "B's host allocator got every byte back, each free with its size", NULL);
  printf("A: %lu allocs, B: %lu allocs\n", ca.allocs, cb.allocs);
  printf("%s\n", failures ? "two_contexts: FAILED" : "two_contexts: ok");
  return failures ? 1 : 0;
}
