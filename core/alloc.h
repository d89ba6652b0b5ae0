/* Storage and the accounted allocator. Every storage has a device and a category;
 * live and peak bytes are kept per category and per device, and a limit is enforced
 * on every device (on the CPU too, so memory policies can be tested without a GPU). */
#ifndef REMAT_ALLOC_H
#define REMAT_ALLOC_H

#include "ctx.h"

typedef struct rm_storage {
  int refcount;
  rm_device device;
  rm_category category;
  size_t bytes;
  int tag;             /* -1; an RM_HOOK_ALLOC subscriber may note what made it here */
  bool phantom;        /* an op output of a dry run: no data behind it */
  uint32_t epoch;      /* the dry run that made it (0: a real run); counted only in it */
  uint32_t version;    /* bumped by every in-place write: autograd checks that what a node
                          saved for backward was not overwritten since (rm_tensor_written) */
  void *data;          /* NULL in a dry run (phantom storage: accounted, no memory) */
} rm_storage;

/* Allocates a storage of `bytes` on dev, tagged cat. Past the limit (after one
 * reclaim-and-retry) fails with RM_ERR_OOM naming the request, live bytes by category
 * and the limit. Returns NULL on failure with the ctx error set. */
rm_storage *rm_storage_new(rm_ctx *ctx, rm_device dev, rm_category cat, size_t bytes);
/* As rm_storage_new, but in a dry run a phantom: accounted, no memory behind it (the
 * outputs of ops, whose kernels a dry run skips). */
rm_storage *rm_storage_new_dry(rm_ctx *ctx, rm_device dev, rm_category cat, size_t bytes);
void rm_storage_retain(rm_storage *s);
void rm_storage_release(rm_ctx *ctx, rm_storage *s);
/* Moves s's bytes from its category to cat (live and peak per category; the total does
 * not change), as a free in the old category and an allocation in the new one to hook
 * subscribers. For a buffer that changes role without a copy (a gradient computed as
 * a temporary that becomes a parameter's .grad). */
void rm_storage_recategorize(rm_ctx *ctx, rm_storage *s, rm_category cat);

/* Whether `bytes` more would fit under dev's limit; RM_ERR_OOM (the message of an
 * allocation past the limit) when not. For memory taken outside the allocator (host
 * scratch sized by user input), checked before it is taken. */
int rm_memory_room(rm_ctx *ctx, rm_device dev, rm_category cat, double bytes);

/* Parses "512MiB", "2GiB", "1.5GB", "1000", "64k" into bytes. Returns false on junk. */
bool rm_parse_bytes(const char *s, size_t *out);
/* Formats bytes readably ("1.50 MiB") into buf. */
char *rm_format_bytes(size_t b, char *buf, size_t n);

void rm_memory_reset_peak(rm_ctx *ctx, rm_device dev);
/* Ends a dry run's accounting: what it made and still lives stops counting. */
void rm_memory_end_dry(rm_ctx *ctx);
/* Debug: make the k-th allocation from now fail (k = 0 switches it off). */
void rm_memory_fail_at(rm_ctx *ctx, uint64_t k);

#endif
