#!/usr/bin/env bash
# One-shot GPU check for a machine with an NVIDIA GPU: builds remat with nvcc, runs the
# #gpu specs, runs bench/gpu.lua (and the same model in PyTorch when torch is
# installed), then prints a short summary table. Meant to finish within ~8 minutes on
# an H200; each phase has its own time limit and a phase that fails is reported, not
# fatal. Run from anywhere: bench/gpu_check.sh [batch=8] [steps=5]
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"

BATCH=${1:-8}
STEPS=${2:-5}
BUILD=${BUILD:-build-gpu}
LOG=${LOG:-$BUILD/gpu_check}
mkdir -p "$LOG"
export LUA_PATH="$PWD/lua/?.lua;$PWD/spec/?.lua;;"
export LUA_CPATH="$PWD/$BUILD/?.so;;"

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }

echo "== device"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG/device.txt"
else
  echo "nvidia-smi not found" | tee "$LOG/device.txt"
fi

echo "== build (nvcc)"
t0=$(now)
if timeout 300 make -j"$(nproc)" CUDA=1 BUILD="$BUILD" >"$LOG/build.txt" 2>&1; then
  build="ok"
else
  build="FAILED (see $LOG/build.txt)"
  tail -n 30 "$LOG/build.txt"
fi
build_s=$(secs "$t0" "$(now)")
echo "build: $build in ${build_s}s"
undefined=$(nm -uD "$BUILD/libremat_cuda.so" 2>/dev/null | grep -c ' rm_' || true)

echo "== specs (busted --tags=gpu)"
t0=$(now)
specs="not run"
if [ "$build" = ok ]; then
  timeout 240 busted --tags=gpu -o TAP spec >"$LOG/specs.tap" 2>&1
  pass=$(grep '^ok ' "$LOG/specs.tap" | grep -vc '# SKIP\|# TODO' || true)
  fail=$(grep -c '^not ok ' "$LOG/specs.tap" || true)
  skip=$(grep -c '# SKIP\|# TODO' "$LOG/specs.tap" || true)
  specs="$pass passed, $fail failed, $skip pending"
  grep -A3 '^not ok ' "$LOG/specs.tap" | head -n 60
fi
specs_s=$(secs "$t0" "$(now)")
echo "specs: $specs in ${specs_s}s"

echo "== bench/gpu.lua (batch $BATCH, $STEPS steps per policy)"
t0=$(now)
bench="not run"
if [ "$build" = ok ]; then
  REMAT_BENCH_SECONDS=40 timeout 270 "$BUILD/remat" bench/gpu.lua "$BATCH" "$STEPS" 2>&1 | tee "$LOG/bench.txt"
  rc=${PIPESTATUS[0]}
  bench=$([ "$rc" = 0 ] && echo ok || echo "exit $rc (see $LOG/bench.txt)")
fi
bench_s=$(secs "$t0" "$(now)")

echo "== PyTorch reference (same shape, bf16 autocast)"
torch_line="torch not installed"
if python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
  timeout 150 python3 - "$BATCH" "$STEPS" >"$LOG/torch.txt" 2>&1 <<'PY'
import sys, time, torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
B, steps = int(sys.argv[1]), int(sys.argv[2])
L, D, H, T, V = 12, 768, 12, 1024, 50257
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1, s.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        s.qkv, s.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        s.fc, s.out = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
    def attn(s, x):
        q, k, v = s.qkv(x).split(D, dim=2)
        q, k, v = [t.view(B, T, H, D // H).transpose(1, 2) for t in (q, k, v)]
        a = torch.softmax((q @ k.transpose(-2, -1)) / (D // H) ** 0.5 +
                          torch.full((T, T), float("-inf"), device=x.device).triu(1), dim=-1)
        return s.proj((a @ v).transpose(1, 2).reshape(B, T, D))
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
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
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
    print("TORCH policy=%s ms=%.1f tokens_per_s=%.0f peak_gib=%.2f" % (
        "checkpoint_every_block" if ck else "none", dt * 1e3, B * T / dt,
        torch.cuda.max_memory_allocated() / 2**30))
    del m, opt
PY
  torch_line=$(grep '^TORCH' "$LOG/torch.txt" | tr '\n' ';')
  [ -z "$torch_line" ] && torch_line="torch failed (see $LOG/torch.txt)"
  cat "$LOG/torch.txt" | tail -n 5
fi

echo
echo "================ remat GPU check ================"
printf '%-22s %s\n' "device" "$(head -n 1 "$LOG/device.txt")"
printf '%-22s %s\n' "build" "$build (${build_s}s); undefined rm_* in libremat_cuda.so: ${undefined:-?}"
printf '%-22s %s\n' "specs --tags=gpu" "$specs (${specs_s}s)"
printf '%-22s %s\n' "bench/gpu.lua" "$bench (${bench_s}s)"
if [ -f "$LOG/bench.txt" ]; then
  awk '/^policy/ { on = 1 } on && NF { print "    " $0 }' "$LOG/bench.txt"
fi
printf '%-22s %s\n' "pytorch" "$torch_line"
echo "logs: $LOG"
