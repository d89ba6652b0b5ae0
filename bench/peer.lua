-- remat against PyTorch 2.x on the CPU: step time of the same three models, same
-- threads, same steps, measured in interleaved rounds (a round of remat steps, then a
-- round of PyTorch steps, over and over) so that both sides see the same machine load;
-- the table gives each side's median seconds per step and the ratio remat / PyTorch.
--
-- PyTorch 2.x in a venv (once; about 5 GB with its CUDA libraries, it runs on the CPU):
--     python3 -m venv /work/venv-torch && /work/venv-torch/bin/pip install torch numpy
-- Run (no environment variables for remat; about 2 minutes on 2 cores):
--     build/remat bench/peer.lua [--python /work/venv-torch/bin/python] [--rounds 7]
--                                [--seconds 1.5] [--only mlp24|mlp|gpt] [--no-torch]
-- Threads: remat runs with what it gets by default (one per core, remat.info().threads);
-- PyTorch gets the same count (torch.set_num_threads), and the OpenMP wait policy the
-- user set (none by default), not the one the remat command sets for itself. Models:
--   mlp24  24 pre-LN residual blocks (LayerNorm, Linear 256->1024, GELU, Linear 1024->256),
--          batch 512, 256 inputs, a Linear(256, 10) head and cross-entropy, SGD (lr 1e-3);
--   mlp    models/mlp.lua's model (Linear 784->256, GELU, 8 residual blocks of LayerNorm,
--          Linear 256->512, GELU, Linear 512->256, LayerNorm, Linear 256->10), batch 128,
--          AdamW, every activation kept (policy none);
--   gpt    models/gpt.lua's shape: 4 pre-LN TransformerBlocks, dim 128, 4 heads, block 64,
--          batch 32, vocab 65, AdamW, dropout 0 (so that both use fused causal attention).
local remat = require "remat"
local nn, optim = remat.nn, remat.optim

local argv = { ... }
local o = { rounds = 7, seconds = 1.5, torch = true, only = nil,
            python = os.getenv("REMAT_PEER_PYTHON") or "/work/venv-torch/bin/python" }
do
  local i = 1
  while i <= #argv do
    local a, v = argv[i], argv[i + 1]
    if a == "--no-torch" then o.torch = false; i = i + 1
    elseif a == "--rounds" then o.rounds = math.tointeger(tonumber(v)) or error("--rounds needs an integer", 0); i = i + 2
    elseif a == "--seconds" then o.seconds = tonumber(v) or error("--seconds needs a number", 0); i = i + 2
    elseif a == "--python" then o.python = v or error("--python needs a path", 0); i = i + 2
    elseif a == "--only" then o.only = v or error("--only needs a model name", 0); i = i + 2
    else error("bench/peer.lua: unknown argument " .. a .. " (--python P, --rounds N, --seconds S, --only M, --no-torch)", 0) end
  end
end

local info = remat.info()
local threads = info.threads

local MODELS = { "mlp24", "mlp", "gpt" }
if o.only then MODELS = { o.only } end

---------------------------------------------------------------- remat ----

local function residual_mlp(inputs, w, hidden, blocks)
  local layers = { nn.Linear(inputs, w), nn.GELU() }
  if inputs == w then layers = {} end
  for _ = 1, blocks do
    layers[#layers + 1] = nn.Residual(nn.Sequential { nn.LayerNorm(w), nn.Linear(w, hidden), nn.GELU(), nn.Linear(hidden, w) })
  end
  if inputs ~= w then layers[#layers + 1] = nn.LayerNorm(w) end
  layers[#layers + 1] = nn.Linear(w, 10)
  return nn.Sequential(layers)
end

local function labels(n, classes) local y = {} for i = 1, n do y[i] = (i * 7) % classes + 1 end return remat.tensor(y) end

local function gpt(c)
  local emb = nn.module {
    tok = nn.Embedding(c.vocab, c.dim), pos = nn.Embedding(c.block, c.dim), positions = remat.arange(1, c.block),
    forward = function(self, x) local p <close> = self.pos(self.positions); return self.tok(x) + p end,
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

-- name -> a function that runs n steps and returns seconds per step
local function remat_model(name)
  remat.manual_seed(1)
  local model, x, y, opt
  if name == "mlp24" then
    model, x, y = residual_mlp(256, 256, 1024, 24), remat.rand(512, 256), labels(512, 10)
    opt = optim.SGD(model:parameters(), { lr = 1e-3 })
  elseif name == "mlp" then
    model, x, y = residual_mlp(784, 256, 512, 8), remat.rand(128, 784), labels(128, 10)
    opt = optim.AdamW(model:parameters(), { lr = 1e-3 })
  elseif name == "gpt" then
    model, x, y = gpt { layers = 4, dim = 128, heads = 4, block = 64, batch = 32, vocab = 65 }
    opt = optim.AdamW(model:parameters(), { lr = 1e-3 })
  else
    error("bench/peer.lua: unknown model " .. name .. " (mlp24, mlp, gpt)", 0)
  end
  local function step()
    local out <close> = model(x)
    local loss <close> = nn.cross_entropy(out, y)
    loss:backward()
    opt:step()
    opt:zero_grad()
  end
  return function(n)
    local t0 = remat.now()
    for _ = 1, n do step() end
    return (remat.now() - t0) / n
  end
end

---------------------------------------------------------------- PyTorch ----

local PY = [==[
import sys, time, math
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(int(sys.argv[1]))

class Res(nn.Module):
    def __init__(s, w, h):
        super().__init__()
        s.f = nn.Sequential(nn.LayerNorm(w), nn.Linear(w, h), nn.GELU(), nn.Linear(h, w))
    def forward(s, x):
        return x + s.f(x)

def residual_mlp(inputs, w, h, blocks):
    head = [] if inputs == w else [nn.Linear(inputs, w), nn.GELU()]
    tail = [] if inputs == w else [nn.LayerNorm(w)]
    return nn.Sequential(*head, *[Res(w, h) for _ in range(blocks)], *tail, nn.Linear(w, 10))

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
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x))))

class GPT(nn.Module):
    def __init__(s, vocab, d, layers, heads, block):
        super().__init__()
        s.tok, s.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        s.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        s.ln, s.head = nn.LayerNorm(d), nn.Linear(d, vocab)
    def forward(s, x):
        return s.head(s.ln(s.blocks(s.tok(x) + s.pos(torch.arange(x.shape[1])))))

def labels(n, classes):
    return torch.tensor([(i * 7) % classes for i in range(1, n + 1)])

def model(name):
    torch.manual_seed(1)
    if name == "mlp24":
        m, x, y = residual_mlp(256, 256, 1024, 24), torch.rand(512, 256), labels(512, 10)
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    elif name == "mlp":
        m, x, y = residual_mlp(784, 256, 512, 8), torch.rand(128, 784), labels(128, 10)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    else:
        V, T, B = 65, 64, 32
        m = GPT(V, 128, 4, 4, T)
        x = torch.tensor([[(b * 31 + t * 7) % V for t in range(1, T + 1)] for b in range(1, B + 1)])
        y = torch.tensor([[(b * 17 + t * 5) % V for t in range(1, T + 1)] for b in range(1, B + 1)])
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    def step():
        out = m(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return step

steps = {}
print("ready torch %s threads %d" % (torch.__version__, torch.get_num_threads()), flush=True)
for line in sys.stdin:
    name, n = line.split()
    if name not in steps:
        steps[name] = model(name)
    step, n = steps[name], int(n)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    print("%.9f" % ((time.perf_counter() - t0) / n), flush=True)
]==]

-- A PyTorch process that runs "name n" requests from a pipe and answers each with the
-- seconds per step on a FIFO; nil and a reason when PyTorch does not start.
local function torch_peer()
  local dir = os.tmpname()
  os.remove(dir)
  if not os.execute("mkdir -p " .. dir .. " && mkfifo " .. dir .. "/out") then return nil, "mkfifo failed" end
  local script = io.open(dir .. "/peer.py", "w")
  script:write(PY)
  script:close()
  -- PyTorch gets the environment the user gave: not the spin count the remat command
  -- sets for itself (lua/main.c)
  local env = os.getenv("REMAT_SET_SPINCOUNT") and "env -u GOMP_SPINCOUNT -u REMAT_SET_SPINCOUNT " or ""
  local cmd = ("%s%q %s/peer.py %d > %s/out 2> %s/err"):format(env, o.python, dir, threads, dir, dir)
  local pipe = io.popen(cmd, "w")
  local out = io.open(dir .. "/out", "r")
  local hello = out and out:read("l")
  if not hello or not hello:match("^ready") then
    pipe:close()
    local e = io.open(dir .. "/err")
    local why = e and e:read("a") or ""
    if e then e:close() end
    os.execute("rm -rf " .. dir)
    return nil, (why:match("([^\n]*)\n?$") or why)
  end
  local peer = { version = hello:match("torch (%S+)") }
  function peer.run(name, n)
    pipe:write(name, " ", n, "\n")
    pipe:flush()
    local l = out:read("l")
    if not l then error("bench/peer.lua: PyTorch stopped: see " .. dir .. "/err", 0) end
    return tonumber(l)
  end
  function peer.close()
    pipe:close()
    out:close()
    os.execute("rm -rf " .. dir)
  end
  return peer
end

---------------------------------------------------------------- run ----

local function median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end

local function loadavg()
  local f = io.open("/proc/loadavg")
  local l = f and f:read("l") or "?"
  if f then f:close() end
  return l:match("^(%S+ %S+ %S+)") or l
end

local peer, why
if o.torch then peer, why = torch_peer() end
print(("remat %s: %s, core %s (%s); %d threads; simd %s; omp wait %s"):format(info.version, info.blas,
  info.blas_core, info.blas_core_from, threads, info.simd, info.omp_wait))
print(peer and ("PyTorch %s, %d threads"):format(peer.version, threads)
  or ("PyTorch: not run (%s)"):format(o.torch and why or "--no-torch"))
print(("load average at start: %s"):format(loadavg()))

print(("\n%-7s %6s %14s %14s %8s"):format("model", "steps", "remat s/step", "torch s/step", "ratio"))
for _, name in ipairs(MODELS) do
  local run = remat_model(name)
  -- steps per round: about o.seconds of remat, from two warm-up steps
  run(1)
  local per = run(1)
  local n = math.max(1, math.floor(o.seconds / per + 0.5))
  if peer then peer.run(name, 2) end
  local rt, pt = {}, {}
  for r = 1, o.rounds do
    rt[r] = run(n)
    if peer then pt[r] = peer.run(name, n) end
  end
  local r = { name = name, n = n, remat = median(rt), torch = peer and median(pt) }
  print(("%-7s %6d %14.4f %14s %8s"):format(r.name, r.n * o.rounds, r.remat,
    r.torch and ("%.4f"):format(r.torch) or "-", r.torch and ("%.2f"):format(r.remat / r.torch) or "-"))
  io.stdout:flush()
  collectgarbage()
  collectgarbage()
end
if peer then peer.close() end
print(("(medians of %d interleaved rounds; ratio below 1: remat is faster; load average at end: %s)"):format(
  o.rounds, loadavg()))
