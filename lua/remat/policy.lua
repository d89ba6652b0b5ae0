-- Checkpoint policies: Lua values that become a plan (one action per layer of a
-- Sequential) which the C engine executes (core/policy.c; docs/ARCHITECTURE.md, "From
-- policy to plan").
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

-- A policy is a description the core plans from (core/policy.c): kind, and k, ops or
-- bytes. Those that need sizes (budget, custom) are planned by dry runs at the first
-- forward, for each input shape.

-- Keep everything (no checkpointing).
function policy.none() return new("none()", { kind = "none" }) end

-- A boundary at layers 1, k+1, 2k+1, ...; the layers between are recomputed, and those
-- from the last boundary on keep (core/policy.c says why).
function policy.every(k)
  if math.type(k) ~= "integer" or k < 1 then
    error("policy.every: k must be an integer >= 1, got " .. tostring(k), 2)
  end
  return new(("every(%d)"):format(k), { kind = "every", k = k })
end

-- every(k) with k = round(sqrt(N)).
function policy.sqrt() return new("sqrt()", { kind = "sqrt" }) end

-- Every layer selective: outputs of the named ops are recomputed in backward.
function policy.selective(ops)
  check_ops(ops, "policy.selective")
  local copy = table.move(ops, 1, #ops, 1, {})
  return new(("selective{%s}"):format(table.concat(copy, ", ")), { kind = "selective", ops = copy })
end

-- Cheap-to-recompute ops a budget plan may make selective (core/policy.c's list).
policy.cheap_ops = { "softmax", "log_softmax", "gelu", "gelu_tanh", "silu", "relu", "sigmoid", "tanh", "dropout" }

local function parse_budget(b)
  local bytes = C.parse_bytes(b)
  if not bytes then
    error(("policy.budget: cannot read %s as a size (examples: 2GiB, 512MiB, 1e9)"):format(
      type(b) == "string" and ("'" .. b .. "'") or tostring(b)), 3)
  end
  return bytes
end

-- With a size b (bytes or "2GiB"): the plan with the least recompute whose activation
-- peak is <= b. With no argument: the plan with the least recompute whose whole
-- training step (forward, loss, backward with its gradients, the optimizer step with
-- its state; parameters, data and everything else live) fits in what the memory limit
-- of the input's device allows (on CUDA without a limit: what the device has).
-- The search runs in the core (core/policy.c): the exact chain DP, whose memory model
-- is the engine's, verified by one dry run; see README, "How budget plans are made".
function policy.budget(b)
  local whole = b == nil
  local bytes = not whole and parse_budget(b) or nil
  return new(whole and "budget()" or ("budget(%s)"):format(remat.memory.format(bytes)), {
    kind = "budget",
    bytes = bytes,
    whole_step = whole,
    needs_input = true,
  })
end

local ACTIONS = { keep = true, boundary = true, recompute = true }

-- A Lua function called once per layer with what is known of it; it returns
-- "keep", "boundary", "recompute" or {selective = {ops...}}. The core measures the
-- model (a dry run keeping everything) and calls decide with those measurements.
function policy.custom(fn)
  if type(fn) ~= "function" then error("policy.custom: expected a function, got " .. type(fn), 2) end
  return new("custom", {
    kind = "custom",
    needs_input = true,
    decide = function(model, keep)
      local info = C.layer_info(model)
      local plan = {}
      for i = 1, #model do
        local s = keep.layers[i]
        local ans = fn({
          index = i, name = remat.nn.layer_name(model, i, info[i].describe), type = info[i].type, param_bytes = s.param_bytes,
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
