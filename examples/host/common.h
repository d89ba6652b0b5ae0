/* Shared by the example hosts: a counting host allocator for rm_host_alloc. A size
 * header before each block checks that every free names the size that was allocated,
 * so a host can prove that every byte it lent remat came back. */
#ifndef REMAT_EXAMPLE_COMMON_H
#define REMAT_EXAMPLE_COMMON_H

#include <stdlib.h>
#include <string.h>

typedef struct counter {
  const char *name;
  size_t live, peak, blocks;
  unsigned long allocs, reallocs, frees, bad_sizes;
} counter;

#define HDR 16 /* keeps 16-byte alignment */

/* rm_host_alloc.alloc: ud is the counter. */
static void *count_alloc(void *ud, size_t n) {
  counter *c = ud;
  char *p = malloc(n + HDR);
  if (!p) return NULL;
  memcpy(p, &n, sizeof n);
  c->allocs++;
  c->blocks++;
  c->live += n;
  if (c->live > c->peak) c->peak = c->live;
  return p + HDR;
}

/* rm_host_alloc.free: counts a size that differs from the block's as bad_sizes. */
static void count_free(void *ud, void *p, size_t n) {
  counter *c = ud;
  if (!p) return;
  char *b = (char *)p - HDR;
  size_t had;
  memcpy(&had, b, sizeof had);
  if (had != n) c->bad_sizes++;
  c->frees++;
  c->blocks--;
  c->live -= had;
  free(b);
}

/* rm_host_alloc.realloc: allocates when p is NULL. */
static void *count_realloc(void *ud, void *p, size_t old_n, size_t new_n) {
  counter *c = ud;
  if (!p) return count_alloc(ud, new_n);
  char *b = (char *)p - HDR;
  size_t had;
  memcpy(&had, b, sizeof had);
  if (had != old_n) c->bad_sizes++;
  char *q = realloc(b, new_n + HDR);
  if (!q) return NULL;
  memcpy(q, &new_n, sizeof new_n);
  c->reallocs++;
  c->live = c->live - had + new_n;
  if (c->live > c->peak) c->peak = c->live;
  return q + HDR;
}

#endif
