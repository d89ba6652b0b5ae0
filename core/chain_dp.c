/* The budget dynamic program over a chain of layers.
 *
 * Model (what the checkpoint engine does, with additive sizes): the first forward
 * leaves kept_i bytes per layer (keep: its saved set; selective: a smaller set;
 * boundary: its input; recompute: nothing). The backward of a keep/selective layer j
 * peaks at P_j + saved_j + bwd_j, where P_j is what the layers before j keep. A
 * segment [a..b] (boundary at a, recompute after it) is replayed from its pinned
 * input when backward reaches it: replay and backward of layer j in it peak at
 * P_a + pin_a + sum(saved_a..j) + fwd_j / bwd_j. Cost = FLOPs replayed.
 *
 * As in the rotor DP (Beaumont et al. 2019) the optimum is found over (layer,
 * memory): here the state after deciding layers 0..k-1 is the pair (P_k, cost), and
 * only Pareto-optimal pairs (less memory kept or less recompute) are carried forward.
 * Exact while the frontier is small; past RM_DP_MAX_STATES pairs memory is rounded up
 * to a grid, which can only overestimate (plans stay feasible). */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

#define RM_DP_MAX_STATES 4096

static const char *const action_names[RM_ACTION_COUNT] = { "keep", "selective", "boundary", "recompute" };
const char *rm_action_name(rm_action a) { return (unsigned)a < RM_ACTION_COUNT ? action_names[a] : "?"; }

static double dmax(double a, double b) { return a > b ? a : b; }

void rm_chain_eval(const rm_chain_layer *c, int n, const rm_action *act, double *peak_out,
                   double *cost_out) {
  double P = 0, peak = 0, cost = 0;
  int k = 0;
  while (k < n) {
    if (act[k] == RM_KEEP || act[k] == RM_SELECTIVE) {
      bool sel = act[k] == RM_SELECTIVE && c[k].sel_flops >= 0;
      double saved = sel ? c[k].sel_saved : c[k].keep_saved;
      double bwd = sel ? c[k].sel_bwd : c[k].keep_bwd;
      peak = dmax(peak, P + c[k].keep_fwd);
      peak = dmax(peak, P + saved + bwd);
      if (sel) cost += c[k].sel_flops;
      P += saved;
      k++;
      continue;
    }
    /* a segment: this layer and the recompute layers after it */
    int b = k;
    while (b + 1 < n && act[b + 1] == RM_RECOMPUTE) b++;
    double pin = k == 0 ? 0 : c[k].in_bytes;
    double s = 0;
    for (int j = k; j <= b; j++) {
      peak = dmax(peak, P + pin + c[j].keep_fwd);     /* first forward */
      peak = dmax(peak, P + pin + s + c[j].keep_fwd); /* replay */
      s += c[j].keep_saved;
      peak = dmax(peak, P + pin + s + c[j].keep_bwd); /* backward */
      cost += c[j].flops;
    }
    P += pin;
    k = b + 1;
  }
  *peak_out = peak;
  *cost_out = cost;
}

typedef struct dp_state {
  double mem, cost;
  int parent;        /* index in the previous position's states (the position is from) */
  int from;          /* position the transition started at */
  rm_action act;     /* keep / selective / boundary (a segment from..here-1) */
} dp_state;

typedef struct dp_pos { dp_state *s; int n, cap; } dp_pos;

static bool push(rm_ctx *ctx, dp_pos *p, dp_state st) {
  if (p->n == p->cap) {
    int cap = p->cap ? 2 * p->cap : 64;
    dp_state *ns = rm_host_realloc(ctx, p->s, sizeof *ns * (size_t)p->cap, sizeof *ns * (size_t)cap);
    if (!ns) return false;
    p->s = ns;
    p->cap = cap;
  }
  p->s[p->n++] = st;
  return true;
}

static int by_mem_then_cost(const void *a, const void *b) {
  const dp_state *x = a, *y = b;
  if (x->mem != y->mem) return x->mem < y->mem ? -1 : 1;
  return x->cost < y->cost ? -1 : x->cost > y->cost ? 1 : 0;
}

/* Keeps the Pareto frontier (increasing memory, strictly decreasing cost). */
static void prune(dp_pos *p, double grid) {
  if (p->n > RM_DP_MAX_STATES && grid > 0)
    for (int i = 0; i < p->n; i++) p->s[i].mem = grid * (double)(long long)(p->s[i].mem / grid + 0.999999);
  if (p->n == 0) return;
  qsort(p->s, (size_t)p->n, sizeof *p->s, by_mem_then_cost);
  int w = 0;
  for (int i = 0; i < p->n; i++)
    if (w == 0 || p->s[i].cost < p->s[w - 1].cost) p->s[w++] = p->s[i];
  p->n = w;
}

bool rm_chain_optimal(rm_ctx *ctx, const rm_chain_layer *c, int n, double B,
                      rm_action *actions, double *cost_out) {
  dp_pos *pos = rm_host_calloc(ctx, (size_t)n + 1, sizeof *pos);
  bool found = false;
  if (!pos) return false;
  if (!push(ctx, &pos[0], (dp_state){ 0, 0, -1, -1, RM_KEEP })) goto done;
  for (int k = 0; k < n; k++) {
    prune(&pos[k], B / RM_DP_MAX_STATES);
    for (int si = 0; si < pos[k].n; si++) {
      double P = pos[k].s[si].mem, cost = pos[k].s[si].cost;
      if (P + c[k].keep_fwd <= B && P + c[k].keep_saved + c[k].keep_bwd <= B)
        if (!push(ctx, &pos[k + 1], (dp_state){ P + c[k].keep_saved, cost, si, k, RM_KEEP })) goto done;
      if (c[k].sel_flops >= 0 && P + c[k].keep_fwd <= B && P + c[k].sel_saved + c[k].sel_bwd <= B)
        if (!push(ctx, &pos[k + 1], (dp_state){ P + c[k].sel_saved, cost + c[k].sel_flops, si, k, RM_SELECTIVE }))
          goto done;
      double pin = k == 0 ? 0 : c[k].in_bytes, s = 0, f = 0;
      for (int j = k; j < n; j++) {
        double base = P + pin;
        if (base + c[j].keep_fwd > B || base + s + c[j].keep_fwd > B) break;
        s += c[j].keep_saved;
        if (base + s + c[j].keep_bwd > B) break;
        f += c[j].flops;
        if (!push(ctx, &pos[j + 1], (dp_state){ P + pin, cost + f, si, k, RM_BOUNDARY })) goto done;
      }
    }
  }
  prune(&pos[n], 0);
  if (pos[n].n > 0) {
    int best = 0;
    for (int i = 1; i < pos[n].n; i++)
      if (pos[n].s[i].cost < pos[n].s[best].cost) best = i;
    *cost_out = pos[n].s[best].cost;
    int at = n, idx = best;
    while (at > 0) {
      dp_state st = pos[at].s[idx];
      for (int j = st.from; j < at; j++)
        actions[j] = st.act == RM_BOUNDARY ? (j == st.from ? RM_BOUNDARY : RM_RECOMPUTE) : st.act;
      idx = st.parent;
      at = st.from;
    }
    found = true;
  }
done:
  for (int k = 0; k <= n; k++) rm_host_free(ctx, pos[k].s, sizeof(dp_state) * (size_t)pos[k].cap);
  rm_host_free(ctx, pos, sizeof *pos * ((size_t)n + 1));
  return found;
}
