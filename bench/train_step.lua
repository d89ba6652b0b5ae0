-- Training-step benchmark: time and peak memory of one step (forward, backward, AdamW
-- step, zero_grad) of a deep residual MLP and of a character GPT at a few sizes, on the
-- CPU. When PyTorch imports (python3 -c "import torch"), the same models run in PyTorch
-- with the same thread count (torch.set_num_threads) from a generated script, and both
-- columns are printed with the ratio remat / PyTorch (below 1: remat is faster).
--
-- Run: remat bench/train_step.lua [--quick] [--seconds S] [--no-torch]
-- Threads: remat uses OMP_NUM_THREADS (default: every core); PyTorch gets the same count.
local remat = require "remat"
local nn, optim = remat.nn, remat.optim
local fmt = remat.memory.format

local argv = { ... }
local o = { quick = false, seconds = 3, torch = true }
do
  local i = 1
  while i <= #argv do
    local a = argv[i]
    if a == "--quick" then o.quick = true
    elseif a == "--no-torch" then o.torch = false
    elseif a == "--seconds" then o.seconds = tonumber(argv[i + 1]) or error("--seconds needs a number", 0); i = i + 1
    else error("bench/train_step.lua: unknown argument " .. a .. " (--quick, --seconds S, --no-torch)", 0) end
    i = i + 1
  end
  if o.quick then o.seconds = 0.2 end
end

local function nproc()
  local n = 0
  local f = io.open("/proc/cpuinfo")
  if f then
    for line in f:lines() do if line:match("^processor") then n = n + 1 end end
    f:close()
  end
  return math.max(n, 1)
end
local threads = math.tointeger(tonumber(os.getenv("OMP_NUM_THREADS") or "")) or nproc()

-- The configurations: name, kind and sizes (shared with the PyTorch script).
local configs = o.quick and {
  { kind = "mlp", blocks = 2, width = 64, batch = 16 },
  { kind = "gpt", layers = 1, dim = 32, heads = 2, block = 16, batch = 4, vocab = 65 },
} or {
  { kind = "mlp", blocks = 8, width = 256, batch = 128 },
  { kind = "mlp", blocks = 16, width = 512, batch = 128 },
  { kind = "mlp", blocks = 8, width = 1024, batch = 128 },
  { kind = "gpt", layers = 2, dim = 64, heads = 4, block = 64, batch = 16, vocab = 65 },
  { kind = "gpt", layers = 4, dim = 128, heads = 4, block = 64, batch = 32, vocab = 65 },
  { kind = "gpt", layers = 6, dim = 256, heads = 8, block = 128, batch = 8, vocab = 65 },
}

local function label(c)
  if c.kind == "mlp" then return ("resMLP %dx%d b%d"):format(c.blocks, c.width, c.batch) end
  return ("GPT L%d d%d T%d b%d"):format(c.layers, c.dim, c.block, c.batch)
end

-- The models (same architectures as models/mlp.lua and models/gpt.lua).
local function build(c)
  remat.manual_seed(1)
  if c.kind == "mlp" then
    local w = c.width
    local layers = { nn.Linear(784, w), nn.GELU() }
    for _ = 1, c.blocks do
      layers[#layers + 1] = nn.Residual(nn.Sequential { nn.LayerNorm(w), nn.Linear(w, 2 * w), nn.GELU(), nn.Linear(2 * w, w) })
    end
    layers[#layers + 1] = nn.LayerNorm(w)
    layers[#layers + 1] = nn.Linear(w, 10)
    local labels = {}
    for i = 1, c.batch do labels[i] = (i * 7) % 10 + 1 end
    return nn.Sequential(layers), remat.rand(c.batch, 784), remat.tensor(labels)
  end
  local emb = nn.module {
    tok = nn.Embedding(c.vocab, c.dim), pos = nn.Embedding(c.block, c.dim), positions = remat.arange(1, c.block),
    forward = function(self, x) return self.tok(x) + self.pos(self.positions) end,
  }
  local layers = { emb }
  for _ = 1, c.layers do layers[#layers + 1] = nn.TransformerBlock(c.dim, c.heads, 0) end
  layers[#layers + 1] = nn.LayerNorm(c.dim)
  layers[#layers + 1] = nn.Linear(c.dim, c.vocab)
  local x, y = {}, {}
  for b = 1, c.batch do
    x[b], y[b] = {}, {}
    for t = 1, c.block do
      x[b][t] = (b * 31 + t * 7) % c.vocab + 1
      y[b][t] = (b * 17 + t * 5) % c.vocab + 1
    end
  end
  return nn.Sequential(layers), remat.tensor(x), remat.tensor(y)
end

-- Mean seconds per step over at least o.seconds (after two warm-up steps), the peak
-- memory of one step (all categories and activations), and the parameter count.
local function bench_remat(c)
  local model, x, y = build(c)
  local opt = optim.AdamW(model:parameters(), { lr = 1e-3 })
  local function step()
    local out = model(x)
    local loss = nn.cross_entropy(out, y)
    loss:backward()
    opt:step()
    opt:zero_grad()
    out:free()
    loss:free()
  end
  step()
  step()
  collectgarbage()
  collectgarbage()
  remat.memory.reset_peak()
  step()
  local m = remat.memory.stats()
  local times, t0 = {}, remat.now()
  repeat
    local t = remat.now()
    step()
    times[#times + 1] = remat.now() - t
  until remat.now() - t0 >= o.seconds and #times >= 3
  table.sort(times)
  return times[(#times + 1) // 2], m.peak, m.peak_by_category.activation, model:num_parameters()
end

---------------------------------------------------------------- PyTorch ----

local PY = [==[
import sys, time, math, json
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(int(sys.argv[1]))
seconds = float(sys.argv[2])
configs = json.loads(sys.argv[3])

class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__()
        s.h = h
        s.ln1, s.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        s.qkv, s.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        s.fc1, s.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // s.h))
            att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        x = x + s.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x))))

class GPT(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.tok, s.pos = nn.Embedding(c["vocab"], c["dim"]), nn.Embedding(c["block"], c["dim"])
        s.blocks = nn.Sequential(*[Block(c["dim"], c["heads"]) for _ in range(c["layers"])])
        s.ln, s.head = nn.LayerNorm(c["dim"]), nn.Linear(c["dim"], c["vocab"])
    def forward(s, x):
        h = s.tok(x) + s.pos(torch.arange(x.shape[1]))
        return s.head(s.ln(s.blocks(h)))

class Res(nn.Module):
    def __init__(s, w):
        super().__init__()
        s.f = nn.Sequential(nn.LayerNorm(w), nn.Linear(w, 2 * w), nn.GELU(), nn.Linear(2 * w, w))
    def forward(s, x):
        return x + s.f(x)

def build(c):
    torch.manual_seed(1)
    if c["kind"] == "mlp":
        w = c["width"]
        m = nn.Sequential(nn.Linear(784, w), nn.GELU(), *[Res(w) for _ in range(c["blocks"])],
                          nn.LayerNorm(w), nn.Linear(w, 10))
        x = torch.rand(c["batch"], 784)
        y = torch.tensor([(i * 7) % 10 for i in range(1, c["batch"] + 1)])
        return m, x, y
    m = GPT(c)
    x = torch.tensor([[(b * 31 + t * 7) % c["vocab"] for t in range(1, c["block"] + 1)] for b in range(1, c["batch"] + 1)])
    y = torch.tensor([[(b * 17 + t * 5) % c["vocab"] for t in range(1, c["block"] + 1)] for b in range(1, c["batch"] + 1)])
    return m, x, y

if hasattr(F, "scaled_dot_product_attention"):
    print("SDPA")
for c in configs:
    m, x, y = build(c)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    def step():
        out = m(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
    step(); step()
    times, t0 = [], time.perf_counter()
    while True:
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
        if time.perf_counter() - t0 >= seconds and len(times) >= 3:
            break
    times.sort()
    print("RESULT", c["id"], times[(len(times) - 1) // 2], flush=True)
]==]

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function json_configs(list)
  local parts = {}
  for _, c in ipairs(list) do
    local i = c.id
    local kv = { ('"id": %d'):format(i), ('"kind": "%s"'):format(c.kind) }
    for k, v in pairs(c) do
      if k ~= "kind" then kv[#kv + 1] = ('"%s": %d'):format(k, v) end
    end
    parts[#parts + 1] = "{" .. table.concat(kv, ", ") .. "}"
  end
  return "[" .. table.concat(parts, ", ") .. "]"
end

-- Finds a python3 that imports torch; returns it and the version, or nil and the reason.
local function find_torch()
  if not o.torch then return nil, "skipped (--no-torch)" end
  -- the first python3 on PATH may be another installation than Debian's (which has python3-torch)
  local python, version
  for _, py in ipairs { "python3", "/usr/bin/python3" } do
    local probe = io.popen(py .. " -c 'import torch; print(torch.__version__)' 2>/dev/null")
    local v = probe and probe:read("l")
    if probe then probe:close() end
    if v and v ~= "" then python, version = py, v break end
  end
  if not python then
    return nil, "PyTorch is not installed (python3 -c \"import torch\" fails; Debian's python3-torch provides it)"
  end
  return python, version
end

-- Runs the PyTorch script on the given configs; returns { [config id] = seconds per
-- step } and whether it used scaled_dot_product_attention, or nil and the output.
local function bench_torch(python, list)
  local path = os.tmpname() .. ".py"
  local f = assert(io.open(path, "w"))
  f:write(PY)
  f:close()
  local cmd = ("%s %s %d %g %s 2>&1"):format(python, path, threads, o.seconds, shell_quote(json_configs(list)))
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  os.remove(path)
  local res = {}
  for id, s in out:gmatch("RESULT (%d+) ([%d.e+-]+)") do res[tonumber(id)] = tonumber(s) end
  if next(res) == nil then return nil, out end
  return res, out:find("SDPA", 1, true) ~= nil
end

---------------------------------------------------------------- report ----

print(("training step (forward + backward + AdamW + zero_grad; median ms), float32 on the CPU, %d thread%s"):format(
  threads, threads == 1 and "" or "s"))
-- Each configuration runs in remat, then at once in PyTorch, so that both see the same
-- machine (medians of per-step times resist other load).
local python, version = find_torch()
local rows, torch_res, sdpa, torch_err = {}, python and {} or nil, false, nil
for i, c in ipairs(configs) do
  c.id = i
  local per, peak, act, params = bench_remat(c)
  rows[i] = { per = per, peak = peak, act = act, params = params }
  local msg = ("  %s: remat %.1f ms"):format(label(c), per * 1000)
  if python and not torch_err then
    local res, info = bench_torch(python, { c })
    if res then
      torch_res[i], sdpa = res[i], info
      msg = msg .. (", PyTorch %.1f ms"):format(res[i] * 1000)
    else
      torch_err = info
    end
  end
  io.stderr:write(msg, "\n")
end
if torch_err then print("the PyTorch script failed:\n" .. torch_err) torch_res = nil end
print(("compared with: %s"):format(python and ("PyTorch %s (%s), torch.set_num_threads(%d), %s"):format(version, python,
  threads, sdpa and "scaled_dot_product_attention" or "attention written out (no SDPA in this version)") or version))
print()
print(("%-24s %10s %12s %12s %12s %12s %8s"):format("model", "params", "remat ms", "peak mem", "peak act", "PyTorch ms",
  "ratio"))
for i, c in ipairs(configs) do
  local r = rows[i]
  local t = torch_res and torch_res[i]
  print(("%-24s %10d %12.2f %12s %12s %12s %8s"):format(label(c), r.params, r.per * 1000, fmt(r.peak), fmt(r.act),
    t and ("%.2f"):format(t * 1000) or "-", t and ("%.2fx"):format(r.per / t) or "-"))
end
if torch_res then
  print("ratio = remat time / PyTorch time (below 1: remat is faster)")
end
