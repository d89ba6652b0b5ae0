/* A game-style host that trains a model in the background of its frame loop.
 *
 * It owns everything: its allocator (counted, so it can prove every byte came back),
 * its log, its lua_State and its fixed-rate frame loop (simulated: no window). Each
 * frame gives remat a slice of the frame's budget through rm_lua_slice, which runs a
 * remat.train stepper until the slice is spent, then the host sleeps to the next frame.
 * It trains the Fashion-MNIST MLP when the dataset is installed, else a small policy
 * network on synthetic observations; it saves the weights at the end.
 *
 *   host [--frames N] [--fps F] [--budget-ms B] [--steps S] [--synthetic]
 *        [--limit BYTES] [--out PATH] [--quiet]
 *
 * Exit status: 0 when training ran, the weights were saved and every byte taken from
 * the host allocators was given back; 1 otherwise. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

#include <remat.h>

#include "common.h" /* the counting allocator */

/* The lua_State's memory, counted too (lua_Alloc semantics). */
static void *lua_count(void *ud, void *p, size_t osize, size_t nsize) {
  counter *c = ud;
  if (nsize == 0) {
    if (p) { c->frees++; c->blocks--; c->live -= osize; }
    free(p);
    return NULL;
  }
  void *q = realloc(p, nsize);
  if (!q) return NULL;
  if (p) { c->reallocs++; c->live = c->live - osize + nsize; }
  else { c->allocs++; c->blocks++; c->live += nsize; }
  if (c->live > c->peak) c->peak = c->live;
  return q;
}

/* The host's log: where remat's own text goes (remat.log from scripts, rm_log). */
static void host_log(void *ud, int level, const char *msg) {
  const char *tag = level == RM_LOG_ERROR ? "error" : level == RM_LOG_WARN ? "warn" : "info";
  fprintf(stderr, "[%s %s] %s\n", (const char *)ud, tag, msg);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void sleep_until(double t_ms) {
  double left = t_ms - now_ms();
  if (left <= 0) return;
  struct timespec ts = { (time_t)(left / 1e3), (long)(fmod(left, 1e3) * 1e6) };
  nanosleep(&ts, NULL);
}

/* The training script: defines the model and returns a stepper; `save` and
 * `evaluate` are globals the host calls at the end. `host` is the host's config. */
static const char *const TRAIN_LUA =
  "local remat = require 'remat'\n"
  "local nn, optim = remat.nn, remat.optim\n"
  "remat.manual_seed(1)\n"
  "local ok, ds = false, nil\n"
  "if not host.synthetic then ok, ds = pcall(remat.data.fashion_mnist, 'train', { limit = 12000 }) end\n"
  "local model, data, test_x, test_y\n"
  "if ok then\n"
  "  model = nn.Sequential{ nn.Linear(784, 256), nn.GELU(), nn.Linear(256, 10) }\n"
  "  data = ds\n"
  "  local test = remat.data.fashion_mnist('test', { limit = 2000 })\n"
  "  test_x, test_y = test.x, test.y\n"
  "  remat.log('training the Fashion-MNIST MLP on ' .. tostring(ds))\n"
  "else\n"
  "  -- a policy network: 16 observations -> 4 actions, imitating a fixed linear expert\n"
  "  model = nn.Sequential{ nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4) }\n"
  "  local expert = remat.randn(16, 4)\n"
  "  local function batch(n)\n"
  "    local x = remat.randn(n, 16)\n"
  "    return x, remat.no_grad(function() return x:matmul(expert):argmax(2) end)\n"
  "  end\n"
  "  data = function() return batch(64) end\n"
  "  test_x, test_y = batch(2000)\n"
  "  remat.log('training a policy network on synthetic observations')\n"
  "end\n"
  "local opt = optim.SGD(model:parameters(), { lr = 0.1, momentum = 0.9 })\n"
  "function evaluate()\n"
  "  return remat.no_grad(function()\n"
  "    local pred = model(test_x):argmax(2)\n"
  "    local right, p, y = 0, pred:totable(), test_y:totable()\n"
  "    for i = 1, #p do if p[i] == y[i] then right = right + 1 end end\n"
  "    return right / #p\n"
  "  end)\n"
  "end\n"
  "function save(path) remat.save(path, model:state_dict(), { steps = trainer.steps }) end\n"
  "trainer = remat.train.stepper{ model = model, optimizer = opt, data = data,\n"
  "  batch_size = 64, steps = host.steps, budget_ms = host.budget_ms }\n"
  "return trainer\n";

typedef struct config {
  int frames, fps, steps, synthetic, quiet;
  double budget_ms;
  size_t limit;
  const char *out;
} config;

static int parse_args(int argc, char **argv, config *c) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--synthetic")) c->synthetic = 1;
    else if (!strcmp(a, "--quiet")) c->quiet = 1;
    else if (v && !strcmp(a, "--frames")) { c->frames = atoi(v); i++; }
    else if (v && !strcmp(a, "--fps")) { c->fps = atoi(v); i++; }
    else if (v && !strcmp(a, "--steps")) { c->steps = atoi(v); i++; }
    else if (v && !strcmp(a, "--budget-ms")) { c->budget_ms = atof(v); i++; }
    else if (v && !strcmp(a, "--limit")) { c->limit = (size_t)strtoull(v, NULL, 10); i++; }
    else if (v && !strcmp(a, "--out")) { c->out = v; i++; }
    else {
      fprintf(stderr, "host: unknown option %s\n"
              "usage: host [--frames N] [--fps F] [--budget-ms B] [--steps S] [--synthetic]"
              " [--limit BYTES] [--out PATH] [--quiet]\n", a);
      return 0;
    }
  }
  if (c->frames < 1 || c->fps < 1 || c->budget_ms < 0 || c->steps < 0) {
    fprintf(stderr, "host: frames and fps must be >= 1, budget and steps >= 0\n");
    return 0;
  }
  return 1;
}

/* Puts the config where the script reads it: the global table `host`. */
static void push_config(lua_State *L, const config *c) {
  lua_newtable(L);
  lua_pushboolean(L, c->synthetic);
  lua_setfield(L, -2, "synthetic");
  if (c->steps > 0) {
    lua_pushinteger(L, c->steps);
    lua_setfield(L, -2, "steps");
  }
  lua_pushnumber(L, c->budget_ms);
  lua_setfield(L, -2, "budget_ms");
  lua_setglobal(L, "host");
}

static int check_counter(const counter *c) {
  printf("%s allocator: %lu allocs, %lu reallocs, %lu frees, peak %zu bytes; live now %zu bytes in %zu blocks%s\n",
         c->name, c->allocs, c->reallocs, c->frees, c->peak, c->live, c->blocks,
         c->bad_sizes ? " (SIZE MISMATCHES)" : "");
  return c->live == 0 && c->blocks == 0 && c->bad_sizes == 0;
}

int main(int argc, char **argv) {
  config cfg = { .frames = 60, .fps = 60, .steps = 0, .budget_ms = 8.0, .out = "host_weights.safetensors" };
  if (!parse_args(argc, argv, &cfg)) return 1;
  counter host_mem = { .name = "remat host" }, lua_mem = { .name = "lua_State" };
  rm_host_alloc alloc = { count_alloc, count_realloc, count_free, &host_mem };
  int ok = 1;

  rm_ctx *ctx = rm_ctx_new(&alloc, host_log, "remat");
  if (!ctx) { fputs("host: cannot create a remat context\n", stderr); return 1; }
  if (cfg.limit) rm_set_memory_limit(ctx, 0, cfg.limit);
  lua_State *L = lua_newstate(lua_count, &lua_mem);
  luaL_openlibs(L);
  if (rm_lua_open(L, ctx) != RM_OK) {
    fprintf(stderr, "host: %s\n", rm_errmsg(ctx));
    lua_close(L);
    rm_ctx_free(ctx);
    return 1;
  }
  lua_setglobal(L, "remat");
  push_config(L, &cfg);

  /* the script returns the stepper: keep it on the stack for rm_lua_slice */
  if (rm_lua_exec(L, ctx, TRAIN_LUA, 1, 1) != RM_OK) {
    fprintf(stderr, "host: the training script failed: %s\n", rm_errmsg(ctx));
    ok = 0;
  }

  double frame_ms = 1000.0 / cfg.fps, train_total = 0, train_max = 0, t_start = now_ms();
  int over = 0, frames = 0;
  rm_slice s = { .loss = NAN };
  for (int f = 0; ok && f < cfg.frames; f++) {
    double t0 = now_ms();
    if (rm_lua_slice(L, ctx, -1, cfg.budget_ms, &s) != RM_OK) {
      fprintf(stderr, "host: training failed at frame %d: %s\n", f, rm_errmsg(ctx));
      ok = 0;
      break;
    }
    double t1 = now_ms();
    /* ... the rest of the frame: simulation, rendering ... */
    frames++;
    train_total += s.ms;
    if (s.ms > train_max) train_max = s.ms;
    if (s.ms > cfg.budget_ms) over++;
    if (!cfg.quiet)
      printf("frame %3d: train %6.2f ms / %.1f ms budget%s  %d step%s (total %lld)  loss %.4f  frame %.2f ms\n",
             f, s.ms, cfg.budget_ms, s.ms > cfg.budget_ms ? " OVER" : "     ", s.steps, s.steps == 1 ? " " : "s",
             (long long)s.total, s.loss, t1 - t0);
    if (s.done) break;
    sleep_until(t0 + frame_ms);
  }
  double wall = now_ms() - t_start;

  if (ok) {
    double acc = NAN;
    if (rm_lua_exec(L, ctx, "return evaluate()", 1, 1) == RM_OK) {
      acc = lua_tonumber(L, -1);
      lua_pop(L, 1);
    } else {
      fprintf(stderr, "host: evaluate failed: %s\n", rm_errmsg(ctx));
      ok = 0;
    }
    lua_pushstring(L, cfg.out);
    lua_setglobal(L, "host_out");
    if (rm_lua_run(L, ctx, "save(host_out)", 1) != RM_OK) {
      fprintf(stderr, "host: saving the weights failed: %s\n", rm_errmsg(ctx));
      ok = 0;
    }
    printf("summary: %d frames in %.0f ms; training %.2f ms/frame on average (max %.2f, budget %.1f, "
           "%d over); %lld steps, loss %.4f, accuracy %.3f; weights saved to %s\n",
           frames, wall, frames ? train_total / frames : 0.0, train_max, cfg.budget_ms, over,
           (long long)s.total, s.loss, acc, cfg.out);
    printf("remat memory: peak %zu bytes of tensors, %zu live before close\n",
           rm_memory_peak(ctx, 0), rm_memory_live(ctx, 0));
  }

  lua_close(L);
  size_t live_after = rm_memory_live(ctx, 0);
  rm_ctx_free(ctx);
  if (live_after) {
    printf("tensor memory still live after lua_close: %zu bytes\n", live_after);
    ok = 0;
  }
  ok &= check_counter(&host_mem);
  ok &= check_counter(&lua_mem);
  printf("%s\n", ok ? "host: ok" : "host: FAILED");
  return ok ? 0 : 1;
}
