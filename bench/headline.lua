-- The headline: under one fixed memory limit, how much larger a batch remat trains with
-- checkpointing than without, and at what throughput.
--
-- A deep residual MLP is trained with AdamW under remat.memory.limit(L) (every byte
-- counts: parameters, gradients, optimizer state, data, activations). For none() and
-- for a checkpoint policy, the largest batch whose training step fits is found (doubling,
-- then bisection; an over-limit step fails cleanly and the search goes on), then
-- examples/s are measured at that batch. The checkpointed runs use policy.budget with
-- what the limit leaves for activations, and policy.every(1).
--
-- Usage: remat bench/headline.lua [--limit 96MiB] [--blocks 16] [--width 128] [--steps 4]
local remat = require "remat"
local nn, optim, policy = remat.nn, remat.optim, remat.policy
local fmt = remat.memory.format

local o = { limit = "96MiB", blocks = 16, width = 128, steps = 4 }
do
  local argv, i = { ... }, 1
  while argv[i] do
    local k = argv[i]:match("^%-%-(.+)$")
    if not k or o[k] == nil or not argv[i + 1] then error("usage: remat bench/headline.lua [--limit 96MiB] [--blocks N] [--width N] [--steps N]", 0) end
    o[k] = k == "limit" and argv[i + 1] or tonumber(argv[i + 1])
    i = i + 2
  end
end
local limit = remat.memory.parse(o.limit)
local classes = 10

local function build()
  remat.manual_seed(1)
  local layers = { nn.Linear(o.width, o.width) }
  for _ = 1, o.blocks do
    layers[#layers + 1] = nn.Residual(nn.Sequential {
      nn.LayerNorm(o.width), nn.Linear(o.width, 4 * o.width), nn.GELU(), nn.Linear(4 * o.width, o.width) })
  end
  layers[#layers + 1] = nn.Linear(o.width, classes)
  return nn.Sequential(layers)
end

local function labels(b)
  local t = {}
  for i = 1, b do t[i] = (i * 7) % classes + 1 end
  return remat.tensor(t)
end

-- One setup: model, optimizer (state allocated by a first small step), and a step
-- function for batch b under the policy maker pol(b) (nil: keep everything).
local function setup()
  collectgarbage()
  collectgarbage()
  remat.memory.limit(nil)
  local model = build()
  local opt = optim.AdamW(model:parameters(), { lr = 1e-3 })
  local x, y = remat.randn(2, o.width), labels(2)
  nn.cross_entropy(model(x), y):backward()
  opt:step()
  opt:zero_grad()
  return model, opt
end

local function param_bytes(model)
  local n = 0
  for _, p in ipairs(model:parameters()) do n = n + 4 * p:numel() end
  return n
end

-- Runs `steps` training steps at batch b under the limit; returns seconds per step, or
-- nil and the error when a step does not fit.
local function run(model, opt, b, pol, steps)
  collectgarbage()
  collectgarbage()
  remat.memory.limit(nil)
  local x, y = remat.randn(b, o.width), labels(b)
  if pol then
    -- what the limit leaves for activations: all that lives now, plus gradients to come
    local room = limit - remat.memory.stats().live - param_bytes(model) - (1 << 20)
    if room <= 0 then x:free(); y:free(); return nil, "no room left for activations" end
    model:checkpoint(pol(room))
  else
    model:checkpoint(policy.none())
  end
  remat.memory.limit(limit)
  local ok, err = pcall(function()
    local t0
    for s = 1, steps + 1 do
      if s == 2 then t0 = remat.now() end
      local loss = nn.cross_entropy(model(x), y)
      loss:backward()
      opt:step()
      opt:zero_grad()
      loss:free()
    end
    return (remat.now() - t0) / steps
  end)
  remat.memory.limit(nil)
  x:free()
  y:free()
  opt:zero_grad()
  collectgarbage()
  collectgarbage()
  if ok then return err end
  return nil, err
end

-- The largest batch (a multiple of 32) whose step fits.
local function largest(model, opt, pol)
  local lo, hi, b = 0, nil, 32
  while not hi do
    if run(model, opt, b, pol, 1) then lo = b; b = b * 2 else hi = b end
    if b > 1 << 20 then break end
  end
  hi = hi or b
  while hi - lo > 32 do
    local mid = (lo + hi) // 2 // 32 * 32
    if mid <= lo then break end
    if run(model, opt, mid, pol, 1) then lo = mid else hi = mid end
  end
  return lo
end

print(("residual MLP: %d blocks, width %d (hidden %d), AdamW; memory limit %s for everything"):format(
  o.blocks, o.width, 4 * o.width, fmt(limit)))
local rows = {}
for _, case in ipairs {
  { name = "none()", pol = nil },
  { name = "budget(what the limit leaves)", pol = function(room) return policy.budget(room) end },
  { name = "every(1)", pol = function() return policy.every(1) end },
} do
  local model, opt = setup()
  local b = largest(model, opt, case.pol)
  local s = b > 0 and run(model, opt, b, case.pol, o.steps)
  rows[#rows + 1] = { name = case.name, batch = b, step = s, eps = s and b / s }
end

print(("%-32s %8s %10s %12s %9s %9s"):format("policy", "batch", "step s", "examples/s", "batch x", "thru x"))
local base = rows[1]
for _, r in ipairs(rows) do
  print(("%-32s %8d %10s %12s %8.2fx %8s"):format(r.name, r.batch, r.step and ("%.3f"):format(r.step) or "-",
    r.eps and ("%.0f"):format(r.eps) or "-", r.batch / math.max(1, base.batch),
    (r.eps and base.eps) and ("%.2fx"):format(r.eps / base.eps) or "-"))
end
