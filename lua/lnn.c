/* Modules and the Sequential container (filled in with the training work). */
#include "lremat.h"

void rm_lua_open_nn(lua_State *L) { (void)L; }
