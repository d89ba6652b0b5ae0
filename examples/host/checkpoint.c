/* A host that builds a model in C, with no Lua, and checkpoints it: a Sequential of
 * Linear, MLP blocks and LayerNorm, a policy planned by the core (the same pipeline
 * as model:checkpoint in Lua: a budget runs the chain DP and verifies its plan by a
 * dry run), then one training forward and backward under the plan.
 *   checkpoint [--blocks N] [--width D] [--batch B] [--limit BYTES] [--roofline 1] [--policy P]
 *   P: none | every:K | sqrt | selective:op,op,... | budget:BYTES | step
 *      (step: the whole step fits in what --limit leaves, as policy.budget())
 *   --roofline 1: replays priced by the roofline, not measured times (reproducible plans)
 * Prints the plan, the predicted and the measured activation peak (absolute bytes, as
 * budgets count them) and the measured peak of every category; exits 1 with the
 * core's message (a budget that cannot be met names the smallest that can) on error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <remat.h>

#define MAX_OPS 16

static int parse_policy(const char *s, rm_policy *p, char *buf, const char **ops) {
  memset(p, 0, sizeof *p);
  if (!strcmp(s, "none")) p->kind = RM_POLICY_NONE;
  else if (!strcmp(s, "sqrt")) p->kind = RM_POLICY_SQRT;
  else if (!strcmp(s, "step")) p->kind = RM_POLICY_BUDGET, p->whole_step = 1;
  else if (!strncmp(s, "every:", 6)) p->kind = RM_POLICY_EVERY, p->every = atoi(s + 6);
  else if (!strncmp(s, "budget:", 7)) p->kind = RM_POLICY_BUDGET, p->budget = (size_t)strtoull(s + 7, NULL, 10);
  else if (!strncmp(s, "selective:", 10)) {
    p->kind = RM_POLICY_SELECTIVE;
    strcpy(buf, s + 10);
    for (char *tok = strtok(buf, ","); tok && p->nops < MAX_OPS; tok = strtok(NULL, ",")) ops[p->nops++] = tok;
    p->ops = ops;
  } else {
    return 0;
  }
  return 1;
}

/* Linear(d, d), blocks x MLP(d, 4d), LayerNorm(d), Linear(d, 10). */
static rm_module *build(rm_ctx *ctx, int blocks, int64_t d) {
  rm_module *seq = rm_sequential_new(ctx);
  int n = blocks + 3;
  for (int i = 0; seq && i < n; i++) {
    rm_module *m = i == 0 ? rm_nn_linear(ctx, d, d, true)
                 : i <= blocks ? rm_nn_mlp(ctx, d, 4 * d, 0.0)
                 : i == blocks + 1 ? rm_nn_layernorm(ctx, d, 1e-5, true)
                 : rm_nn_linear(ctx, d, 10, true);
    int rc = m ? rm_module_add_child(ctx, seq, m) : RM_ERR_OOM;
    rm_module_release(ctx, m);   /* the Sequential holds its own reference */
    if (rc != RM_OK) {
      rm_module_release(ctx, seq);
      return NULL;
    }
  }
  return seq;
}

int main(int argc, char **argv) {
  int blocks = 6;
  int64_t width = 32, batch = 16;
  size_t limit = 0;
  int roofline = 0;
  const char *pol = "sqrt";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--blocks")) blocks = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--width")) width = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--batch")) batch = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--limit")) limit = (size_t)strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--policy")) pol = argv[i + 1];
    else if (!strcmp(argv[i], "--roofline")) roofline = atoi(argv[i + 1]);
    else break;
  }
  rm_policy policy;
  char buf[256];
  const char *ops[MAX_OPS];
  if (argc % 2 == 0 || strlen(pol) >= sizeof buf || !parse_policy(pol, &policy, buf, ops)) {
    fprintf(stderr, "usage: checkpoint [--blocks N] [--width D] [--batch B] [--limit BYTES] [--roofline 1] "
                    "[--policy none|every:K|sqrt|selective:op,...|budget:BYTES|step]\n");
    return 2;
  }
  rm_ctx *ctx = rm_ctx_new(NULL, NULL, NULL);
  if (!ctx) return 1;
  rm_manual_seed(ctx, 1);
  if (roofline) rm_checkpoint_measured_costs(ctx, 0);
  int rc = limit ? rm_set_memory_limit(ctx, 0, limit) : RM_OK;
  rm_module *model = rc == RM_OK ? build(ctx, blocks, width) : NULL;
  if (!model) rc = rm_errcode(ctx);
  int64_t shape[2] = { batch, width };
  rm_tensor *x = rc == RM_OK ? rm_tensor_filled(ctx, 0, 2, shape, 0.5) : NULL;
  if (rc == RM_OK && !x) rc = rm_errcode(ctx);
  /* set the policy, then plan it for x: dry runs, nothing computed */
  if (rc == RM_OK) rc = rm_checkpoint(ctx, model, &policy);
  if (rc == RM_OK) rc = rm_checkpoint_plan(ctx, model, x);
  size_t predicted = 0, step = 0;
  if (rc == RM_OK) rc = rm_checkpoint_predict(ctx, model, x, &predicted, &step);
  if (rc == RM_OK) {
    printf("layers: %d\nplan:", blocks + 3);
    for (int i = 0; i < blocks + 3; i++) printf(" %s", rm_checkpoint_action(model, i));
    printf("\npredicted: %zu\nstep: %zu\n", predicted, step);
    /* the real thing: forward and backward (from ones) under the plan */
    rm_tensor *y = NULL, *g = NULL;
    rm_memory_restart_peak(ctx, 0);
    rc = rm_module_forward(ctx, model, x, &y);
    int64_t gshape[2] = { batch, 10 };
    if (rc == RM_OK) g = rm_tensor_filled(ctx, 0, 2, gshape, 1.0);
    if (rc == RM_OK) rc = g ? rm_backward(ctx, y, g) : rm_errcode(ctx);
    rm_tensor_drop(ctx, g);
    rm_tensor_drop(ctx, y);
    if (rc == RM_OK)
      printf("measured: %zu\nmeasured step: %zu\n", rm_memory_category_peak(ctx, 0, "activation"),
             rm_memory_peak(ctx, 0));
  }
  rm_tensor_drop(ctx, x);
  rm_module_release(ctx, model);
  if (rc != RM_OK) fprintf(stderr, "error: %s\n", rm_errmsg(ctx));
  rm_ctx_free(ctx);
  return rc == RM_OK ? 0 : 1;
}
