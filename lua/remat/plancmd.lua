-- `remat plan SCRIPT [--budget B | --policy P] [script args...]`: prints the checkpoint
-- plan of a model script. A plannable script, when its first argument is "--plan",
-- returns { model = <Sequential>, input = function() return x end,
--           loss = function(y) return <scalar> end (optional) } instead of training.
local remat = package.loaded.remat

local function usage(msg)
  error((msg and (msg .. "\n") or "") ..
    "usage: remat plan SCRIPT [--budget SIZE | --policy none|sqrt|every:K|selective:op,op] [script args]", 0)
end

local script, budget, pol, rest = nil, nil, nil, {}
local i = 1
while arg[i] do
  local a = arg[i]
  if a == "--budget" then budget = arg[i + 1] or usage("--budget needs a size"); i = i + 2
  elseif a == "--policy" then pol = arg[i + 1] or usage("--policy needs a name"); i = i + 2
  elseif not script then script = a; i = i + 1
  else rest[#rest + 1] = a; i = i + 1 end
end
if not script then usage("no model script given") end

local policy = remat.policy
local p
if budget then
  p = policy.budget(tonumber(budget) or budget)
elseif pol then
  local k = pol:match("^every:(%d+)$")
  local ops = pol:match("^selective:(.+)$")
  if k then p = policy.every(tonumber(k) // 1)
  elseif ops then
    local list = {}
    for op in ops:gmatch("[^,]+") do list[#list + 1] = op end
    p = policy.selective(list)
  elseif policy[pol] then p = policy[pol]()
  else usage("unknown policy '" .. pol .. "'") end
else
  p = policy.none()
end

local chunk, err = loadfile(script)
if not chunk then error(err, 0) end
local spec = chunk("--plan", table.unpack(rest))
if type(spec) ~= "table" or not spec.model or type(spec.input) ~= "function" then
  error(script .. ": not plannable: with the argument --plan a model script must return " ..
    "{ model = <Sequential>, input = function() return x end, loss = function(y) ... end }", 0)
end
local x = spec.input()
local report = spec.model:plan(x, { policy = p, loss = spec.loss })
print(report)
