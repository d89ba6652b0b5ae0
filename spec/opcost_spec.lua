-- The planner's currency: per-op costs measured on the device (core/opcost.c), and the
-- per-op timers. Nothing here asserts a speed: only where the numbers come from.
local remat = require "remat"
local nn, policy = remat.nn, remat.policy
local C = remat._C

-- One residual block whose only selective-evictable op is the GELU: selective{gelu}
-- replays exactly one op call.
-- A boundary every k layers, the last segment included (policy.every keeps the layers
-- after its last boundary; these specs are about what a replayed segment reruns).
local function segments(k)
  return policy.custom(function(l) return (l.index - 1) % k == 0 and "boundary" or "recompute" end)
end

local function block(d)
  remat.manual_seed(5)
  return nn.Sequential { nn.Residual(nn.Sequential { nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d) }) }
end

local function gelu_costs()
  local s, n = 0, 0
  for _, e in ipairs(C.opcost_entries()) do
    if e.op == "gelu" then s, n = s + e.seconds, n + 1 end
  end
  return s, n
end

describe("per-op costs", function()
  before_each(function()
    C.opcost_reset()
    C.opcost_calibrate(true)
  end)
  after_each(function()
    C.op_timers(false)
    C.opcost_learn(false)
    C.opcost_reset()
    C.opcost_calibrate(true)
  end)

  it("are measured on inputs of ones, not zeros: valid indices, and no block a kernel skips", function()
    -- dropout copies blocks of zeros without drawing random numbers, so a measurement on
    -- zeros would price it as a copy; an embedding refuses index 0 (indices are 1-based),
    -- so on zeros its call could not be measured at all
    remat.manual_seed(1)
    local m = nn.Sequential { nn.Embedding(50, 16), nn.Linear(16, 16), nn.Dropout(0.1), nn.Linear(16, 50) }
    m:plan(remat.tensor({ { 1, 2, 3, 4 }, { 5, 6, 7, 8 } }), { policy = policy.none() })
    local seen = {}
    for _, e in ipairs(C.opcost_entries()) do seen[e.op] = (seen[e.op] or 0) + 1 end
    assert.equal(1, seen.embedding)
    assert.equal(1, seen.dropout)
  end)

  it("are measured at a plan's first use, cached, and price its replays in seconds", function()
    local m = block(16)
    local x = remat.randn(8, 16)
    assert.equal(0, #C.opcost_entries())
    local r = m:plan(x, { policy = policy.selective { "gelu" } })
    local entries = C.opcost_entries()
    assert.is_true(#entries >= 3) -- the linears, the gelu, the residual add
    for _, e in ipairs(entries) do assert.is_true(e.seconds > 0, e.op) end
    -- the one replayed call costs what its measurement says, to the bit
    local g, n = gelu_costs()
    assert.equal(1, n)
    assert.equal(g, r.recompute_cost)
    -- a second plan of the same shapes measures nothing new and prices alike
    local r2 = m:plan(x, { policy = policy.selective { "gelu" } })
    assert.equal(#entries, #C.opcost_entries())
    assert.equal(r.recompute_cost, r2.recompute_cost)
    -- another shape is another call
    m:plan(remat.randn(4, 16), { policy = policy.selective { "gelu" } })
    assert.is_true(#C.opcost_entries() > #entries)
  end)

  it("do not disturb the generator, the memory statistics or the gradients", function()
    local m = nn.Sequential { nn.Residual(nn.Sequential { nn.Linear(8, 32), nn.GELU(), nn.Dropout(0.5), nn.Linear(32, 8) }) }
    local x = remat.randn(4, 8)
    collectgarbage()
    remat.memory.reset_peak()
    local before = remat.memory.stats()
    local seed, offset = C.rng_state()
    m:plan(x, { policy = policy.every(1) })
    assert.is_true(#C.opcost_entries() > 0)
    local s2, o2 = C.rng_state()
    assert.equal(seed, s2)
    assert.equal(offset, o2)
    local after = remat.memory.stats()
    -- the measurements' inputs and outputs (workspace) left no trace
    assert.equal(before.peak_by_category.workspace, after.peak_by_category.workspace)
    assert.same(before.by_category, after.by_category)
  end)

  it("are priced by the roofline when calibration is off", function()
    C.opcost_calibrate(false)
    local m = block(16)
    local r = m:plan(remat.randn(8, 16), { policy = policy.selective { "gelu" } })
    assert.equal(0, #C.opcost_entries())
    assert.is_true(r.recompute_cost > 0)
  end)

  -- core/timestat.c, through a test binding: what a call's samples come to
  it("learn the samples' mean less spikes (above 3x their median), from the last 2048 at most", function()
    assert.are.same({ 0, 0 }, { C.timestat_value {} })
    assert.near(2, (C.timestat_value { 3, 1, 2 }), 1e-6)
    -- a preempted sample is dropped; one at exactly 3x the median is not
    assert.near(1, (C.timestat_value { 1, 1, 1, 50 }), 1e-6)
    assert.near(1.5, (C.timestat_value { 1, 1, 1, 3 }), 1e-6)
    -- an even count: the median is the mean of the middle two (2), so 6 stays, 6.5 goes
    assert.near(11 / 4, (C.timestat_value { 1, 2, 2, 6 }), 1e-6)
    assert.near(5 / 3, (C.timestat_value { 1, 2, 2, 6.5 }), 1e-6)
    -- more samples than kept: 2048 stay; the newest replace kept ones slot by slot
    local many = {}
    for i = 1, 3000 do many[i] = i <= 2048 and 1 or 2 end
    local v, kept = C.timestat_value(many)
    assert.equal(2048, kept)
    assert.near((1096 + 2 * 952) / 2048, v, 1e-6)
    assert.error_matches(function() C.timestat_value { 1, "x" } end, "sample 2 is not a number")
  end)

  -- n training steps of model under policy p with the op timers and learning on
  local function learn_steps(model, p, x, n)
    model:checkpoint(p)
    model:plan(x)
    C.op_timers(true)
    C.opcost_learn(true)
    for _ = 1, n do
      local y = model(x)
      y:sum():backward()
      y:free()
    end
    C.op_timers(false)
    C.opcost_learn(false)
  end

  it("are learned from the timed replays of real steps, else from their first runs", function()
    local x = remat.randn(8, 16)
    -- a call that was replayed: priced at the time of its replays (what a plan prices);
    -- the samples are kept as float
    local m = block(16)
    learn_steps(m, policy.selective { "gelu" }, x, 1)
    local t = C.op_timing().gelu
    assert.equal(1, t.calls)        -- first runs
    assert.equal(1, t.replay_calls) -- one replay per backward
    assert.are_not.equal(t.seconds, t.replay_seconds)
    assert.near(t.replay_seconds, m:plan(x).recompute_cost, 1e-6 * t.replay_seconds)
    -- three replays: their mean, less any above 3x their median (a preempted one)
    learn_steps(m, policy.selective { "gelu" }, x, 3)
    t = C.op_timing().gelu
    assert.equal(3, t.replay_calls)
    local c3 = m:plan(x).recompute_cost
    assert.is_true(c3 > 0 and c3 <= t.replay_seconds / 3 * (1 + 1e-6))
    -- a call only run first (no plan replayed it while learning): its first runs' time
    local k = block(16)
    learn_steps(k, policy.none(), x, 1)
    local f = C.op_timing().gelu
    assert.equal(1, f.calls)
    assert.equal(0, f.replay_calls)
    assert.near(f.seconds, k:plan(x, { policy = policy.selective { "gelu" } }).recompute_cost, 1e-6 * f.seconds)
  end)
end)

describe("per-op timers", function()
  after_each(function() C.op_timers(false) end)

  it("split first runs from replays, per op", function()
    local m = block(8)
    local x = remat.randn(4, 8)
    m:checkpoint(segments(1))
    m:plan(x)
    C.op_timers(true)
    local y = m(x)
    y:sum():backward()
    C.op_timers(false)
    local t = C.op_timing()
    assert.equal(2, t.linear.calls)
    assert.is_true(t.linear.replay_calls >= 1)
    assert.equal(1, t.gelu.replay_calls)
    assert.is_true(t.linear.seconds > 0 and t.linear.replay_seconds > 0)
    -- starting again clears the totals
    C.op_timers(true)
    C.op_timers(false)
    assert.is_nil(next(C.op_timing()))
  end)

  it("show a segment's last layer replaying only what its own backward reads", function()
    -- a block's backward reads fc2's input, GELU's input and the block input: of the
    -- segment's last block, fc2 and the residual add are never replayed
    remat.manual_seed(7)
    local layers = {}
    for i = 1, 6 do layers[i] = nn.Residual(nn.Sequential { nn.Linear(8, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 8) }) end
    local m = nn.Sequential(layers)
    local x = remat.randn(4, 8)
    for _, case in ipairs { { segments(1), 6, 0, "every 1" }, { segments(3), 10, 4, "every 3" } } do
      m:checkpoint(case[1])
      m:plan(x)
      C.op_timers(true)
      m(x):sum():backward()
      C.op_timers(false)
      local t = C.op_timing()
      assert.equal(12, t.linear.calls)
      assert.equal(case[2], t.linear.replay_calls, case[4])
      assert.equal(case[3], t.add.replay_calls, case[4])
      assert.equal(6, t.gelu.replay_calls)
      m:zero_grad()
    end
  end)

  it("show no op replayed more often than the forward ran it (no redundant chain replays)", function()
    -- segments(10): one segment over all 10 layers (each of the 8 blocks replays q, k and
    -- v from views of one qkv projection; those once piled up until the segment's replay
    -- ended, and past 32 of them each view replayed the projection again)
    local policies = { policy.every(1), policy.every(2), policy.sqrt(), segments(10),
                       policy.selective { "softmax", "gelu", "dropout" }, policy.budget(1) }
    for _, p in ipairs(policies) do
      remat.manual_seed(11)
      local layers = { nn.Embedding(32, 16) }
      for _ = 1, 8 do layers[#layers + 1] = nn.TransformerBlock(16, 2, 0.1) end
      layers[#layers + 1] = nn.Linear(16, 32)
      local m = nn.Sequential(layers)
      local x = remat.tensor { { 1, 5, 9, 2, 7, 3, 8, 4 } }
      local ok = pcall(function() m:checkpoint(p) m:plan(x) end)
      if not ok then m:checkpoint(policy.every(1)) end -- budget(1) is refused: the smallest plan
      C.op_timers(true)
      local y = m(x)
      C.op_timers(false)
      local fwd = C.op_timing()
      C.op_timers(true)
      y:sum():backward()
      C.op_timers(false)
      local any, bwd = 0, C.op_timing()
      -- matmul_softmax is the replay of a causal softmax with its scores' product: one
      -- replay of each
      local fused = bwd.matmul_softmax and bwd.matmul_softmax.replay_calls or 0
      local seen = { matmul = { replay_calls = 0 }, softmax = { replay_calls = 0 } }
      for op, t in pairs(bwd) do seen[op] = t end
      for op, t in pairs(seen) do
        local r = t.replay_calls + ((op == "matmul" or op == "softmax") and fused or 0)
        any = any + t.replay_calls
        local f = fwd[op] and fwd[op].calls or 0
        if op ~= "matmul_softmax" then
          assert(r <= f, ("%s: %s replayed %d times, run %d times in forward"):format(tostring(p), op, r, f))
        end
      end
      assert(any > 0, tostring(p) .. ": nothing was replayed")
      -- where the CPU fuses them (float32 tiles on AVX-512), no softmax replays alone
      if remat.info().vector_path == "avx512" then
        assert(fused > 0 and not (bwd.softmax and bwd.softmax.replay_calls > 0),
          ("%s: %d fused replays, %d softmax replays alone"):format(tostring(p), fused, bwd.softmax and bwd.softmax.replay_calls or 0))
      end
    end
  end)
end)

describe("the cache credit", function()
  after_each(function()
    remat.memory.limit(nil)
    C.opcost_calibrate(true)
  end)

  it("is measured once, under any limit, and leaves the memory statistics as they were", function()
    C.opcost_reset()
    collectgarbage()
    local before = remat.memory.stats()
    remat.memory.limit(before.live + 1024 * 1024)   -- far below the probe's 64 MiB scratch
    local limited = remat.memory.stats()
    local cr = C.cache_credit("cpu", 64 * 1024 * 1024)
    local after = remat.memory.stats()
    assert.are.equal(limited.live, after.live)
    assert.are.equal(limited.peak, after.peak)
    assert.are.equal(limited.limit, after.limit)
    assert.are.same(limited.peak_by_category, after.peak_by_category)
    assert(cr.act >= 0 and cr.param >= 0, "negative rates")
    -- 64 MiB outgrows the caches of the machines this project runs on (16-32 MiB of L3):
    -- the probe ran and found memory slower than cache (a rate of 0 would mean it did
    -- not). Not under check-mem: its probe loops, instrumented at -O1, are bound by
    -- their own checks, not by memory, and read cold and hot alike.
    local sanitized = (os.getenv("LD_PRELOAD") or ""):find("libasan", 1, true)
    if not sanitized then assert(cr.act > 0, "no round-trip rate measured") end
    assert.are.equal(7, #cr.cold)
    for i = 1, 7 do assert(cr.cold[i] >= 0 and cr.cold[i] <= 1, "share " .. i .. ": " .. cr.cold[i]) end
    assert.are.equal(1, cr.cold[7])   -- the largest probe pays the whole rate by definition
    assert.are.same(cr, C.cache_credit("cpu", 64 * 1024 * 1024))   -- cached: the same numbers
    assert.error_matches(function() C.cache_credit("tpu") end, "unknown device 'tpu'")
  end)

  it("is 0 when calibration is off (every cost then comes from the roofline)", function()
    C.opcost_calibrate(false)
    local cr = C.cache_credit("cpu", 64 * 1024 * 1024)
    assert.are.same({ act = 0, param = 0, cold = { 0, 0, 0, 0, 0, 0, 0 } }, cr)
    local m = block(32)
    local r = m:plan(remat.randn(64, 32), { policy = policy.every(1) })
    assert.are.equal(r.recompute_cost, r.step_cost)
  end)

  -- The DP's arithmetic on a hand-made chain: each layer keeps 3 MiB and holds 1 MiB of
  -- weights, a replay costs 1 ms; the probe paid 0, 0, 1/4, 1/2, 3/4, 1, 1 of the rates
  -- at 1 .. 64 MiB.
  it("takes from a segment's replays the credit for the share a probe of its size keeps hot", function()
    local MiB = 1024 * 1024
    local function layer()
      return { keep_saved = 3 * MiB, sel_saved = 3 * MiB, fwd = 3 * MiB, keep_bwd = MiB, sel_bwd = MiB,
               in_bytes = MiB, in_kept = MiB, out_bytes = MiB, cost = 1e-3, sel_cost = -1, param_bytes = MiB }
    end
    local chain = { held = 0, loss_peak = 0, layer(), layer(),
                    credit = { act = 1e-10, param = 5e-11, cold = { 0, 0, 0.25, 0.5, 0.75, 1, 1 } } }
    local per_layer = 1e-10 * 3 * MiB + 5e-11 * MiB
    -- one segment of both: 8 MiB replayed, half of it hot
    local _, cost = C.chain_eval(chain, { "boundary", "recompute" })
    assert.near(2e-3 - 2 * per_layer * 0.5, cost, 1e-15)
    -- a boundary each: 4 MiB each, three quarters hot
    _, cost = C.chain_eval(chain, { "boundary", "boundary" })
    assert.near(2 * (1e-3 - per_layer * 0.75), cost, 1e-15)
    -- 6 MiB: between the 4 and 8 MiB probes on a log scale
    chain[1].keep_saved, chain[2].keep_saved = 2 * MiB, 2 * MiB
    local cold = 0.25 + (math.log(6, 2) - 2) * 0.25
    _, cost = C.chain_eval(chain, { "boundary", "recompute" })
    assert.near(2e-3 - 2 * (1e-10 * 2 * MiB + 5e-11 * MiB) * (1 - cold), cost, 1e-15)
    -- a credit larger than the replay leaves 0, never a negative cost
    chain.credit.act = 1
    _, cost = C.chain_eval(chain, { "boundary", "boundary" })
    assert.are.equal(0, cost)
    -- no credit: the replays alone
    chain.credit = nil
    _, cost = C.chain_eval(chain, { "boundary", "recompute" })
    assert.are.equal(2e-3, cost)
  end)

  it("prices a plan as budget() does: the report's step time is its replays less the credit", function()
    C.opcost_calibrate(true)
    local m = block(256)
    local x = remat.randn(512, 256)
    for _, p in ipairs { policy.every(1), policy.selective { "gelu" }, policy.none() } do
      local r = m:plan(x, { policy = p })
      assert(r.step_cost >= 0 and r.step_cost <= r.recompute_cost, ("%s: step %g, replays %g"):format(tostring(p), r.step_cost, r.recompute_cost))
      assert.are.same(C.cache_credit("cpu", 64 * 1024 * 1024).cold, r.credit.cold)
    end
    assert.are.equal(0, m:plan(x, { policy = policy.none() }).step_cost)
  end)
end)
