/* The smallest host: a context, a lua_State, a stepper, one slice per frame.
 * (README "Embedding remat"; built by `make examples` so that the text compiles.) */
#include <stdio.h>
#include <lauxlib.h>
#include <lualib.h>
#include <remat.h>

static const char *const SCRIPT =
  "local m = remat.nn.Linear(4, 2)\n"
  "local x = remat.randn(32, 4); local y = x:narrow(2, 1, 2):argmax(2)\n"
  "return remat.train.stepper{ model = m, optimizer = remat.optim.SGD(m:parameters(), { lr = 0.5 }),\n"
  "                            data = function() return x, y end, steps = 200 }\n";

int main(void) {
  rm_ctx *ctx = rm_ctx_new(NULL, NULL, NULL);      /* or your allocator and log callback */
  lua_State *L = luaL_newstate();                  /* your own lua_State */
  luaL_openlibs(L);
  if (rm_lua_open(L, ctx) == RM_OK) lua_setglobal(L, "remat");
  int rc = rm_lua_exec(L, ctx, SCRIPT, 1, 1);      /* leaves the stepper on the stack */
  rm_slice s = { 0 };
  while (rc == RM_OK && !s.done) {                 /* the frame loop */
    rc = rm_lua_slice(L, ctx, -1, 4.0, &s);        /* train for up to ~4 ms */
    /* ... update and draw the frame ... */
  }
  if (rc != RM_OK) fprintf(stderr, "training: %s\n", rm_errmsg(ctx));
  else printf("%lld steps, loss %.4f\n", (long long)s.total, s.loss);
  lua_close(L);
  rm_ctx_free(ctx);
  return rc == RM_OK ? 0 : 1;
}
