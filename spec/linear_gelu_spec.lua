-- The tanh-approximate GELU in modules (issue 16 item 14): nn.GELU{approximate = "tanh"},
-- nn.Linear(in, out, {activation = "gelu_tanh"}) (the fused linear_gelu op) and the MLP /
-- TransformerBlock option approximate = "tanh". On the CPU the fused op is bit for bit
-- the unfused pair, forward and backward; checkpoint replays give the same gradients.
-- (The ops themselves: spec/cases/elementwise.lua and spec/cases/matmul.lua.)
local remat = require "remat"
local nn, policy = remat.nn, remat.policy
local C = remat._C

local function same_bits(a, b, what)
  local x, y = C.flat(a), C.flat(b)
  assert.are.same(a:shape(), b:shape(), what .. ": shapes differ")
  for i = 1, #x do assert(x[i] == y[i], ("%s[%d]: %.17g vs %.17g"):format(what, i, x[i], y[i])) end
end

local function grads(model)
  local out = {}
  for i, p in ipairs(model:parameters()) do out[i] = p.grad end
  return out
end

-- Runs fn() with op timers on; returns the calls per op name.
local function op_calls(fn)
  C.op_timers(true)
  local ok, err = pcall(fn)
  local t = C.op_timing()
  C.op_timers(false)
  assert(ok, err)
  local calls = {}
  for name, e in pairs(t) do calls[name] = e.calls end
  return calls
end

before_each(function() remat.manual_seed(5) end)

describe("nn.GELU{approximate}", function()
  it("'tanh' is the gelu_tanh op; the default and 'none' are the exact gelu", function()
    local x = remat.randn(3, 7)
    same_bits(nn.GELU { approximate = "tanh" }(x), C.op(C.ops.gelu_tanh, nil, x), "GELU tanh")
    same_bits(nn.GELU()(x), x:gelu(), "GELU")
    same_bits(nn.GELU { approximate = "none" }(x), x:gelu(), "GELU none")
    assert.truthy(tostring(nn.GELU { approximate = "tanh" }):find("GELU(approximate='tanh')", 1, true))
    assert.truthy(tostring(nn.GELU()):find("GELU()", 1, true))
  end)

  it("a bad value or option is a clear error", function()
    assert.has_error(function() nn.GELU { approximate = "fast" } end,
      "nn.GELU: approximate must be 'none' (the exact GELU) or 'tanh', got fast")
    assert.has_error(function() nn.GELU { approx = "tanh" } end, "nn.GELU: unknown option 'approx' (known: approximate)")
    assert.has_error(function() nn.GELU("tanh") end, "nn.GELU: options must be a table, got string")
  end)
end)

describe("nn.Linear{activation = 'gelu_tanh'} (the fused linear_gelu op)", function()
  -- a Linear and its fused twin with the same parameters
  local function pair(fin, fout, bias)
    local lin = nn.Linear(fin, fout, bias)
    local fused = nn.Linear(fin, fout, { bias = bias, activation = "gelu_tanh" })
    fused:load_state_dict(lin:state_dict())
    return lin, fused
  end

  for _, bias in ipairs { true, false } do
    it(("forward and backward equal Linear then GELU{approximate='tanh'} bit for bit (bias %s)"):format(tostring(bias)), function()
      local lin, fused = pair(9, 13, bias)
      local ref = nn.Sequential { lin, nn.GELU { approximate = "tanh" } }
      local x1 = remat.randn(2, 5, 9):requires_grad(true)
      local x2 = x1:detach():requires_grad(true)
      local w = remat.randn(2, 5, 13)
      local y1, y2 = ref(x1), fused(x2)
      same_bits(y2, y1, "y")
      local calls = op_calls(function() (y2 * w):sum():backward() end)
      assert.equal(1, calls.gelu_tanh_backward)
      ;(y1 * w):sum():backward()
      same_bits(x2.grad, x1.grad, "dx")
      local g1, g2 = grads(lin), grads(fused)
      assert.equal(bias and 2 or 1, #g2)
      for i = 1, #g1 do same_bits(g2[i], g1[i], "dparam " .. i) end
    end)
  end

  it("its forward is one linear_gelu op: no separate linear or gelu", function()
    local _, fused = pair(4, 8, true)
    local calls = op_calls(function() fused(remat.randn(3, 4)) end)
    assert.equal(1, calls.linear_gelu)
    assert.is_nil(calls.linear)
    assert.is_nil(calls.gelu_tanh)
  end)

  it("describes itself, keeps PyTorch's state dict names, and rejects bad options", function()
    local m = nn.Linear(4, 8, { activation = "gelu_tanh" })
    assert.truthy(tostring(m):find("Linear(4 -> 8, activation='gelu_tanh')", 1, true), tostring(m))
    local keys = {}
    for k in pairs(m:state_dict()) do keys[#keys + 1] = k end
    table.sort(keys)
    assert.are.same({ "bias", "weight" }, keys)
    assert.has_error(function() nn.Linear(4, 8, { activation = "gelu" }) end,
      "nn.Linear: activation must be 'gelu_tanh' (the fused linear_gelu op), got gelu")
    assert.has_error(function() nn.Linear(4, 8, { act = "gelu_tanh" }) end,
      "nn.Linear: unknown option 'act' (known: bias, activation)")
    assert.has_error(function() nn.Linear(4, 8, { bias = 1 }) end, "nn.Linear: bias must be a boolean, got number")
  end)
end)

describe("MLP and TransformerBlock with approximate = 'tanh'", function()
  it("MLP: fc2(linear_gelu(x)), the same bits as fc2(gelu_tanh(linear(x)))", function()
    local m = nn.MLP(6, 16, 0, { approximate = "tanh" })
    local x = remat.randn(3, 6)
    local sd = m:state_dict()
    local ref = C.op(C.ops.gelu_tanh, nil, C.op(C.ops.linear, nil, x, sd["fc1.weight"], sd["fc1.bias"]))
    same_bits(m(x), m.fc2(ref), "MLP")
    assert.truthy(tostring(m):find("approximate='tanh'", 1, true))
    assert.has_error(function() nn.MLP(6, 16, 0, { approximate = "erf" }) end,
      "nn.MLP: approximate must be 'none' (the exact GELU) or 'tanh', got erf")
  end)

  it("TransformerBlock: the tanh MLP runs linear_gelu; the default stays the exact gelu", function()
    local x = remat.randn(2, 5, 8)
    local calls = op_calls(function() nn.TransformerBlock(8, 2, 0, { approximate = "tanh" })(x) end)
    assert.equal(1, calls.linear_gelu)
    assert.is_nil(calls.gelu)
    calls = op_calls(function() nn.TransformerBlock(8, 2)(x) end)
    assert.is_nil(calls.linear_gelu)
    assert.equal(1, calls.gelu)
    calls = op_calls(function() nn.TransformerBlock(8, 2, 0, { fused = true, approximate = "none" })(x) end)
    assert.equal(1, calls.gelu)
    assert.has_error(function() nn.TransformerBlock(8, 2, 0, { approximate = true }) end,
      "nn.TransformerBlock: approximate must be 'none' (the exact GELU) or 'tanh', got true")
    assert.has_error(function() nn.CausalSelfAttention(8, 2, 0, { approximate = "tanh" }) end,
      "nn.CausalSelfAttention: unknown option 'approximate' (known: fused)")
  end)

  it("checkpoint replays give the gradients of none(), bit for bit, under every(1) and selective", function()
    local function run(pol)
      remat.manual_seed(21)
      local layers = {}
      for i = 1, 4 do
        layers[i] = i % 2 == 1 and nn.TransformerBlock(8, 2, 0, { approximate = "tanh" })
          or nn.Residual(nn.Sequential { nn.Linear(8, 16, { activation = "gelu_tanh" }), nn.Linear(16, 8) })
      end
      local model = nn.Sequential(layers)
      if pol then model:checkpoint(pol) end
      local x = remat.randn(2, 5, 8)
      model(x):sum():backward()
      return grads(model)
    end
    local base = run(nil)
    for _, pol in ipairs { policy.every(1), policy.selective { "linear_gelu" }, policy.selective { "linear_gelu", "softmax" } } do
      local g = run(pol)
      assert.equal(#base, #g)
      for i = 1, #base do same_bits(g[i], base[i], tostring(pol) .. " grad " .. i) end
    end
  end)
end)
