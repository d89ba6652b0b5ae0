/* The `remat` command: runs a script, a chunk (-e), or a REPL. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

#include "../core/remat.h"

int rm_repl(lua_State *L);

/* Prints the usage text on f; returns 0. */
static int usage(FILE *f) {
  fputs("usage: remat [options] [script.lua [args...]]\n"
        "  -e code   run code (remat, nn, optim and policy are predefined, as in the REPL)\n"
        "  -v        print the version\n"
        "  -h        this help\n"
        "  -         run the script on standard input\n"
        "  remat plan SCRIPT [--budget B | --policy P]   print a model script's checkpoint plan\n"
        "                                    (remat plan --help for more)\n"
        "  remat plot LOG [--out PATH]   draw a metrics log (remat.train.metrics): loss and memory\n"
        "With no script, remat starts a REPL (plain lines, no prompt, when the input is not a terminal).\n", f);
  return 0;
}

/* Sets the global `arg` as lua does: script at 0, its arguments at 1.. */
static void set_args(lua_State *L, char **argv, int argc, int script) {
  lua_createtable(L, argc - script, script + 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
}

static int report(lua_State *L, int status, const char *who) {
  if (status != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    fprintf(stderr, "%s: %s\n", who, msg ? msg : "(error object is not a string)");
    lua_pop(L, 1);
  }
  return status;
}

static int msgh(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  luaL_traceback(L, L, msg, 1);
  return 1;
}

static int run_chunk(lua_State *L, int loadrc, int nargs) {
  if (loadrc != LUA_OK) return report(L, loadrc, "remat");
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, msgh);
  lua_insert(L, base);
  int rc = lua_pcall(L, nargs, 0, base);
  lua_remove(L, base);
  return report(L, rc, "remat");
}

/* `remat plan` and `remat plot` (the Lua modules remat.plancmd and remat.plotcmd): their
 * errors are the user's (a bad flag, a script that is not plannable, an error in the
 * script located at its line, an unreadable log): no traceback. */
static int run_command(lua_State *L, const char *module, const char *who) {
  lua_getglobal(L, "require");
  lua_pushstring(L, module);
  return report(L, lua_pcall(L, 1, 0, 0), who);
}

/* For -e, the globals the REPL has: remat, nn, optim, policy. */
static void predefine(lua_State *L) {
  lua_getglobal(L, "require");
  lua_pushliteral(L, "remat");
  lua_call(L, 1, 1);
  static const char *const parts[] = { "nn", "optim", "policy", NULL };
  for (int k = 0; parts[k]; k++) {
    lua_getfield(L, -1, parts[k]);
    lua_setglobal(L, parts[k]);
  }
  lua_setglobal(L, "remat");
}

/* `remat -v`: the version and what runs (rm_get_info). */
static void print_version(lua_State *L) {
  printf("remat %s (%s)\n", REMAT_VERSION, LUA_RELEASE);
  rm_info r;
  if (rm_get_info(rm_lua_context(L), &r) != RM_OK) return;
  printf("blas: %s, core %s (%s)%s%s\nthreads: %d (OpenMP%s), simd: %s (kernels' own: %s)\nomp wait: %s\n",
         r.blas, r.blas_core, r.blas_core_from, r.blas_path[0] ? ", " : "", r.blas_path, r.threads,
         r.blas_openmp ? ", shared with the BLAS" : "; the BLAS keeps its own", r.simd, r.vector_path,
         r.omp_wait);
}

/* The OpenMP wait policy (README, "CPU speed"). By default libgomp's idle threads spin
 * 300,000 times (about a millisecond) before they sleep: harmless when the cores are
 * free, but on a machine shared with other busy processes the spinning takes the time
 * the working threads need (bench/peer.lua's mlp: 5-15x slower steps). A count of 1,000
 * (the one libgomp itself falls back to when it has more threads than CPUs) still
 * bridges the gaps between the parallel loops of a step: no slower on a quiet machine
 * (within 2%), 5-10x faster on a loaded one. libgomp reads GOMP_SPINCOUNT once, when it
 * loads, before main; so when neither it nor OMP_WAIT_POLICY is set, the command sets
 * it (and REMAT_SET_SPINCOUNT=1, so remat.info() and bench/peer.lua can tell) and runs
 * itself again. A value the user set is kept. Under LD_PRELOAD (valgrind, sanitizers)
 * the command does not re-execute itself, and keeps libgomp's default. */
static void wait_policy(char **argv) {
  const char *pre = getenv("LD_PRELOAD");
  if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") || (pre && *pre)) return;
  if (setenv("GOMP_SPINCOUNT", "1000", 1) == 0 && setenv("REMAT_SET_SPINCOUNT", "1", 1) == 0)
    execv("/proc/self/exe", argv);
  /* not re-executed: leave the environment as found */
  unsetenv("GOMP_SPINCOUNT");
  unsetenv("REMAT_SET_SPINCOUNT");
}

int main(int argc, char **argv) {
  wait_policy(argv);
  lua_State *L = luaL_newstate();
  if (!L) { fputs("remat: cannot create a Lua state\n", stderr); return 1; }
  luaL_openlibs(L);
  luaL_requiref(L, "remat", luaopen_remat, 0);
  lua_pop(L, 1);
  int status = LUA_OK;
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (!strcmp(argv[i], "-v")) {
      print_version(L);
      if (argc == 2) { lua_close(L); return 0; }
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      lua_close(L);
      return 0;
    } else if (!strcmp(argv[i], "-e")) {
      if (i + 1 >= argc) { fputs("remat: -e needs an argument\n", stderr); lua_close(L); return 1; }
      set_args(L, argv, argc, 0);
      predefine(L);
      status = run_chunk(L, luaL_loadbuffer(L, argv[i + 1], strlen(argv[i + 1]), "=(command line)"), 0);
      i++;
      if (status != LUA_OK) { lua_close(L); return 1; }
      if (i + 1 >= argc) { lua_close(L); return 0; }
    } else if (!strcmp(argv[i], "-")) {
      break;
    } else if (!strcmp(argv[i], "--")) {
      i++;
      break;
    } else {
      fprintf(stderr, "remat: unknown option %s\n", argv[i]);
      usage(stderr);
      lua_close(L);
      return 1;
    }
  }
  if (i < argc && !strcmp(argv[i], "plan")) {
    set_args(L, argv, argc, i);
    status = run_command(L, "remat.plancmd", "remat plan");
  } else if (i < argc && !strcmp(argv[i], "plot")) {
    set_args(L, argv, argc, i);
    status = run_command(L, "remat.plotcmd", "remat plot");
  } else if (i < argc) {
    set_args(L, argv, argc, i);
    int nargs = argc - i - 1;
    int lrc = luaL_loadfile(L, strcmp(argv[i], "-") ? argv[i] : NULL);
    if (lrc == LUA_OK)
      for (int k = i + 1; k < argc; k++) lua_pushstring(L, argv[k]);
    else
      nargs = 0;
    status = run_chunk(L, lrc, nargs);
  } else {
    status = rm_repl(L);
  }
  lua_close(L);
  return status == LUA_OK ? 0 : 1;
}
