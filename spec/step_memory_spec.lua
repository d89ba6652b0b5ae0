-- Memory guarantees of a whole training step in a user's own loop: the data category,
-- a loop that never frees by hand staying within its plan step after step (C and Lua
-- modules, the stepper, a C host), whole-step planning (policy.budget() with no
-- argument, model:plan's step_peak = what the step measures), and optimizers fused
-- into backward (bitwise equal to the ordinary step, gradients freed as they are used).
local remat = require "remat"
local nn, optim, policy = remat.nn, remat.optim, remat.policy
local memory = remat.memory
local C = remat._C

local W, IN, B = 16, 8, 64

local function mlp(lua_blocks)
  remat.manual_seed(3)
  local layers = { nn.Linear(IN, W) }
  for k = 1, 4 do
    if lua_blocks and k % 2 == 0 then
      layers[#layers + 1] = nn.module {
        a = nn.Linear(W, 2 * W), b = nn.Linear(2 * W, W),
        forward = function(self, x) return x + self.b(self.a(x):gelu()) end,
      }
    else
      layers[#layers + 1] = nn.Residual(nn.Sequential {
        nn.LayerNorm(W), nn.Linear(W, 4 * W), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * W, W) })
    end
  end
  layers[#layers + 1] = nn.Linear(W, 5)
  return nn.Sequential(layers)
end

local function batch(seed)
  remat.manual_seed(seed)
  local x = remat.randn(B, IN)
  local t = {}
  for i = 1, B do t[i] = (i + seed) % 5 + 1 end
  return x, remat.tensor(t)
end

local function settle() collectgarbage(); collectgarbage() end

local POLICIES = {
  function() return policy.none() end,
  function() return policy.every(2) end,
  function() return policy.sqrt() end,
  function() return policy.selective { "gelu", "dropout" } end,
  function() return policy.budget("140KiB") end,
}

describe("the data category", function()
  it("is reported by memory.stats, and batches read from a dataset count there", function()
    settle()
    local s = memory.stats()
    assert.is_number(s.by_category.data)
    assert.is_number(s.peak_by_category.data)
    local ds = remat.data.tensor_dataset(remat.randn(40, 3), remat.randn(40))
    local before = memory.stats().by_category.data
    local it = ds:batches(10, { shuffle = false })
    local xb, yb = it()
    assert.are.equal(before + 4 * 10 * 3 + 4 * 10, memory.stats().by_category.data)
    xb:free(); yb:free()
    assert.are.equal(before, memory.stats().by_category.data)
  end)

  it("text datasets and their batches are data", function()
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(("hello world, remat trains. "):rep(20))
    f:close()
    settle()
    local before = memory.stats().by_category.data
    local ds = remat.data.text(path, { block = 8 })
    local x, y = ds:batch(4)
    assert.is_true(memory.stats().by_category.data >= before + 2 * 4 * 8 * 4)
    x:free(); y:free()
    os.remove(path)
  end)
end)

describe("policy.budget() with no argument", function()
  after_each(function() memory.limit(nil) end)

  it("says what is missing when no memory limit is set", function()
    local model = mlp():checkpoint(policy.budget())
    local x = batch(1)
    local ok, err = pcall(model.plan, model, x)
    assert.is_false(ok)
    assert.matches("policy.budget%(%): no memory limit is set", err)
    assert.is_nil(err:find("parse_bytes", 1, true))
  end)

  it("names the smallest whole step when none fits", function()
    local model = mlp()
    local opt = optim.AdamW(model:parameters())
    local x, y = batch(1)
    settle()
    memory.limit(memory.stats().live + 1024)
    model:checkpoint(policy.budget())
    local ok, err = pcall(model.plan, model, x, { loss = function(o) return nn.cross_entropy(o, y) end })
    assert.is_false(ok)
    assert.matches("no plan fits the whole step in .*; the smallest step needs", err)
    assert.are.equal(opt, optim.owner_of(model:parameters()[1]))
  end)
end)

-- Runs `steps` README-style steps (no <close>, no collectgarbage, no free) and returns
-- the largest measured minus predicted activation and whole-step peaks.
local function readme_loop(model, opt, steps, x, y)
  local lossf = function(o) return nn.cross_entropy(o, y) end
  local plan = model:plan(x, { loss = lossf, optimizer = opt })
  local worst_act, worst_step = -math.huge, -math.huge
  for _ = 1, steps do
    memory.reset_peak()
    local loss = nn.cross_entropy(model(x), y)
    loss:backward()
    opt:step()
    opt:zero_grad()
    local s = memory.stats()
    worst_act = math.max(worst_act, s.peak_by_category.activation - plan.predicted_peak)
    worst_step = math.max(worst_step, s.peak - plan.step_peak)
  end
  return worst_act, worst_step, plan
end

describe("a README-style loop that never frees by hand", function()
  after_each(function() memory.limit(nil); memory.step_collect(true) end)

  it("stays within its predicted peaks on every one of 200 steps, under every policy", function()
    for k, make in ipairs(POLICIES) do
      settle()
      local model = mlp():checkpoint(make())
      local opt = optim.AdamW(model:parameters(), { lr = 1e-3 })
      local x, y = batch(k)
      local act, step = readme_loop(model, opt, 200, x, y)
      assert(act <= 0, ("%s: activations %d bytes over the prediction"):format(tostring(model:checkpoint_policy()), act))
      assert(step <= 0, ("%s: the step %d bytes over the prediction"):format(tostring(model:checkpoint_policy()), step))
    end
  end)

  it("stays within its predicted peaks on every one of 200 steps under whole-step budget()", function()
    for _, fused in ipairs { false, true } do
      settle()
      local model = mlp()
      local opt = optim.AdamW(model:parameters(), { lr = 1e-3, in_backward = fused })
      local x, y = batch(3)
      local lossf = function(o) return nn.cross_entropy(o, y) end
      local full = model:plan(x, { loss = lossf, optimizer = opt, policy = policy.none() })
      local least = model:plan(x, { loss = lossf, optimizer = opt, policy = policy.every(1) })
      local limit = (full.step_peak + least.step_peak) // 2
      memory.limit(limit)
      model:checkpoint(policy.budget())
      local act, step, plan = readme_loop(model, opt, 200, x, y)
      memory.limit(nil)
      assert(plan.recompute_flops > 0 and plan.step_peak <= limit, ("fused %s: the plan does not bind or fit"):format(tostring(fused)))
      assert(act <= 0, ("budget(), fused %s: activations %d bytes over the prediction"):format(tostring(fused), act))
      assert(step <= 0, ("budget(), fused %s: the step %d bytes over the prediction"):format(tostring(fused), step))
    end
  end)

  it("holds for Lua modules inside the Sequential too", function()
    for k, make in ipairs { POLICIES[1], POLICIES[2], POLICIES[5] } do
      settle()
      local model = mlp(true):checkpoint(make())
      local opt = optim.SGD(model:parameters(), { lr = 1e-2, momentum = 0.9 })
      local x, y = batch(k)
      local act, step = readme_loop(model, opt, 60, x, y)
      assert(act <= 0, ("Lua modules, policy %d: activations %d bytes over"):format(k, act))
      assert(step <= 0, ("Lua modules, policy %d: the step %d bytes over"):format(k, step))
    end
  end)

  it("is what the collection at each step's start buys (without it, garbage piles up)", function()
    settle()
    memory.step_collect(false)
    collectgarbage("stop")
    local model = mlp(true)
    local opt = optim.SGD(model:parameters(), { lr = 1e-2 })
    local x, y = batch(2)
    local act = readme_loop(model, opt, 5, x, y)
    collectgarbage("restart")
    assert.is_true(act > 0)
  end)

  it("holds for the stepper", function()
    settle()
    local model = mlp():checkpoint(policy.every(2))
    local opt = optim.AdamW(model:parameters())
    local x, y = batch(4)
    local plan = model:plan(x, { loss = function(o) return nn.cross_entropy(o, y) end, optimizer = opt })
    local s = remat.train.stepper { model = model, optimizer = opt, data = function() return x, y end, steps = 50 }
    for _ = 1, 50 do
      memory.reset_peak()
      assert.is_number(s:step())
      local m = memory.stats()
      assert.is_true(m.peak_by_category.activation <= plan.predicted_peak)
      assert.is_true(m.peak <= plan.step_peak)
    end
  end)

  it("holds in a C host (the remat command's own lua_State)", function()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write([[
      local remat = require "remat"
      local nn, optim, policy = remat.nn, remat.optim, remat.policy
      remat.manual_seed(1)
      local model = nn.Sequential { nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4) }
      model:checkpoint(policy.every(2))
      local opt = optim.AdamW(model:parameters())
      local x, y = remat.randn(16, 8), remat.tensor { 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4 }
      local plan = model:plan(x, { loss = function(o) return nn.cross_entropy(o, y) end })
      local worst = -math.huge
      for _ = 1, 100 do
        remat.memory.reset_peak()
        local loss = nn.cross_entropy(model(x), y)
        loss:backward()
        opt:step(); opt:zero_grad()
        worst = math.max(worst, remat.memory.stats().peak - plan.step_peak)
      end
      print(worst <= 0 and "within" or ("over " .. worst))
    ]])
    f:close()
    local p = io.popen((os.getenv("REMAT_BUILD") or "build") .. "/remat " .. script .. " 2>&1")
    local out = p:read("a")
    p:close()
    os.remove(script)
    assert.are.equal("within\n", out)
  end)
end)

describe("whole-step planning", function()
  after_each(function() memory.limit(nil) end)

  it("model:plan predicts the whole step's peak, by category, as measured (within 1%)", function()
    for k, make in ipairs(POLICIES) do
      for _, fused in ipairs { false, true } do
        settle()
        local model = mlp():checkpoint(make())
        local opt = optim.Adam(model:parameters(), { in_backward = fused })
        local x, y = batch(k)
        local plan = model:plan(x, { loss = function(o) return nn.cross_entropy(o, y) end, optimizer = opt })
        local sum = 0
        for _, v in pairs(plan.step_by_category) do sum = sum + v end
        assert.are.equal(plan.step_peak, sum)
        assert.is_true(plan.step_by_category.optim > 0)
        for step = 1, 3 do
          memory.reset_peak()
          local loss = nn.cross_entropy(model(x), y)
          loss:backward()
          opt:step(); opt:zero_grad()
          local measured = memory.stats().peak
          assert(measured <= plan.step_peak, ("policy %d fused %s step %d: measured %d > predicted %d"):format(
            k, tostring(fused), step, measured, plan.step_peak))
          if step > 1 or fused then
            assert(math.abs(measured - plan.step_peak) <= 0.01 * plan.step_peak,
              ("policy %d fused %s: measured %d, predicted %d"):format(k, tostring(fused), measured, plan.step_peak))
          end
        end
      end
    end
  end)

  it("budget() fits the whole step under the limit: every byte of it, with no arithmetic", function()
    for _, fused in ipairs { false, true } do
      settle()
      local model = mlp()
      local opt = optim.AdamW(model:parameters(), { in_backward = fused })
      local x, y = batch(7)
      local lossf = function(o) return nn.cross_entropy(o, y) end
      local full = model:plan(x, { loss = lossf, optimizer = opt, policy = policy.none() })
      local least = model:plan(x, { loss = lossf, optimizer = opt, policy = policy.every(1) })
      -- halfway between the step with the most recompute and the one with none
      local limit = (full.step_peak + least.step_peak) // 2
      memory.limit(limit)
      model:checkpoint(policy.budget())
      local plan = model:plan(x, { loss = lossf, optimizer = opt })
      assert(plan.step_peak <= limit and plan.recompute_flops > 0, ("fused %s: none %d, every(1) %d, limit %d, plan %d, %g"):format(
        tostring(fused), full.step_peak, least.step_peak, limit, plan.step_peak, plan.recompute_flops))
      memory.reset_peak()
      for _ = 1, 3 do
        local loss = nn.cross_entropy(model(x), y)
        loss:backward()
        opt:step(); opt:zero_grad()
      end
      assert.is_true(memory.stats().peak <= limit)
      memory.limit(nil)
    end
  end)
end)

describe("parameter gradients", function()
  it("become .grad without a copy: the backward's buffer changes category, accounted to the byte", function()
    remat.manual_seed(2)
    local model = nn.Sequential { nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16) }
    local x = remat.randn(8, 16)
    local pbytes = 0
    for _, p in ipairs(model:parameters()) do pbytes = pbytes + 4 * p:numel() end
    collectgarbage()
    local before = memory.stats()
    C.op_timers(true)
    local y = model(x)
    y:sum():backward()
    C.op_timers(false)
    local t = C.op_timing()
    -- the one copy is backward's seed (ones, expanded from a scalar); each of the four
    -- parameters' gradients was copied once more into category grad before
    assert.is_true(t.copy == nil or t.copy.calls <= 1, "a gradient was copied")
    y:free()
    collectgarbage()
    local after = memory.stats()
    assert.equal(before.by_category.grad + pbytes, after.by_category.grad)
    assert.equal(before.by_category.activation, after.by_category.activation)
    -- a second backward accumulates into the same buffers, in place: a handle held
    -- across it sees the sum
    local held = model[1].weight.grad
    local g1 = held:clone()
    model(x):sum():backward()
    local g2 = model[1].weight.grad
    assert.equal(2 * g1[1][1], g2[1][1])
    assert.equal(2 * g1[1][1], held[1][1])
    assert.equal(before.by_category.grad + pbytes, memory.stats().by_category.grad)
  end)
end)

describe("optimizers fused into backward (in_backward = true)", function()
  local MAKERS = {
    function(p, f) return optim.SGD(p, { lr = 0.05, momentum = 0.9, weight_decay = 0.01, in_backward = f }) end,
    function(p, f) return optim.Adam(p, { lr = 0.01, weight_decay = 0.01, in_backward = f }) end,
    function(p, f) return optim.AdamW(p, { lr = 0.01, in_backward = f }) end,
  }

  local function train(make_opt, make_pol, fused, steps)
    local model = mlp():checkpoint(make_pol())
    local opt = make_opt(model:parameters(), fused)
    for s = 1, steps do
      local x, y = batch(s)
      local loss = nn.cross_entropy(model(x), y)
      loss:backward()
      if fused then
        for _, p in ipairs(model:parameters()) do assert.is_nil(p.grad) end
      end
      opt:step(); opt:zero_grad()
    end
    local out = {}
    for i, p in ipairs(model:parameters()) do out[i] = remat._C.flat(p) end
    return out
  end

  it("gives bitwise the parameters of the ordinary step, for each optimizer and policy", function()
    for o, make_opt in ipairs(MAKERS) do
      for k, make_pol in ipairs(POLICIES) do
        local a = train(make_opt, make_pol, false, 3)
        local b = train(make_opt, make_pol, true, 3)
        for i = 1, #a do
          for j = 1, #a[i] do
            if a[i][j] ~= b[i][j] then
              error(("optimizer %d, policy %d: parameter %d[%d]: %.9g fused, %.9g ordinary"):format(
                o, k, i, j, b[i][j], a[i][j]))
            end
          end
        end
      end
    end
  end)

  it("keeps only the gradients in flight: the peak of category grad falls", function()
    local peaks = {}
    for _, fused in ipairs { false, true } do
      settle()
      local model = mlp()
      local opt = optim.AdamW(model:parameters(), { in_backward = fused })
      local x, y = batch(1)
      memory.reset_peak()
      local loss = nn.cross_entropy(model(x), y)
      loss:backward()
      opt:step(); opt:zero_grad()
      peaks[fused] = memory.stats().peak_by_category.grad
    end
    local params = 0
    for _, p in ipairs(mlp():parameters()) do params = params + 4 * p:numel() end
    assert.are.equal(params, peaks[false])
    assert.is_true(peaks[true] < params / 2, ("fused grad peak %d of %d"):format(peaks[true], params))
  end)

  it("what needs every gradient first raises a clear error", function()
    local model = mlp()
    local opt = optim.AdamW(model:parameters(), { in_backward = true })
    assert.has_error(function() optim.clip_grad_norm(model:parameters(), 1.0) end,
      "optim.clip_grad_norm: a parameter belongs to an optimizer with in_backward = true, which applies and frees each "
      .. "gradient during backward, before the norm over all of them is known; clip without in_backward")
    local x, y = batch(1)
    local ok, err = pcall(remat.train.stepper, { model = model, optimizer = opt, data = function() return x, y end,
      micro_batches = 2 })
    assert.is_false(ok)
    assert.matches("micro_batches %(gradient accumulation%) needs every micro%-batch's gradient", err)
    assert.has_error(function() optim.SGD(model:parameters(), { in_backward = "yes" }) end,
      "optim.SGD: in_backward must be a boolean, got string yes")
  end)

  it("an error inside the fused update ends backward with its message", function()
    local model = mlp()
    local opt = optim.AdamW(model:parameters(), { in_backward = true })
    opt.lr = -1
    local x, y = batch(1)
    local loss = nn.cross_entropy(model(x), y)
    local ok, err = pcall(loss.backward, loss)
    assert.is_false(ok)
    assert.matches("backward: .*invalid lr %-1", err)
    opt.lr = 1e-3
    opt:zero_grad()
    loss = nn.cross_entropy(model(x), y)
    loss:backward()
    for _, p in ipairs(model:parameters()) do assert.is_nil(p.grad) end
  end)
end)

describe("dry runs predict kernel workspace", function()
  it("model:plan's step peak holds the attention kernels' workspace, as measured (within 1%)", function()
    -- one attention layer on a long sequence: its kernels' per-thread score blocks
    -- (2 x 32 x 512 floats a thread in backward) are the step's largest allocation
    remat.manual_seed(41)
    local model = nn.Sequential { nn.CausalSelfAttention(8, 2) }
    local x = remat.randn(1, 512, 8)
    local t = {}
    for i = 1, 512 do t[i] = i % 8 + 1 end
    local y = remat.tensor(t):view(1, 512)
    local opt = optim.SGD(model:parameters(), { lr = 0.1 })
    local plan = model:plan(x, { loss = function(o) return nn.cross_entropy(o, y) end, optimizer = opt })
    assert(plan.step_by_category.workspace >= 2 * 32 * 512 * 4,
      ("predicted workspace at the peak: %d bytes"):format(plan.step_by_category.workspace))
    for step = 1, 2 do
      settle()
      memory.reset_peak()
      local loss = nn.cross_entropy(model(x), y)
      loss:backward()
      opt:step(); opt:zero_grad()
      loss:free()
      local measured = memory.stats().peak
      assert(measured <= plan.step_peak, ("step %d: measured %d > predicted %d"):format(step, measured, plan.step_peak))
      assert(math.abs(measured - plan.step_peak) <= 0.01 * plan.step_peak,
        ("step %d: measured %d, predicted %d"):format(step, measured, plan.step_peak))
    end
  end)
end)
