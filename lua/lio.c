/* Files: safetensors and datasets (filled in with the training work). */
#include "lremat.h"

void rm_lua_open_io(lua_State *L) { (void)L; }
