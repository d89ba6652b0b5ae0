/* Opening remat's own shared objects (libremat_cuda.so, libremat_mpi.so) at run time. */
#ifndef RM_PLUGIN_H
#define RM_PLUGIN_H
#include <stddef.h>

/* dlopen's handle for `name` (flags: dlopen's), or NULL with why filled. Looks at the
 * path in the environment variable `env` when set, else beside the code that loaded
 * remat and where an install puts it, else on the loader's path. */
void *rm_plugin_open(const char *name, const char *env, int flags, char *why, size_t n);

#endif
