/* The REPL (placeholder; the binding work completes it). */
#include <lua.h>

int rm_repl(lua_State *L) { (void)L; return 0; }
