-- `remat plan SCRIPT [--budget SIZE | --policy P] [script args...]`: prints the checkpoint
-- plan of a model script. The script runs as `remat SCRIPT --plan args...` would run it
-- (arg[0] = SCRIPT, arg[1] = "--plan", and the same in ...) and must return
--   { model = <Sequential>, input = function() return x end,
--     loss = function(y) return <scalar> end (optional) }
-- instead of training. Errors here are the user's: messages, no tracebacks (main.c).
local remat = package.loaded.remat
local policy = remat.policy

local USAGE = [[usage: remat plan SCRIPT [--budget SIZE | --policy P] [script args...]
  --budget SIZE  the plan with the least recompute whose activations fit SIZE
                 (2GiB, 512MiB, 1e9)
  --policy P     none | sqrt | every:K | selective:op,op (default none), or the Lua
                 spelling: every(2), sqrt(), selective{"gelu", "softmax"}, budget("1GiB")
SCRIPT runs with --plan as its first argument and must then return
  { model = <Sequential>, input = function() return x end, loss = function(y) ... end }
instead of training.]]

local function usage(msg) error(msg .. "\n" .. USAGE, 0) end

-- A policy from the command line: the short spellings, else a Lua expression over
-- remat.policy's constructors.
local function parse_policy(s)
  local ok, p
  local k = s:match("^every:(%d+)$")
  local ops = s:match("^selective:(.+)$")
  if k then
    ok, p = pcall(policy.every, math.tointeger(tonumber(k)))
  elseif ops then
    local list = {}
    for op in ops:gmatch("[^,%s]+") do list[#list + 1] = op end
    ok, p = pcall(policy.selective, list)
  elseif s == "none" or s == "sqrt" then
    ok, p = true, policy[s]()
  else
    local env = setmetatable({ policy = policy, remat = remat }, { __index = policy })
    local chunk = load("return " .. s, "=--policy", "t", env)
    if not chunk then usage(("cannot read --policy '%s'"):format(s)) end
    ok, p = pcall(chunk)
    if ok and not policy.is_policy(p) then usage(("--policy '%s' is not a policy"):format(s)) end
  end
  if not ok then usage(("--policy '%s': %s"):format(s, tostring(p))) end
  return p
end

local script, budget, pol, rest = nil, nil, nil, {}
local i = 1
while arg[i] do
  local a = arg[i]
  if not script and (a == "--help" or a == "-h") then io.write(USAGE, "\n") return end
  if not script and a == "--budget" then budget = arg[i + 1] or usage("--budget needs a size"); i = i + 2
  elseif not script and a == "--policy" then pol = arg[i + 1] or usage("--policy needs a policy"); i = i + 2
  elseif not script and a:match("^%-%-") then usage("unknown option " .. a)
  elseif not script then script = a; i = i + 1
  elseif a == "--budget" then budget = arg[i + 1] or usage("--budget needs a size"); i = i + 2
  elseif a == "--policy" then pol = arg[i + 1] or usage("--policy needs a policy"); i = i + 2
  else rest[#rest + 1] = a; i = i + 1 end
end
if not script then usage("no model script given") end
if budget and pol then usage("--budget and --policy exclude each other") end

local p
if budget then
  local ok, b = pcall(policy.budget, tonumber(budget) or budget)
  if not ok then usage(tostring(b)) end
  p = b
elseif pol then
  p = parse_policy(pol)
else
  p = policy.none()
end

local chunk, err = loadfile(script)
if not chunk then error(err, 0) end

-- arg as lua sets it for `remat SCRIPT --plan args...`: the script at 0, its arguments
-- from 1, what came before it (the command, "plan") at negative indices.
local script_arg = { [0] = script, "--plan", table.unpack(rest) }
script_arg[-1] = arg[0]
for k = -1, -math.huge, -1 do
  if arg[k] == nil then break end
  script_arg[k - 1] = arg[k]
end

local NOT_PLANNABLE = script .. " is not plannable: with the argument --plan a model script must return " ..
  "{ model = <Sequential>, input = function() return x end, loss = function(y) ... end }"

-- A script that ignores --plan trains: stop it at its first backward, not at its end.
local Tensor = remat.Tensor
local backward = Tensor.backward
Tensor.backward = function() error(NOT_PLANNABLE .. " (it started training: backward was called)", 0) end
local saved_arg = arg
_G.arg = script_arg
local ok, spec = pcall(chunk, table.unpack(script_arg, 1, #script_arg))
_G.arg = saved_arg
Tensor.backward = backward
if not ok then error(spec, 0) end

if type(spec) ~= "table" or not spec.model or type(spec.input) ~= "function" then error(NOT_PLANNABLE, 0) end
local x = spec.input()
print(spec.model:plan(x, { policy = p, loss = spec.loss }))
