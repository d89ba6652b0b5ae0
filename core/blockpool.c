/* The caching block pool (blockpool.h): segments from a backend, carved into blocks by
 * best fit, split on allocation and merged with free neighbours on release. */
#include "blockpool.h"

#include <string.h>

struct rm_pool_block {
  uintptr_t addr;
  size_t size;
  rm_pool_block *prev, *next;         /* address neighbours in the segment */
  rm_pool_block *fprev, *fnext;       /* its bin's list (free blocks) */
  rm_pool_block *hnext;               /* hash chain (live blocks) */
  rm_pool_block *seg_prev, *seg_next; /* the segment list (a segment's first block) */
  size_t seg_size;                    /* a segment's first block: the segment's bytes */
  bool free, large;
};

#define TABLE_MIN 1024

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* 15 exact bins below 8 KiB, then 8 per power of two (a bin spans at most 12.5%). */
static unsigned bin_of(size_t bytes) {
  uint64_t u = bytes / RM_POOL_ALIGN;
  if (u < 16) return (unsigned)u;
  unsigned top = 63u - (unsigned)__builtin_clzll(u);
  return 16u + (top - 4u) * 8u + (unsigned)((u >> (top - 3u)) & 7u);
}

static rm_pool_block *record_new(rm_pool *p) {
  rm_pool_block *b = p->spare;
  if (b) p->spare = b->next;
  else b = p->cfg.host_alloc(p->cfg.ud, sizeof *b);
  if (b) memset(b, 0, sizeof *b);
  return b;
}

static void record_drop(rm_pool *p, rm_pool_block *b) {
  b->next = p->spare;
  p->spare = b;
}

/* ---- bins (free blocks) ---- */

static void bin_insert(rm_pool *p, rm_pool_block *b) {
  rm_pool_heap *h = &p->heap[b->large];
  unsigned i = bin_of(b->size);
  b->free = true;
  b->fprev = NULL;
  b->fnext = h->bin[i];
  if (b->fnext) b->fnext->fprev = b;
  h->bin[i] = b;
  h->nonempty[i / 64] |= (uint64_t)1 << (i % 64);
  p->free_bytes += b->size;
}

static void bin_remove(rm_pool *p, rm_pool_block *b) {
  rm_pool_heap *h = &p->heap[b->large];
  unsigned i = bin_of(b->size);
  if (b->fprev) b->fprev->fnext = b->fnext;
  else h->bin[i] = b->fnext;
  if (b->fnext) b->fnext->fprev = b->fprev;
  if (!h->bin[i]) h->nonempty[i / 64] &= ~((uint64_t)1 << (i % 64));
  b->free = false;
  b->fprev = b->fnext = NULL;
  p->free_bytes -= b->size;
}

/* The smallest free block of at least `bytes`: the best in its own bin, else the
 * smallest in the first non-empty bin above (all of which are big enough). */
static rm_pool_block *best_fit(rm_pool_heap *h, size_t bytes) {
  unsigned i = bin_of(bytes);
  rm_pool_block *best = NULL;
  for (rm_pool_block *b = h->bin[i]; b; b = b->fnext)
    if (b->size >= bytes && (!best || b->size < best->size)) best = b;
  if (best) return best;
  for (unsigned w = (i + 1) / 64; w < RM_POOL_BINS / 64; w++) {
    uint64_t bits = h->nonempty[w];
    if (w == (i + 1) / 64) bits &= ~(uint64_t)0 << ((i + 1) % 64);
    if (!bits) continue;
    unsigned j = w * 64 + (unsigned)__builtin_ctzll(bits);
    for (rm_pool_block *b = h->bin[j]; b; b = b->fnext)
      if (!best || b->size < best->size) best = b;
    return best;
  }
  return NULL;
}

/* ---- the live table ---- */

static size_t slot_of(const rm_pool *p, uintptr_t addr) {
  return (size_t)(((uint64_t)(addr / RM_POOL_ALIGN) * 0x9E3779B97F4A7C15ull) >> 17) &
         (p->table_size - 1);
}

/* Grows the table when it is full; a failed growth keeps the old one (longer chains). */
static void table_grow(rm_pool *p) {
  size_t n = p->table_size ? p->table_size * 2 : TABLE_MIN;
  rm_pool_block **t = p->cfg.host_alloc(p->cfg.ud, n * sizeof *t);
  if (!t) return;
  memset(t, 0, n * sizeof *t);
  rm_pool_block **old = p->table;
  size_t old_n = p->table_size;
  p->table = t;
  p->table_size = n;
  for (size_t s = 0; s < old_n; s++)
    for (rm_pool_block *b = old[s], *next; b; b = next) {
      next = b->hnext;
      size_t k = slot_of(p, b->addr);
      b->hnext = t[k];
      t[k] = b;
    }
  if (old) p->cfg.host_free(p->cfg.ud, old, old_n * sizeof *old);
}

/* The table must exist (rm_pool_alloc makes it before it takes a block). */
static void table_add(rm_pool *p, rm_pool_block *b) {
  size_t k = slot_of(p, b->addr);
  b->hnext = p->table[k];
  p->table[k] = b;
  p->live_blocks++;
}

static rm_pool_block *table_take(rm_pool *p, uintptr_t addr) {
  if (!p->table) return NULL;
  for (rm_pool_block **at = &p->table[slot_of(p, addr)]; *at; at = &(*at)->hnext)
    if ((*at)->addr == addr) {
      rm_pool_block *b = *at;
      *at = b->hnext;
      b->hnext = NULL;
      p->live_blocks--;
      return b;
    }
  return NULL;
}

/* ---- segments ---- */

static void segment_link(rm_pool *p, rm_pool_block *head) {
  head->seg_prev = NULL;
  head->seg_next = p->segs;
  if (p->segs) p->segs->seg_prev = head;
  p->segs = head;
  p->segments++;
  p->reserved += head->seg_size;
}

/* Gives a wholly free segment back to the backend. */
static void segment_release(rm_pool *p, rm_pool_block *head) {
  bin_remove(p, head);
  if (head->seg_prev) head->seg_prev->seg_next = head->seg_next;
  else p->segs = head->seg_next;
  if (head->seg_next) head->seg_next->seg_prev = head->seg_prev;
  p->segments--;
  p->reserved -= head->seg_size;
  p->cfg.seg_free(p->cfg.ud, (void *)head->addr, head->seg_size);
  record_drop(p, head);
}

static bool whole_free(const rm_pool_block *b) { return b->free && !b->prev && !b->next; }

size_t rm_pool_trim(rm_pool *p, size_t want) {
  size_t given = 0;
  while (given < want) {
    rm_pool_block *big = NULL;
    for (rm_pool_block *s = p->segs; s; s = s->seg_next)
      if (whole_free(s) && (!big || s->seg_size > big->seg_size)) big = s;
    if (!big) break;
    given += big->seg_size;
    segment_release(p, big);
  }
  return given;
}

/* A new segment for a request of `bytes`, as one free block in its heap; NULL when the
 * backend has no memory even after the free segments went back. */
static rm_pool_block *segment_new(rm_pool *p, size_t bytes, bool large) {
  size_t seg = !large ? RM_POOL_SMALL_SEG
             : bytes <= RM_POOL_MID ? RM_POOL_MID_SEG : round_up(bytes, RM_POOL_SMALL_SEG);
  if (seg < bytes) return NULL; /* rounding to whole segments overflowed */
  rm_pool_block *head = record_new(p);
  if (!head) return NULL;
  void *mem = p->cfg.seg_alloc(p->cfg.ud, seg);
  if (!mem && rm_pool_trim(p, seg)) mem = p->cfg.seg_alloc(p->cfg.ud, seg);
  if (!mem && rm_pool_trim(p, SIZE_MAX)) mem = p->cfg.seg_alloc(p->cfg.ud, seg);
  if (!mem) {
    record_drop(p, head);
    return NULL;
  }
  head->addr = (uintptr_t)mem;
  head->size = head->seg_size = seg;
  head->large = large;
  segment_link(p, head);
  bin_insert(p, head);
  return head;
}

/* ---- the public calls ---- */

void rm_pool_init(rm_pool *p, const rm_pool_cfg *cfg) {
  memset(p, 0, sizeof *p);
  p->cfg = *cfg;
}

void *rm_pool_alloc(rm_pool *p, size_t bytes) {
  size_t n = round_up(bytes ? bytes : 1, RM_POOL_ALIGN);
  if (n < bytes) return NULL; /* overflow */
  bool large = n > RM_POOL_SMALL;
  if (p->live_blocks >= p->table_size) table_grow(p);
  if (!p->table) return NULL; /* no host memory */
  rm_pool_block *b = best_fit(&p->heap[large], n);
  if (!b) b = segment_new(p, n, large);
  if (!b) return NULL;
  bin_remove(p, b);
  /* Split off the rest unless it is a sliver of a large block (kept with the block:
   * at most 1 MiB, and large segments do not fill with fragments). */
  size_t rest = b->size - n;
  if (rest >= (large ? RM_POOL_SMALL + 1 : RM_POOL_ALIGN)) {
    rm_pool_block *r = record_new(p);
    if (r) {
      r->addr = b->addr + n;
      r->size = rest;
      r->large = large;
      r->prev = b;
      r->next = b->next;
      if (b->next) b->next->prev = r;
      b->next = r;
      b->size = n;
      bin_insert(p, r);
    }
  }
  table_add(p, b);
  return (void *)b->addr;
}

bool rm_pool_free(rm_pool *p, void *ptr) {
  rm_pool_block *b = ptr ? table_take(p, (uintptr_t)ptr) : NULL;
  if (!b) return false;
  rm_pool_block *n = b->next;
  if (n && n->free) { /* absorb the next block */
    bin_remove(p, n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    record_drop(p, n);
  }
  rm_pool_block *v = b->prev;
  if (v && v->free) { /* the previous block absorbs this one */
    bin_remove(p, v);
    v->size += b->size;
    v->next = b->next;
    if (b->next) b->next->prev = v;
    record_drop(p, b);
    b = v;
  }
  bin_insert(p, b);
  return true;
}

void rm_pool_destroy(rm_pool *p) {
  for (rm_pool_block *s = p->segs, *next_seg; s; s = next_seg) {
    next_seg = s->seg_next;
    p->cfg.seg_free(p->cfg.ud, (void *)s->addr, s->seg_size);
    for (rm_pool_block *b = s, *next; b; b = next) {
      next = b->next;
      p->cfg.host_free(p->cfg.ud, b, sizeof *b);
    }
  }
  for (rm_pool_block *b = p->spare, *next; b; b = next) {
    next = b->next;
    p->cfg.host_free(p->cfg.ud, b, sizeof *b);
  }
  if (p->table) p->cfg.host_free(p->cfg.ud, p->table, p->table_size * sizeof *p->table);
  rm_pool_init(p, &p->cfg);
}

void rm_pool_stats_get(const rm_pool *p, rm_pool_stats *s) {
  memset(s, 0, sizeof *s);
  s->reserved = p->reserved;
  s->free_bytes = p->free_bytes;
  s->live_bytes = p->reserved - p->free_bytes;
  s->segments = p->segments;
  s->live_blocks = p->live_blocks;
  for (int h = 0; h < 2; h++)
    for (int i = 0; i < RM_POOL_BINS; i++)
      for (const rm_pool_block *b = p->heap[h].bin[i]; b; b = b->fnext) {
        s->free_blocks++;
        if (b->size > s->largest_free) s->largest_free = b->size;
      }
}

static bool in_bin(const rm_pool *p, const rm_pool_block *b) {
  for (const rm_pool_block *x = p->heap[b->large].bin[bin_of(b->size)]; x; x = x->fnext)
    if (x == b) return true;
  return false;
}

const char *rm_pool_check(const rm_pool *p) {
  size_t reserved = 0, free_bytes = 0, live = 0, free_blocks = 0, segs = 0;
  for (const rm_pool_block *s = p->segs; s; s = s->seg_next) {
    segs++;
    reserved += s->seg_size;
    if (s->prev) return "a segment's first block has a previous block";
    size_t covered = 0;
    for (const rm_pool_block *b = s; b; b = b->next) {
      if (b->addr != s->addr + covered) return "blocks do not tile their segment";
      if (b->size == 0 || b->size % RM_POOL_ALIGN) return "a block size is not aligned";
      if (b->large != s->large) return "a block is in the wrong heap";
      if (b->next && b->next->prev != b) return "neighbour links disagree";
      if (b->free) {
        if (b->next && b->next->free) return "two free neighbours were not merged";
        if (!in_bin(p, b)) return "a free block is missing from its bin";
        free_bytes += b->size;
        free_blocks++;
      } else {
        bool found = false;
        for (const rm_pool_block *x = p->table[slot_of(p, b->addr)]; x; x = x->hnext)
          found |= x == b;
        if (!found) return "a live block is missing from the table";
        live++;
      }
      covered += b->size;
    }
    if (covered != s->seg_size) return "blocks do not cover their segment";
  }
  size_t binned = 0;
  for (int h = 0; h < 2; h++)
    for (unsigned i = 0; i < RM_POOL_BINS; i++) {
      bool bit = (p->heap[h].nonempty[i / 64] >> (i % 64)) & 1;
      if (bit != (p->heap[h].bin[i] != NULL)) return "a bin's bit disagrees with its list";
      for (const rm_pool_block *b = p->heap[h].bin[i]; b; b = b->fnext) {
        if (!b->free || bin_of(b->size) != i) return "a bin holds a wrong block";
        binned++;
      }
    }
  if (binned != free_blocks) return "a bin holds a block of no segment";
  if (segs != p->segments || reserved != p->reserved) return "segment counters are off";
  if (free_bytes != p->free_bytes) return "free byte counter is off";
  if (live != p->live_blocks) return "live block counter is off";
  return NULL;
}
