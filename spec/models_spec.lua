-- models/: the two model scripts run end to end (quick settings) as the `remat` command
-- runs them, their save / reload check passes, and they follow the `remat plan`
-- convention (first argument --plan: return { model =, input =, loss = }).
local remat = require "remat"

-- The build directory: REMAT_BUILD, else the one remat.so was loaded from, else "build".
local build = os.getenv("REMAT_BUILD")
  or (package.searchpath("remat", package.cpath) or ""):match("^(.*)/remat%.so$") or "build"
local remat_bin = build .. "/remat"

-- Runs `remat script args...`; returns the output (stdout and stderr) and the exit code.
-- One thread: these check behaviour, not speed, and stay fast on a busy machine.
local function run(script, args)
  local cmd = ("OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 %s %s %s 2>&1"):format(remat_bin, script, args or "")
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  local _, _, code = p:close()
  return out, code
end

local function has(out, s) return out:find(s, 1, true) ~= nil end

-- Loads a model script in this process with the --plan argument.
local function plan_spec(script, ...)
  local chunk = assert(loadfile(script))
  return chunk("--plan", ...)
end

describe("models/mlp.lua --quick", function()
  local out, code
  setup(function() out, code = run("models/mlp.lua", "--quick") end)

  it("trains, evaluates, and exits 0", function()
    assert.are.equal(0, code, out)
    local acc = tonumber(out:match("test accuracy ([%d.]+)%%"))
    assert.truthy(acc, out)
    assert.is_true(acc > 50, out)
    assert.truthy(out:match("step +%d+/%d+ +loss [%d.]+ +%d+ ex/s +memory live"), out)
    assert.truthy(has(out, "peak memory by category: param"), out)
  end)

  it("trains under a budget below the keep-everything peak, with the plan and the measured peak", function()
    assert.truthy(has(out, "training under policy.budget("), out)
    assert.truthy(has(out, "plan for remat.policy.budget("), out)
    local measured = out:match("measured ([%d.]+ %a+), predicted")
    assert.truthy(measured, out)
  end)

  it("reloads its saved weights with the same outputs", function()
    assert.truthy(has(out, "reloaded them: outputs identical"), out)
  end)

  it("rejects unknown arguments with its usage", function()
    local o, c = run("models/mlp.lua", "--bogus")
    assert.are_not.equal(0, c)
    assert.truthy(has(o, "unknown argument --bogus"), o)
    assert.truthy(has(o, "usage:"), o)
  end)
end)

describe("models/gpt.lua --quick", function()
  it("trains, samples, reloads its weights, and exits 0", function()
    local out, code = run("models/gpt.lua", "--quick")
    assert.are.equal(0, code, out)
    local a, b = out:match("training loss ([%d.]+) %-> ([%d.]+)")
    assert.truthy(a, out)
    assert.is_true(tonumber(b) < tonumber(a), out)
    assert.truthy(has(out, "sample (40 characters"), out)
    assert.truthy(has(out, "reloaded them: outputs identical"), out)
  end)

  it("trains under a checkpoint policy", function()
    local out, code = run("models/gpt.lua", "--quick --policy sqrt")
    assert.are.equal(0, code, out)
    assert.truthy(has(out, "plan for remat.policy.sqrt()"), out)
  end)
end)

describe("model scripts are plannable", function()
  for _, script in ipairs { "models/mlp.lua", "models/gpt.lua" } do
    it(script .. " --plan returns a model, an input and a loss", function()
      local spec = plan_spec(script, "--quick")
      assert.are.equal("table", type(spec))
      assert.are.equal("Sequential", spec.model:type_name())
      local x = spec.input()
      local report = spec.model:plan(x, { policy = remat.policy.sqrt(), loss = spec.loss })
      assert.is_true(report.predicted_peak > 0)
      assert.is_true(report.predicted_peak <= report.keep_peak)
      local y = spec.model(x)
      local loss = spec.loss(y)
      assert.are.same({}, loss:shape())
    end)
  end

  it("remat plan prints the plan of models/mlp.lua under a budget", function()
    local out, code = run("plan models/mlp.lua", "--budget 1MiB --quick")
    assert.are.equal(0, code, out)
    assert.truthy(has(out, "plan for remat.policy.budget(1.00 MiB)"), out)
    assert.truthy(has(out, "predicted peak activation"), out)
  end)
end)

describe("models/cnn.lua --quick", function()
  local out, code
  local log = os.tmpname() .. ".jsonl"
  setup(function() out, code = run("models/cnn.lua", "--quick --log " .. log) end)
  teardown(function() os.remove(log) end)

  it("writes a metrics log of every step", function()
    assert.are.equal(0, code, out)
    local m = remat.train.read_metrics(log)
    assert.are.equal(16, #m.rows) -- 1024 examples in batches of 64
    for i, r in ipairs(m.rows) do
      assert.are.equal(i, r.step)
      assert.is_true(r.loss > 0 and r.lr > 0 and r.examples_per_s > 0 and r.mem_param > 0, i)
    end
  end)

  -- gnuplot is another program: under check-mem's preloaded sanitizer its own leaks
  -- would be reported, so this one is tagged subprocess (check-mem skips those)
  it("writes a log that remat plot draws #subprocess", function()
    assert.are.equal(0, code, out)
    local png = log:gsub("%.jsonl$", ".png")
    local o, c = run("plot", log)
    assert.are.equal(0, c, o)
    assert.truthy(has(o, "wrote " .. png .. " (16 records, loss, memory: live, param"), o)
    local f = assert(io.open(png, "rb"))
    assert.are.equal("\137PNG", f:read(4))
    f:close()
    os.remove(png)
  end)

  it("trains convolutions under a budget plan, evaluates, and exits 0", function()
    assert.are.equal(0, code, out)
    local acc = tonumber(out:match("test accuracy ([%d.]+)%%"))
    assert.truthy(acc, out)
    assert.is_true(acc > 40, out)
    assert.truthy(has(out, "training under policy.budget("), out)
    assert.truthy(out:match("step +%d+/%d+ +loss [%d.]+ +%d+ ex/s +memory live .* ETA"), out)
  end)

  it("plans convolutions as the expensive layers to recompute, ReLU and pooling as cheap", function()
    local spec = plan_spec("models/cnn.lua", "--quick")
    local plan = spec.model:plan(spec.input(), { loss = spec.loss })
    local cost = {}
    for _, l in ipairs(plan.layers) do
      local kind = tostring(l.name):match("^(%a+%d?d?)")
      cost[kind] = math.max(cost[kind] or 0, l.flops)
    end
    assert.truthy(cost.Conv2d and cost.ReLU and cost.MaxPool2d, "layers: " .. table.concat((function()
      local k = {} for n in pairs(cost) do k[#k + 1] = n end return k end)(), ", "))
    assert.is_true(cost.Conv2d > 10 * cost.ReLU, ("conv %g vs relu %g"):format(cost.Conv2d, cost.ReLU))
    assert.is_true(cost.Conv2d > 10 * cost.MaxPool2d, ("conv %g vs pool %g"):format(cost.Conv2d, cost.MaxPool2d))
  end)
end)
