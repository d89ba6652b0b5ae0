/* remat: the C API for host programs.
 *
 * A host creates a context, opens remat into its own lua_State tied to that context,
 * and runs Lua that trains. Nothing here exits, aborts, prints or longjmps through the
 * host's frames: every call returns a status (RM_OK == 0) and leaves a message on the
 * context (rm_errmsg). Threads: a context, and every lua_State opened on it, is used
 * from one thread at a time; different contexts may run on different threads. */
#ifndef REMAT_H
#define REMAT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define REMAT_VERSION "0.1.0"

typedef struct rm_ctx rm_ctx;
struct lua_State;

/* Host allocator: malloc/realloc/free with a user pointer. realloc(ud, NULL, 0, n)
 * allocates; free gets the size that was asked for. Any NULL member: the C library's. */
typedef struct rm_host_alloc {
  void *(*alloc)(void *ud, size_t n);
  void *(*realloc)(void *ud, void *p, size_t old_n, size_t new_n);
  void (*free)(void *ud, void *p, size_t n);
  void *ud;
} rm_host_alloc;

/* Log callback: the only way remat ever writes text on its own. level 0 info, 1 warn. */
typedef void (*rm_log_fn)(void *ud, int level, const char *msg);

/* Creates a context. alloc and log may be NULL. Returns NULL only when the allocator
 * itself fails. */
rm_ctx *rm_ctx_new(const rm_host_alloc *alloc, rm_log_fn log, void *log_ud);
/* Destroys a context; every byte it took from the host allocator is given back. */
void rm_ctx_free(rm_ctx *ctx);
/* The last error message on ctx ("" when none). Valid until the next failing call. */
const char *rm_errmsg(const rm_ctx *ctx);
/* Sets the memory limit in bytes for a device (0 = CPU, 1 = CUDA); 0 removes it. */
int rm_set_memory_limit(rm_ctx *ctx, int device, size_t bytes);
/* Live and peak bytes (all categories) on a device. */
size_t rm_memory_live(const rm_ctx *ctx, int device);
size_t rm_memory_peak(const rm_ctx *ctx, int device);

/* Opens remat into L bound to ctx, leaving the module table on the stack (like
 * luaL_requiref). The ctx must outlive L. Returns RM_OK or an error status. */
int rm_lua_open(struct lua_State *L, rm_ctx *ctx);
/* lua_CFunction for luaL_requiref(L, "remat", luaopen_remat, 0): opens remat with a
 * context of its own, owned by (and freed with) that lua_State. */
int luaopen_remat(struct lua_State *L);
/* Runs a Lua file (or a chunk when is_code) in L; on error the message goes to ctx and
 * the status is returned; L stays usable. */
int rm_lua_run(struct lua_State *L, rm_ctx *ctx, const char *file_or_code, int is_code);

#ifdef __cplusplus
}
#endif
#endif
