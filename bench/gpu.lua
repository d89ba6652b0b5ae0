-- GPU training benchmark: a GPT-2 small shaped model (12 layers, 768 wide, 12 heads,
-- T = 1024, vocabulary 50257) trained on random tokens under several checkpoint
-- policies. Per policy: ms per step, tokens/s, MFU and peak CUDA memory.
--
-- MFU = (6 N + 12 L d T) x tokens/s / peak, with N the parameters that take part in
-- matrix products (everything but the embedding tables: the LM head counts) and
-- 12 L d T the attention score/value FLOPs per token (forward + backward); peak is the
-- H200's dense bf16 rate, 989 TFLOP/s (override with REMAT_PEAK_TFLOPS).
--
-- The model is built from the names of the API (README.md: nn.Embedding, nn.TransformerBlock,
-- nn.LayerNorm, nn.Linear, model:checkpoint(remat.policy.*), optim.AdamW); every piece
-- is guarded, so a build that lacks one reports what is missing instead of failing.
--
-- A bfloat16 model trains with float32 master weights and float32 AdamW state
-- (lua/remat/optim.lua). Each policy also prints a "ROW impl=remat policy=... ms=...
-- tokens_per_s=... mfu=... peak_gib=..." line (bench/gpu_check.sh builds its table
-- from them).
-- With REMAT_GPU_PROFILE=1 (and REMAT_CUDA_PROFILE=1, which times every op with CUDA
-- events) it runs one warm step of policy none and prints the GPU time per op.
--
-- Run: remat bench/gpu.lua [batch=8] [steps=5] [dtype=bfloat16]
local remat = require "remat"
local C = remat._C

local B = tonumber(arg and arg[1]) or 8
local STEPS = tonumber(arg and arg[2]) or 5
local WANT_DTYPE = (arg and arg[3]) or "bfloat16"
local L, D, H, T, V = 12, 768, 12, 1024, 50257
local PEAK = (tonumber(os.getenv("REMAT_PEAK_TFLOPS")) or 989) * 1e12
local TIME_BUDGET = tonumber(os.getenv("REMAT_BENCH_SECONDS")) or 60 -- per policy

local function out(...) io.write(string.format(...), "\n") io.stdout:flush() end

if not remat.cuda.available() then
  local _, why = C.device_available("cuda")
  out("bench/gpu.lua: CUDA is not available (%s); nothing to measure", tostring(why))
  return
end

local function gib(b) return b and string.format("%.2f GiB", b / 2 ^ 30) or "?" end

local function sync() if remat.cuda.synchronize then remat.cuda.synchronize() end end

local missing = {}
local function need(ok, what, err)
  if not ok then missing[#missing + 1] = what .. ": " .. tostring(err) end
  return ok
end

-- ---- model ----

local nn, policy = remat.nn, remat.policy

local function build(dtype)
  remat.manual_seed(1)
  local tok = nn.Embedding(V, D)
  local pos = nn.Embedding(T, D)
  local positions -- (T) 1-based, made once on the model's device
  local embed = nn.module {
    tok = tok, pos = pos,
    forward = function(self, idx)
      if not positions then positions = remat.arange(1, T):to(idx:device()) end
      return self.tok(idx) + self.pos(positions)
    end,
  }
  local layers = { embed }
  for _ = 1, L do layers[#layers + 1] = nn.TransformerBlock(D, H) end
  layers[#layers + 1] = nn.LayerNorm(D)
  layers[#layers + 1] = nn.Linear(D, V, false)
  local model = nn.Sequential(layers):to("cuda")
  if dtype ~= "float32" then model = model:to(dtype) end
  return model
end

local function count_params(model)
  local total, emb = 0, V * D + T * D
  for _, p in ipairs(model:parameters()) do total = total + p:numel() end
  return total, total - emb
end

-- ---- data: random tokens, next-token labels ----

local function tokens(dtype)
  local v, y = {}, {}
  local s = 12345
  for i = 1, B * T do
    s = (s * 1103515245 + 12345) % 2147483648
    v[i] = s % V + 1
  end
  for i = 1, B * T do y[i] = v[i % (B * T) + 1] end
  local idx = remat.tensor(v):view(B, T):cuda()
  local lab = remat.tensor(y):cuda()
  return idx, lab
end

-- ---- one policy ----

local function run(model, pol_name, pol, idx, lab, opt)
  if pol then
    local ok, err = pcall(model.checkpoint, model, pol)
    if not need(ok, "model:checkpoint(" .. pol_name .. ")", err) then return nil end
  end
  local function step()
    local logits = model(idx)
    local loss = nn.cross_entropy(logits:view(B * T, V), lab)
    loss:backward()
    if opt then opt:step(); opt:zero_grad() else model:zero_grad() end
    return loss:item() -- reading the loss waits for the device
  end
  local ok, err = pcall(step) -- warm-up: allocator cache, cuBLAS heuristics
  if not need(ok, "training step (" .. pol_name .. ")", err) then return nil end
  collectgarbage()
  sync()
  C.reset_peak("cuda")
  local t0, n, loss = remat.now(), 0, nil
  repeat
    ok, loss = pcall(step)
    if not need(ok, "training step (" .. pol_name .. ")", loss) then return nil end
    n = n + 1
  until n >= STEPS or remat.now() - t0 > TIME_BUDGET
  sync()
  local dt = (remat.now() - t0) / n
  local stats = C.memory_stats("cuda")
  local act = stats.peak_by_category and stats.peak_by_category.activation
  return { ms = dt * 1e3, tps = B * T / dt, peak = stats.peak, act = act, reserved = stats.reserved, loss = loss,
           steps = n }
end

-- ---- main ----

out("remat GPU benchmark: GPT-2 small shape (L=%d, d=%d, heads=%d, T=%d, V=%d), batch %d, %d steps per policy",
    L, D, H, T, V, B, STEPS)

local model, dtype
for _, dt in ipairs({ WANT_DTYPE, "float32" }) do
  local ok, m = pcall(build, dt)
  if ok then model, dtype = m, dt break end
  need(false, "building the model in " .. dt, m)
end
if not model then
  out("could not build the model:")
  for _, m in ipairs(missing) do out("  missing: %s", m) end
  return
end
local total, nonemb = count_params(model)
local flops_per_token = 6 * nonemb + 12 * L * D * T
out("dtype %s, %.1fM parameters (%.1fM outside embeddings), %.1f GFLOP per token", dtype, total / 1e6,
    nonemb / 1e6, flops_per_token / 1e9)

local idx, lab = tokens(dtype)
local opt
if remat.optim and remat.optim.AdamW then
  local ok, o = pcall(remat.optim.AdamW, model:parameters(), { lr = 1e-4, weight_decay = 0.1 })
  if need(ok, "optim.AdamW", o) then opt = o end
else
  need(false, "remat.optim.AdamW", "not present (steps are forward + backward only)")
end

local policies = { { "none", policy and policy.none and policy.none() } }
if policy then
  if policy.sqrt then policies[#policies + 1] = { "sqrt", policy.sqrt() } end
  if policy.selective then policies[#policies + 1] = { "selective{softmax,gelu,dropout}", policy.selective { "softmax", "gelu", "dropout" } } end
else
  need(false, "remat.policy", "not present (only the default policy is measured)")
end

if os.getenv("REMAT_GPU_PROFILE") == "1" then
  local function step()
    local logits = model(idx)
    local loss = nn.cross_entropy(logits:view(B * T, V), lab)
    loss:backward()
    if opt then opt:step(); opt:zero_grad() else model:zero_grad() end
    return loss:item()
  end
  step() -- warm
  if not remat.cuda.profile(true) then
    out("PROFILE unavailable: start with REMAT_CUDA_PROFILE=1")
    return
  end
  local t0 = remat.now()
  step()
  local wall = (remat.now() - t0) * 1e3
  local list, total = remat.cuda.profile(), 0
  for _, r in ipairs(list) do total = total + r.ms end
  out("PROFILE one training step (policy none, batch %d): %.1f ms of GPU time in ops, %.1f ms wall "
      .. "(synchronised after every op)", B, total, wall)
  out("%-26s %8s %10s %7s", "op", "calls", "ms", "%")
  for _, r in ipairs(list) do out("%-26s %8d %10.3f %6.1f%%", r.name, r.calls, r.ms, 100 * r.ms / total) end
  return
end

local rows = {}
for _, p in ipairs(policies) do
  local r = run(model, p[1], p[2], idx, lab, opt)
  if r then r.name = p[1] rows[#rows + 1] = r end
end
-- budget: the smallest of 1/2, 2/3, 5/6, 1 x none()'s activation peak that has a plan
if policy and policy.budget and rows[1] and rows[1].name == "none" then
  for _, frac in ipairs({ 1 / 2, 2 / 3, 5 / 6, 1 }) do
    local bytes = math.floor((rows[1].act or rows[1].peak) * frac)
    local ok, pol = pcall(policy.budget, bytes)
    if ok then
      local name = ("budget(%s)"):format(gib(bytes))
      local r = run(model, name, pol, idx, lab, opt)
      if r then r.name = name rows[#rows + 1] = r break end
    end
  end
end

out("")
out("%-34s %10s %12s %8s %12s %12s %12s %10s", "policy", "ms/step", "tokens/s", "MFU", "peak", "activations",
    "reserved", "loss")
local base = rows[1]
for _, r in ipairs(rows) do
  local mfu = flops_per_token * r.tps / PEAK
  out("%-34s %10.1f %12.0f %7.1f%% %12s %12s %12s %10.4f%s", r.name, r.ms, r.tps, 100 * mfu, gib(r.peak),
      gib(r.act), r.reserved and gib(r.reserved) or "?", r.loss or 0 / 0,
      (base and r ~= base) and ("   (%.2fx time of none)"):format(r.ms / base.ms) or "")
end
for _, r in ipairs(rows) do
  out("ROW impl=remat policy=%s ms=%.1f tokens_per_s=%.0f mfu=%.1f peak_gib=%.2f", (r.name:gsub("%s", "")), r.ms, r.tps,
      100 * flops_per_token * r.tps / PEAK, (r.peak or 0) / 2 ^ 30)
end
for _, m in ipairs(missing) do out("missing: %s", m) end
out("RESULT dtype=%s batch=%d best_tokens_per_s=%.0f", dtype, B, rows[1] and rows[1].tps or 0)
