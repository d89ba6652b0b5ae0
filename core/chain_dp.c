/* The budget dynamic program over a chain of layers.
 *
 * The model is what the checkpoint engine does with each byte, so that a plan's modelled
 * peak is the peak its dry run measures (spec/checkpoint_spec.lua checks this on real
 * models). P is what the layers before k leave live after the forward; a layer's input
 * (the previous output) is counted in P when the previous layer kept it (in_kept).
 *   keep / selective k: the forward peaks at P + its input + fwd; it leaves its saved set
 *     (keep_saved / sel_saved, its output included when the next layer keeps that);
 *     its backward peaks at P' + held + keep_bwd / sel_bwd, where held is what the loss
 *     leaves live for the whole backward.
 *   segment a..b (boundary at a, recompute after it): a's input is pinned (P0 = P with
 *     it counted); the first forward of j peaks at P0 + x_j + fwd_j (x_j: j's input,
 *     evicted after j). When backward reaches b, the segment is replayed from the pin
 *     while b's output gradient is live: replaying j peaks at P0 + held + out_b +
 *     S(a..j-1) + (x_j not kept) + fwd_j, and j's backward at P0 + held + S(a..j) +
 *     keep_bwd_j, with S the saved sets replayed. The segment leaves P0 (plus its output
 *     if it is the model's); the next layer counts that output if it keeps it (the
 *     engine keeps a segment's output for a layer that needs it).
 *   the loss peaks at P_n + loss_peak.
 * Cost = the replay cost of selective layers and segments: a segment a..b replays the
 * forward of a..b-1 (their outputs lead to b) and, of b, what b's backward reads
 * (last_cost: a layer's final ops, whose output only its gradient needs, are not
 * replayed), less the chain's cache credit for what that replay hands its backward hot
 * (rm_chain_credit; 0 for a chain without one).
 *
 * As in the rotor DP (Beaumont et al. 2019) the optimum is found over (layer, memory):
 * the state after deciding layers 0..k-1 is (P, cost, whether they end in a segment),
 * and only Pareto-optimal states are carried forward: one with no more memory and no
 * more cost (or peak, when minimising the peak) is never worse, so the DP is exact. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

static const char *const action_names[RM_ACTION_COUNT] = { "keep", "selective", "boundary", "recompute" };
const char *rm_action_name(rm_action a) { return (unsigned)a < RM_ACTION_COUNT ? action_names[a] : "?"; }

static double dmax(double a, double b) { return a > b ? a : b; }

void rm_chain_from_sims(const rm_sim *keep, const rm_sim *sel, rm_chain_layer *out, rm_chain *chain) {
  int n = keep->n;
  for (int k = 0; k < n; k++) {
    const rm_layer_stats *K = &keep->layers[k];
    /* the last output is live until the loss is done with it */
    double out_kept = k == n - 1 ? (double)K->out_bytes : (double)K->out_live;
    rm_chain_layer *c = &out[k];
    c->keep_saved = (double)K->saved;
    c->fwd = (double)K->fwd_peak;
    c->keep_bwd = (double)K->out_bytes - out_kept + (double)K->bwd_peak;
    c->in_bytes = (double)K->in_bytes;
    c->in_kept = k == 0 ? 0 : (double)keep->layers[k - 1].out_live;
    c->out_bytes = (double)K->out_bytes;
    c->cost = K->cost;
    c->param_bytes = (double)K->param_bytes;
    c->last_cost = -1;
    c->sel_saved = c->keep_saved;
    c->sel_bwd = c->keep_bwd;
    c->sel_cost = -1;
    if (!sel) continue;
    const rm_layer_stats *S = &sel->layers[k];
    /* selective only where it keeps what keep keeps of the layer's output and input;
     * elsewhere its measurements belong to another plan */
    bool clean = S->out_live == K->out_live && (k == 0 || sel->layers[k - 1].out_live == keep->layers[k - 1].out_live);
    if (clean && S->saved < K->saved) {
      c->sel_saved = (double)S->saved;
      c->sel_bwd = (double)K->out_bytes - out_kept + (double)S->bwd_peak;
      c->sel_cost = S->recompute_cost;
    }
  }
  chain->layer = out;
  chain->n = n;
  chain->held = (double)keep->held;
  chain->loss_peak = (double)keep->loss_peak;
  chain->credit = (rm_credit){ 0 };
}

/* ---- the cache credit (opcost.h) ---- */

static double less_credit(double cost, double credit) { return cost > credit ? cost - credit : 0; }

/* Seconds of credit for act activation bytes and par parameter bytes one replay makes
 * or reads for the backward after it: the share of them that comes back hot is what the
 * memory probe measured for a working set of their size (log-linear between sizes). */
static double credit_of(rm_credit cr, double act, double par) {
  double r = act + par, full = cr.act * act + cr.param * par;
  if (full <= 0) return 0;
  double x = log2(r > 1 ? r : 1) - 20;   /* position among the probed sizes (2^20 = 1 MiB) */
  double cold;
  if (x <= 0) cold = cr.cold[0];
  else if (x >= RM_CREDIT_SIZES - 1) cold = cr.cold[RM_CREDIT_SIZES - 1];
  else {
    int i = (int)x;
    cold = cr.cold[i] + (x - i) * (cr.cold[i + 1] - cr.cold[i]);
  }
  return full * (1 - cold);
}

void rm_chain_credit(rm_chain *chain, rm_chain_layer *c, const rm_sim *keep, rm_credit cr) {
  chain->credit = cr;
  for (int k = 0; k < chain->n; k++) {
    const rm_layer_stats *K = &keep->layers[k];
    if (c[k].sel_cost >= 0)
      c[k].sel_cost = less_credit(c[k].sel_cost, credit_of(cr, (double)K->saved - c[k].sel_saved, 0));
  }
}

double rm_plan_step_cost(const rm_sim *sim, const rm_sim *keep, const rm_plan *p, rm_credit cr) {
  double t = 0;
  int n = sim->n < keep->n ? sim->n : keep->n;
  if (p->n < n) n = p->n;
  for (int k = 0; k < n;) {
    const rm_layer_stats *L = &sim->layers[k], *K = &keep->layers[k];
    if (p->action[k] == RM_KEEP || p->action[k] == RM_SELECTIVE) {
      double act = K->saved > L->saved ? (double)(K->saved - L->saved) : 0;
      t += less_credit(L->recompute_cost, credit_of(cr, act, 0));
      k++;
      continue;
    }
    /* a segment: a boundary (or a leading recompute) and the recomputes after it */
    double rc = 0, act = 0, par = 0;
    int b = k;
    do {
      rc += sim->layers[b].recompute_cost;
      act += (double)keep->layers[b].saved;
      par += (double)keep->layers[b].param_bytes;
      b++;
    } while (b < n && p->action[b] == RM_RECOMPUTE);
    t += less_credit(rc, credit_of(cr, act, par));
    k = b;
  }
  return t;
}

size_t rm_credit_working_set(const rm_sim *keep) {
  size_t ws = keep->peak > keep->base ? keep->peak - keep->base : 0;
  for (int k = 0; k < keep->n; k++) ws += keep->layers[k].param_bytes;
  return ws;
}

/* ---- transitions (shared by the evaluation and the DP) ---- */

/* Peak and P after layer k kept (sel: selective) from P; seg: the layers before end in
 * a segment (whose output P does not count). */
static void step_keep(const rm_chain *c, int k, double P, bool seg, bool sel, double *peak, double *P_after) {
  const rm_chain_layer *l = &c->layer[k];
  double counted = k == 0 || seg ? 0 : l->in_kept;
  double x = k == 0 ? 0 : l->in_bytes - counted;
  double Pn = P + (seg && k > 0 ? l->in_kept : 0) + (sel ? l->sel_saved : l->keep_saved);
  *peak = dmax(P + x + l->fwd, Pn + c->held + (sel ? l->sel_bwd : l->keep_bwd));
  *P_after = Pn;
}

/* Walks a segment a..b, b = a, a+1, ...: call seg_begin once, then seg_extend for each b. */
typedef struct seg_walk {
  double P0;      /* P with the pinned input */
  double first;   /* max over j of the first forward and the backward terms */
  double replay;  /* max over j of the replay terms without the output gradient */
  double S;       /* saved sets of a..b */
  double full;    /* forward cost of a..b */
  double cost;    /* replay cost of the segment a..b, less its cache credit */
  double act, par; /* bytes its replay makes for backward, parameters it reads */
} seg_walk;

static void seg_begin(const rm_chain *c, int a, double P, bool seg, seg_walk *w) {
  const rm_chain_layer *l = &c->layer[a];
  double counted = a == 0 || seg ? 0 : l->in_kept;
  w->P0 = a == 0 ? P : P - counted + l->in_bytes;
  w->first = w->replay = -1;
  w->S = w->full = w->cost = w->act = w->par = 0;
}

/* Adds layer b; returns the segment's peak and P after it. */
static double seg_extend(const rm_chain *c, int a, int b, seg_walk *w, double *P_after) {
  const rm_chain_layer *l = &c->layer[b];
  double x = b > a ? l->in_bytes : 0;
  double x_replay = b > a ? l->in_bytes - l->in_kept : 0;
  w->first = dmax(w->first, w->P0 + x + l->fwd);
  w->replay = dmax(w->replay, w->P0 + c->held + w->S + x_replay + l->fwd);
  w->S += l->keep_saved;
  w->first = dmax(w->first, w->P0 + c->held + w->S + l->keep_bwd);
  w->act += l->keep_saved;
  w->par += l->param_bytes;
  w->cost = less_credit(w->full + (l->last_cost >= 0 ? l->last_cost : l->cost), credit_of(c->credit, w->act, w->par));
  w->full += l->cost;
  *P_after = w->P0 + (b == c->n - 1 ? l->out_bytes : 0);
  return dmax(w->first, w->replay + l->out_bytes);
}

void rm_chain_eval(const rm_chain *c, const rm_action *act, double *peak_out, double *cost_out) {
  double P = 0, peak = 0, cost = 0, pk;
  bool seg = false;
  int k = 0, n = c->n;
  while (k < n) {
    if (act[k] == RM_KEEP || act[k] == RM_SELECTIVE) {
      bool sel = act[k] == RM_SELECTIVE && c->layer[k].sel_cost >= 0;
      step_keep(c, k, P, seg, sel, &pk, &P);
      if (sel) cost += c->layer[k].sel_cost;
      peak = dmax(peak, pk);
      seg = false;
      k++;
      continue;
    }
    int b = k;
    while (b + 1 < n && act[b + 1] == RM_RECOMPUTE) b++;
    seg_walk w;
    seg_begin(c, k, P, seg, &w);
    for (int j = k; j <= b; j++) pk = seg_extend(c, k, j, &w, &P);
    peak = dmax(peak, pk);
    cost += w.cost;
    seg = true;
    k = b + 1;
  }
  *peak_out = dmax(peak, P + c->loss_peak);
  *cost_out = cost;
}

/* ---- the DP ---- */

typedef struct dp_state {
  double mem, obj;   /* P, and the objective so far (cost, or peak) */
  bool seg;          /* the layers so far end in a segment */
  int parent;        /* index in the states at position `from` */
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

static int by_kind_mem_obj(const void *a, const void *b) {
  const dp_state *x = a, *y = b;
  if (x->seg != y->seg) return x->seg ? 1 : -1;
  if (x->mem != y->mem) return x->mem < y->mem ? -1 : 1;
  return x->obj < y->obj ? -1 : x->obj > y->obj ? 1 : 0;
}

/* Keeps, for each kind, the Pareto frontier (increasing memory, strictly decreasing
 * objective): every state dropped is dominated by one kept. Nothing is rounded. */
static void prune(dp_pos *p) {
  if (p->n == 0) return;
  qsort(p->s, (size_t)p->n, sizeof *p->s, by_kind_mem_obj);
  int w = 0;
  for (int i = 0; i < p->n; i++)
    if (w == 0 || p->s[i].seg != p->s[w - 1].seg || p->s[i].obj < p->s[w - 1].obj) p->s[w++] = p->s[i];
  p->n = w;
}

/* min_peak: minimise the peak (budget ignored); else the cost under the budget. */
static bool dp_run(rm_ctx *ctx, const rm_chain *c, double B, bool min_peak, rm_action *actions, double *obj_out,
                   bool *found) {
  int n = c->n;
  bool ok = false;
  *found = false;
  dp_pos *pos = rm_host_calloc(ctx, (size_t)n + 1, sizeof *pos);
  if (!pos) return false;
  if (!push(ctx, &pos[0], (dp_state){ 0, 0, false, -1, -1, RM_KEEP })) goto done;
  for (int k = 0; k < n; k++) {
    prune(&pos[k]);
    for (int si = 0; si < pos[k].n; si++) {
      dp_state s = pos[k].s[si];
      double pk, Pn;
      for (int sel = 0; sel <= 1; sel++) {
        if (sel && c->layer[k].sel_cost < 0) continue;
        step_keep(c, k, s.mem, s.seg, sel, &pk, &Pn);
        if (!min_peak && pk > B) continue;
        double obj = min_peak ? dmax(s.obj, pk) : s.obj + (sel ? c->layer[k].sel_cost : 0);
        if (!push(ctx, &pos[k + 1], (dp_state){ Pn, obj, false, si, k, sel ? RM_SELECTIVE : RM_KEEP })) goto done;
      }
      seg_walk w;
      seg_begin(c, k, s.mem, s.seg, &w);
      for (int b = k; b < n; b++) {
        pk = seg_extend(c, k, b, &w, &Pn);
        /* first and replay only grow with b: past the budget, so is every longer segment */
        if (!min_peak && (w.first > B || w.replay > B)) break;
        if (!min_peak && pk > B) continue;
        double obj = min_peak ? dmax(s.obj, pk) : s.obj + w.cost;
        if (!push(ctx, &pos[b + 1], (dp_state){ Pn, obj, true, si, k, RM_BOUNDARY })) goto done;
      }
    }
  }
  prune(&pos[n]);
  int best = -1;
  double best_obj = 0;
  for (int i = 0; i < pos[n].n; i++) {
    dp_state s = pos[n].s[i];
    double end = s.mem + c->loss_peak;
    if (!min_peak && end > B) continue;
    double obj = min_peak ? dmax(s.obj, end) : s.obj;
    if (best < 0 || obj < best_obj) best = i, best_obj = obj;
  }
  if (best >= 0) {
    *obj_out = best_obj;
    int at = n, idx = best;
    while (at > 0) {
      dp_state st = pos[at].s[idx];
      for (int j = st.from; j < at; j++)
        actions[j] = st.act == RM_BOUNDARY ? (j == st.from ? RM_BOUNDARY : RM_RECOMPUTE) : st.act;
      idx = st.parent;
      at = st.from;
    }
    *found = true;
  }
  ok = true;
done:
  for (int k = 0; k <= n; k++) rm_host_free(ctx, pos[k].s, sizeof(dp_state) * (size_t)pos[k].cap);
  rm_host_free(ctx, pos, sizeof *pos * ((size_t)n + 1));
  return ok;
}

bool rm_chain_optimal(rm_ctx *ctx, const rm_chain *c, double B, rm_action *actions, double *cost_out) {
  bool found;
  return dp_run(ctx, c, B, false, actions, cost_out, &found) && found;
}

bool rm_chain_min_peak(rm_ctx *ctx, const rm_chain *c, rm_action *actions, double *peak) {
  bool found;
  return dp_run(ctx, c, 0, true, actions, peak, &found) && found;
}
