-- Checkpoint policies: Lua values that become a plan (one action per layer of a
-- Sequential) which the C engine executes. See DESIGN.md, "The checkpoint engine".
local remat = package.loaded.remat
local C = remat._C
local policy = {}
remat.policy = policy

local Policy = {}
Policy.__index = Policy
Policy.__tostring = function(p) return "remat.policy." .. p.name end

local function new(name, fields)
  fields.name = name
  return setmetatable(fields, Policy)
end

function policy.is_policy(p) return getmetatable(p) == Policy end

-- Ops a selective policy may name: the registry's user-facing names.
local function known_ops()
  local set, list = {}, {}
  for _, op in ipairs(C.op_list()) do
    if op.implemented and not op.internal then
      set[op.name] = true
      list[#list + 1] = op.name
    end
  end
  return set, list
end

local function check_ops(ops, where)
  if type(ops) ~= "table" or #ops == 0 then
    error(("%s: expected a list of op names such as {\"softmax\", \"gelu\"}"):format(where), 3)
  end
  local set, list = known_ops()
  for _, name in ipairs(ops) do
    if not set[name] then
      error(("%s: unknown op '%s' (known ops: %s)"):format(where, tostring(name), table.concat(list, ", ")), 3)
    end
  end
  return ops
end

local function uniform(n, action, ops)
  local plan = {}
  for i = 1, n do plan[i] = { action = action, ops = ops } end
  return plan
end

-- Keep everything (no checkpointing).
function policy.none()
  return new("none()", { resolve = function(n) return uniform(n, "keep") end })
end

-- A boundary at layers 1, k+1, 2k+1, ...; the layers between are recomputed.
function policy.every(k)
  if math.type(k) ~= "integer" or k < 1 then
    error("policy.every: k must be an integer >= 1, got " .. tostring(k), 2)
  end
  return new(("every(%d)"):format(k), {
    k = k,
    resolve = function(n)
      local plan = {}
      for i = 1, n do plan[i] = { action = (i - 1) % k == 0 and "boundary" or "recompute" } end
      return plan
    end,
  })
end

-- every(k) with k = round(sqrt(N)).
function policy.sqrt()
  return new("sqrt()", {
    resolve = function(n)
      local k = math.max(1, math.floor(math.sqrt(n) + 0.5))
      return policy.every(k).resolve(n)
    end,
  })
end

-- Every layer selective: outputs of the named ops are recomputed in backward.
function policy.selective(ops)
  check_ops(ops, "policy.selective")
  local copy = table.move(ops, 1, #ops, 1, {})
  return new(("selective{%s}"):format(table.concat(copy, ", ")), {
    ops = copy,
    resolve = function(n) return uniform(n, "selective", copy) end,
  })
end

-- Cheap-to-recompute ops a budget plan may make selective.
policy.cheap_ops = { "softmax", "log_softmax", "gelu", "silu", "relu", "sigmoid", "tanh", "dropout" }

local function parse_budget(b)
  local bytes = C.parse_bytes(b)
  if not bytes then
    error(("policy.budget: cannot read %s as a size (examples: 2GiB, 512MiB, 1e9)"):format(
      type(b) == "string" and ("'" .. b .. "'") or tostring(b)), 3)
  end
  return bytes
end

local function plan_of(actions, ops)
  local plan = {}
  for i, a in ipairs(actions) do plan[i] = { action = a, ops = a == "selective" and ops or nil } end
  return plan
end

-- With a size b (bytes or "2GiB"): the plan with the least recompute whose activation
-- peak is <= b. With no argument: the plan with the least recompute whose whole
-- training step (forward, loss, backward with its gradients, the optimizer step with
-- its state; parameters, data and everything else live) fits in what the memory limit
-- of the input's device allows (on CUDA without a limit: what the device has).
-- Recompute is priced as a roofline: FLOPs + bytes moved x the device's FLOPs per byte,
-- so memory-bound ops (softmax, gelu, dropout) are not taken for free. The DP's memory
-- model is the engine's (core/chain_dp.c): its plan's peak is the dry run's, so one
-- simulation verifies it. For the whole step, the DP budgets activations with what the
-- rest of the step holds at keep-everything's peak set aside; the simulation of the
-- whole step is the truth, and the DP's budget is tightened by what a plan overshoots.
function policy.budget(b)
  local whole = b == nil
  local bytes = not whole and parse_budget(b) or nil
  return new(whole and "budget()" or ("budget(%s)"):format(remat.memory.format(bytes)), {
    bytes = bytes,
    whole_step = whole,
    needs_input = true,
    resolve = function(n, ctx)
      local limit, peak_of = bytes, function(sim) return sim.peak end
      if whole then
        limit = ctx.room()
        if not limit then
          error("policy.budget(): no memory limit is set for the step to fit in; set one with "
            .. "remat.memory.limit(\"1GiB\"), or give an activation budget: policy.budget(\"512MiB\")", 0)
        end
        peak_of = ctx.step_peak
      end
      local keep = ctx.keep_stats()
      local keep_peak = peak_of(keep)
      if keep_peak <= limit then return uniform(n, "keep") end
      local ops = {}
      local set = known_ops()
      for _, op in ipairs(policy.cheap_ops) do if set[op] then ops[#ops + 1] = op end end
      -- A layer whose selective run evicts its own output (a lone GELU) offers no
      -- selective choice; measure the others with it kept, as the DP will place them.
      local selplan = uniform(n, "selective", ops)
      local sel = ctx.simulate(selplan, true)
      local again = false
      for i = 1, n do
        if sel.layers[i].out_live ~= keep.layers[i].out_live then selplan[i], again = { action = "keep" }, true end
      end
      if again then sel = ctx.simulate(selplan, true) end
      local chain = C.chain_from_sims(keep, sel)
      local m = limit - (keep_peak - keep.peak) - keep.base
      local actions = C.chain_optimal(chain, m)
      local first = actions
      for _ = 1, whole and 8 or 1 do
        if not actions then break end
        local plan = plan_of(actions, ops)
        local over = peak_of(ctx.simulate(plan)) - limit
        if over <= 0 then return plan end
        m = m - over - 1
        actions = C.chain_optimal(chain, m)
      end
      -- The model and the dry run disagree (a layer the model does not describe, or the
      -- rest of the step at another moment): DP plans over a sweep of modelled budgets
      -- and every(k); the fitting one with the least recompute wins.
      local best, best_cost, smallest = nil, math.huge, math.huge
      local function try(plan)
        local sim = ctx.simulate(plan)
        local peak = peak_of(sim)
        smallest = math.min(smallest, peak)
        if peak <= limit and sim.recompute_cost < best_cost then
          best, best_cost = plan, sim.recompute_cost
        end
      end
      local _, min_actions = C.chain_min_peak(chain)
      try(plan_of(min_actions, ops))
      if first or whole then
        local hi = keep.peak - keep.base
        for i = 0, 23 do
          local a = C.chain_optimal(chain, hi * (0.85 ^ i))
          if a then try(plan_of(a, ops)) end
        end
        for k = 1, math.min(n, 8) do try(policy.every(k).resolve(n)) end
        try(policy.sqrt().resolve(n))
      end
      if best then return best end
      if whole then
        error(("policy.budget(): no plan fits the whole step in %s; the smallest step needs %s (%s more)"):format(
          remat.memory.format(limit), remat.memory.format(smallest), remat.memory.format(smallest - limit)), 0)
      end
      error(("policy.budget: no plan keeps activations within %s; the smallest that fits needs %s (policy.budget(%d))"):format(
        remat.memory.format(bytes), remat.memory.format(smallest), smallest), 0)
    end,
  })
end

local ACTIONS = { keep = true, boundary = true, recompute = true }

-- A Lua function called once per layer with what is known of it; it returns
-- "keep", "boundary", "recompute" or {selective = {ops...}}.
function policy.custom(fn)
  if type(fn) ~= "function" then error("policy.custom: expected a function, got " .. type(fn), 2) end
  return new("custom", {
    needs_input = true,
    resolve = function(n, ctx)
      local keep = ctx.keep_stats()
      local info = C.layer_info(ctx.model)
      local plan = {}
      for i = 1, n do
        local s = keep.layers[i]
        local ans = fn({
          index = i, name = remat.nn.layer_name(ctx.model, i, info[i].describe), type = info[i].type, param_bytes = s.param_bytes,
          saved_bytes = s.saved, output_bytes = s.out_bytes, flops = s.flops,
        })
        if type(ans) == "string" and ACTIONS[ans] then
          plan[i] = { action = ans }
        elseif type(ans) == "table" and type(ans.selective) == "table" then
          plan[i] = { action = "selective", ops = check_ops(ans.selective, ("custom policy (layer %d)"):format(i)) }
        else
          error(("custom policy: layer %d: expected \"keep\", \"boundary\", \"recompute\" or {selective = {...}}, got %s"):format(
            i, type(ans) == "string" and ("'" .. ans .. "'") or tostring(ans)), 0)
        end
      end
      return plan
    end,
  })
end

return policy
