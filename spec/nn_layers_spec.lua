-- Conv2d, MaxPool2d, AvgPool2d, BatchNorm1d/2d and PositionalEmbedding: forward
-- against naive Lua references, gradients against float64 central differences, and
-- BatchNorm's running statistics under every checkpoint policy, budget plans included.
local remat = require "remat"
local kit = require "support.kit"
local nn, policy = remat.nn, remat.policy
local C = remat._C

local function close(got, want, tol, what)
  assert.equal(#want, #got, what)
  for i = 1, #want do
    local e = math.abs(got[i] - want[i]) / math.max(1, math.abs(want[i]))
    if e > tol then error(("%s[%d]: got %.12g, expected %.12g"):format(what or "values", i, got[i], want[i])) end
  end
end

local function flat(t) return C.flat(t:contiguous()) end

-- Naive conv2d over flat values; w (Co, Ci/G, kh, kw), x (B, Ci, H, W).
local function conv_ref(x, xs, w, ws, b, stride, pad, dil, G)
  local B, Ci, H, W = table.unpack(xs)
  local Co, Cg, kh, kw = table.unpack(ws)
  local Ho = (H + 2 * pad[1] - dil[1] * (kh - 1) - 1) // stride[1] + 1
  local Wo = (W + 2 * pad[2] - dil[2] * (kw - 1) - 1) // stride[2] + 1
  local out, og = {}, Co // G
  for n = 0, B - 1 do
    for co = 0, Co - 1 do
      local grp = co // og
      for oh = 0, Ho - 1 do
        for ow = 0, Wo - 1 do
          local s = b and b[co + 1] or 0
          for c = 0, Cg - 1 do
            local ci = grp * Cg + c
            for i = 0, kh - 1 do
              for j = 0, kw - 1 do
                local h, ww = oh * stride[1] - pad[1] + i * dil[1], ow * stride[2] - pad[2] + j * dil[2]
                if h >= 0 and h < H and ww >= 0 and ww < W then
                  s = s + x[((n * Ci + ci) * H + h) * W + ww + 1] * w[((co * Cg + c) * kh + i) * kw + j + 1]
                end
              end
            end
          end
          out[#out + 1] = s
        end
      end
    end
  end
  return out, { B, Co, Ho, Wo }
end

local function pool_ref(x, xs, k, stride, pad, is_max)
  local B, Cc, H, W = table.unpack(xs)
  local Ho = (H + 2 * pad - k) // stride + 1
  local Wo = (W + 2 * pad - k) // stride + 1
  local out = {}
  for p = 0, B * Cc - 1 do
    for oh = 0, Ho - 1 do
      for ow = 0, Wo - 1 do
        local acc = is_max and -math.huge or 0
        for i = 0, k - 1 do
          for j = 0, k - 1 do
            local h, w = oh * stride - pad + i, ow * stride - pad + j
            local v = (h >= 0 and h < H and w >= 0 and w < W) and x[(p * H + h) * W + w + 1] or (is_max and -math.huge or 0)
            if is_max then acc = math.max(acc, v) else acc = acc + v end
          end
        end
        out[#out + 1] = is_max and acc or acc / (k * k)
      end
    end
  end
  return out, { B, Cc, Ho, Wo }
end

-- Central differences of sum(w * m(x)) with respect to every input and parameter
-- element, against backward (float64).
local function fd_check(m, xshape, tol)
  m:to("float64")
  kit.seed(17)
  local x = remat.tensor(kit.values(xshape), "float64"):view(xshape):requires_grad(true)
  local y = m(x)
  local wv = remat.tensor(kit.values(y:shape()), "float64"):view(y:shape())
  local loss = (y * wv):sum()
  m:zero_grad()
  loss:backward()
  local function f()
    return remat.no_grad(function() return (m(x) * wv):sum():item() end)
  end
  local targets = { { x, x.grad } }
  for _, p in ipairs(m:parameters()) do targets[#targets + 1] = { p, p.grad } end
  for ti, tg in ipairs(targets) do
    local t, g = tg[1], flat(tg[2])
    local n = t:numel()
    local tv = t:view(n)
    for k = 1, n do
      local x0 = tv[k]
      remat.no_grad(function() tv[k] = x0 + 1e-6 end)
      local fp = f()
      remat.no_grad(function() tv[k] = x0 - 1e-6 end)
      local fm = f()
      remat.no_grad(function() tv[k] = x0 end)
      local num = (fp - fm) / 2e-6
      local err = math.abs(num - g[k]) / math.max(1, math.abs(num))
      if err > (tol or 1e-5) then
        error(("gradient of tensor %d element %d: analytic %.10g, numeric %.10g"):format(ti, k, g[k], num))
      end
    end
  end
end

describe("nn.Conv2d", function()
  for _, c in ipairs {
    { "3x3, padding 1", 2, 3, 3, {}, { 1, 1 }, { 1, 1 }, { 1, 1 }, 1 },
    { "stride 2, no bias", 3, 4, 3, { stride = 2, bias = false }, { 2, 2 }, { 0, 0 }, { 1, 1 }, 1 },
    { "2x3 kernel, dilation 2x1, padding 0x2", 2, 2, { 2, 3 }, { dilation = { 2, 1 }, padding = { 0, 2 } }, { 1, 1 }, { 0, 2 }, { 2, 1 }, 1 },
    { "groups 2", 4, 6, 3, { groups = 2, padding = 1 }, { 1, 1 }, { 1, 1 }, { 1, 1 }, 2 },
    { "depthwise (groups = channels)", 3, 3, 3, { groups = 3 }, { 1, 1 }, { 0, 0 }, { 1, 1 }, 3 },
  } do
    local name, ci, co, k, opts, stride, pad, dil, G = table.unpack(c)
    if not opts.padding and pad[1] == 1 then opts.padding = 1 end
    it("equals a naive convolution: " .. name, function()
      remat.manual_seed(3)
      local m = nn.Conv2d(ci, co, k, opts):to("float64")
      local x = remat.randn(2, ci, 7, 6, "float64")
      local y = m(x)
      local w = m.weight
      local b = m.bias and flat(m.bias) or nil
      local want, shape = conv_ref(flat(x), x:shape(), flat(w), w:shape(), b, stride, pad, dil, G)
      assert.are.same(shape, y:shape())
      close(flat(y), want, 1e-12, name)
    end)
    it("backward matches central differences: " .. name, function()
      remat.manual_seed(4)
      fd_check(nn.Conv2d(ci, co, k, opts), { 1, ci, 5, 4 })
    end)
  end

  it("rejects bad arguments and inputs with clear errors", function()
    assert.error_matches(function() nn.Conv2d(3, 4, 3, { groups = 2 }) end, "groups %(2%) must divide")
    assert.error_matches(function() nn.Conv2d(3, 4, 0) end, "kernel, stride and dilation must be >= 1")
    assert.error_matches(function() nn.Conv2d(3, 4, 3, { strides = 2 }) end, "unknown option 'strides'")
    local m = nn.Conv2d(3, 4, 3)
    assert.error_matches(function() m(remat.randn(2, 2, 5, 5)) end, "the input has 2 channels, expected 3")
    assert.error_matches(function() m(remat.randn(2, 3, 5)) end, "expected a 4%-d input")
    assert.error_matches(function() m(remat.randn(1, 3, 2, 2)) end, "does not fit")
  end)
end)

describe("nn.MaxPool2d and nn.AvgPool2d", function()
  for _, c in ipairs { { 2, 2, 0 }, { 3, 2, 1 }, { 3, 1, 0 } } do
    local k, s, p = table.unpack(c)
    for _, kind in ipairs { "MaxPool2d", "AvgPool2d" } do
      local name = ("%s kernel %d stride %d padding %d"):format(kind, k, s, p)
      it(name .. " equals a naive pooling; backward matches central differences", function()
        remat.manual_seed(5)
        local m = nn[kind](k, { stride = s, padding = p })
        local x = remat.randn(2, 3, 7, 6, "float64")
        local want, shape = pool_ref(flat(x), x:shape(), k, s, p, kind == "MaxPool2d")
        local y = m(x)
        assert.are.same(shape, y:shape())
        close(flat(y), want, 1e-12, name)
        fd_check(m, { 1, 2, 5, 5 })
      end)
    end
  end
  it("rejects padding above half the kernel", function()
    assert.error_matches(function() nn.MaxPool2d(2, { padding = 2 }) end, "padding 2x2 must be at most half")
  end)
end)

describe("nn.BatchNorm1d and nn.BatchNorm2d", function()
  it("normalise with batch statistics in training and running ones in eval", function()
    remat.manual_seed(6)
    local m = nn.BatchNorm2d(3, { momentum = 0.25 }):to("float64")
    local x = remat.randn(4, 3, 2, 5, "float64") * 3 + 1
    local y = m(x)
    local xv, yv, n = flat(x), flat(y), 4 * 2 * 5
    local rm, rv = flat(m.running_mean), flat(m.running_var)
    for c = 0, 2 do
      local s, ss = 0, 0
      for b = 0, 3 do for k = 0, 9 do s = s + xv[(b * 3 + c) * 10 + k + 1] end end
      local mean = s / n
      for b = 0, 3 do for k = 0, 9 do ss = ss + (xv[(b * 3 + c) * 10 + k + 1] - mean) ^ 2 end end
      local var = ss / n
      for b = 0, 3 do
        for k = 0, 9 do
          local i = (b * 3 + c) * 10 + k + 1
          assert.is_true(math.abs(yv[i] - (xv[i] - mean) / math.sqrt(var + 1e-5)) < 1e-10)
        end
      end
      assert.is_true(math.abs(rm[c + 1] - 0.25 * mean) < 1e-12)
      assert.is_true(math.abs(rv[c + 1] - (0.75 + 0.25 * ss / (n - 1))) < 1e-12)
    end
    m:eval()
    local z = flat(m(x))
    for i = 1, #xv do
      local c = ((i - 1) // 10) % 3 + 1
      assert.is_true(math.abs(z[i] - (xv[i] - rm[c]) / math.sqrt(rv[c] + 1e-5)) < 1e-10)
    end
    assert.are.same(rm, flat(m.running_mean))   -- eval leaves the statistics alone
  end)

  it("backward matches central differences (1d and 2d, with affine parameters)", function()
    remat.manual_seed(7)
    local m1 = nn.BatchNorm1d(3)
    fd_check(m1, { 5, 3 })
    fd_check(nn.BatchNorm1d(2), { 3, 2, 4 })
    fd_check(nn.BatchNorm2d(2), { 2, 2, 3, 3 })
  end)

  it("rejects wrong shapes and single-value batches", function()
    local m = nn.BatchNorm2d(3)
    assert.error_matches(function() m(remat.randn(2, 3, 4)) end, "expected a %(N, C, H, W%) input")
    assert.error_matches(function() m(remat.randn(2, 4, 3, 3)) end, "the input has 4 channels, expected 3")
    assert.error_matches(function() nn.BatchNorm1d(3)(remat.randn(1, 3)) end, "more than one value per channel")
  end)
end)

describe("BatchNorm running statistics under checkpointing", function()
  local function build()
    remat.manual_seed(21)
    return nn.Sequential {
      nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(),
      nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(),
      nn.Linear(8, 8), nn.BatchNorm1d(8), nn.GELU(),
      nn.Linear(8, 3),
    }
  end
  remat.manual_seed(22)
  local x = remat.randn(16, 6)
  local lab = remat.tensor((function() local t = {} for i = 1, 16 do t[i] = i % 3 + 1 end return t end)())
  local function run(p)
    local m = build()
    m:checkpoint(p)
    for _ = 1, 2 do
      local loss = nn.cross_entropy(m(x), lab)
      loss:backward()
    end
    local stats, grads = {}, {}
    for _, i in ipairs { 2, 5, 8 } do
      stats[#stats + 1] = flat(m[i].running_mean)
      stats[#stats + 1] = flat(m[i].running_var)
    end
    for _, q in ipairs(m:parameters()) do grads[#grads + 1] = flat(q.grad) end
    return stats, grads
  end
  local ref_stats, ref_grads = run(policy.none())

  it("none(): two steps move the statistics exactly twice", function()
    local m = build()
    local h = m[1](x)
    local bm = flat(h:mean(1))
    local after1 = {}
    for c = 1, 8 do after1[c] = 0.9 * 0 + 0.1 * bm[c] end
    local want = {}
    for c = 1, 8 do want[c] = 0.9 * after1[c] + 0.1 * bm[c] end   -- same batch twice
    close(ref_stats[1], want, 1e-6, "running mean of the first BatchNorm")
  end)

  for _, p in ipairs {
    policy.every(1), policy.every(2), policy.every(3), policy.sqrt(),
    policy.selective { "relu", "gelu" },
    function(l) return l.index % 2 == 1 and "boundary" or "recompute" end,
    function() return "recompute" end,
  } do
    local pname = type(p) == "function" and "a custom function" or tostring(p)
    it("replays never update them again, and gradients are unchanged, under " .. pname, function()
      local stats, grads = run(p)
      for i = 1, #ref_stats do assert.are.same(ref_stats[i], stats[i]) end
      for i = 1, #ref_grads do assert.are.same(ref_grads[i], grads[i]) end
    end)
  end

  -- Budget plans: the budgets are found here, from this model's own plans (the smallest
  -- activation budget any plan fits, then steps up to keeping everything), so that the
  -- rest of the suite cannot move them; the ones whose plan replays a BatchNorm layer
  -- are checked (at least one must).
  it("replays never update them again, and gradients are unchanged, under budget plans", function()
    local m = build()
    local loss = function(y) return nn.cross_entropy(y, lab) end
    local keep = m:plan(x, { loss = loss }).keep_peak
    local ok, err = pcall(m.plan, m, x, { loss = loss, policy = policy.budget(1) })
    assert.is_false(ok)
    local smallest = math.tointeger(tonumber(tostring(err):match("policy%.budget%((%d+)%)")))
    assert.truthy(smallest, err)
    local checked, plans = 0, {}
    for k = 0, 7 do
      local b = smallest + (keep - smallest) * k // 8
      local plan = m:plan(x, { loss = loss, policy = policy.budget(b) })
      local replayed = false
      for _, l in ipairs(plan.layers) do
        if l.type == "BatchNorm1d" or tostring(l.name):find("BatchNorm", 1, true) then
          replayed = replayed or l.action == "recompute" or l.action == "boundary"
        end
      end
      plans[#plans + 1] = tostring(plan)
      if replayed and checked < 2 then
        checked = checked + 1
        local stats, grads = run(policy.budget(b))
        for i = 1, #ref_stats do assert.are.same(ref_stats[i], stats[i]) end
        for i = 1, #ref_grads do assert.are.same(ref_grads[i], grads[i]) end
      end
    end
    assert.is_true(checked > 0, "no budget plan replays a BatchNorm layer:\n" .. table.concat(plans, "\n"))
  end)
end)

describe("nn.PositionalEmbedding", function()
  it("adds a learned vector per position, for any T up to the block", function()
    remat.manual_seed(8)
    local m = nn.PositionalEmbedding(6, 4)
    local x = remat.randn(2, 5, 4)
    local y = m(x)
    local w, xv, yv = flat(m.weight), flat(x), flat(y)
    for b = 0, 1 do
      for t = 0, 4 do
        for d = 1, 4 do
          local i = (b * 5 + t) * 4 + d
          assert.is_true(math.abs(yv[i] - (xv[i] + w[t * 4 + d])) < 1e-6)
        end
      end
    end
    assert.error_matches(function() m(remat.randn(1, 7, 4)) end, "7 positions, more than the block of 6")
    fd_check(nn.PositionalEmbedding(4, 3), { 2, 3, 3 })
  end)
end)
