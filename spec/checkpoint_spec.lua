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

  it("keeps the layers after its last boundary: the same peak as replaying them, less replay", function()
    -- backward starts with the last segment, so its replay would rebuild what the forward
    -- just freed; keeping it instead holds the same tensors at the same moment
    for _, k in ipairs { 1, 3, 4, 5, 17 } do
      local m = build()
      local last = (n + 1 - 1) // k * k + 1 -- the last boundary (1-based; n + 1 layers)
      local plan = m:plan(x, { policy = policy.every(k), loss = loss_fn })
      for i, l in ipairs(plan.layers) do
        local want = i >= last and "keep" or (i - 1) % k == 0 and "boundary" or "recompute"
        assert.equal(want, l.action, ("every(%d), layer %d"):format(k, i))
      end
      local replayed = policy.custom(function(l) return (l.index - 1) % k == 0 and "boundary" or "recompute" end)
      local old = m:plan(x, { policy = replayed, loss = loss_fn })
      assert.equal(old.predicted_peak, plan.predicted_peak, ("every(%d)"):format(k))
      -- strictly less where the last segment holds a block (with k = 1 or 4 it is the
      -- final Linear alone, whose backward reads only its input: nothing to replay)
      local less = (k == 1 or k == 4) and plan.recompute_flops <= old.recompute_flops or plan.recompute_flops < old.recompute_flops
      assert.is_true(less, ("every(%d): %g vs %g flops"):format(k, plan.recompute_flops, old.recompute_flops))
      local _, _, peak = step(build, x, loss_fn, policy.every(k))
      assert.equal(plan.predicted_peak, peak)
    end
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

  it("an infeasible budget names the smallest budget that fits, exactly: that one fits, one byte less does not", function()
    local ok, err = pcall(step, build, x, loss_fn, policy.budget(1024))
    assert.is_false(ok)
    local smallest = tonumber(tostring(err):match("policy%.budget%((%d+)%)"))
    assert.truthy(smallest, err)
    local _, _, peak = step(build, x, loss_fn, policy.budget(smallest))
    assert.is_true(peak <= smallest)
    -- exact: one byte less is refused, naming the same minimum
    local ok2, err2 = pcall(step, build, x, loss_fn, policy.budget(smallest - 1))
    assert.is_false(ok2)
    assert.equal(smallest, tonumber(tostring(err2):match("policy%.budget%((%d+)%)")))
  end)
end)

-- A Lua model of the DP's chain (the rules in core/chain_dp.c's header), for brute force.
-- Returns the peak and cost of a plan; with `upto`, of its first layers only (a lower
-- bound for every plan that starts so). Bytes and costs are integers, so sums are exact.
local function chain_eval(c, act, upto)
  local n, P, peak, cost, seg, k = #c, 0, 0, 0, false, 1
  local max = math.max
  upto = upto or n
  while k <= upto do
    local l, a = c[k], act[k]
    local counted = (k == 1 or seg) and 0 or l.in_kept
    if a == "keep" or a == "selective" then
      local sel = a == "selective" and l.sel_cost >= 0
      peak = max(peak, P + (k == 1 and 0 or l.in_bytes - counted) + l.fwd)
      P = P + ((seg and k > 1) and l.in_kept or 0) + (sel and l.sel_saved or l.keep_saved)
      peak = max(peak, P + c.held + (sel and l.sel_bwd or l.keep_bwd))
      if sel then cost = cost + l.sel_cost end
      seg, k = false, k + 1
    else
      local b = k
      while b < upto and act[b + 1] == "recompute" do b = b + 1 end
      local P0 = k == 1 and P or P - counted + l.in_bytes
      local S = 0
      for j = k, b do
        local lj = c[j]
        local x, xr = 0, 0
        if j > k then x, xr = lj.in_bytes, lj.in_bytes - lj.in_kept end
        peak = max(peak, P0 + x + lj.fwd, P0 + c.held + c[b].out_bytes + S + xr + lj.fwd)
        S = S + lj.keep_saved
        peak = max(peak, P0 + c.held + S + lj.keep_bwd)
        cost = cost + lj.cost
      end
      P = P0 + (b == n and c[b].out_bytes or 0)
      seg, k = true, b + 1
    end
  end
  if upto < n then return peak, cost end
  return max(peak, P + c.loss_peak), cost
end

describe("the budget DP", function()
  local seed = 12345
  local function rnd(n)
    seed = (seed * 1103515245 + 12345) % 2147483648
    return seed % n
  end
  -- Heterogeneous chains with the engine's structure: each input is the previous
  -- output, kept by the layer or not; sizes from a few values, so ties are common.
  local function random_chain(n)
    local c = { held = 1 + rnd(20), loss_peak = 0 }
    c.loss_peak = c.held + rnd(20)
    local out = 4 * (1 + rnd(8))
    for i = 1, n do
      local inb = out
      out = 4 * (1 + rnd(8))
      local in_kept = (i > 1 and rnd(3) > 0) and inb or 0
      local saved = in_kept + 4 * rnd(25)
      local sel_ok = rnd(3) > 0
      c[i] = { in_bytes = inb, in_kept = in_kept, out_bytes = out, keep_saved = saved,
               sel_saved = sel_ok and in_kept + rnd(saved - in_kept + 1) or saved,
               fwd = out + 4 * rnd(10), keep_bwd = out + 4 * rnd(15), sel_bwd = out + 4 * rnd(20),
               cost = 1 + rnd(20), sel_cost = sel_ok and 1 + rnd(8) or -1 }
    end
    return c
  end

  -- Every plan: each layer keeps, is selective, or starts a segment (boundary +
  -- recompute) of any length. Calls leaf(actions) for each; `cut(peak, cost)` prunes a
  -- branch whose partial peak or cost is already too high (peaks only grow).
  local function plans(c, leaf, cut)
    local n, act = #c, {}
    local function rec(k)
      if k > n then return leaf(act) end
      for _, a in ipairs { "keep", "selective" } do
        if a == "keep" or c[k].sel_cost >= 0 then
          act[k] = a
          local pk, cost = chain_eval(c, act, k)
          if not cut(pk, cost) then rec(k + 1) end
        end
      end
      for b = k, n do
        for j = k, b do act[j] = j == k and "boundary" or "recompute" end
        local pk, cost = chain_eval(c, act, b)
        if not cut(pk, cost) then rec(b + 1) end
      end
    end
    rec(1)
  end

  local function brute_cost(c, budget)
    local best = math.huge
    plans(c, function(act)
      local pk, cost = chain_eval(c, act)
      if pk <= budget and cost < best then best = cost end
    end, function(pk, cost) return pk > budget or cost >= best end)
    return best
  end

  local function brute_min_peak(c)
    local best = math.huge
    plans(c, function(act)
      local pk = chain_eval(c, act)
      if pk < best then best = pk end
    end, function(pk) return pk >= best end)
    return best
  end

  it("finds exactly the brute-force optimum on random chains of up to 10 layers", function()
    for _, n in ipairs { 1, 2, 3, 5, 7, 8, 10 } do
      for _ = 1, 5 do
        local c = random_chain(n)
        local all = {}
        for i = 1, n do all[i] = "keep" end
        local keep_peak = chain_eval(c, all)
        local min_peak = brute_min_peak(c)
        local got_min, min_act = C.chain_min_peak(c)
        assert.equal(min_peak, got_min)
        assert.equal(min_peak, (chain_eval(c, min_act)))
        for _, budget in ipairs { keep_peak, keep_peak - 1, min_peak + (keep_peak - min_peak) * 0.6 // 1,
                                  min_peak + (keep_peak - min_peak) * 0.25 // 1, min_peak, min_peak - 1 } do
          local want = brute_cost(c, budget)
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

  -- The chain the budget policy builds (lua/remat/policy.lua), and its dry runs.
  local function real_chain(model, x, loss)
    local n = #model
    local keep = C.plan_simulate(model, x, false, loss, true)
    local selplan = {}
    for i = 1, n do selplan[i] = { action = "selective", ops = policy.cheap_ops } end
    local sel = C.plan_simulate(model, x, selplan, loss, true)
    for i = 1, n do
      if sel.layers[i].out_live ~= keep.layers[i].out_live then selplan[i] = { action = "keep" } end
    end
    sel = C.plan_simulate(model, x, selplan, loss, true)
    return C.chain_from_sims(keep, sel), keep
  end

  -- Long segments on a GPT: replaying one rebuilds q, k and v of each block from views
  -- of one qkv projection. Those views once stayed until the whole segment's replay was
  -- over (keep, boundary, recompute x5, keep x8 dry-ran at 1180808 bytes, modelled
  -- 1090696); a replayed tensor is now evicted once its last reader has replayed.
  it("predicts the dry run's peak exactly for every single-segment plan on a 12-block GPT", function()
    C.opcost_reset()
    C.opcost_calibrate(false)
    finally(function() C.opcost_calibrate(true) end)
    local spec = assert(loadfile("models/gpt.lua"))("--plan", "--layers", "12", "--dim", "32", "--heads", "2",
                                                     "--block", "32", "--batch", "2")
    local model, x, loss = spec.model, spec.input(), spec.loss
    local chain = real_chain(model, x, loss)
    local n, checked = #model, 0
    for a = 1, n do
      for b = a, n do
        local act, plan = {}, {}
        for i = 1, n do
          act[i] = i == a and "boundary" or (i > a and i <= b) and "recompute" or "keep"
          plan[i] = { action = act[i] }
        end
        local sim = C.plan_simulate(model, x, plan, loss, false)
        assert.equal(sim.peak - sim.base, (C.chain_eval(chain, act)), table.concat(act, " "))
        checked = checked + 1
      end
    end
    assert.equal(n * (n + 1) // 2, checked)
  end)

  for _, case in ipairs {
    { "models/mlp.lua, 16 blocks", "models/mlp.lua", { "--plan", "--blocks", "16", "--width", "32", "--batch", "16" } },
    { "models/mlp.lua, 32 blocks", "models/mlp.lua", { "--plan", "--blocks", "32", "--width", "32", "--batch", "16" } },
    { "a 12-block GPT (models/gpt.lua)", "models/gpt.lua",
      { "--plan", "--layers", "12", "--dim", "32", "--heads", "2", "--block", "32", "--batch", "2" } },
  } do
    it("predicts the dry run's peak exactly for every DP plan on " .. case[1], function()
      -- roofline costs, not measured ones: the plans the DP picks (and so the plans this
      -- checks) must not depend on how fast the machine or the build is
      C.opcost_reset()
      C.opcost_calibrate(false)
      finally(function() C.opcost_calibrate(true) end)
      local spec = assert(loadfile(case[2]))(table.unpack(case[3]))
      local model, x, loss = spec.model, spec.input(), spec.loss
      local chain, keep = real_chain(model, x, loss)
      local min_peak, min_act = C.chain_min_peak(chain)
      local top = keep.peak - keep.base
      local budgets = { min_peak }
      for i = 0, 15 do budgets[#budgets + 1] = min_peak + (top - min_peak) * i / 15 // 1 end
      local checked = 0
      for _, b in ipairs(budgets) do
        local act = b == min_peak and min_act or C.chain_optimal(chain, b)
        assert.truthy(act, ("budget %d has a plan (the smallest is %d)"):format(b, min_peak))
        local plan = {}
        for i, a in ipairs(act) do plan[i] = { action = a, ops = a == "selective" and policy.cheap_ops or nil } end
        local sim = C.plan_simulate(model, x, plan, loss, false)
        local modelled = C.chain_eval(chain, act)
        assert.equal(sim.peak - sim.base, modelled, table.concat(act, " "))
        assert.is_true(modelled <= b)
        checked = checked + 1
      end
      assert.is_nil(C.chain_optimal(chain, min_peak - 1))
      assert.equal(#budgets, checked)
    end)

    it("verifies its plan with one dry run on " .. case[1], function()
      -- the search's dry runs: keep all, all selective (again with the layers whose own
      -- output selective evicts kept), every(1) for the last layers' replay, and one
      -- verification; a plan the dry run refused would add the fallback sweep's dozens
      local spec = assert(loadfile(case[2]))(table.unpack(case[3]))
      local model, x, loss = spec.model, spec.input(), spec.loss
      local every1 = {}
      for i = 1, #model do every1[i] = { action = "boundary" } end
      local lo = C.plan_simulate(model, x, every1, loss, false)
      local hi = C.plan_simulate(model, x, false, loss, false)
      for i = 0, 9 do
        local b = lo.peak + (hi.peak - 1 - lo.peak) * i / 9 // 1
        local before = C.plan_simulations()
        C.policy_plan(model, x, policy.budget(b), loss, 0)
        local sims = C.plan_simulations() - before
        assert.is_true(sims == 4 or sims == 5, ("budget %d: %d dry runs"):format(b, sims))
      end
    end)
  end
end)

describe("budget() against every(k) at their memory", function()
  it("costs no more replay than every(1) or every(sqrt N) at their peaks (a segment's last layer replays only what its backward reads)", function()
    -- priced by the roofline (deterministic: measured times vary from run to run)
    C.opcost_reset()
    C.opcost_calibrate(false)
    finally(function() C.opcost_calibrate(true) end)
    remat.manual_seed(3)
    local m = residual_mlp(16, 32, 0.1)
    local x = remat.randn(32, 32)
    for _, ref in ipairs { policy.every(1), policy.sqrt() } do
      local r = m:plan(x, { policy = ref })
      local b = m:plan(x, { policy = policy.budget(r.predicted_peak) })
      assert(b.predicted_peak <= r.predicted_peak)
      assert(b.recompute_cost <= r.recompute_cost, ("%s: budget %.6f s, %s %.6f s"):format(tostring(ref), b.recompute_cost,
        tostring(ref), r.recompute_cost))
    end
  end)
end)

describe("a plan report", function()
  it("states its predicted replay time and the cost model it was priced with", function()
    remat.manual_seed(1)
    local m = residual_mlp(4, 8, 0)
    local report = m:plan(remat.randn(4, 8), { policy = policy.every(2) })
    -- seconds: a few small replayed ops take microseconds, not FLOP counts
    assert.is_true(report.recompute_cost > 0 and report.recompute_cost < 1)
    assert.is_true(report.flops_per_byte > 0)
    local text = tostring(report)
    assert.matches("predicted replay time [%d.]+ ms", text)
    assert.matches("cost model: a replay costs the measured time of its ops on this device", text)
    assert.is_nil(text:find("a selective layer rebuilds", 1, true))
  end)

  it("says what a selective layer replays when the plan has one", function()
    remat.manual_seed(1)
    local m = residual_mlp(4, 8, 0)
    local text = tostring(m:plan(remat.randn(4, 8), { policy = policy.selective { "gelu" } }))
    assert.matches("recomputes {gelu}", text, 1, true)
    assert.matches("a selective layer rebuilds what it drops from the nearest tensors it keeps, each op once", text, 1, true)
  end)
end)

describe("model:checkpoint", function()
  it("re-resolves the policy when a layer is added, and returns the model", function()
    local m = nn.Sequential { nn.Linear(3, 3) }
    assert.equal(m, m:checkpoint(policy.every(2)))
    m:add(nn.ReLU()):add(nn.Linear(3, 2))
    local plan = m:plan(remat.randn(4, 3))
    assert.equal(3, #plan.layers)
    -- layer 3 starts the last segment: every(k) keeps what follows its last boundary
    assert.same({ "boundary", "recompute", "keep" },
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

  it("a Sequential called from a Lua module's forward plans its policy for its input", function()
    local body = nn.Sequential { nn.MLP(8, 32, 0), nn.MLP(8, 32, 0), nn.MLP(8, 32, 0) }
    local calls = 0
    body:checkpoint(function() calls = calls + 1 return "keep" end)
    local outer = nn.module { body = body, forward = function(self, x) return self.body(x) end }
    outer(remat.randn(16, 8)):sum():backward()
    assert.equal(3, calls)
    outer(remat.randn(16, 8)):sum():backward()
    assert.equal(3, calls) -- once per input shape
  end)

  it("a custom policy that changes the model while it is being planned is refused", function()
    local m = nn.Sequential { nn.Linear(3, 3), nn.ReLU() }
    m:checkpoint(function() m:add(nn.ReLU()) return "keep" end)
    local ok, err = pcall(function() return m(remat.randn(2, 3)) end)
    assert.is_false(ok)
    assert.matches("checkpoint: remat.policy.custom failed and was uninstalled .*being planned", err)
    assert.equal(2, #m)
    m:checkpoint(function() m:checkpoint(policy.none()) return "keep" end)
    ok, err = pcall(function() return m(remat.randn(2, 3)) end)
    assert.is_false(ok)
    assert.matches("being planned", err)
    assert.are.same({ 2, 3 }, m(remat.randn(2, 3)):shape())
  end)

  it("a budget string that does not parse", function()
    assert.has_error(function() policy.budget("12 parsecs") end,
      "policy.budget: cannot read '12 parsecs' as a size (examples: 2GiB, 512MiB, 1e9)")
    assert.has_error(function() policy.budget({}) end)
  end)
end)
