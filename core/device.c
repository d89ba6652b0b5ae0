/* Finding the CUDA backend at run time: it is its own shared object, opened when a
 * CUDA tensor is first asked for, so a build with CUDA still loads and runs where
 * there is no GPU, driver or CUDA library. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

#define CUDA_LIB "libremat_cuda.so"

/* The directory this code was loaded from (libremat.so, remat.so or the command). */
static void self_dir(char *buf, size_t n) {
  Dl_info info;
  buf[0] = 0;
  if (dladdr((void *)self_dir, &info) && info.dli_fname) {
    snprintf(buf, n, "%s", info.dli_fname);
    char *slash = strrchr(buf, '/');
    if (slash) slash[1] = 0;
    else buf[0] = 0;
  }
}

const rm_backend *rm_cuda_backend_load(rm_ctx *ctx) {
  char path[1024], dir[900];
  const char *env = getenv("REMAT_CUDA_LIB");
  void *h = NULL;
  char why[256] = "";
  if (env && *env) {
    h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
  } else {
    self_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s%s", dir, CUDA_LIB);
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen(CUDA_LIB, RTLD_NOW | RTLD_LOCAL);
  }
  if (!h) {
    const char *e = dlerror();
    snprintf(why, sizeof why, "%s", e ? e : "not found");
    rm_fail(ctx, RM_ERR_DEVICE, "CUDA is not available: cannot load %s (%s)", CUDA_LIB, why);
    return NULL;
  }
  const rm_backend *(*get)(void) = (const rm_backend *(*)(void))dlsym(h, "rm_cuda_backend_get");
  const rm_backend *b = get ? get() : NULL;
  if (!b) {
    dlclose(h);
    rm_fail(ctx, RM_ERR_DEVICE, "CUDA is not available: %s has no backend table", CUDA_LIB);
    return NULL;
  }
  ctx->cuda_lib = h;
  return b;
}

void rm_cuda_backend_unload(rm_ctx *ctx) {
  if (ctx->cuda_lib) dlclose(ctx->cuda_lib);
  ctx->cuda_lib = NULL;
}
