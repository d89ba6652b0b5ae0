-- model:checkpoint(policy) and model:plan(x): turning a policy into a plan installed
-- on a Sequential, resolved at the first forward for policies that need sizes.
local remat = package.loaded.remat
local C = remat._C
local nn, policy = remat.nn, remat.policy
local Module = nn.Module
local fail = remat._fail

-- The Lua policy value set on each model (the core holds what it plans from).
local policies = setmetatable({}, { __mode = "k" })

-- The optimizer of a model: opt when given, else the one that updates its first
-- parameter (remat.optim keeps track), or nil.
local function optimizer_of(model, opt)
  if opt ~= nil then return opt end
  local params = model:parameters()
  return params[1] and remat.optim.owner_of(params[1]) or nil
end

-- Optimizer state a whole-step plan must leave room for: what the optimizer has yet to
-- make (from its first step on, that lives through every step).
local function optim_extra(model, opt)
  opt = optimizer_of(model, opt)
  return opt and opt:step_bytes() or 0
end

-- The whole training step of a dry run sim: its peak over every category (forward,
-- loss, backward with its gradients; the optimizer step updates in place) and the bytes
-- by category there, with the state the optimizer has yet to make added.
local function whole_step(sim, opt)
  local cats = {}
  for k, v in pairs(sim.step_by_category) do cats[k] = v end
  local extra = opt and opt:step_bytes() or 0
  cats.optim = cats.optim + extra
  return sim.step_peak + extra, cats
end

-- A policy constructor passed uncalled (policy.every instead of policy.every(4)).
local function constructor_name(f)
  for name, v in pairs(policy) do
    if v == f and name ~= "custom" and name ~= "is_policy" then return name end
  end
end

local function as_policy(p, where)
  local ctor = type(p) == "function" and constructor_name(p)
  if ctor then
    fail(("%s: policy.%s is a constructor: call it (policy.%s(...)) to get a policy"):format(where, ctor, ctor))
  end
  if type(p) == "function" then return policy.custom(p) end
  if p == nil then return policy.none() end
  if not policy.is_policy(p) then
    fail(("%s: expected a policy (remat.policy.every(4), sqrt(), selective{...}, budget(\"1GiB\"), none()) or a function, got %s"):format(
      where, type(p)))
  end
  return p
end

-- What the core plans from: the policy's description, and for a whole-step budget
-- planned at a forward, how to find the optimizer state it must leave room for.
local function description(p)
  if p.kind == "budget" and p.whole_step then
    return setmetatable({ extra = optim_extra }, { __index = p })
  end
  return p
end

-- Sets the checkpoint policy of a Sequential (the core plans it now, or at the first
-- forward when it needs sizes, and again when layers are added); returns the model.
function Module:checkpoint(p)
  p = as_policy(p, "checkpoint")
  C.checkpoint_set(self, description(p))
  policies[self] = p
  return self
end

function Module:checkpoint_policy()
  -- a policy that failed at a forward was uninstalled by the core
  return C.checkpoint_name(self) and policies[self] or nil
end

local PlanReport = {}
PlanReport.__index = PlanReport

local function fmt_flops(f)
  if f >= 1e12 then return ("%.2f TF"):format(f / 1e12) end
  if f >= 1e9 then return ("%.2f GF"):format(f / 1e9) end
  if f >= 1e6 then return ("%.2f MF"):format(f / 1e6) end
  return ("%.0f F"):format(f)
end

PlanReport.__tostring = function(r)
  local fmt = remat.memory.format
  local w = #"module"
  for _, l in ipairs(r.layers) do w = math.max(w, #l.name) end
  local row = "%5s  %-" .. w .. "s %-10s %12s %12s %10s"
  local lines = { ("plan for %s: %d layers"):format(r.policy, #r.layers),
    row:format("layer", "module", "action", "saved", "output", "flops") }
  for _, l in ipairs(r.layers) do
    local line = row:format(l.index, l.name, l.action, fmt(l.saved_bytes), fmt(l.output_bytes), fmt_flops(l.flops))
    if l.selective then
      line = line .. (#l.recomputes > 0 and "  recomputes {" .. table.concat(l.recomputes, ", ") .. "}"
        or "  (has no output of {" .. table.concat(l.selective, ", ") .. "} to drop)")
    end
    lines[#lines + 1] = line
  end
  lines[#lines + 1] = "saved: activation bytes the layer allocates in forward that stay alive for backward"
  lines[#lines + 1] = ("predicted peak activation: %s (keep everything: %s)"):format(fmt(r.predicted_peak), fmt(r.keep_peak))
  lines[#lines + 1] = ("recompute: %s (%.1f%% of the forward's %s); predicted replay time %.3f ms"):format(fmt_flops(r.recompute_flops),
    r.flops > 0 and 100 * r.recompute_flops / r.flops or 0, fmt_flops(r.flops), r.recompute_cost * 1e3)
  local MiB = 1024 * 1024
  lines[#lines + 1] = ("predicted step time added: %.3f ms (the replays less the cache credit)"):format(r.step_cost * 1e3)
  lines[#lines + 1] = "cost model: a replay costs the measured time of its ops on this device (each distinct op call"
  lines[#lines + 1] = ("  timed alone at first use and cached; one that cannot be is priced by FLOPs + bytes x %g);"):format(r.flops_per_byte)
  lines[#lines + 1] = "  cache credit: the backward right after a replay reads from cache what keeping would read"
  lines[#lines + 1] = ("  from memory: %.3f ms per MiB of activations no longer kept and %.3f per MiB of weights"):format(
    r.credit.activation * MiB * 1e3, r.credit.param * MiB * 1e3)
  lines[#lines + 1] = "  a replay read, for the share of a replay's bytes a working set of that size keeps in cache"
  lines[#lines + 1] = "  (a memory probe at 1 .. 64 MiB, at first use; 0 when the step fits the caches)"
  lines[#lines + 1] = "  peaks count bytes as the engine holds them (a budget plan's equals its dry run's)"
  local selective, softmax = false, false
  for _, l in ipairs(r.layers) do
    if l.selective and #l.recomputes > 0 then
      selective = true
      for _, op in ipairs(l.recomputes) do softmax = softmax or op == "softmax" end
    end
  end
  if selective then
    lines[#lines + 1] = "  a selective layer rebuilds what it drops from the nearest tensors it keeps, each op once"
  end
  if softmax then
    lines[#lines + 1] = "  (a dropped softmax replays its scores' op too: attention's q.k^T; on the CPU's float32"
    lines[#lines + 1] = "  tiles the two run as one op, matmul_softmax, which never stores the scores)"
  end
  local parts = {}
  for _, c in ipairs { "param", "grad", "optim", "activation", "workspace", "temp", "data" } do
    if (r.step_by_category[c] or 0) > 0 then parts[#parts + 1] = c .. " " .. fmt(r.step_by_category[c]) end
  end
  lines[#lines + 1] = ("predicted whole-step peak: %s (%s)"):format(fmt(r.step_peak), table.concat(parts, ", "))
  return table.concat(lines, "\n")
end

-- For each selective layer of plan, the ops among those it names whose outputs it
-- really stops keeping: each op alone made selective on those layers, in a dry run,
-- must lower the layer's saved bytes below keeping everything.
local function recomputed_ops(model, x, loss, plan, keep)
  local res, by_op = {}, {}
  for i, a in ipairs(plan) do
    if a.action == "selective" then
      res[i] = {}
      for _, op in ipairs(a.ops) do
        if not by_op[op] then
          local p = {}
          for k, b in ipairs(plan) do
            local named = false
            for _, o in ipairs(b.ops or {}) do named = named or o == op end
            p[k] = (b.action == "selective" and named) and { action = "selective", ops = { op } } or { action = "keep" }
          end
          by_op[op] = C.plan_simulate(model, x, p, loss, true).layers
        end
        if by_op[op][i].saved < keep.layers[i].saved then res[i][#res[i] + 1] = op end
      end
    end
  end
  return res
end

-- A plan from the core names a selective layer's ops as a set; list them in the
-- order the policy gave them (budget: policy.cheap_ops).
local function in_policy_order(plan, p)
  local rank = {}
  for i, op in ipairs(p.ops or policy.cheap_ops) do rank[op] = i end
  local function before(a, b)
    local ra, rb = rank[a] or math.huge, rank[b] or math.huge
    if ra ~= rb then return ra < rb end
    return a < b
  end
  for _, l in ipairs(plan) do
    if l.ops then table.sort(l.ops, before) end
  end
  return plan
end

-- The plan the model's policy (or opts.policy) gives for input x, with its predicted
-- peak activation bytes and recompute FLOPs, from dry runs (nothing is computed).
-- opts.loss: function(y) -> scalar loss used in the dry run (default: backward from y).
-- opts.optimizer: the optimizer of the step (default: the one that updates the model's
-- parameters, if any), for step_peak: the whole step's peak bytes, every category, and
-- step_by_category, the bytes of each category at that peak.
function Module:plan(x, opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("plan: options must be a table", 2) end
  if not x then error("plan: needs an example input (model:plan(x))", 2) end
  -- predicts a step, which begins with a collection: both dry runs below start clean
  if C.step_collect() then collectgarbage() end
  local extra = optim_extra(self, opts.optimizer)
  local p, plan
  if opts.policy then
    p = as_policy(opts.policy, "plan")
    plan = C.policy_plan(self, x, p, opts.loss, extra)
  else
    -- the plan training will use (planned now for x when the policy needs sizes)
    plan = C.checkpoint_prepare(self, x, opts.loss, extra)
    p = plan and policies[self] or policy.none()
    plan = plan or C.policy_plan(self, x, p)
  end
  in_policy_order(plan, p)
  local sim = C.plan_simulate(self, x, plan, opts.loss, true)
  local keep = C.plan_simulate(self, x, false, opts.loss, true)
  local actions = {}
  for i = 1, #plan do actions[i] = plan[i].action end
  local step_cost, credit_act, credit_param, credit_cold = C.plan_step_cost(x, sim, keep, actions)
  local recomputes = recomputed_ops(self, x, opts.loss, plan, keep)
  local info = C.layer_info(self)
  local step_peak, step_cats = whole_step(sim, optimizer_of(self, opts.optimizer))
  local report = setmetatable({ policy = tostring(p), layers = {}, predicted_peak = sim.peak,
    recompute_flops = sim.recompute_flops, recompute_cost = sim.recompute_cost, flops_per_byte = sim.flops_per_byte,
    step_cost = step_cost, credit = { activation = credit_act, param = credit_param, cold = credit_cold },
    flops = sim.flops, keep_peak = keep.peak, base = sim.base,
    step_peak = step_peak, step_by_category = step_cats }, PlanReport)
  for i, l in ipairs(sim.layers) do
    report.layers[i] = {
      index = i, name = remat.nn.layer_name(self, i, info[i].describe), type = info[i].type, action = plan[i].action,
      selective = plan[i].action == "selective" and plan[i].ops or nil, recomputes = recomputes[i],
      saved_bytes = l.saved, output_bytes = l.out_bytes, flops = l.flops, param_bytes = l.param_bytes,
      recompute_flops = l.recompute_flops,
    }
  end
  return report
end

return true
