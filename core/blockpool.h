/* A caching block pool over device segments: best fit, blocks split on allocation and
 * merged with their free neighbours on release. Device-agnostic: segments come from
 * callbacks (cudaMalloc on CUDA, malloc in the specs), so the same code is checked on
 * the CPU. Single-threaded: one pool per context and stream (a block freed after a
 * kernel was queued may go to the next kernel on that stream without waiting).
 *
 * Sizes are rounded up to RM_POOL_ALIGN. Requests up to RM_POOL_SMALL come from
 * RM_POOL_SMALL_SEG segments; those up to RM_POOL_MID from RM_POOL_MID_SEG segments;
 * larger ones get a segment of their own size (rounded to RM_POOL_SMALL_SEG). Small
 * and large blocks live in separate segments so that small, long-lived tensors do not
 * pin large segments. When a segment cannot be had, free whole segments are given
 * back, largest first, until the request fits, and then all of them, before failing. */
#ifndef REMAT_BLOCKPOOL_H
#define REMAT_BLOCKPOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RM_POOL_ALIGN ((size_t)512)
#define RM_POOL_SMALL ((size_t)1 << 20)          /* 1 MiB */
#define RM_POOL_SMALL_SEG ((size_t)2 << 20)      /* 2 MiB */
#define RM_POOL_MID ((size_t)10 << 20)           /* 10 MiB */
#define RM_POOL_MID_SEG ((size_t)20 << 20)       /* 20 MiB */
#define RM_POOL_BINS 512                          /* 8 bins per power of two */

typedef struct rm_pool_block rm_pool_block;

typedef struct rm_pool_cfg {
  void *(*seg_alloc)(void *ud, size_t bytes);         /* NULL: out of device memory */
  void (*seg_free)(void *ud, void *p, size_t bytes);
  void *(*host_alloc)(void *ud, size_t bytes);        /* block records and the table */
  void (*host_free)(void *ud, void *p, size_t bytes);
  void *ud;
} rm_pool_cfg;

typedef struct rm_pool_heap {           /* one per size range (small, large) */
  rm_pool_block *bin[RM_POOL_BINS];     /* free blocks by size bin */
  uint64_t nonempty[RM_POOL_BINS / 64]; /* bit b set: bin[b] has a block */
} rm_pool_heap;

typedef struct rm_pool {
  rm_pool_cfg cfg;
  rm_pool_heap heap[2];                 /* [0] small, [1] large */
  rm_pool_block **table;                /* live blocks by address (chained hash) */
  size_t table_size, live_blocks;
  rm_pool_block *spare;                 /* recycled block records */
  rm_pool_block *segs;                  /* first blocks of the segments */
  size_t reserved;                      /* bytes held in segments */
  size_t free_bytes;                    /* of which: in free blocks */
  size_t segments;
} rm_pool;

typedef struct rm_pool_stats {
  size_t reserved, free_bytes, live_bytes, segments, live_blocks, free_blocks,
      largest_free;
} rm_pool_stats;

/* Sets up an empty pool; no memory is taken until the first allocation. */
void rm_pool_init(rm_pool *p, const rm_pool_cfg *cfg);
/* A block of at least `bytes` (aligned to RM_POOL_ALIGN), or NULL when no segment can
 * be had even after giving back the free ones (or the host is out of memory). */
void *rm_pool_alloc(rm_pool *p, size_t bytes);
/* Returns a block from rm_pool_alloc to the pool (merged with free neighbours). A
 * pointer the pool did not hand out is ignored and false returned. */
bool rm_pool_free(rm_pool *p, void *ptr);
/* Gives back free segments, largest first, until at least `want` bytes are returned
 * (SIZE_MAX: all of them). Returns the bytes given back. */
size_t rm_pool_trim(rm_pool *p, size_t want);
/* Gives back every segment, live blocks included (the pool's owner is shutting down). */
void rm_pool_destroy(rm_pool *p);
void rm_pool_stats_get(const rm_pool *p, rm_pool_stats *s);
/* Checks the pool's invariants (blocks tile each segment, free neighbours are merged,
 * bins and counters agree). Returns NULL when they hold, else what is wrong. */
const char *rm_pool_check(const rm_pool *p);

#ifdef __cplusplus
}
#endif

#endif
