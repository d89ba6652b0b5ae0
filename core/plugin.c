/* Finding remat's plugins relative to the object remat's code was loaded from, so a
 * build tree, `make install` and a LuaRocks tree all work without LD_LIBRARY_PATH:
 *   build/               everything side by side
 *   PREFIX/bin/remat     plugins in PREFIX/lib              (make install)
 *   PREFIX/lib/lua/5.4/  remat.so; plugins in PREFIX/lib    (make install)
 *   TREE/bin/remat       plugins beside remat.so in TREE/lib/lua/5.4 (luarocks) */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"

static const char *const RELATIVE[] = { "", "../lib/", "../../", "../lib/lua/5.4/", NULL };

void *rm_plugin_open(const char *name, const char *env, int flags, char *why, size_t n) {
  const char *forced = env ? getenv(env) : NULL;
  void *h = NULL;
  why[0] = 0;
  if (forced && *forced) {
    h = dlopen(forced, flags);
  } else {
    Dl_info info;
    char dir[900] = "", path[1024];
    if (dladdr((void *)rm_plugin_open, &info) && info.dli_fname) {
      snprintf(dir, sizeof dir, "%s", info.dli_fname);
      char *slash = strrchr(dir, '/');
      if (slash) slash[1] = 0;
      else dir[0] = 0;
    }
    for (int i = 0; !h && dir[0] && RELATIVE[i]; i++) {
      snprintf(path, sizeof path, "%s%s%s", dir, RELATIVE[i], name);
      h = dlopen(path, flags);
    }
    if (!h) h = dlopen(name, flags);
  }
  if (!h) {
    const char *e = dlerror();
    snprintf(why, n, "%s", e ? e : "not found");
  }
  return h;
}
