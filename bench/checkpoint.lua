-- Checkpointing benchmark (issue 4): step time and measured peak activation memory of
-- each checkpoint policy relative to none(), side by side in one run, for
--   * a residual MLP: N blocks Residual(Sequential{Linear(d,4d), GELU, Dropout, Linear(4d,d)})
--   * a GPT: Embedding, 12 TransformerBlocks with dropout, LayerNorm, Linear head, T = 256.
-- Beside the measurements: each plan's predicted peak and predicted step time: none()'s
-- measured step plus the plan's replay time, priced by per-op costs (core/opcost.c)
-- learned from the op timers during these same rounds (so the prediction sees the same
-- load and caches; a call is priced at its replays' time, their mean less spikes, where
-- some plan replayed it, else at its first runs'; "alone" is the price the planner used,
-- from ops timed alone).
-- budget() runs at the memory of every(sqrt N), of every(1) and of each PyTorch row.
-- The same models under PyTorch 2.x's torch.utils.checkpoint (bench/checkpoint_torch.py:
-- every(k), checkpoint_sequential, selective checkpoint contexts) when torch imports
-- (the venv at /work/venv-torch, or $PYTHON). Plots (gnuplot): peak activation against
-- N, step time against budget, and the time-memory frontier of each model.
--
-- Method. One model per policy, all built from the same seed (same weights); steps are
-- interleaved (one step of every policy per round, each round starting one policy later
-- than the one before) so that load from other processes hits every policy alike; a
-- policy's time ratio ("time x") is the median over rounds
-- of (its step / none()'s step in the same round), "q25-q75" the quartiles of those
-- ratios (how noisy the machine was). The load average is printed at the start and end. Step = forward + cross entropy +
-- backward, timed with remat.now(). Peak = peak_by_category.activation after
-- collectgarbage() and remat.memory.reset_peak().
--
-- Run: remat bench/checkpoint.lua [--quick] [--rounds=R] [--no-torch] [--no-plots] [--out=DIR] [--passive]
-- It runs in the environment it is given, as a user's script does: the remat command
-- sets GOMP_SPINCOUNT=1000 (README, "The wait policy"), which PyTorch inherits here.
-- --passive re-runs it (and PyTorch under it) with OMP_WAIT_POLICY=passive, steadier on
-- a heavily shared machine: threads then sleep at every barrier, which costs each
-- parallel loop a wake-up (5-15% of a step, more for plans that replay many small ops).
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
local nn, policy = remat.nn, remat.policy
local C = remat._C

local opts = { rounds = 24, warmup = 1, out = "bench/results" }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^%-%-([%w-]+)=?(.*)$")
  if k == "quick" then opts.quick = true
  elseif k == "rounds" then opts.rounds = assert(tonumber(v), "--rounds=R")
  elseif k == "no-torch" then opts.no_torch = true
  elseif k == "no-plots" then opts.no_plots = true
  elseif k == "out" then opts.out = v
  elseif k == "passive" then -- handled above
  else error("bench/checkpoint.lua: unknown argument " .. a .. " (--quick --rounds=R --no-torch --no-plots --out=DIR --passive)") end
end

-- Sizes: small enough for a 2-core CPU (the whole bench, PyTorch included, ~10 min).
local cfg = opts.quick and {
  mlp = { n = 64, d = 64, batch = 64 }, sweep_n = { 8, 16, 32, 64 },
  gpt = { blocks = 12, d = 64, heads = 4, vocab = 256, t = 256, batch = 1 },
  dropout = 0.1, rounds = math.min(opts.rounds, 4),
} or {
  mlp = { n = 64, d = 128, batch = 64 }, sweep_n = { 8, 16, 32, 64 },
  gpt = { blocks = 12, d = 128, heads = 4, vocab = 256, t = 256, batch = 2 },
  dropout = 0.1, rounds = opts.rounds,
}
cfg.mlp.rounds = 2 * cfg.rounds -- MLP steps are cheap: more rounds against noise

local function out(...) io.write(string.format(...), "\n") io.stdout:flush() end
local MiB = 2 ^ 20
local t_start = remat.now()

-- ---- models and data ----

local function residual_mlp(n, d, p)
  remat.manual_seed(7)
  local layers = {}
  for i = 1, n do
    layers[i] = nn.Residual(nn.Sequential { nn.Linear(d, 4 * d), nn.GELU(), nn.Dropout(p), nn.Linear(4 * d, d) })
  end
  return nn.Sequential(layers)
end

local function gpt(c, p)
  remat.manual_seed(11)
  local layers = { nn.Embedding(c.vocab, c.d) }
  for _ = 1, c.blocks do layers[#layers + 1] = nn.TransformerBlock(c.d, c.heads, p) end
  layers[#layers + 1] = nn.LayerNorm(c.d)
  layers[#layers + 1] = nn.Linear(c.d, c.vocab)
  return nn.Sequential(layers)
end

-- Deterministic labels in 1..classes (a list, or rows of a list).
local function labels(n, classes, salt)
  local t = {}
  for i = 1, n do t[i] = (i * 7 + salt * 13) % classes + 1 end
  return t
end

local function mlp_task(n)
  local c = cfg.mlp
  remat.manual_seed(3)
  local x = remat.randn(c.batch, c.d)
  local lab = remat.tensor(labels(c.batch, c.d, 0))
  return { name = ("MLP-%d"):format(n), n = n, build = function() return residual_mlp(n, c.d, cfg.dropout) end,
           x = x, loss = function(y) return nn.cross_entropy(y, lab) end }
end

local function gpt_task()
  local c = cfg.gpt
  local xs, ls = {}, {}
  for b = 1, c.batch do
    xs[b] = labels(c.t, c.vocab, b)
    ls[b] = labels(c.t, c.vocab, b + 1)
  end
  local lab = remat.tensor(ls)
  return { name = ("GPT-%d"):format(c.blocks), n = c.blocks + 3, build = function() return gpt(c, cfg.dropout) end,
           x = remat.tensor(xs), loss = function(y) return nn.cross_entropy(y, lab) end }
end

-- ---- measuring ----

-- One training step; returns forward seconds, backward seconds, peak activation bytes.
local function step(m, task)
  collectgarbage()
  collectgarbage()
  remat.memory.reset_peak()
  local t0 = remat.now()
  local loss = task.loss(m(task.x))
  local t1 = remat.now()
  loss:backward()
  local t2 = remat.now()
  local peak = remat.memory.stats().peak_by_category.activation
  loss:free()
  m:zero_grad()
  return t1 - t0, t2 - t1, peak
end

local function median(t)
  local s = table.move(t, 1, #t, 1, {})
  table.sort(s)
  local n = #s
  if n == 0 then return 0 / 0 end
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end

-- The plan report of policy p on the task's input (dry runs only).
local function plan_of(task, p, m)
  m = m or task.build()
  collectgarbage()
  return m:plan(task.x, { policy = p, loss = task.loss })
end

-- The smallest budget a plan fits in, from policy.budget's documented error.
local function smallest_budget(task)
  local ok, err = pcall(plan_of, task, policy.budget(1))
  if ok then return 1 end
  return tonumber(tostring(err):match("policy%.budget%((%d+)%)"))
end

-- Runs every entry {label=, policy=} of list on the task, interleaved; fills in per
-- entry: time (median step s), fwd, ratio (median per-round ratio to entry 1 = none),
-- peak (measured), plan (report). Entry 1 must be none().
local function measure(task, list, rounds)
  local base_plan
  local kept = {}
  for _, e in ipairs(list) do
    e.model = task.build()
    local ok, plan = pcall(function()
      e.model:checkpoint(e.policy)
      return plan_of(task, nil, e.model) -- resolves and installs the policy's plan for x
    end)
    if ok then
      e.plan = plan
      base_plan = base_plan or e.plan
      e.steps, e.fwds, e.ratios, e.peaks = {}, {}, {}, {}
      kept[#kept + 1] = e
    else
      out("  %s %s: %s", task.name, e.label, tostring(plan):gsub("\n.*", ""))
    end
  end
  for i = #list, 1, -1 do list[i] = nil end
  table.move(kept, 1, #kept, 1, list)
  -- per-op timers on through the rounds; from the first measured round, each op call's
  -- cost becomes the time (mean less spikes) of its replays in these steps (else of its
  -- first runs: same load, same caches), which prices the replays
  C.op_timers(true)
  -- each round starts one entry later than the one before and wraps around: where the
  -- machine slows down within a round (memory bandwidth shared with neighbours), no
  -- entry is always the one that pays for it, and none runs twice in a row (as the
  -- ends of a list visited forth and back would)
  for r = 1, opts.warmup + rounds do
    -- learning starts over after the warm-up: a first step's replays fault in the pages
    -- of blocks the pool has just grown, which no later step pays
    if r == opts.warmup + 1 then C.opcost_learn(true) end
    local took = {}
    for j = 1, #list do
      local i = (r - 1 + j - 1) % #list + 1
      local e = list[i]
      C.op_timers(true) -- clears the totals: this step's replays alone
      local f, b, peak = step(e.model, task)
      e.peaks[#e.peaks + 1] = peak
      local rep = 0
      for _, t in pairs(C.op_timing()) do rep = rep + t.replay_seconds end
      took[i] = { f = f, b = b, rep = rep }
    end
    if r > opts.warmup then
      local none_t = took[1].f + took[1].b
      for i, e in ipairs(list) do
        local t = took[i]
        e.reps = e.reps or {}
        e.reps[#e.reps + 1] = t.rep
        e.steps[#e.steps + 1] = t.f + t.b
        e.fwds[#e.fwds + 1] = t.f
        e.ratios[#e.ratios + 1] = (t.f + t.b) / none_t
        e.overs = e.overs or {}
        e.overs[#e.overs + 1] = (t.f + t.b) - none_t
      end
    end
    io.write(("  %s round %d/%d done (%.0f s elapsed)\n"):format(task.name, r, opts.warmup + rounds, remat.now() - t_start))
    io.stdout:flush()
  end
  C.op_timers(false)
  C.opcost_learn(false)
  for _, e in ipairs(list) do
    e.alone_rec_s = e.plan.recompute_cost -- priced by op calls timed alone, at planning
    local pr = plan_of(task, nil, e.model) -- priced by the learned costs
    e.pred_rec_s, e.pred_step_s = pr.recompute_cost, pr.step_cost
  end
  for _, e in ipairs(list) do
    e.time, e.fwd, e.ratio, e.over = median(e.steps), median(e.fwds), median(e.ratios), median(e.overs)
    e.rep = median(e.reps)
    local s = table.move(e.ratios, 1, #e.ratios, 1, {})
    table.sort(s)
    e.q25, e.q75 = s[math.max(1, math.floor(#s * 0.25 + 0.5))], s[math.max(1, math.floor(#s * 0.75 + 0.5))]
    e.peak = math.max(table.unpack(e.peaks))
    e.peak_min = math.min(table.unpack(e.peaks))
    e.model = nil
  end
  collectgarbage()
  for _, e in ipairs(list) do
    e.mem_ratio = e.peak / list[1].peak
    e.pred_time = list[1].time + e.pred_step_s
  end
  return { step_flops = base_plan.flops }
end

local function policy_list(task, budgets)
  local list = {
    { label = "none()", policy = policy.none() },
    { label = ("every(sqrt N=%d)"):format(math.floor(math.sqrt(task.n) + 0.5)), policy = policy.sqrt(), key = "sqrt" },
    { label = "every(2)", policy = policy.every(2), key = "every2" },
    { label = "every(8)", policy = policy.every(8), key = "every8" },
    { label = "every(1)", policy = policy.every(1), key = "every1" },
    { label = "selective{softmax,gelu,dropout}", policy = policy.selective { "softmax", "gelu", "dropout" }, key = "selective" },
  }
  for _, b in ipairs(budgets) do
    list[#list + 1] = { label = ("budget(%.2f MiB)%s"):format(b.bytes / MiB, b.at and (" @" .. b.at) or ""),
                        policy = policy.budget(b.bytes), budget = b.bytes, main = b.main, at = b.at,
                        key = b.key or (b.main and ("budget" .. b.main)) or nil }
  end
  return list
end

-- Budgets between the sqrt() peak and none()'s (fractions 1/4, 1/2, 3/4), plus for
-- the sweep the smallest that fits, halfway to sqrt's, sqrt's own and 90% of none().
local function budgets_for(task, sweep, torch_rows)
  local none = plan_of(task, policy.none()).predicted_peak
  local sq = plan_of(task, policy.sqrt()).predicted_peak
  local e1 = plan_of(task, policy.every(1)).predicted_peak
  local b = {}
  -- budget() at the memory of every(sqrt N) and every(1), and of each PyTorch row
  b[#b + 1] = { bytes = sq, at = "every(sqrt N)", key = "at_sqrt" }
  b[#b + 1] = { bytes = e1, at = "every(1)", key = "at_every1" }
  for _, r in ipairs(torch_rows or {}) do
    if r.key ~= "none" and r.peak < none then
      b[#b + 1] = { bytes = r.peak, at = "torch " .. r.key, key = "at_torch_" .. r.key, torch = r }
    end
  end
  for i, f in ipairs { 0.25, 0.5, 0.75 } do b[#b + 1] = { bytes = math.floor(sq + f * (none - sq)), main = i } end
  if sweep then
    local lo = smallest_budget(task)
    if lo and lo < sq then
      table.insert(b, 1, { bytes = math.floor((lo + sq) / 2) })
      table.insert(b, 1, { bytes = lo })
    end
    b[#b + 1] = { bytes = math.floor(0.9 * none) }
  end
  return b, none, sq
end

-- ---- run: remat ----

local function loadavg()
  local f = io.open("/proc/loadavg")
  if not f then return "?" end
  local s = f:read("l")
  f:close()
  return s:match("^(%S+ %S+ %S+)") or "?"
end
out("remat checkpoint bench%s: MLP %d / GPT %d rounds after %d warm-up; OMP_NUM_THREADS=%s; load average %s",
  opts.quick and " (--quick)" or "", cfg.mlp.rounds, cfg.rounds, opts.warmup, os.getenv("OMP_NUM_THREADS") or "unset", loadavg())
out("omp wait: %s (see the top of this file)", remat.info().omp_wait)
out("MLP: N=%d, d=%d, batch %d, dropout %.1f | GPT: %d blocks, d=%d, %d heads, vocab %d, T=%d, batch %d",
  cfg.mlp.n, cfg.mlp.d, cfg.mlp.batch, cfg.dropout, cfg.gpt.blocks, cfg.gpt.d, cfg.gpt.heads, cfg.gpt.vocab, cfg.gpt.t, cfg.gpt.batch)

-- ---- run: PyTorch ----

local torch = { available = false, why = "not run (--no-torch)", rows = {}, sweep = {} }
if not opts.no_torch then
  local py
  for _, cand in ipairs { os.getenv("PYTHON") or "/work/venv-torch/bin/python", "/usr/bin/python3", "python3" } do
    if os.execute(cand .. " -c 'import torch' >/dev/null 2>&1") then py = cand break end
  end
  if not py then
    torch.why = "python3 cannot import torch (Debian: apt-get install python3-torch)"
  else
    local c, m = cfg.gpt, cfg.mlp
    local cmd = ("%s bench/checkpoint_torch.py --mlp-n=%d --mlp-d=%d --mlp-batch=%d --gpt-blocks=%d --gpt-d=%d --gpt-heads=%d --vocab=%d --t=%d --gpt-batch=%d --dropout=%g --rounds=%d --mlp-rounds=%d --warmup=%d --sweep-n=%s")
      :format(py, m.n, m.d, m.batch, c.blocks, c.d, c.heads, c.vocab, c.t, c.batch, cfg.dropout, cfg.rounds, m.rounds, opts.warmup,
        table.concat(cfg.sweep_n, ","))
    out("running PyTorch: %s", cmd)
    local p = io.popen(cmd .. " 2>&1")
    for line in p:lines() do
      local f = {}
      for field in line:gmatch("[^\t]+") do f[#f + 1] = field end
      if f[1] == "VERSION" then torch.version = f[2] torch.available = true
      elseif f[1] == "RESULT" then
        torch.rows[f[2] .. "/" .. f[3]] = { label = f[4], time = tonumber(f[5]), ratio = tonumber(f[6]),
                                             peak = tonumber(f[7]), mem_ratio = tonumber(f[8]),
                                             q25 = tonumber(f[9]), q75 = tonumber(f[10]) }
      elseif f[1] == "SWEEP" then
        torch.sweep[#torch.sweep + 1] = { n = tonumber(f[2]), key = f[3], peak = tonumber(f[4]) }
      elseif f[1] == "NOTE" then out("  torch: %s", f[2])
      elseif line:match("^USDT:") or line:match("gpuGetDeviceCount") then -- the profiler's chatter
      else out("  torch> %s", line) end
    end
    local ok = p:close()
    if not ok then torch.why = "bench/checkpoint_torch.py failed (output above)" torch.available = torch.version ~= nil end
  end
end

-- PyTorch's rows of one model, with their keys.
local function torch_list(model_key)
  local t = {}
  for k, r in pairs(torch.rows) do
    local m, key = k:match("^(%w+)/(.+)$")
    if m == model_key then r.key = key t[#t + 1] = r end
  end
  table.sort(t, function(a, b) return a.peak < b.peak end)
  return t
end

local results = {}
local mlp = mlp_task(cfg.mlp.n)
local mlp_budgets = budgets_for(mlp, true, torch_list("mlp"))
local mlp_list = policy_list(mlp, mlp_budgets)
results[#results + 1] = { task = mlp, list = mlp_list, info = measure(mlp, mlp_list, cfg.mlp.rounds) }

local g = gpt_task()
local gpt_budgets = budgets_for(g, false, torch_list("gpt"))
local gpt_list = policy_list(g, gpt_budgets)
results[#results + 1] = { task = g, list = gpt_list, info = measure(g, gpt_list, cfg.rounds) }

-- Peak activation against N (memory only: one step per point after one warm-up).
local sweep = {}
local sweep_policies = {
  { key = "none", make = function() return policy.none() end },
  { key = "sqrt", make = function() return policy.sqrt() end },
  { key = "every2", make = function() return policy.every(2) end },
  { key = "every8", make = function() return policy.every(8) end },
  { key = "selective", make = function() return policy.selective { "softmax", "gelu", "dropout" } end },
  { key = "budget50", make = function(none_peak) return policy.budget(math.floor(none_peak / 2)) end },
}
for _, n in ipairs(cfg.sweep_n) do
  local task = mlp_task(n)
  local row = { n = n }
  local none_peak
  for _, sp in ipairs(sweep_policies) do
    local m = task.build()
    local ok, err = pcall(function()
      m:checkpoint(sp.make(none_peak))
      plan_of(task, nil, m)
      step(m, task)
      local _, _, peak = step(m, task)
      row[sp.key] = peak
      none_peak = none_peak or peak
    end)
    if not ok then out("  N=%d %s: %s", n, sp.key, tostring(err)) end
  end
  sweep[#sweep + 1] = row
  out("  N=%d sweep done (%.0f s elapsed)", n, remat.now() - t_start)
end

-- ---- tables ----

local function torch_cols(model_key, e)
  local r = e.key and torch.rows[model_key .. "/" .. e.key] or (e.label == "none()" and torch.rows[model_key .. "/none"])
  if not r then return ("%7s %7s"):format("-", "-") end
  return ("%6.3fx %6.3fx"):format(r.ratio, r.mem_ratio)
end

for _, res in ipairs(results) do
  local task, list = res.task, res.list
  local mk = task.name:match("^MLP") and "mlp" or "gpt"
  out("")
  out("== %s (%d layers in the Sequential): none() step %.3f s (fwd %.3f s)", task.name, task.n, list[1].time, list[1].fwd)
  out("   rec ms: predicted replay time, per-op costs learned in these rounds (a call's replays, else its first runs); alone: as planned (ops timed alone);")
  out("   meas: the replays' measured time in a step (per-op timers, median over rounds)")
  out("   credit: what backward saves reading hot what the replays made (the cost model's cache credit, remat plan)")
  out("   pred x: none()'s step + rec ms - credit, over none()'s step; err: time x (median of per-round ratios) vs pred x")
  out("%-40s %7s %7s %11s %8s %7s %8s %7s %7s %7s %7s %7s %7s %6s | %7s %7s", "policy", "step s", "time x", "q25-q75",
    "peak MiB", "mem x", "pred MiB", "pred/ms", "rec ms", "credit", "meas", "alone", "pred x", "err", "torch t", "torch m")
  for _, e in ipairs(list) do
    local err = e.ratio / (e.pred_time / list[1].time) - 1
    out("%-40s %7.3f %6.3fx %5.2f-%5.2f %8.2f %6.3fx %8.2f %7.3f %7.2f %7.2f %7.2f %7.2f %6.3fx %+5.1f%% | %s", e.label:sub(1, 40),
      e.time, e.ratio, e.q25, e.q75, e.peak / MiB, e.mem_ratio, e.plan.predicted_peak / MiB, e.plan.predicted_peak / e.peak,
      e.pred_rec_s * 1e3, (e.pred_rec_s - e.pred_step_s) * 1e3, e.rep * 1e3, e.alone_rec_s * 1e3, e.pred_time / list[1].time,
      100 * err, torch_cols(mk, e))
    if e.peak ~= e.peak_min then out("    (peak varied between steps: %d .. %d bytes)", e.peak_min, e.peak) end
    if e.budget and e.peak > e.budget then out("    (peak over its budget of %d bytes)", e.budget) end
  end
end

if torch.available then
  out("")
  out("PyTorch %s (torch.utils.checkpoint: every(k) non-reentrant per segment, checkpoint_sequential reentrant,", torch.version)
  out("  selective rows: create_selective_checkpoint_contexts around each layer; no budget planner)")
  out("  %-6s %-40s %9s %8s %11s %10s %8s", "model", "policy", "step s", "time x", "q25-q75", "peak MiB", "mem x")
  local keys = {}
  for k in pairs(torch.rows) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b)
    local ma, mb = a:match("^(%w+)"), b:match("^(%w+)")
    if ma ~= mb then return ma > mb end
    return torch.rows[a].ratio < torch.rows[b].ratio
  end)
  for _, k in ipairs(keys) do
    local r = torch.rows[k]
    out("  %-6s %-40s %9.3f %7.3fx %5.2f-%5.2f %10.2f %7.3fx", k:match("^(%w+)"), r.label, r.time, r.ratio, r.q25, r.q75,
      r.peak / MiB, r.mem_ratio)
  end
else
  out("")
  out("PyTorch: %s", torch.why)
end

-- ---- targets ----

local function find(list, key) for _, e in ipairs(list) do if e.key == key then return e end end end
local function met(ok) return ok and "met" or "NOT met" end
out("")
out("targets:")
local sq = find(mlp_list, "sqrt")
out("  MLP-%d every(sqrt N): time %.3fx (target <= 1.30x: %s), activation %.3fx", cfg.mlp.n, sq.ratio, met(sq.ratio <= 1.30),
  sq.mem_ratio)
local sel = find(gpt_list, "selective")
out("  GPT selective{softmax,gelu,dropout}: time %.3fx (target <= 1.08x: %s), activation %.3fx", sel.ratio,
  met(sel.ratio <= 1.08), sel.mem_ratio)
-- Whether two plan reports keep, drop and replay the same things layer by layer (then
-- their steps run the same ops, and a difference in time is the machine's).
local function same_plan(a, b)
  if #a.layers ~= #b.layers then return false end
  for i, l in ipairs(a.layers) do
    local m = b.layers[i]
    if l.action ~= m.action or table.concat(l.recomputes or {}, ",") ~= table.concat(m.recomputes or {}, ",") then
      return false
    end
  end
  return true
end
local worst, nplans, errs = 0, 0, {}
for _, res in ipairs(results) do
  for i, e in ipairs(res.list) do
    local err = e.ratio / (e.pred_time / res.list[1].time) - 1
    nplans = nplans + 1
    if i > 1 then errs[#errs + 1] = err end
    if math.abs(err) > math.abs(worst) then worst = err end
  end
end
out("  measured/predicted step time: worst %+.1f%% over %d plans, median %+.1f%% (target within 3%%: %s)", 100 * worst, nplans,
  100 * median(errs), met(math.abs(worst) <= 0.03))
-- The noise floor under that target: rows whose plans are the same (every(8) is
-- every(sqrt N) at N = 64; a budget() row may equal an every(k) row) run the same ops, so
-- what separates their measured times is the machine.
local apart, npairs, which = 0, 0, ""
for _, res in ipairs(results) do
  for i = 2, #res.list do
    for j = i + 1, #res.list do
      local a, b = res.list[i], res.list[j]
      if same_plan(a.plan, b.plan) then
        local d = math.abs(a.ratio / b.ratio - 1)
        npairs = npairs + 1
        if d > apart then apart, which = d, ("%s: %s %.3fx, %s %.3fx"):format(res.task.name, a.label, a.ratio, b.label, b.ratio) end
      end
    end
  end
end
if npairs > 0 then
  out("  the same plan measured twice in this run: up to %.1f%% apart over %d pairs (%s)", 100 * apart, npairs, which)
end
local rworst, rplans = 0, 0
for _, res in ipairs(results) do
  for _, e in ipairs(res.list) do
    if e.pred_rec_s > 0 then
      local err = e.rep / e.pred_rec_s - 1
      rplans = rplans + 1
      if math.abs(err) > math.abs(rworst) then rworst = err end
    end
  end
end
out("  measured/predicted replay time (per-op timers, inside the step): worst %+.1f%% over %d plans", 100 * rworst, rplans)
for _, res in ipairs(results) do
  for _, pair in ipairs { { "at_sqrt", "sqrt" }, { "at_every1", "every1" } } do
    local b, ref = find(res.list, pair[1]), find(res.list, pair[2])
    if b and ref then
      local same = same_plan(b.plan, ref.plan)
      out("  %s budget() at %s's memory: %.3fx vs %.3fx, peak %.2f vs %.2f MiB (target: not slower: %s)", res.task.name,
        ref.label, b.ratio, ref.ratio, b.peak / MiB, ref.peak / MiB,
        same and "met: the same plan" or met(b.ratio <= ref.ratio))
    end
  end
end
if torch.available then
  for _, res in ipairs(results) do
    local mk = res.task.name:match("^MLP") and "mlp" or "gpt"
    for _, r in ipairs(torch_list(mk)) do
      local b = find(res.list, "at_torch_" .. r.key)
      if b then
        out("  %s budget() at PyTorch %s's memory (%.2f MiB): %.3fx vs PyTorch's %.3fx of its none() (%s); %.3f vs %.3f s",
          res.task.name, r.label, r.peak / MiB, b.ratio, r.ratio, met(b.ratio <= r.ratio), b.time, r.time)
      elseif r.key ~= "none" then
        out("  %s PyTorch %s (%.2f MiB, %.3fx): no budget() plan at that memory (below remat's smallest, or above none()'s)",
          res.task.name, r.label, r.peak / MiB, r.ratio)
      end
    end
  end
end

-- ---- data files and plots ----

os.execute("mkdir -p " .. opts.out)
local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

local lines = { "# N none sqrt every2 every8 selective budget50 torch_none torch_sqrt (MiB; ? = not measured)" }
local tsweep = {}
for _, s in ipairs(torch.sweep) do tsweep[s.n .. s.key] = s.peak end
for _, row in ipairs(sweep) do
  local f = { tostring(row.n) }
  for _, k in ipairs { "none", "sqrt", "every2", "every8", "selective", "budget50" } do
    f[#f + 1] = row[k] and ("%.3f"):format(row[k] / MiB) or "?"
  end
  for _, k in ipairs { "none", "sqrt" } do
    local v = tsweep[row.n .. k]
    f[#f + 1] = v and ("%.3f"):format(v / MiB) or "?"
  end
  lines[#lines + 1] = table.concat(f, " ")
end
write(opts.out .. "/checkpoint_memory.dat", table.concat(lines, "\n") .. "\n")

lines = { "# budget_MiB measured_time_x(median) predicted_time_x peak_MiB q25 q75 (MLP-" .. cfg.mlp.n .. ")" }
local bl = {}
for _, e in ipairs(mlp_list) do if e.budget then bl[#bl + 1] = e end end
table.sort(bl, function(a, b) return a.budget < b.budget end)
for _, e in ipairs(bl) do
  lines[#lines + 1] = ("%.3f %.4f %.4f %.3f %.4f %.4f"):format(e.budget / MiB, e.ratio, e.pred_time / mlp_list[1].time,
    e.peak / MiB, e.q25, e.q75)
end
write(opts.out .. "/checkpoint_budget.dat", table.concat(lines, "\n") .. "\n")

-- The time-memory frontier per model: three blocks (gnuplot index 0, 1, 2) of
-- "peak_MiB time_x label": remat budget(), remat's fixed policies, PyTorch's rows.
for _, res in ipairs(results) do
  local mk = res.task.name:match("^MLP") and "mlp" or "gpt"
  local b, f = {}, {}
  for _, e in ipairs(res.list) do
    if e.budget then b[#b + 1] = e elseif e.key or e.label == "none()" then f[#f + 1] = e end
  end
  table.sort(b, function(x, y) return x.peak < y.peak end)
  table.sort(f, function(x, y) return x.peak < y.peak end)
  local L = { "# " .. res.task.name .. ": peak_MiB time_x label (blocks: remat budget(); remat fixed policies; PyTorch)" }
  for _, e in ipairs(b) do L[#L + 1] = ("%.4f %.4f \"%s\""):format(e.peak / MiB, e.ratio, e.label) end
  L[#L + 1] = "\n"
  for _, e in ipairs(f) do L[#L + 1] = ("%.4f %.4f \"%s\""):format(e.peak / MiB, e.ratio, e.label) end
  L[#L + 1] = "\n"
  for _, r in ipairs(torch_list(mk)) do L[#L + 1] = ("%.4f %.4f \"%s\""):format(r.peak / MiB, r.ratio, r.label) end
  if #torch_list(mk) == 0 then L[#L + 1] = "? ? \"none\"" end
  write(opts.out .. "/checkpoint_frontier_" .. mk .. ".dat", table.concat(L, "\n") .. "\n")
end

local function refs(list)
  local t = {}
  for _, e in ipairs(list) do
    if e.key == "sqrt" or e.key == "every2" or e.label == "none()" then t[#t + 1] = e end
  end
  return t
end
local marks = {}
for _, e in ipairs(refs(mlp_list)) do
  marks[#marks + 1] = ("set label \"%s\" at %.3f,%.4f point pt 7 offset -1,-1 right font ',9'"):format(
    e.label, e.peak / MiB, e.ratio)
end

local gp = ([[
set terminal pngcairo size 900,600 noenhanced
set output '%s/checkpoint_memory.png'
set title 'Residual MLP (d=%d, batch %d): measured peak activation vs depth N'
set xlabel 'layers N'
set ylabel 'peak activation (MiB)'
set logscale xy 2
set xtics (8, 16, 32, 64)
set xrange [7:72]
set key top left
set grid
set datafile missing '?'
plot '%s/checkpoint_memory.dat' u 1:2 w lp lw 2 t 'none()', \
     '' u 1:3 w lp lw 2 t 'every(sqrt N)', \
     '' u 1:4 w lp lw 2 t 'every(2)', \
     '' u 1:5 w lp lw 2 t 'every(8)', \
     '' u 1:6 w lp lw 2 t 'selective{softmax,gelu,dropout}', \
     '' u 1:7 w lp lw 2 t 'budget(none/2)', \
     '' u 1:8 w lp dt 2 t 'PyTorch none', \
     '' u 1:9 w lp dt 2 t 'PyTorch every(sqrt N)'
set output '%s/checkpoint_budget.png'
unset logscale
set xtics auto
set xrange [0:*]
set yrange [0.8:*]
set title 'Residual MLP N=%d: step time vs activation budget (relative to none(); dots: every(k) at their peak)'
set xlabel 'budget (MiB)'
set ylabel 'step time / none() step time'
set key top right
%s
plot '%s/checkpoint_budget.dat' u 1:2 w lp lw 2 pt 7 t 'budget(b): measured (median of per-round ratios)', \
     '' u 1:2:5:6 w yerrorbars lc 1 pt 0 t 'quartiles of the per-round ratios', \
     '' u 1:3 w lp lw 2 dt 2 t 'predicted: none + replay time (per-op costs)'
set datafile missing '?'
set yrange [0.9:*]
set xrange [0:*]
unset label
set xlabel 'measured peak activation (MiB)'
set ylabel 'step time / the framework''s own none() step time'
set key top right
set output '%s/checkpoint_frontier_mlp.png'
set title 'Residual MLP N=%d: time-memory frontier, remat budget() vs every(k) vs PyTorch %s'
plot '%s/checkpoint_frontier_mlp.dat' index 0 u 1:2 w lp lw 2 pt 7 t 'remat budget(b)', \
     '' index 1 u 1:2:3 w labels point pt 5 offset 1,0.5 left font ',8' t 'remat fixed policies', \
     '' index 2 u 1:2:3 w labels point pt 9 offset 1,-0.5 left font ',8' t 'PyTorch'
set output '%s/checkpoint_frontier_gpt.png'
set title 'GPT-%d: time-memory frontier, remat budget() vs every(k) vs PyTorch %s'
plot '%s/checkpoint_frontier_gpt.dat' index 0 u 1:2 w lp lw 2 pt 7 t 'remat budget(b)', \
     '' index 1 u 1:2:3 w labels point pt 5 offset 1,0.5 left font ',8' t 'remat fixed policies', \
     '' index 2 u 1:2:3 w labels point pt 9 offset 1,-0.5 left font ',8' t 'PyTorch'
]]):format(opts.out, cfg.mlp.d, cfg.mlp.batch, opts.out, opts.out, cfg.mlp.n, table.concat(marks, "\n"), opts.out,
  opts.out, cfg.mlp.n, torch.version or "(not run)", opts.out, opts.out, cfg.gpt.blocks, torch.version or "(not run)", opts.out)
write(opts.out .. "/checkpoint_plots.gp", gp)
if not opts.no_plots then
  if os.execute("gnuplot " .. opts.out .. "/checkpoint_plots.gp") then
    out("")
    out("plots: %s/checkpoint_memory.png, %s/checkpoint_budget.png, %s/checkpoint_frontier_{mlp,gpt}.png", opts.out, opts.out,
      opts.out)
  else
    out("gnuplot failed or is missing: data in %s/*.dat, script %s/checkpoint_plots.gp", opts.out, opts.out)
  end
end
out("total %.0f s; load average %s", remat.now() - t_start, loadavg())
