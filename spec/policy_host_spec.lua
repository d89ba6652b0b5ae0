-- The checkpoint pipeline from C: examples/host/checkpoint.c builds a Sequential
-- through core/remat.h (no Lua), sets a policy and gets its plan from the core
-- (policy -> plan -> dry runs -> budget search -> install). Its budget plans fit,
-- the real step stays within them, and they are the plans remat.policy gives the same
-- model in Lua (run in a fresh process too: budgets count every live activation; both
-- price replays by the roofline: measured times differ between processes).
local files = require "support.files"

local build = os.getenv("REMAT_BUILD") or "build"

local shell = require "support.shell"
local run = shell.run
local ensure_built = shell.maker(("%s/examples/checkpoint %s/remat"):format(build, build), build)

local ENV = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "
local SHAPE = { blocks = 6, width = 32, batch = 256 }

-- The C host's report: plan (list of actions), predicted, step, measured, measured_step.
local function host(policy, limit, measured)
  ensure_built()
  local out, err, code = run(("%s%s/examples/checkpoint --roofline %d --blocks %d --width %d --batch %d --policy %s%s"):format(
    ENV, build, measured and 0 or 1, SHAPE.blocks, SHAPE.width, SHAPE.batch, policy, limit and (" --limit " .. limit) or ""))
  if code ~= 0 then return nil, err end
  local r = { plan = {} }
  for a in out:match("plan: ([^\n]*)"):gmatch("%S+") do r.plan[#r.plan + 1] = a end
  for _, k in ipairs { "predicted", "step", "measured" } do r[k] = tonumber(out:match("\n" .. k .. ": (%d+)")) end
  r.measured_step = tonumber(out:match("measured step: (%d+)"))
  return r
end

-- The same model in Lua: Linear, MLP blocks, LayerNorm, Linear, on the same input.
local LUA_MODEL = [[
local remat = require "remat"
local nn, policy = remat.nn, remat.policy
local blocks, d, b, what, limit = tonumber(arg[1]), tonumber(arg[2]), tonumber(arg[3]), arg[4], tonumber(arg[5])
remat.manual_seed(1)
remat._C.opcost_calibrate(false)   -- priced by the roofline, as the host's --roofline 1
local layers = { nn.Linear(d, d) }
for _ = 1, blocks do layers[#layers + 1] = nn.MLP(d, 4 * d, 0) end
layers[#layers + 1] = nn.LayerNorm(d)
layers[#layers + 1] = nn.Linear(d, 10)
local model = nn.Sequential(layers)
local x = remat.full({ b, d }, 0.5)
if limit then remat.memory.limit(limit) end
local p = what == "step" and policy.budget() or what == "none" and policy.none() or policy.budget(tonumber(what))
local ok, r = pcall(model.plan, model, x, { policy = p })
if not ok then print("error: " .. tostring(r)) return end
local acts = {}
for i, l in ipairs(r.layers) do acts[i] = l.action end
print("plan: " .. table.concat(acts, " "))
print("predicted: " .. r.predicted_peak)
print("step: " .. r.step_peak)
]]

local script
local function lua_plan(what, limit)
  ensure_built()
  if not script then
    script = os.tmpname()
    files.write(script, LUA_MODEL)
  end
  local out, err, code = run(("%s%s/remat %s %d %d %d %s %s"):format(ENV, build, script, SHAPE.blocks, SHAPE.width,
    SHAPE.batch, what, limit or ""))
  assert(code == 0, err)
  local e = out:match("error: ([^\n]*)")
  if e then return nil, e end
  local r = { plan = {} }
  for a in out:match("plan: ([^\n]*)"):gmatch("%S+") do r.plan[#r.plan + 1] = a end
  r.predicted = tonumber(out:match("predicted: (%d+)"))
  r.step = tonumber(out:match("step: (%d+)"))
  return r
end

describe("a C host checkpoints a Sequential built through the C API #subprocess", function()
  teardown(function() if script then os.remove(script) end end)

  local keep
  it("measures the model as Lua does (keep everything)", function()
    local c = assert(host("none"))
    local l = assert(lua_plan("none"))
    assert.are.same(l.plan, c.plan)
    assert.are.equal(l.predicted, c.predicted)
    assert.are.equal(c.predicted, c.measured)
    keep = c.predicted
  end)

  it("gets budget plans that fit, and that equal policy.budget's for the same model", function()
    assert.truthy(keep)
    local recomputing = 0
    for _, frac in ipairs { 0.85, 0.6, 0.45 } do
      local b = math.floor(keep * frac)
      local c, err = host("budget:" .. b)
      assert.truthy(c, err)
      assert.is_true(c.predicted <= b, ("budget %d: predicted %d"):format(b, c.predicted))
      assert.is_true(c.measured <= b, ("budget %d: the real step's peak %d"):format(b, c.measured))
      assert.are.equal(c.predicted, c.measured)
      local l = assert(lua_plan(b))
      assert.are.same(l.plan, c.plan)
      assert.are.equal(l.predicted, c.predicted)
      for _, a in ipairs(c.plan) do if a ~= "keep" then recomputing = recomputing + 1 end end
      -- priced by measured times (the default), the plan may differ; it fits all the same
      local m = assert(host("budget:" .. b, nil, true))
      assert.is_true(m.measured <= b, ("budget %d, measured costs: the real step's peak %d"):format(b, m.measured))
    end
    assert.is_true(recomputing > 0, "no budget made the plan recompute anything")
  end)

  it("refuses a budget it cannot meet, naming the exact minimum (as Lua does)", function()
    local c, err = host("budget:1024")
    assert.is_nil(c)
    assert.matches("no plan keeps activations within 1.00 KiB; the smallest that fits needs", err)
    local min = tonumber(err:match("policy%.budget%((%d+)%)"))
    assert.truthy(min, err)
    local _, lerr = lua_plan(1024)
    assert.are.equal(min, tonumber(lerr:match("policy%.budget%((%d+)%)")))
    local ok = assert(host("budget:" .. min))
    assert.is_true(ok.measured <= min)
    local _, err2 = host("budget:" .. (min - 1))
    assert.matches("policy%.budget%(" .. min .. "%)", err2)
  end)

  it("fits the whole step in the memory limit (budget with no bytes), as policy.budget() does", function()
    local _, err = host("step")
    assert.matches("no memory limit is set", err)
    local limit = math.floor(host("none").measured_step * 0.7)
    local c, cerr = host("step", limit)
    assert.truthy(c, cerr)
    assert.is_true(c.measured_step <= limit, ("limit %d: the step's peak %d"):format(limit, c.measured_step))
    local l = assert(lua_plan("step", limit))
    assert.are.same(l.plan, c.plan)
  end)
end)
