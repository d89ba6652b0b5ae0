#!/usr/bin/env bash
# The first thing to run on a machine with an NVIDIA GPU (budget: under 6 minutes).
#   1. checks its dependencies (and installs the Debian ones when root and apt works);
#   2. builds remat with nvcc;
#   3. runs spec/cuda_spec.lua first, in its own process (an asynchronous fault breaks
#      the CUDA context for the rest of a process), then the other #gpu specs; when
#      cuda_spec fails, reruns it under REMAT_CUDA_SYNC=1 so the fault is named;
#   4. trains GPT-2 small (bench/gpu.lua) under several checkpoint policies;
#   5. times one step per op with REMAT_CUDA_PROFILE=1 (CUDA events);
#   6. runs the same model in PyTorch 2.x (bf16 autocast, scaled_dot_product_attention,
#      fused AdamW) when torch with CUDA is installed;
# then prints one table. Every phase has a time limit taken from one overall budget
# (TOTAL_S, default 340 s), and a phase that fails is reported, never fatal.
# Without a GPU it says so and stops after the dependency check.
# Run from anywhere: bench/gpu_check.sh [batch=8] [steps=5]
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"

BATCH=${1:-8}
STEPS=${2:-5}
BUILD=${BUILD:-build-gpu}
LOG=${LOG:-$BUILD/gpu_check}
TOTAL_S=${TOTAL_S:-340}
mkdir -p "$LOG"
export LUA_PATH="$PWD/lua/?.lua;$PWD/spec/?.lua;;"
export LUA_CPATH="$PWD/$BUILD/?.so;;"

START=$(date +%s)
left() { echo $((TOTAL_S - ($(date +%s) - START))); }
# limit WANT: the smaller of WANT seconds and what is left of the budget (0: skip)
limit() { local l; l=$(left); [ "$l" -lt 10 ] && { echo 0; return; }; [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }

# ---- 1. dependencies ----
echo "== dependencies"
missing_apt=()
need_cmd() { command -v "$1" >/dev/null 2>&1 || missing_apt+=("$2"); }
need_cmd lua5.4 lua5.4
need_cmd busted lua-busted
need_cmd pkg-config pkg-config
need_cmd make make
need_cmd gcc gcc
pkg-config --exists lua5.4 2>/dev/null || missing_apt+=(liblua5.4-dev)
pkg-config --exists openblas 2>/dev/null || missing_apt+=(libopenblas-dev)
[ -e /usr/include/zlib.h ] || missing_apt+=(zlib1g-dev)
if [ ${#missing_apt[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing: ${missing_apt[*]}"
  if timeout "$(limit 90)" bash -c "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ${missing_apt[*]}" \
      >"$LOG/apt.txt" 2>&1; then
    missing_apt=()
  else
    echo "apt-get install failed (no network?): see $LOG/apt.txt"
  fi
fi
deps="ok"
[ ${#missing_apt[@]} -gt 0 ] && deps="missing Debian packages: ${missing_apt[*]}"
command -v nvcc >/dev/null 2>&1 || deps="$deps; nvcc not found (CUDA toolkit in /usr/local/cuda/bin?)"
torch_ok=0
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() and int(torch.__version__.split(".")[0]) >= 2 else 1)' \
    >/dev/null 2>&1; then torch_ok=1; fi
echo "deps: $deps; pytorch 2.x with CUDA: $([ $torch_ok = 1 ] && echo yes || echo no)"

# ---- the GPU ----
echo "== device"
gpu=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
fi
if [ -z "$gpu" ]; then
  why=$(command -v nvidia-smi >/dev/null 2>&1 && echo "nvidia-smi lists no GPU" || echo "nvidia-smi not found")
  echo "no GPU: $why; nothing to check here (the CPU suite is \`make test\`)"
  exit 0
fi
echo "$gpu" | tee "$LOG/device.txt"

# ---- 2. build ----
echo "== build (nvcc)"
t0=$(now)
build="not run"
if [ "$deps" != ok ]; then
  build="skipped ($deps)"
elif timeout "$(limit 120)" make -j"$(nproc)" CUDA=1 BUILD="$BUILD" all >"$LOG/build.txt" 2>&1 &&
     [ -f "$BUILD/libremat_cuda.so" ]; then
  build="ok"
else
  build="FAILED (see $LOG/build.txt)"
  tail -n 30 "$LOG/build.txt"
fi
build_s=$(secs "$t0" "$(now)")
echo "build: $build in ${build_s}s"
undefined=$(nm -uD "$BUILD/libremat_cuda.so" 2>/dev/null | grep -c ' rm_' || true)

# ---- 3. specs ----
# tap FILE -> "P passed, F failed, S pending" (a run that printed no result says so)
tap() {
  local p f s
  p=$(grep '^ok ' "$1" 2>/dev/null | grep -vc '# SKIP\|# TODO' || true)
  f=$(grep -c '^not ok ' "$1" 2>/dev/null || true)
  s=$(grep -c '# SKIP\|# TODO' "$1" 2>/dev/null || true)
  if ! grep -q '^1\.\.[0-9]' "$1" 2>/dev/null; then echo "no result (crashed or timed out; see $1)"; return; fi
  echo "$p passed, $f failed, $s pending"
}
cuda_specs="not run"; other_specs="not run"; sync_rerun=""
t0=$(now)
if [ "$build" = ok ]; then
  timeout "$(limit 60)" lua5.4 "$(command -v busted)" --tags=gpu -o TAP spec/cuda_spec.lua >"$LOG/cuda_spec.tap" 2>&1
  cuda_specs=$(tap "$LOG/cuda_spec.tap")
  grep -A4 '^not ok ' "$LOG/cuda_spec.tap" | head -n 40
  if grep -q '^not ok ' "$LOG/cuda_spec.tap" && [ "$(limit 60)" -gt 0 ]; then
    REMAT_CUDA_SYNC=1 timeout "$(limit 60)" lua5.4 "$(command -v busted)" --tags=gpu -o TAP spec/cuda_spec.lua >"$LOG/cuda_spec_sync.tap" 2>&1
    sync_rerun=$(tap "$LOG/cuda_spec_sync.tap")
    echo "-- under REMAT_CUDA_SYNC=1 (faults named at their kernel): $sync_rerun"
    grep -A4 '^not ok ' "$LOG/cuda_spec_sync.tap" | head -n 20
  fi
  others=$(ls spec/*_spec.lua | grep -v 'spec/cuda_spec.lua')
  # shellcheck disable=SC2086
  timeout "$(limit 45)" lua5.4 "$(command -v busted)" --tags=gpu -o TAP $others >"$LOG/gpu_specs.tap" 2>&1
  other_specs=$(tap "$LOG/gpu_specs.tap")
  grep -A4 '^not ok ' "$LOG/gpu_specs.tap" | head -n 20
fi
specs_s=$(secs "$t0" "$(now)")

# ---- 4. training benchmark ----
echo "== bench/gpu.lua (batch $BATCH, $STEPS steps per policy)"
t0=$(now)
bench="not run"
if [ "$build" = ok ]; then
  REMAT_BENCH_SECONDS=12 timeout "$(limit 75)" "$BUILD/remat" bench/gpu.lua "$BATCH" "$STEPS" 2>&1 | tee "$LOG/bench.txt"
  rc=${PIPESTATUS[0]}
  bench=$([ "$rc" = 0 ] && echo ok || echo "exit $rc (see $LOG/bench.txt)")
fi
bench_s=$(secs "$t0" "$(now)")

# ---- 5. per-op time of one step ----
echo "== one step per op (REMAT_CUDA_PROFILE=1)"
if [ "$build" = ok ] && [ "$(limit 30)" -gt 0 ]; then
  REMAT_CUDA_PROFILE=1 REMAT_GPU_PROFILE=1 timeout "$(limit 30)" "$BUILD/remat" bench/gpu.lua "$BATCH" 1 \
    >"$LOG/profile.txt" 2>&1
  awk '/^PROFILE/ { on = 1 } on' "$LOG/profile.txt" | head -n 32
fi

# ---- 6. PyTorch ----
echo "== PyTorch 2.x reference (bf16 autocast, scaled_dot_product_attention, fused AdamW)"
if [ $torch_ok = 1 ] && [ "$(limit 45)" -gt 0 ]; then
  timeout "$(limit 45)" python3 - "$BATCH" "$STEPS" >"$LOG/torch.txt" 2>&1 <<'PY'
import sys, time, torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
B, steps = int(sys.argv[1]), int(sys.argv[2])
L, D, H, T, V = 12, 768, 12, 1024, 50257
PEAK = 989e12
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1, s.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        s.qkv, s.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        s.fc, s.out = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
    def attn(s, x):
        q, k, v = s.qkv(x).view(B, T, 3, H, D // H).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return s.proj(y.transpose(1, 2).reshape(B, T, D))
    def forward(s, x):
        x = x + s.attn(s.ln1(x))
        return x + s.out(F.gelu(s.fc(s.ln2(x))))
class GPT(nn.Module):
    def __init__(s, ck):
        super().__init__()
        s.tok, s.pos = nn.Embedding(V, D), nn.Embedding(T, D)
        s.blocks = nn.ModuleList(Block() for _ in range(L))
        s.ln, s.head, s.ck = nn.LayerNorm(D), nn.Linear(D, V, bias=False), ck
    def forward(s, idx):
        x = s.tok(idx) + s.pos(torch.arange(T, device=idx.device))
        for b in s.blocks:
            x = checkpoint(b, x, use_reentrant=False) if s.ck else b(x)
        return s.head(s.ln(x))
for ck in (False, True):
    torch.manual_seed(0)
    m = GPT(ck).cuda()
    nonemb = sum(p.numel() for n, p in m.named_parameters() if not n.startswith(("tok", "pos")))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
    idx = torch.randint(0, V, (B, T), device="cuda")
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(m(idx).view(B * T, V).float(), idx.view(-1))
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        return loss.item()
    step(); torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    for _ in range(steps): step()
    torch.cuda.synchronize()
    dt = (time.time() - t0) / steps
    tps = B * T / dt
    mfu = (6 * nonemb + 12 * L * D * T) * tps / PEAK
    print("ROW impl=torch policy=%s ms=%.1f tokens_per_s=%.0f mfu=%.1f peak_gib=%.2f" % (
        "checkpoint_every_block" if ck else "none", dt * 1e3, tps, 100 * mfu,
        torch.cuda.max_memory_allocated() / 2**30))
    del m, opt
PY
  tail -n 3 "$LOG/torch.txt"
fi

# ---- the table ----
echo
echo "================ remat GPU check ($(($(date +%s) - START)) s) ================"
printf '%-24s %s\n' "device" "$gpu"
printf '%-24s %s\n' "dependencies" "$deps"
printf '%-24s %s\n' "build" "$build (${build_s}s); undefined rm_* in libremat_cuda.so: ${undefined:-?}"
printf '%-24s %s\n' "spec/cuda_spec.lua" "$cuda_specs${sync_rerun:+; under REMAT_CUDA_SYNC=1: $sync_rerun}"
printf '%-24s %s\n' "other #gpu specs" "$other_specs (${specs_s}s for all specs)"
printf '%-24s %s\n' "bench/gpu.lua" "$bench (${bench_s}s)"
printf '\n%-8s %-34s %10s %12s %7s %10s\n' "impl" "policy" "ms/step" "tokens/s" "MFU %" "peak GiB"
cat "$LOG/bench.txt" "$LOG/torch.txt" 2>/dev/null | awk '
  /^ROW / {
    delete f
    for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    printf "%-8s %-34s %10s %12s %7s %10s\n", f["impl"], f["policy"], f["ms"], f["tokens_per_s"], f["mfu"], f["peak_gib"]
  }'
[ -f "$LOG/profile.txt" ] && echo "per-op times of one step: $LOG/profile.txt"
echo "logs: $LOG"
