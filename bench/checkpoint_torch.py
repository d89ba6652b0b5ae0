"""PyTorch side of bench/checkpoint.lua: the same residual MLP and GPT under
torch.utils.checkpoint, float32, 2 threads, same shapes. Called by the Lua bench
(which parses the tab-separated VERSION / RESULT / SWEEP / NOTE lines); runnable alone:

    python3 bench/checkpoint_torch.py [--mlp-n=64 --mlp-d=128 ... --rounds=5]

Policies:
  none()            plain autograd
  every(k)          torch.utils.checkpoint.checkpoint(use_reentrant=False) around each
                    run of k layers starting at layers 1, k+1, ... (remat's every(k)
                    boundaries; every segment, the last included, is recomputed)
  checkpoint_sequential(s)  the stock function with s = round(sqrt N) segments: it is
                    reentrant and does NOT checkpoint its last segment; the input is
                    made to require grad (MLP) / the embedding runs outside (GPT) so
                    that the first segment's parameters get gradients
  sacmm             the same contexts with the policy of PyTorch's documentation: save
                    matmul outputs, recompute everything else
  selective         torch 2.x's selective activation checkpointing
                    (create_selective_checkpoint_contexts) around each layer: the
                    outputs of softmax, gelu and dropout are recomputed, everything else
                    saved (remat's selective{softmax,gelu,dropout}); absent before 2.4
There is no budget planner in PyTorch: the Lua side compares remat's budget() with
every row at that row's memory.

Peak memory: CPU has no allocator statistics in torch 1.13, so the step runs once
under torch.profiler with profile_memory=True and the running sum of the allocation
events ([memory] events: +bytes on allocation, -bytes on free) gives the peak above
the bytes live before the step. Parameter gradients are allocated by a warm-up step
beforehand and zeroed in place (set_to_none=False), so the peak counts activations,
activation gradients and temporaries, like remat's activation category (which also
counts the input batch).
"""
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

try:
    from functools import partial
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    _ops = torch.ops.aten
    RECOMPUTE = {_ops._softmax.default, _ops.gelu.default, _ops.native_dropout.default,
                 _ops.empty_like.default, _ops.bernoulli_.float, _ops.bernoulli.p, _ops.div_.Scalar, _ops.mul.Tensor}

    MATMULS = {_ops.mm.default, _ops.addmm.default, _ops.bmm.default, _ops.matmul.default}

    def _sac_policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.PREFER_RECOMPUTE if op in RECOMPUTE else CheckpointPolicy.MUST_SAVE

    def _sac_mm_policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in MATMULS else CheckpointPolicy.PREFER_RECOMPUTE
    SAC = {"selective": partial(create_selective_checkpoint_contexts, _sac_policy),
           "sacmm": partial(create_selective_checkpoint_contexts, _sac_mm_policy)}
except ImportError:
    SAC = None


def parse_args(argv):
    a = dict(mlp_n=64, mlp_d=128, mlp_batch=128, gpt_blocks=12, gpt_d=128, gpt_heads=4, vocab=256,
             t=256, gpt_batch=2, dropout=0.1, rounds=5, mlp_rounds=10, warmup=1, sweep_n="8,16,32,64")
    for arg in argv:
        if not arg.startswith("--") or "=" not in arg:
            raise SystemExit("checkpoint_torch.py: expected --name=value, got " + arg)
        k, v = arg[2:].split("=", 1)
        k = k.replace("-", "_")
        if k not in a:
            raise SystemExit("checkpoint_torch.py: unknown option --" + k)
        a[k] = type(a[k])(v)
    return a


class Residual(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return x + self.inner(x)


def residual_mlp(n, d, p):
    torch.manual_seed(7)
    return nn.Sequential(*[Residual(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Dropout(p),
                                                  nn.Linear(4 * d, d))) for _ in range(n)])


class Attention(nn.Module):
    """remat's CausalSelfAttention: qkv, scale, causal mask, softmax, dropout, @v, proj."""

    def __init__(self, d, heads, p):
        super().__init__()
        self.h, self.qkv, self.proj, self.drop = heads, nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Dropout(p)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.h, c // self.h).unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.h))
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = self.drop(F.softmax(att.masked_fill(mask, float("-inf")), dim=-1))
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """remat's TransformerBlock: pre-norm; MLP = fc1, GELU, fc2, dropout."""

    def __init__(self, d, heads, p):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), Attention(d, heads, p), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(p))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def gpt(a):
    torch.manual_seed(11)
    d = a["gpt_d"]
    return nn.Sequential(nn.Embedding(a["vocab"], d), *[Block(d, a["gpt_heads"], a["dropout"])
                                                         for _ in range(a["gpt_blocks"])],
                         nn.LayerNorm(d), nn.Linear(d, a["vocab"]))


def labels(n, classes, salt):
    return [(i * 7 + salt * 13) % classes for i in range(1, n + 1)]


def run_every(layers, k, x):
    """remat's every(k): a non-reentrant checkpoint around each run of k layers."""
    def segment(lo, hi):
        def f(h):
            for m in layers[lo:hi]:
                h = m(h)
            return h
        return f
    for lo in range(0, len(layers), k):
        x = checkpoint(segment(lo, min(lo + k, len(layers))), x, use_reentrant=False)
    return x


def run_selective(layers, x, which):
    """A selective checkpoint around each layer (SAC[which]'s policy)."""
    for m in layers:
        x = checkpoint(m, x, use_reentrant=False, context_fn=SAC[which])
    return x


def forward_fn(model, policy, is_gpt):
    layers = list(model.children())
    kind, k = policy
    if kind == "none":
        return model
    if kind == "selective":
        return lambda x: run_selective(layers, x, k)
    if kind == "every":
        return lambda x: run_every(layers, k, x)
    # checkpoint_sequential: reentrant, so its first segment's input must require grad
    if is_gpt:
        rest = nn.Sequential(*layers[1:])
        return lambda x: checkpoint_sequential(rest, k, layers[0](x), use_reentrant=True)
    return lambda x: checkpoint_sequential(model, k, x.detach().requires_grad_(True), use_reentrant=True)


def step(model, fn, x, y, vocab):
    t0 = time.perf_counter()
    out = fn(x)
    loss = F.cross_entropy(out.reshape(-1, vocab), y.reshape(-1))
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    model.zero_grad(set_to_none=False)
    return t1 - t0, t2 - t1


def peak_bytes(model, fn, x, y, vocab):
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(model, fn, x, y, vocab)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns() if hasattr(e, "start_ns") else e.start_us())
    cur = peak = 0
    for e in events:
        cur += e.nbytes()
        peak = max(peak, cur)
    return peak


def policies(n):
    s = max(1, int(math.floor(math.sqrt(n) + 0.5)))
    return [("none", "none()", ("none", 0)), ("sqrt", "every(sqrt N=%d)" % s, ("every", s)),
            ("every2", "every(2)", ("every", 2)), ("every8", "every(8)", ("every", 8)),
            ("ckseq", "checkpoint_sequential(%d segments)" % s, ("seq", s)),
            ("every1", "every(1)", ("every", 1))] + \
        ([("selective", "selective{softmax,gelu,dropout} (SAC)", ("selective", "selective")),
          ("sacmm", "SAC saving matmul outputs only", ("selective", "sacmm"))] if SAC else [])


def quartiles(v):
    s = sorted(v)
    return s[max(0, int(len(s) * 0.25 + 0.5) - 1)], s[max(0, int(len(s) * 0.75 + 0.5) - 1)]


def measure(name, model, x, y, vocab, a, rounds):
    n = len(list(model.children()))
    rows = []
    for key, label, pol in policies(n):
        fn = forward_fn(model, pol, name == "gpt")
        step(model, fn, x, y, vocab)  # allocates parameter gradients
        rows.append(dict(key=key, label=label, fn=fn, peak=peak_bytes(model, fn, x, y, vocab), times=[], ratios=[]))
    # each round starts one policy later than the one before (as bench/checkpoint.lua)
    for r in range(a["warmup"] + rounds):
        took = [None] * len(rows)
        for j in range(len(rows)):
            i = (r + j) % len(rows)
            f, b = step(model, rows[i]["fn"], x, y, vocab)
            took[i] = f + b
        if r >= a["warmup"]:
            for row, t in zip(rows, took):
                row["times"].append(t)
                row["ratios"].append(t / took[0])
        print("NOTE\t%s round %d/%d done" % (name, r + 1, a["warmup"] + rounds), flush=True)
    for row in rows:
        print("RESULT\t%s\t%s\t%s\t%.6f\t%.6f\t%d\t%.6f\t%.6f\t%.6f" % (name, row["key"], row["label"],
              statistics.median(row["times"]), statistics.median(row["ratios"]), row["peak"],
              row["peak"] / rows[0]["peak"], *quartiles(row["ratios"])), flush=True)


def main():
    a = parse_args(sys.argv[1:])
    torch.set_num_threads(2)
    torch.set_default_dtype(torch.float32)
    print("VERSION\t%s" % torch.__version__, flush=True)
    print("NOTE\tmlp_d=%d mlp_batch=%d gpt_d=%d gpt_batch=%d T=%d, %d threads" % (
        a["mlp_d"], a["mlp_batch"], a["gpt_d"], a["gpt_batch"], a["t"], torch.get_num_threads()), flush=True)
    model = residual_mlp(a["mlp_n"], a["mlp_d"], a["dropout"]).train()
    torch.manual_seed(3)
    x = torch.randn(a["mlp_batch"], a["mlp_d"])
    y = torch.tensor(labels(a["mlp_batch"], a["mlp_d"], 0))
    measure("mlp", model, x, y, a["mlp_d"], a, a["mlp_rounds"])

    model = gpt(a).train()
    xs = torch.tensor([labels(a["t"], a["vocab"], b) for b in range(1, a["gpt_batch"] + 1)])
    ys = torch.tensor([labels(a["t"], a["vocab"], b + 1) for b in range(1, a["gpt_batch"] + 1)])
    measure("gpt", model, xs, ys, a["vocab"], a, a["rounds"])

    for n in [int(v) for v in a["sweep_n"].split(",") if v]:
        model = residual_mlp(n, a["mlp_d"], a["dropout"]).train()
        for key, _, pol in policies(n)[:2]:
            fn = forward_fn(model, pol, False)
            step(model, fn, x, y, a["mlp_d"])
            print("SWEEP\t%d\t%s\t%d" % (n, key, peak_bytes(model, fn, x, y, a["mlp_d"])), flush=True)


if __name__ == "__main__":
    main()
