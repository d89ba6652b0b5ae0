-- The headline: under one fixed memory limit, how much larger a batch remat trains with
-- checkpointing than without, and at what throughput, on two models:
--   activations: a deep residual MLP with AdamW whose activations dominate;
--   parameters:  a wide residual MLP with SGD whose parameters and gradients take
--                >= 70% of the limit.
-- Every byte counts against remat.memory.limit(L): parameters, gradients, optimizer
-- state, data, activations. The user does no arithmetic: policy.budget() plans the whole
-- step within the limit. Rows: none(), every(1), budget(), and budget() with the
-- optimizer fused into backward (in_backward = true); then budget(), plain and fused, at
-- exactly 4x none()'s batch (the goal: 4x the batch at none()'s examples/s or more).
--
-- The largest batch (a multiple of 16) is found by bisection over dry runs (model:plan's
-- whole-step peak, or whether budget() finds a plan), then one real step at it must fit.
-- Examples/s: the median over rounds that interleave the rows (the machine is shared);
-- thru x: the median over rounds of the row's examples/s over none()'s in that round.
--
-- Usage: remat bench/headline.lua [--rounds 3] [--steps 3] [--only activations|parameters] [--passive]
--
-- It runs in the environment it is given, as a user's script does (the remat command
-- sets GOMP_SPINCOUNT=1000: README, "The wait policy"); --passive re-runs it with
-- OMP_WAIT_POLICY=passive, steadier on a heavily shared machine (bench/checkpoint.lua
-- has the same flag).
local passive = false
for _, a in ipairs(arg or {}) do passive = passive or a == "--passive" end
if passive and not os.getenv("OMP_WAIT_POLICY") and arg and arg[-1] and arg[0] then
  local q = {}
  for i = -1, #arg do q[#q + 1] = "'" .. tostring(arg[i]):gsub("'", "'\\''") .. "'" end
  local ok, how, code = os.execute("OMP_WAIT_POLICY=passive " .. table.concat(q, " "))
  if not ok then os.exit(how == "exit" and code or 1) end
  return
end

local remat = require "remat"
local nn, optim, policy = remat.nn, remat.optim, remat.policy
local fmt = remat.memory.format

local o = { rounds = 3, steps = 3, only = false }
do
  local argv, i = { ... }, 1
  while argv[i] do
    local k = argv[i]:match("^%-%-(.+)$")
    if k == "passive" then
      i = i + 1 -- handled above
    else
      if not k or o[k] == nil or not argv[i + 1] then
        error("usage: remat bench/headline.lua [--rounds N] [--steps N] [--only activations|parameters] [--passive]", 0)
      end
      o[k] = k == "only" and argv[i + 1] or tonumber(argv[i + 1])
      i = i + 2
    end
  end
end

local MODELS = {
  { name = "activations", limit = "48MiB", blocks = 16, width = 128, input = 128,
    opt = function(p, fused) return optim.AdamW(p, { lr = 1e-3, in_backward = fused }) end,
    what = "16-block residual MLP, width 128 (hidden 512), AdamW" },
  { name = "parameters", limit = "32MiB", blocks = 16, width = 160, input = 64,
    opt = function(p, fused) return optim.SGD(p, { lr = 1e-2, in_backward = fused }) end,
    what = "16-block residual MLP, width 160 (hidden 640), SGD" },
}
local classes = 10

local function build(m)
  remat.manual_seed(1)
  local layers = { nn.Linear(m.input, m.width) }
  for _ = 1, m.blocks do
    layers[#layers + 1] = nn.Residual(nn.Sequential {
      nn.LayerNorm(m.width), nn.Linear(m.width, 4 * m.width), nn.GELU(), nn.Linear(4 * m.width, m.width) })
  end
  layers[#layers + 1] = nn.Linear(m.width, classes)
  return nn.Sequential(layers)
end

local function batch(m, b)
  local t = {}
  for i = 1, b do t[i] = (i * 7) % classes + 1 end
  return remat.randn(b, m.input), remat.tensor(t)
end

local function settle() collectgarbage(); collectgarbage() end

-- `at4`: the row runs at exactly 4x none()'s batch instead of its largest, where
-- budget() has memory to spare and so replays less than at its largest batch.
local ROWS = {
  { name = "none()", pol = policy.none },
  { name = "every(1)", pol = function() return policy.every(1) end },
  { name = "budget()", pol = policy.budget },
  { name = "budget() + in_backward", pol = policy.budget, fused = true },
  { name = "budget() at 4x", pol = policy.budget, at4 = true },
  { name = "+ in_backward at 4x", pol = policy.budget, fused = true, at4 = true },
}

-- A model and its optimizer (state made by a first small step), checkpointed.
local function setup(m, row)
  settle()
  remat.memory.limit(nil)
  local model = build(m)
  local opt = m.opt(model:parameters(), row.fused or false)
  local x, y = batch(m, 2)
  nn.cross_entropy(model(x), y):backward()
  opt:step()
  opt:zero_grad()
  x, y = nil, nil
  settle()
  return model, opt
end

-- Installs the row's policy and resolves it for batch x, y with the step's loss and
-- optimizer (a forward alone would plan with ones backpropagated from the output);
-- returns model:plan's report, or nil and the error when no plan fits.
local function install(row, model, opt, x, y)
  model:checkpoint(row.pol())
  return pcall(model.plan, model, x, { loss = function(out) return nn.cross_entropy(out, y) end, optimizer = opt })
end

-- Whether batch b fits under the limit, by a dry run of the whole step.
local function fits(m, row, model, opt, limit, b)
  local x, y = batch(m, b)
  remat.memory.limit(limit)
  local ok, plan = install(row, model, opt, x, y)
  remat.memory.limit(nil)
  x:free(); y:free()
  return ok and plan.step_peak <= limit
end

local function largest(m, row, model, opt, limit)
  local lo, hi = 0, 16
  while fits(m, row, model, opt, limit, hi) do lo, hi = hi, hi * 2 end
  while hi - lo > 16 do
    local mid = (lo + hi) // 2 // 16 * 16
    if fits(m, row, model, opt, limit, mid) then lo = mid else hi = mid end
  end
  return lo
end

-- Seconds per step over `steps` steps at batch b under the limit (after one untimed
-- step), or nil and the error when a step does not fit.
local function run(m, row, model, opt, limit, b, steps)
  settle()
  local x, y = batch(m, b)
  remat.memory.limit(limit)
  local ok, res = install(row, model, opt, x, y)
  if ok then ok, res = pcall(function()
    local t0
    for s = 1, steps + 1 do
      if s == 2 then t0 = remat.now() end
      local loss = nn.cross_entropy(model(x), y)
      loss:backward()
      opt:step()
      opt:zero_grad()
    end
    return steps > 0 and (remat.now() - t0) / steps or 0
  end) end
  remat.memory.limit(nil)
  opt:zero_grad()
  x, y = nil, nil
  settle()
  if ok then return res end
  return nil, res
end

local function median(t)
  table.sort(t)
  local n = #t
  if n == 0 then return nil end
  return n % 2 == 1 and t[(n + 1) // 2] or (t[n // 2] + t[n // 2 + 1]) / 2
end

local function loadavg()
  local f = io.open("/proc/loadavg")
  local s = f and f:read("l") or "?"
  if f then f:close() end
  return s:match("^(%S+ %S+ %S+)") or s
end

local t_start = remat.now()
print(("remat bench/headline.lua --rounds %d --steps %d  (omp wait: %s; load average at start: %s)"):format(
  o.rounds, o.steps, remat.info().omp_wait, loadavg()))
for _, m in ipairs(MODELS) do
  if not o.only or o.only == m.name then
    local limit = remat.memory.parse(m.limit)
    local probe = build(m)
    local pbytes = 0
    for _, p in ipairs(probe:parameters()) do pbytes = pbytes + 4 * p:numel() end
    probe = nil
    print(("\n%s: %s; limit %s for everything; parameters + gradients %s (%.0f%% of the limit)"):format(
      m.name, m.what, fmt(limit), fmt(2 * pbytes), 100 * 2 * pbytes / limit))
    -- one model lives at a time: each run sets up its own (the limit is for one)
    local rows = {}
    for r, row in ipairs(ROWS) do
      local model, opt = setup(m, row)
      local b
      if row.at4 then
        b = 4 * rows[1].batch
        if not fits(m, row, model, opt, limit, b) then b = 0 end
      else
        b = largest(m, row, model, opt, limit)
      end
      local ok, err = true, nil
      if b > 0 then ok, err = run(m, row, model, opt, limit, b, 0) end
      rows[r] = { row = row, batch = b, eps = {}, err = not ok and err or nil }
    end
    for k = 1, o.rounds do
      for _, r in ipairs(rows) do
        if r.batch > 0 and not r.err then
          local model, opt = setup(m, r.row)
          local s, err = run(m, r.row, model, opt, limit, r.batch, o.steps)
          if s then r.eps[k] = r.batch / s else r.err = err end
        end
      end
      -- each row against none() in the same round: the machine's slow and fast phases
      -- (seconds long) then move both sides of a ratio alike
      for _, r in ipairs(rows) do
        if r.eps[k] and rows[1].eps[k] then
          r.ratios = r.ratios or {}
          r.ratios[#r.ratios + 1] = r.eps[k] / rows[1].eps[k]
        end
      end
    end
    print(("%-24s %8s %12s %9s %9s"):format("policy", "batch", "examples/s", "batch x", "thru x"))
    local base_b = rows[1].batch
    for _, r in ipairs(rows) do
      local eps, thru = median(r.eps), r.ratios and median(r.ratios)
      print(("%-24s %8s %12s %8.2fx %9s%s"):format(r.row.name, r.batch > 0 and r.batch or "no fit", eps and ("%.0f"):format(eps) or "-",
        r.batch / math.max(1, base_b), thru and ("%.2fx"):format(thru) or "-",
        r.err and ("  (" .. tostring(r.err):sub(1, 80) .. ")") or ""))
    end
  end
end
print(("\n%.0f s; load average at the end: %s"):format(remat.now() - t_start, loadavg()))
