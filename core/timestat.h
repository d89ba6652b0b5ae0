/* A learned time: the mean of the samples a timer gave it, less its spikes: samples
 * above RM_TIMESTAT_SPIKE times their median (at most RM_TIMESTAT_CAP samples are kept:
 * past that, each new one replaces a kept one, slot by slot). On a shared machine a
 * preempted op or a disturbed step gives samples many times the typical one, and a
 * plain mean follows them; a median would not add up (a step's time is the sum of its
 * ops', and a sum's median is not the sum of medians). Samples are kept as float (a
 * timer's resolution is far coarser). */
#ifndef REMAT_TIMESTAT_H
#define REMAT_TIMESTAT_H

#include "ctx.h"

#define RM_TIMESTAT_CAP 2048
#define RM_TIMESTAT_SPIKE 3.0

typedef struct rm_timestat {
  float *v;         /* the samples (cap of them allocated) */
  int32_t n, cap;
  int64_t count;    /* samples ever added since the last clear */
  double value;     /* cached while !dirty */
  bool dirty;
} rm_timestat;

/* Adds a sample of that many seconds. A failed allocation drops it (learning is best
 * effort; nothing is left half-done). */
void rm_timestat_add(rm_ctx *ctx, rm_timestat *s, double seconds);
/* The learned time: the kept samples' mean less spikes (0 when there are none). Sorts
 * them in place. */
double rm_timestat_value(rm_timestat *s);
/* Forgets the samples (keeps the buffer). */
void rm_timestat_clear(rm_timestat *s);
/* Frees the buffer. */
void rm_timestat_free(rm_ctx *ctx, rm_timestat *s);

#endif
