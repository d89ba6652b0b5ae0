/* Finding the CUDA backend at run time: it is its own shared object, opened when a
 * CUDA tensor is first asked for, so a build with CUDA still loads and runs where
 * there is no GPU, driver or CUDA library. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "plugin.h"

#define CUDA_LIB "libremat_cuda.so"

const rm_backend *rm_cuda_backend_load(rm_ctx *ctx) {
  char why[256];
  void *h = rm_plugin_open(CUDA_LIB, "REMAT_CUDA_LIB", RTLD_NOW | RTLD_LOCAL, why, sizeof why);
  if (!h) {
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
