/* Per-op costs measured on the device, and per-op timers (see opcost.h). */
#include <string.h>
#include <time.h>

#include "backend.h"
#include "opcost.h"
#include "ops.h"
#include "timestat.h"

#define MAX_IN 8        /* calls with more inputs are priced by the roofline */
#define REPS 7          /* timed runs per call (after one warm-up); the least is kept */

typedef struct geom {   /* an input as the call saw it */
  rm_dtype dtype;
  rm_device device;
  int ndim;
  int64_t shape[RM_MAX_DIM], stride[RM_MAX_DIM], offset;
  int64_t numel;        /* of its storage */
} geom;

typedef struct entry {
  uint64_t key;
  double seconds;       /* < 0: noted, not measured yet; NaN: could not be measured
                         * (priced by the roofline until rm_opcost_reset) */
  double units;         /* rm_op_cost of the call (the roofline), for the fit */
  rm_timestat first;    /* its first runs inside real steps (rm_opcost_learn) */
  rm_timestat replay;   /* its replays (what a plan prices, where seen: rm_opcost_seconds) */
  rm_device device;
  rm_op_id op;
  int nin;
  rm_attrs attrs;
  geom in[MAX_IN];
} entry;

#define CREDIT_MIN_LOG2 20  /* the cache credit's working sets: 1 MiB ... */
#define CREDIT_BUCKETS RM_CREDIT_SIZES  /* ... 64 MiB (larger ones are priced at 64 MiB) */

typedef struct rm_opcost {
  entry *e;             /* open addressing, cap a power of two */
  rm_credit rates[RM_DEVICE_COUNT][CREDIT_BUCKETS];  /* the probes, per working-set size */
  bool rates_known[RM_DEVICE_COUNT];
  size_t n, cap;
  int pending;
  rm_op_timing timing;
  bool timing_valid;
} rm_opcost;

static rm_opcost *get(rm_ctx *ctx) {
  if (!ctx->opcost) ctx->opcost = rm_host_calloc(ctx, 1, sizeof(rm_opcost));
  return ctx->opcost;
}

static uint64_t mix(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

/* The call's identity: op, attrs (but the random stream: it does not change the time),
 * and each input's dtype, device and geometry. */
static uint64_t call_key(rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = mix(h, &op, sizeof op);
  h = mix(h, &nin, sizeof nin);
  /* the op's declared attributes, field by field: padding bytes are not reliably zero */
  int nf = 0;
  const rm_attr_field *f = rm_op_attrs(op, &nf);
  for (int k = 0; f && k < nf; k++) {
    const char *p = (const char *)a + f[k].offset;
    switch (f[k].type) {
    case RM_ATTR_INT: h = mix(h, p, sizeof(int64_t)); break;
    case RM_ATTR_BOOL: h = mix(h, p, sizeof(bool)); break;
    case RM_ATTR_REAL: h = mix(h, p, sizeof(double)); break;
    case RM_ATTR_SHAPE:
      h = mix(h, &a->ndim, sizeof a->ndim);
      if (a->ndim > 0 && a->ndim <= RM_MAX_DIM) h = mix(h, a->shape, sizeof(int64_t) * (size_t)a->ndim);
      break;
    }
  }
  for (int i = 0; i < nin; i++) {
    const rm_tensor *t = in[i];
    int64_t g[2] = { t->dtype, t->device };
    h = mix(h, g, sizeof g);
    h = mix(h, &t->ndim, sizeof t->ndim);
    h = mix(h, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    h = mix(h, t->stride, sizeof(int64_t) * (size_t)t->ndim);
    h = mix(h, &t->offset, sizeof t->offset);
  }
  return h ? h : 1;
}

static entry *find(rm_opcost *c, uint64_t key) {
  if (!c->cap) return NULL;
  for (size_t i = key & (c->cap - 1);; i = (i + 1) & (c->cap - 1)) {
    if (c->e[i].key == key) return &c->e[i];
    if (!c->e[i].key) return NULL;
  }
}

static entry *insert(rm_ctx *ctx, rm_opcost *c, uint64_t key) {
  if (2 * (c->n + 1) > c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 64;
    entry *ne = rm_host_calloc(ctx, cap, sizeof *ne);
    if (!ne) return NULL;
    for (size_t i = 0; i < c->cap; i++) {
      if (!c->e[i].key) continue;
      size_t j = c->e[i].key & (cap - 1);
      while (ne[j].key) j = (j + 1) & (cap - 1);
      ne[j] = c->e[i];
    }
    rm_host_free(ctx, c->e, c->cap * sizeof *c->e);
    c->e = ne;
    c->cap = cap;
  }
  size_t j = key & (c->cap - 1);
  while (c->e[j].key) j = (j + 1) & (c->cap - 1);
  c->e[j].key = key;
  c->n++;
  return &c->e[j];
}

/* Seconds per roofline unit on dev, fitted on its measured calls (0: none yet). */
static double unit_seconds(const rm_opcost *c, rm_device dev) {
  double s = 0, u = 0;
  for (size_t i = 0; c && i < c->cap; i++) {
    const entry *e = &c->e[i];
    if (e->key && e->device == dev && e->seconds >= 0 && e->units > 0) s += e->seconds, u += e->units;
  }
  return u > 0 ? s / u : 0;
}

/* Before any measurement: about 10 GFLOP/s, so that units stay seconds. */
#define DEFAULT_UNIT 1e-10

double rm_opcost_seconds(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a,
                         const rm_meta *out, bool *measured) {
  double units = rm_op_cost(ctx, op, nin, in, a, out);
  if (measured) *measured = false;
  const rm_op_def *def = rm_op_def_get(op);
  if (!def || (def->flags & RM_OPF_VIEW)) return 0;
  rm_device dev = nin > 0 ? in[0]->device : out[0].device;
  rm_opcost *c = ctx->opcost_off ? ctx->opcost : get(ctx);
  uint64_t key = call_key(op, nin, in, a);
  entry *e = c ? find(c, key) : NULL;
  /* What a plan prices is replays. A replay writes into blocks just freed, while the
   * first runs pooled here include forwards that keep every output in fresh memory: on
   * bench/checkpoint.lua's MLP the replays ran 5-12% below the same calls' first runs
   * (the likely reason, not isolated). So a call is priced at its replays' time where
   * some were timed, else at its first runs'. */
  if (e && e->replay.n > 0) {
    if (measured) *measured = true;
    return rm_timestat_value(&e->replay);
  }
  if (e && e->first.n > 0) {
    if (measured) *measured = true;
    return rm_timestat_value(&e->first);
  }
  if (e && e->seconds >= 0) {
    if (measured) *measured = true;
    return e->seconds;
  }
  if (!e && c && !ctx->opcost_off && nin <= MAX_IN && (e = insert(ctx, c, key))) {
    e->seconds = -1;
    e->units = units;
    e->device = dev;
    e->op = op;
    e->nin = nin;
    e->attrs = *a;
    for (int i = 0; i < nin; i++) {
      const rm_tensor *t = in[i];
      geom *g = &e->in[i];
      g->dtype = t->dtype;
      g->device = t->device;
      g->ndim = t->ndim;
      memcpy(g->shape, t->shape, sizeof g->shape);
      memcpy(g->stride, t->stride, sizeof g->stride);
      g->offset = t->offset;
      size_t es = rm_dtype_size(t->dtype);
      g->numel = t->storage && es ? (int64_t)(t->storage->bytes / es) : rm_tensor_numel(t) + t->offset;
    }
    c->pending++;
  }
  double u = unit_seconds(c, dev);
  return units * (u > 0 ? u : DEFAULT_UNIT);
}

int rm_opcost_pending(const rm_ctx *ctx) { return ctx->opcost && !ctx->opcost_off ? ctx->opcost->pending : 0; }

double rm_opcost_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int sync_dev(rm_ctx *ctx, rm_device dev) {
  const rm_backend *b = ctx->backend[dev];
  return b && b->synchronize ? b->synchronize(ctx) : RM_OK;
}

/* Runs e's call REPS + 1 times on inputs of its geometry filled with ones; its least
 * time. Not zeros: a kernel may skip them (dropout copies blocks of zeros without
 * drawing random numbers), which real activations seldom are; and 1 is a valid index. */
static int measure_one(rm_ctx *ctx, entry *e, double *seconds) {
  rm_tensor *base[MAX_IN] = { 0 }, *in[MAX_IN] = { 0 };
  int rc = RM_OK;
  for (int i = 0; i < e->nin && rc == RM_OK; i++) {
    geom *g = &e->in[i];
    int64_t n = g->numel > 0 ? g->numel : 1;
    base[i] = rm_full(ctx, g->dtype, g->device, 1, &n, 1.0);
    in[i] = base[i] ? rm_tensor_view_of(ctx, base[i], g->ndim, g->shape, g->stride, g->offset) : NULL;
    if (!in[i]) rc = ctx->err_code ? ctx->err_code : RM_ERR_OOM;
  }
  double t[REPS];
  for (int r = 0; r <= REPS && rc == RM_OK; r++) {
    rm_tensor *outs[RM_MAX_OUTPUTS] = { 0 };
    int nout = rm_op_def_get(e->op)->nout;
    if ((rc = sync_dev(ctx, e->device))) break;
    double t0 = rm_opcost_clock();
    rc = rm_op_exec(ctx, e->op, e->nin, in, &e->attrs, outs);
    if (rc == RM_OK) rc = sync_dev(ctx, e->device);
    double t1 = rm_opcost_clock();
    for (int j = 0; j < nout; j++) rm_tensor_drop(ctx, outs[j]);
    if (r > 0) t[r - 1] = t1 - t0;
  }
  for (int i = 0; i < e->nin; i++) {
    rm_tensor_drop(ctx, in[i]);
    rm_tensor_drop(ctx, base[i]);
  }
  if (rc == RM_OK) { /* the least: preemption and a descheduled thread only add */
    *seconds = t[0];
    for (int r = 1; r < REPS; r++) if (t[r] < *seconds) *seconds = t[r];
  }
  return rc;
}

/* What a measurement outside the step may disturb, saved by aside_begin and put back by
 * aside_end: the error, peaks (a user's reset_peak), the timers. In between, tensors go
 * to category workspace with grad off and the user's limit (an accounting of the step)
 * does not apply; a device really out of memory still fails. Every tensor made in
 * between must be dropped, so that live and reserved are back where they were. */
typedef struct aside {
  char err[sizeof ((rm_ctx *)0)->err];
  int err_code;
  rm_memstats mem[RM_DEVICE_COUNT];
  bool timing;
  rm_scope sc;
} aside;

static void aside_begin(rm_ctx *ctx, aside *a) {
  a->err_code = ctx->err_code;
  memcpy(a->err, ctx->err, sizeof a->err);
  memcpy(a->mem, ctx->mem, sizeof a->mem);
  for (int d = 0; d < RM_DEVICE_COUNT; d++) ctx->mem[d].limit = 0;
  a->timing = ctx->op_timing;
  ctx->op_timing = false;
  rm_scope_enter(ctx, &a->sc, RM_CAT_WORKSPACE, RM_GRAD_OFF);
}

static void aside_end(rm_ctx *ctx, aside *a) {
  rm_scope_leave(ctx, &a->sc);
  ctx->op_timing = a->timing;
  for (int d = 0; d < RM_DEVICE_COUNT; d++) {
    for (int k = 0; k < RM_CAT_COUNT; k++) {
      ctx->mem[d].peak[k] = a->mem[d].peak[k];
      ctx->mem[d].peak_live[k] = a->mem[d].peak_live[k];
    }
    ctx->mem[d].peak_total = a->mem[d].peak_total;
    ctx->mem[d].limit = a->mem[d].limit;
  }
  memcpy(ctx->err, a->err, sizeof a->err);
  ctx->err_code = a->err_code;
}

int rm_opcost_calibrate(rm_ctx *ctx) {
  rm_opcost *c = ctx->opcost;
  if (!c || !c->pending || ctx->opcost_off) return RM_OK;
  if (ctx->dry) return rm_fail(ctx, RM_ERR_STATE, "opcost: calibration inside a dry run");
  aside a;
  aside_begin(ctx, &a);   /* a few small tensors at a time, given back at once */
  for (size_t i = 0; i < c->cap; i++) {
    entry *e = &c->e[i];
    if (!e->key || !(e->seconds < 0)) continue;
    double s;
    e->seconds = measure_one(ctx, e, &s) == RM_OK ? s : 0.0 / 0.0;
    rm_clear_error(ctx);
  }
  c->pending = 0;
  aside_end(ctx, &a);
  return RM_OK;
}

/* Measures the rates for working sets of 2^(MIN_LOG2 + b) bytes into c's table, on
 * scratch blocks set aside as calibrate's inputs are (a size that cannot be had
 * measures 0). */
static void probe_rates(rm_ctx *ctx, rm_opcost *c, const rm_backend *be, rm_device dev) {
  aside a;
  aside_begin(ctx, &a);
  for (int b = 0; b < CREDIT_BUCKETS; b++) {
    int64_t n = (int64_t)(((size_t)1 << (CREDIT_MIN_LOG2 + b)) / sizeof(float));
    rm_tensor *buf = rm_tensor_new(ctx, RM_F32, dev, 1, &n, RM_CAT_WORKSPACE);
    double rt = 0, rd = 0;
    if (!buf || be->memory_rates(ctx, rm_tensor_ptr(buf), rm_tensor_nbytes(buf), &rt, &rd) != RM_OK) rt = rd = 0;
    rm_clear_error(ctx);
    rm_tensor_drop(ctx, buf);
    c->rates[dev][b] = (rm_credit){ .act = rt, .param = rd };
  }
  aside_end(ctx, &a);
  c->rates_known[dev] = true;
}

int rm_opcost_cache_credit(rm_ctx *ctx, rm_device dev, size_t working_set, rm_credit *out) {
  *out = (rm_credit){ 0 };
  rm_opcost *c = get(ctx);
  if (!c) return rm_fail(ctx, RM_ERR_OOM, "opcost: out of host memory");
  if ((unsigned)dev >= RM_DEVICE_COUNT) return rm_fail(ctx, RM_ERR_ARG, "opcost: no device %d", (int)dev);
  const rm_backend *be = rm_backend_get(ctx, dev);   /* started if it was not yet */
  if (!be) return ctx->err_code;
  if (!be->memory_rates || ctx->opcost_off) return RM_OK;
  if (!c->rates_known[dev]) {
    if (ctx->dry) return rm_fail(ctx, RM_ERR_STATE, "opcost: cache credit measured inside a dry run");
    probe_rates(ctx, c, be, dev);
  }
  const rm_credit *r = c->rates[dev];
  int b = 0;
  while (b < CREDIT_BUCKETS - 1 && ((size_t)1 << (CREDIT_MIN_LOG2 + b)) < working_set) b++;
  *out = r[b];
  double top = r[CREDIT_BUCKETS - 1].act;
  for (int k = 0; k < CREDIT_BUCKETS; k++) {
    double f = top > 0 ? r[k].act / top : 1;
    out->cold[k] = k == CREDIT_BUCKETS - 1 ? 1 : f < 0 ? 0 : f > 1 ? 1 : f;
  }
  return RM_OK;
}

void rm_opcost_each(const rm_ctx *ctx, void (*f)(rm_op_id op, double seconds, double units, void *ud), void *ud) {
  const rm_opcost *c = ctx->opcost;
  for (size_t i = 0; c && i < c->cap; i++)
    if (c->e[i].key && c->e[i].seconds >= 0) f(c->e[i].op, c->e[i].seconds, c->e[i].units, ud);
}

void rm_opcost_enable(rm_ctx *ctx, bool on) { ctx->opcost_off = !on; }
bool rm_opcost_enabled(const rm_ctx *ctx) { return !ctx->opcost_off; }

void rm_opcost_reset(rm_ctx *ctx) {
  rm_opcost *c = ctx->opcost;
  if (!c) return;
  for (size_t i = 0; i < c->cap; i++) {
    rm_timestat_free(ctx, &c->e[i].first);
    rm_timestat_free(ctx, &c->e[i].replay);
  }
  rm_host_free(ctx, c->e, c->cap * sizeof *c->e);
  c->e = NULL;
  c->n = c->cap = 0;
  c->pending = 0;
  memset(c->rates_known, 0, sizeof c->rates_known);
}

void rm_opcost_free(rm_ctx *ctx) {
  rm_opcost_reset(ctx);
  rm_host_free(ctx, ctx->opcost, sizeof(rm_opcost));
  ctx->opcost = NULL;
}

void rm_opcost_learn(rm_ctx *ctx, bool on) {
  rm_opcost *c = ctx->opcost;
  if (on && c)
    for (size_t i = 0; i < c->cap; i++) {
      rm_timestat_clear(&c->e[i].first);
      rm_timestat_clear(&c->e[i].replay);
    }
  ctx->opcost_learn = on;
}

int rm_opcost_profile(rm_ctx *ctx, bool on) {
  rm_opcost *c = get(ctx);
  if (!c) return rm_fail(ctx, RM_ERR_OOM, "opcost: out of host memory");
  if (on) {
    memset(&c->timing, 0, sizeof c->timing);
    c->timing_valid = true;
  }
  ctx->op_timing = on;
  return RM_OK;
}

const rm_op_timing *rm_opcost_timing(const rm_ctx *ctx) {
  return ctx->opcost && ctx->opcost->timing_valid ? &ctx->opcost->timing : NULL;
}

void rm_opcost_record(rm_ctx *ctx, rm_op_id op, int nin, rm_tensor *const *in, const rm_attrs *a,
                      double seconds) {
  rm_opcost *c = ctx->opcost;
  if (!c || (unsigned)op >= RM_OP_COUNT) return;
  /* an asynchronous device's host-side time is its launch, not its work: CPU only */
  if (ctx->opcost_learn && nin > 0 && in[0]->device == RM_CPU) {
    /* only calls a dry run priced (noted or measured) learn: the layers' forward ops */
    entry *e = find(c, call_key(op, nin, in, a));
    if (e && ctx->replay_depth > 0) rm_timestat_add(ctx, &e->replay, seconds);
    else if (e) rm_timestat_add(ctx, &e->first, seconds);
  }
  if (ctx->replay_depth > 0) {
    c->timing.replay_seconds[op] += seconds;
    c->timing.replay_calls[op]++;
  } else {
    c->timing.seconds[op] += seconds;
    c->timing.calls[op]++;
  }
}
