-- The checkpoint engine: identical gradients under every policy, predicted vs measured
-- activation peaks, budgets that hold, the DP against brute force, and bad input.
local remat = require "remat"
local nn, policy = remat.nn, remat.policy
local C = remat._C

local function residual_mlp(n, d, p)
  remat.manual_seed(7)
  local layers = {}
  for i = 1, n do
    layers[i] = nn.Residual(nn.Sequential { nn.Linear(d, 2 * d), nn.GELU(), nn.Dropout(p), nn.Linear(2 * d, d) })
  end
  layers[n + 1] = nn.Linear(d, 10)
  return nn.Sequential(layers)
end

local function tiny_gpt(nblocks, d, heads, vocab, p)
  remat.manual_seed(11)
  local layers = { nn.Embedding(vocab, d) }
  for _ = 1, nblocks do layers[#layers + 1] = nn.TransformerBlock(d, heads, p) end
  layers[#layers + 1] = nn.LayerNorm(d)
  layers[#layers + 1] = nn.Linear(d, vocab)
  return nn.Sequential(layers)
end

local function labels_of(n, classes)
  local t = {}
  for i = 1, n do t[i] = (i * 7) % classes + 1 end
  return t
end

-- One training step under policy p; returns parameter gradients (flat), the loss,
-- and the activation peak measured during the step.
local function step(build, x, loss_fn, p)
  local m = build()
  m:checkpoint(p)
  collectgarbage()
  collectgarbage()
  remat.memory.reset_peak()
  remat.manual_seed(99)
  local loss = loss_fn(m(x))
  loss:backward()
  local peak = remat.memory.stats().peak_by_category.activation
  local grads = {}
  for i, t in ipairs(m:parameters()) do grads[i] = C.flat(t.grad) end
  return grads, loss:item(), peak, m
end

local function predicted(m, x, loss_fn)
  collectgarbage()
  collectgarbage()
  remat.manual_seed(99)
  return m:plan(x, { loss = loss_fn })
end

local function assert_same(ref, got, what)
  assert.equal(#ref, #got)
  for i = 1, #ref do
    assert.equal(#ref[i], #got[i])
    for k = 1, #ref[i] do
      if ref[i][k] ~= got[i][k] then
        error(("%s: parameter %d element %d differs: %.17g vs %.17g"):format(what, i, k, ref[i][k], got[i][k]))
      end
    end
  end
end

local function policies(keep_peak)
  return {
    policy.every(1), policy.every(2), policy.every(3), policy.every(5), policy.sqrt(),
    policy.selective { "gelu", "dropout" }, policy.selective { "softmax", "gelu", "dropout" },
    policy.budget(math.floor(keep_peak * 0.8)), policy.budget(math.floor(keep_peak * 0.6)),
    function(l) return l.index % 2 == 1 and "boundary" or "recompute" end,
    function(l) return l.index % 3 == 0 and { selective = { "gelu" } } or "keep" end,
  }
end

for _, model in ipairs {
  { name = "residual MLP with dropout", build = function() return residual_mlp(9, 24, 0.1) end,
    x = function() remat.manual_seed(3) return remat.randn(12, 24) end,
    loss = function() local lab = remat.tensor(labels_of(12, 10)) return function(y) return nn.cross_entropy(y, lab) end end },
  { name = "GPT with dropout", build = function() return tiny_gpt(3, 16, 2, 11, 0.1) end,
    x = function() return remat.tensor({ labels_of(8, 11), labels_of(8, 11) }) end,
    loss = function() local lab = remat.tensor({ labels_of(8, 11), labels_of(8, 11) }) return function(y) return nn.cross_entropy(y, lab) end end },
} do
  describe("checkpointing a " .. model.name, function()
    local x, loss_fn = model.x(), model.loss()
    local ref, ref_loss, keep_peak = step(model.build, x, loss_fn, policy.none())

    it("keeps everything under none(), as predicted", function()
      local _, _, peak, m = step(model.build, x, loss_fn, policy.none())
      local plan = predicted(m, x, loss_fn)
      assert.equal(plan.predicted_peak, plan.keep_peak)
      assert.is_true(math.abs(peak - plan.predicted_peak) <= 0.03 * peak, ("measured %d, predicted %d"):format(peak, plan.predicted_peak))
    end)

    for _, p in ipairs(policies(keep_peak)) do
      local pname = type(p) == "function" and "a custom function" or tostring(p)
      it("gives gradients bit for bit equal to none() and the predicted peak under " .. pname, function()
        local grads, loss, peak, m = step(model.build, x, loss_fn, p)
        assert.equal(ref_loss, loss)
        assert_same(ref, grads, pname)
        local plan = predicted(m, x, loss_fn)
        assert.is_true(math.abs(peak - plan.predicted_peak) <= 0.03 * peak,
          ("%s: measured %d, predicted %d"):format(pname, peak, plan.predicted_peak))
        if type(p) == "table" and p.bytes then
          assert.is_true(peak <= p.bytes, ("%s: peak %d above the budget"):format(pname, peak))
        end
      end)
    end
  end)
end

describe("activation memory under every(k)", function()
  local n = 16
  local build = function() return residual_mlp(n, 32, 0) end
  remat.manual_seed(5)
  local x = remat.randn(64, 32)
  local lab = remat.tensor(labels_of(64, 10))
  local loss_fn = function(y) return nn.cross_entropy(y, lab) end

  it("follows ceil(N/k) kept inputs + k replayed layers: falls from none(), then rises towards k = N", function()
    local _, _, none = step(build, x, loss_fn, policy.none())
    local m = build()
    local stats = m:plan(x, { loss = loss_fn })
    local input, saved = stats.layers[2].output_bytes, stats.layers[2].saved_bytes
    local ks, peaks, model = { 1, 2, 4, 8, 17 }, {}, {}
    for _, k in ipairs(ks) do
      local _, _, pk = step(build, x, loss_fn, policy.every(k))
      peaks[k] = pk
      model[k] = math.ceil((n + 1) / k) * input + k * saved
    end
    local function argmin(t)
      local best
      for _, k in ipairs(ks) do if not best or t[k] < t[best] then best = k end end
      return best
    end
    assert.equal(argmin(model), argmin(peaks))
    assert.is_true(peaks[argmin(peaks)] < 0.5 * none, ("best every(k) %d vs none %d"):format(peaks[argmin(peaks)], none))
    for i = 2, #ks - 1 do
      if ks[i] > argmin(peaks) then assert.is_true(peaks[ks[i]] < peaks[ks[i + 1]]) end
    end
    assert.is_true(peaks[17] <= none * 1.05)
  end)

  it("budget(b) never exceeds b over a sweep of b, and keeps everything when that fits", function()
    local _, _, none = step(build, x, loss_fn, policy.none())
    local m = build()
    m:checkpoint(policy.budget(none + 1024))
    local plan = predicted(m, x, loss_fn)
    for _, l in ipairs(plan.layers) do assert.equal("keep", l.action) end
    local last
    for _, frac in ipairs { 0.9, 0.7, 0.5, 0.4, 0.3 } do
      local b = math.floor(none * frac)
      local ok, grads_or_err, _, peak = pcall(step, build, x, loss_fn, policy.budget(b))
      if ok then
        assert.is_true(peak <= b, ("budget %d: measured peak %d"):format(b, peak))
        last = peak
      else
        assert.matches("no plan keeps activations within", grads_or_err)
      end
    end
    assert.truthy(last, "no budget in the sweep was feasible")
  end)

  it("an infeasible budget names the smallest budget that fits, and that one fits", function()
    local ok, err = pcall(step, build, x, loss_fn, policy.budget(1024))
    assert.is_false(ok)
    local smallest = tonumber(tostring(err):match("policy%.budget%((%d+)%)"))
    assert.truthy(smallest, err)
    local _, _, peak = step(build, x, loss_fn, policy.budget(smallest))
    assert.is_true(peak <= smallest)
  end)
end)

-- An independent Lua model of the DP's chain cost, for brute force.
local function chain_eval(c, act)
  local P, peak, cost, k, n = 0, 0, 0, 1, #c
  while k <= n do
    local a = act[k]
    if a == "keep" or (a == "selective" and c[k].sel_flops < 0) then
      peak = math.max(peak, P + c[k].keep_fwd, P + c[k].keep_saved + c[k].keep_bwd)
      P = P + c[k].keep_saved
      k = k + 1
    elseif a == "selective" then
      peak = math.max(peak, P + c[k].keep_fwd, P + c[k].sel_saved + c[k].sel_bwd)
      P = P + c[k].sel_saved
      cost = cost + c[k].sel_flops
      k = k + 1
    else
      local b = k
      while b < n and act[b + 1] == "recompute" do b = b + 1 end
      local pin = k == 1 and 0 or c[k].in_bytes
      local s = 0
      for j = k, b do
        peak = math.max(peak, P + pin + c[j].keep_fwd, P + pin + s + c[j].keep_fwd)
        s = s + c[j].keep_saved
        peak = math.max(peak, P + pin + s + c[j].keep_bwd)
        cost = cost + c[j].flops
      end
      P = P + pin
      k = b + 1
    end
  end
  return peak, cost
end

describe("the budget DP", function()
  local ACTS = { "keep", "selective", "boundary", "recompute" }
  local seed = 12345
  local function rnd(n)
    seed = (seed * 1103515245 + 12345) % 2147483648
    return seed % n
  end
  local function random_chain(n)
    local c = {}
    for i = 1, n do
      local saved = 10 + rnd(90)
      c[i] = { keep_saved = saved, keep_fwd = 5 + rnd(40), keep_bwd = 5 + rnd(60),
               sel_saved = rnd(saved), sel_bwd = 5 + rnd(70), sel_flops = rnd(3) == 0 and -1 or 1 + rnd(30),
               in_bytes = 5 + rnd(40), flops = 1 + rnd(100) }
    end
    return c
  end

  -- Exhaustive search over every plan: each layer keeps, is selective, or starts a
  -- segment (boundary + recompute) of any length; a branch stops only when its partial
  -- peak is already over the budget or its cost cannot beat the best found. Leaves are
  -- scored by chain_eval above, independently of the DP.
  local function brute(c, budget)
    local n, best, act = #c, math.huge, {}
    local function rec(k, P, peak, cost)
      if peak > budget or cost >= best then return end
      if k > n then
        local p2, c2 = chain_eval(c, act)
        assert(p2 == peak and c2 == cost)
        best = cost
        return
      end
      act[k] = "keep"
      rec(k + 1, P + c[k].keep_saved, math.max(peak, P + c[k].keep_fwd, P + c[k].keep_saved + c[k].keep_bwd), cost)
      if c[k].sel_flops >= 0 then
        act[k] = "selective"
        rec(k + 1, P + c[k].sel_saved, math.max(peak, P + c[k].keep_fwd, P + c[k].sel_saved + c[k].sel_bwd),
          cost + c[k].sel_flops)
      end
      local pin, s, f, pk = k == 1 and 0 or c[k].in_bytes, 0, 0, peak
      for b = k, n do
        act[b] = b == k and "boundary" or "recompute"
        pk = math.max(pk, P + pin + c[b].keep_fwd, P + pin + s + c[b].keep_fwd)
        s = s + c[b].keep_saved
        pk = math.max(pk, P + pin + s + c[b].keep_bwd)
        f = f + c[b].flops
        rec(b + 1, P + pin, pk, cost + f)
      end
    end
    rec(1, 0, 0, 0)
    return best
  end

  it("finds the same optimum as brute force on random chains of up to 10 layers", function()
    for _, n in ipairs { 1, 2, 3, 5, 7, 8, 10 } do
      for _ = 1, 6 do
        local c = random_chain(n)
        local all = {}
        for i = 1, n do all[i] = "keep" end
        local keep_peak = chain_eval(c, all)
        for _, frac in ipairs { 1.0, 0.8, 0.6, 0.45, 0.3 } do
          local budget = keep_peak * frac
          local want = brute(c, budget)
          local actions, cost = C.chain_optimal(c, budget)
          if want == math.huge then
            assert.is_nil(actions, ("n=%d budget=%g: DP found a plan brute force did not"):format(n, budget))
          else
            assert.truthy(actions, ("n=%d budget=%g: DP found no plan, brute force cost %g"):format(n, budget, want))
            assert.equal(want, cost)
            local peak, c2 = chain_eval(c, actions)
            assert.is_true(peak <= budget)
            assert.equal(cost, c2)
            local cpeak, ccost = C.chain_eval(c, actions)
            assert.equal(peak, cpeak)
            assert.equal(c2, ccost)
          end
        end
      end
    end
  end)
end)

describe("model:checkpoint", function()
  it("re-resolves the policy when a layer is added, and returns the model", function()
    local m = nn.Sequential { nn.Linear(3, 3) }
    assert.equal(m, m:checkpoint(policy.every(2)))
    m:add(nn.ReLU()):add(nn.Linear(3, 2))
    local plan = m:plan(remat.randn(4, 3))
    assert.equal(3, #plan.layers)
    assert.same({ "boundary", "recompute", "boundary" },
      { plan.layers[1].action, plan.layers[2].action, plan.layers[3].action })
    local y = m(remat.randn(4, 3))
    y:sum():backward()
    assert.truthy(m[3].weight.grad)
  end)
end)

describe("checkpoint policies reject bad input", function()
  it("k < 1 and non-integers", function()
    assert.has_error(function() policy.every(0) end, "policy.every: k must be an integer >= 1, got 0")
    assert.has_error(function() policy.every(1.5) end)
    assert.has_error(function() policy.every("3") end)
  end)

  it("a policy on something that is not a Sequential", function()
    local ok, err = pcall(function() nn.Linear(2, 2):checkpoint(policy.every(2)) end)
    assert.is_false(ok)
    assert.matches("policies apply to a Sequential, not a Linear", err)
    ok, err = pcall(function() nn.Sequential { nn.ReLU() }:checkpoint(42) end)
    assert.is_false(ok)
    assert.matches("expected a policy", err)
  end)

  it("unknown op names, listing the known ones", function()
    local ok, err = pcall(policy.selective, { "softmax", "sofmax" })
    assert.is_false(ok)
    assert.matches("unknown op 'sofmax'", err)
    assert.matches("known ops: .*softmax", err)
  end)

  it("garbage from a custom policy", function()
    local m = nn.Sequential { nn.Linear(3, 3), nn.ReLU() }
    m:checkpoint(function() return "sometimes" end)
    local ok, err = pcall(function() return m(remat.randn(2, 3)) end)
    assert.is_false(ok)
    assert.matches("custom policy: layer 1: expected", err)
    m:checkpoint(function() return { selective = { "nope" } } end)
    ok, err = pcall(function() return m(remat.randn(2, 3)) end)
    assert.is_false(ok)
    assert.matches("unknown op 'nope'", err)
  end)

  it("is validated at checkpoint(), located at the caller's line", function()
    local m = nn.Sequential { nn.Linear(3, 3), nn.ReLU() }
    local ok, err = pcall(function() m:checkpoint(policy.every) end)
    assert.is_false(ok)
    assert.matches("checkpoint_spec.lua:%d+: checkpoint: policy.every is a constructor", err)
    ok, err = pcall(function() m:checkpoint("every(2)") end)
    assert.is_false(ok)
    assert.matches("checkpoint_spec.lua:%d+: checkpoint: expected a policy", err)
    assert.is_nil(m:checkpoint_policy())
  end)

  it("a policy that fails at the first forward names the caller's line and is uninstalled", function()
    local m = nn.Sequential { nn.Linear(3, 3), nn.ReLU() }
    m:checkpoint(policy.every(1))
    m:checkpoint(function() return "sometimes" end)
    local ok, err = pcall(function() return m(remat.randn(2, 3)) end)
    assert.is_false(ok)
    assert.matches("checkpoint_spec.lua:%d+: checkpoint: remat.policy.custom failed and was uninstalled", err)
    assert.is_nil(m:checkpoint_policy())
    local y = m(remat.randn(2, 3)) -- keeps everything now: no second failure
    assert.are.same({ 2, 3 }, y:shape())
    m:checkpoint(policy.budget(1))
    ok, err = pcall(function() return m(remat.randn(2, 3)) end)
    assert.is_false(ok)
    assert.matches("checkpoint_spec.lua:%d+: .*no plan keeps activations within 1 B", err)
    assert.is_nil(m:checkpoint_policy())
  end)

  it("a budget string that does not parse", function()
    assert.has_error(function() policy.budget("12 parsecs") end,
      "policy.budget: cannot read '12 parsecs' as a size (examples: 2GiB, 512MiB, 1e9)")
    assert.has_error(function() policy.budget({}) end)
  end)
end)
