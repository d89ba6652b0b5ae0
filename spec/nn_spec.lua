-- nn modules: each built-in layer against a reference made of plain ops from its own
-- parameters, float64 gradient checks of inputs and parameters, the Sequential API,
-- state dicts, Lua-defined modules, dropout modes, initialisation, and a deterministic
-- tiny training run.
local remat = require "remat"
local kit = require "support.kit"
local nn = remat.nn
local C = remat._C

-- Float64 tensor of the given shape with deterministic values in [lo, hi).
local function rand64(shape, lo, hi)
  return C.from_table(kit.values(shape, lo, hi), shape, "float64")
end

local function flat(t) return C.flat(t) end

local function assert_close(got, expected, tol, what)
  local g, e = flat(got), flat(expected)
  assert.are.same(got:shape(), expected:shape(), (what or "values") .. ": shapes differ")
  tol = tol or 1e-10
  for i = 1, #e do
    local err = math.abs(g[i] - e[i]) / math.max(1, math.abs(e[i]))
    assert(err <= tol, ("%s[%d]: got %.12g, expected %.12g"):format(what or "values", i, g[i], e[i]))
  end
end

-- Central-difference check of d(sum(w * model(x)))/d(param) for every parameter
-- element, and of the input when check_input. The model must be float64.
local function gradcheck_module(model, x, opts)
  opts = opts or {}
  local eps, tol = 1e-6, opts.tol or 1e-6
  local out = model(x)
  local w = rand64(out:shape())
  model:zero_grad()
  if opts.check_input then x:requires_grad(true) end
  local y = model(x)
  local loss = (y * w):sum()
  loss:backward()
  local function f()
    return remat.no_grad(function()
      local o = model(x)
      return (o * w):sum():item()
    end)
  end
  local named = model:named_parameters()
  assert(#named > 0 or opts.check_input, "nothing to check")
  for _, np in ipairs(named) do
    local name, p = np[1], np[2]
    local g = p.grad
    assert(g, "no gradient for parameter " .. name)
    local gv, vals, shape = flat(g), flat(p), p:shape()
    local step = math.max(1, #vals // (opts.max_elems or 40))
    for k = 1, #vals, step do
      local v0 = vals[k]
      vals[k] = v0 + eps
      C.copy_values(p, C.from_table(vals, shape, "float64"))
      local fp = f()
      vals[k] = v0 - eps
      C.copy_values(p, C.from_table(vals, shape, "float64"))
      local fm = f()
      vals[k] = v0
      C.copy_values(p, C.from_table(vals, shape, "float64"))
      local num = (fp - fm) / (2 * eps)
      local err = math.abs(num - gv[k]) / math.max(1, math.abs(num))
      assert(err <= tol, ("%s[%d]: analytic %.10g, numeric %.10g"):format(name, k, gv[k], num))
    end
  end
  if opts.check_input then
    local xv, shape = flat(x), x:shape()
    local gv = flat(x.grad)
    for k = 1, #xv, math.max(1, #xv // (opts.max_elems or 40)) do
      local function at(v)
        local vals = { table.unpack(xv) }
        vals[k] = v
        return remat.no_grad(function()
          return (model(C.from_table(vals, shape, "float64")) * w):sum():item()
        end)
      end
      local num = (at(xv[k] + eps) - at(xv[k] - eps)) / (2 * eps)
      local err = math.abs(num - gv[k]) / math.max(1, math.abs(num))
      assert(err <= tol, ("input[%d]: analytic %.10g, numeric %.10g"):format(k, gv[k], num))
    end
  end
end

local function param(m, name) return m:state_dict()[name] end

before_each(function()
  remat.manual_seed(7)
  kit.seed(11)
end)

describe("nn layers match plain-op references", function()
  it("Linear: x W^T + b, with and without bias, on 2-d and 3-d inputs", function()
    local m = nn.Linear(5, 3):to("float64")
    local x = rand64({ 4, 5 })
    assert_close(m(x), x:matmul(param(m, "weight"):t()) + param(m, "bias"), 1e-12, "Linear")
    local x3 = rand64({ 2, 4, 5 })
    assert_close(m(x3), x3:matmul(param(m, "weight"):t()) + param(m, "bias"), 1e-12, "Linear 3-d")
    local nb = nn.Linear(5, 3, false):to("float64")
    assert.are.equal(1, #nb:parameters())
    assert_close(nb(x), x:matmul(param(nb, "weight"):t()), 1e-12, "Linear no bias")
  end)

  it("Embedding: rows of the weight picked by 1-based indices", function()
    local m = nn.Embedding(6, 3):to("float64")
    local idx = remat.tensor({ { 1, 6, 2 }, { 3, 3, 5 } })
    local y = m(idx)
    assert.are.same({ 2, 3, 3 }, y:shape())
    local w = param(m, "weight"):totable()
    local got = y:totable()
    local ids = idx:totable()
    for b = 1, 2 do
      for t = 1, 3 do
        for d = 1, 3 do assert.are.equal(w[ids[b][t]][d], got[b][t][d]) end
      end
    end
  end)

  local function norm_ref(x, w, b, eps, rms)
    local s = x:shape()
    local d = s[#s]
    local v, out = flat(x), {}
    local wv, bv = w and flat(w), b and flat(b)
    for r = 0, #v // d - 1 do
      local mean, sq = 0, 0
      for j = 1, d do mean = mean + v[r * d + j] end
      mean = rms and 0 or mean / d
      for j = 1, d do sq = sq + (v[r * d + j] - mean) ^ 2 end
      local inv = 1 / math.sqrt(sq / d + eps)
      for j = 1, d do
        local y = (v[r * d + j] - mean) * inv
        if wv then y = y * wv[j] end
        if bv then y = y + bv[j] end
        out[r * d + j] = y
      end
    end
    return C.from_table(out, s, "float64")
  end

  it("LayerNorm: normalised rows, scaled and shifted", function()
    local m = nn.LayerNorm(7):to("float64")
    -- non-trivial affine parameters
    m:load_state_dict({ weight = rand64({ 7 }, 0.5, 1.5), bias = rand64({ 7 }) })
    local x = rand64({ 3, 2, 7 }, -2, 2)
    assert_close(m(x), norm_ref(x, param(m, "weight"), param(m, "bias"), 1e-5), 1e-10, "LayerNorm")
    local na = nn.LayerNorm(7, 1e-3, false):to("float64")
    assert.are.equal(0, #na:parameters())
    assert_close(na(x), norm_ref(x, nil, nil, 1e-3), 1e-10, "LayerNorm no affine")
  end)

  it("RMSNorm: rows over their root mean square, scaled (eps 1e-6)", function()
    local m = nn.RMSNorm(5):to("float64")
    m:load_state_dict({ weight = rand64({ 5 }, 0.5, 1.5) })
    local x = rand64({ 4, 5 }, -2, 2)
    assert_close(m(x), norm_ref(x, param(m, "weight"), nil, 1e-6, true), 1e-10, "RMSNorm")
    assert.truthy(tostring(m):find("eps=1e-06", 1, true))
  end)

  it("activations and Softmax are their ops", function()
    local x = rand64({ 3, 4 }, -3, 3)
    assert_close(nn.GELU()(x), x:gelu(), 0, "GELU")
    assert_close(nn.ReLU()(x), x:relu(), 0, "ReLU")
    assert_close(nn.SiLU()(x), x * x:sigmoid(), 1e-12, "SiLU")
    assert_close(nn.Softmax()(x), x:softmax(2), 0, "Softmax")
    assert_close(nn.Softmax(1)(x), x:softmax(1), 0, "Softmax dim 1")
  end)

  -- attention per batch and head with 2-d ops and an explicit additive mask
  local function attention_ref(m, x)
    local B, T, Cd = table.unpack(x:shape())
    local H = m.heads
    local D = Cd // H
    local qkv = m.qkv(x)
    local mask = {}
    for i = 1, T do
      for j = 1, T do mask[(i - 1) * T + j] = j > i and -math.huge or 0 end
    end
    mask = C.from_table(mask, { T, T }, "float64")
    local rows = {}
    for b = 1, B do
      local heads = {}
      local xb = qkv:select(1, b)
      for h = 1, H do
        local q = xb:narrow(2, (h - 1) * D + 1, D)
        local k = xb:narrow(2, Cd + (h - 1) * D + 1, D)
        local v = xb:narrow(2, 2 * Cd + (h - 1) * D + 1, D)
        local s = q:matmul(k:t()) * (1 / math.sqrt(D)) + mask
        heads[h] = s:softmax(2):matmul(v)
      end
      rows[b] = remat.cat(heads, 2):reshape(1, T, Cd)
    end
    return m.proj(remat.cat(rows, 1))
  end

  it("CausalSelfAttention: per-head softmax(q k^T / sqrt(D) + causal mask) v, projected", function()
    local m = nn.CausalSelfAttention(6, 2):to("float64")
    m.heads = 2
    local x = rand64({ 2, 5, 6 })
    assert_close(m(x), attention_ref(m, x), 1e-10, "attention")
    -- causal: changing the last position leaves earlier outputs unchanged
    local x2 = x:clone()
    local v = flat(x2)
    for j = 1, 6 do v[4 * 6 + j] = v[4 * 6 + j] + 1 end
    local y1, y2 = m(x), m(C.from_table(v, { 2, 5, 6 }, "float64"))
    assert_close(y1:narrow(2, 1, 4), y2:narrow(2, 1, 4), 1e-12, "causality")
  end)

  it("MLP: fc2(gelu(fc1(x))), hidden 4d by default", function()
    local m = nn.MLP(4):to("float64")
    assert.are.same({ 16, 4 }, param(m, "fc1.weight"):shape())
    local x = rand64({ 3, 4 })
    assert_close(m(x), m.fc2(m.fc1(x):gelu()), 1e-12, "MLP")
    assert.are.same({ 7, 4 }, param(nn.MLP(4, 7), "fc1.weight"):shape())
  end)

  it("TransformerBlock: x + attn(ln1(x)), then + mlp(ln2(x))", function()
    local m = nn.TransformerBlock(8, 2):to("float64")
    local x = rand64({ 2, 3, 8 })
    local h = x + m.attn(m.ln1(x))
    assert_close(m(x), h + m.mlp(m.ln2(h)), 1e-12, "block")
    local names = {}
    for i, p in ipairs(m:named_parameters()) do names[i] = p[1] end
    assert.are.same({ "ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                      "attn.proj.bias", "ln2.weight", "ln2.bias", "mlp.fc1.weight", "mlp.fc1.bias",
                      "mlp.fc2.weight", "mlp.fc2.bias" }, names)
  end)

  it("Residual: x + m(x)", function()
    local inner = nn.Linear(4, 4)
    local m = nn.Residual(inner):to("float64")
    local x = rand64({ 2, 4 })
    assert_close(m(x), x + inner(x), 1e-12, "Residual")
    assert.are.equal(20, m:num_parameters())
  end)
end)

describe("nn gradients (float64, central differences)", function()
  local cases = {
    { "Linear", function() return nn.Linear(4, 3) end, { 2, 4 } },
    { "Linear without bias", function() return nn.Linear(3, 2, false) end, { 2, 3 } },
    { "LayerNorm", function() return nn.LayerNorm(5) end, { 3, 5 } },
    { "RMSNorm", function() return nn.RMSNorm(5) end, { 3, 5 } },
    { "GELU", function() return nn.GELU() end, { 2, 5 } },
    { "ReLU", function() return nn.ReLU() end, { 2, 5 } },
    { "SiLU", function() return nn.SiLU() end, { 2, 5 } },
    { "Softmax", function() return nn.Softmax() end, { 2, 5 } },
    { "CausalSelfAttention", function() return nn.CausalSelfAttention(4, 2) end, { 2, 3, 4 } },
    { "MLP", function() return nn.MLP(3, 5) end, { 2, 3 } },
    { "TransformerBlock", function() return nn.TransformerBlock(4, 2) end, { 1, 3, 4 } },
    { "Residual", function() return nn.Residual(nn.Linear(3, 3)) end, { 2, 3 } },
    { "Sequential", function() return nn.Sequential { nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2) } end, { 3, 3 } },
  }
  for _, c in ipairs(cases) do
    it(c[1], function()
      local m = c[2]():to("float64")
      gradcheck_module(m, rand64(c[3], -1, 1), { check_input = true })
    end)
  end

  it("Embedding (weight)", function()
    local m = nn.Embedding(5, 3):to("float64")
    gradcheck_module(m, remat.tensor({ { 1, 5, 5 }, { 2, 4, 1 } }))
  end)

  it("Dropout in training (the mask is replayed with its recorded seed)", function()
    local m = nn.Dropout(0.3):to("float64")
    local x = rand64({ 4, 6 }):requires_grad(true)
    remat.manual_seed(3)
    local y = m(x)
    local w = rand64({ 4, 6 })
    ;(y * w):sum():backward()
    local yv, gv, wv, xv = flat(y), flat(x.grad), flat(w), flat(x)
    for i = 1, #yv do
      if yv[i] == 0 then assert.are.equal(0, gv[i])
      else
        assert.is_true(math.abs(yv[i] - xv[i] / 0.7) < 1e-12)
        assert.is_true(math.abs(gv[i] - wv[i] / 0.7) < 1e-12)
      end
    end
  end)
end)

describe("Sequential", function()
  it("builds from a list, has a length, 1-based layers and add() returning self", function()
    local a, b = nn.Linear(3, 4), nn.ReLU()
    local s = nn.Sequential { a, b }
    assert.are.equal(2, #s)
    assert.are.equal(a, s[1])
    assert.are.equal(b, s[2])
    assert.are.equal(s, s:add(nn.Linear(4, 2)))
    assert.are.equal(3, #s)
    assert.are.equal("Linear", s[3]:type_name())
    assert.are.equal("Sequential", s:type_name())
    assert.are.equal(0, #nn.Sequential())
  end)

  it("raises clear errors for out-of-range layers and bad elements", function()
    local s = nn.Sequential { nn.ReLU() }
    assert.has_error(function() return s[2] end, "Sequential[2]: index out of range (it has 1 layer)")
    assert.has_error(function() return s[0] end)
    local ok, err = pcall(nn.Sequential, { nn.ReLU(), 3 })
    assert.is_false(ok)
    assert.truthy(err:find("element 2 is a number, not a module", 1, true))
    ok, err = pcall(function() nn.Linear(2, 2):add(nn.ReLU()) end)
    assert.truthy(err:find("only a Sequential takes layers", 1, true))
    ok, err = pcall(function() s:add(s) end)
    assert.truthy(err:find("cannot add a module to itself", 1, true))
    ok, err = pcall(nn.Linear, 0, 3)
    assert.truthy(err:find("nn.Linear: in_features must be >= 1", 1, true))
    ok, err = pcall(nn.CausalSelfAttention, 6, 4)
    assert.truthy(err:find("multiple of the number of heads", 1, true))
  end)

  it("forward equals calling the layers in turn; model(x) == model:forward(x)", function()
    local s = nn.Sequential { nn.Linear(3, 5), nn.GELU(), nn.Linear(5, 2) }
    local x = remat.randn(4, 3)
    local ref = s[3](s[2](s[1](x)))
    assert.are.same(flat(ref), flat(s(x)))
    assert.are.same(flat(ref), flat(s:forward(x)))
  end)

  it("lists parameters in order, with dotted names through nested modules", function()
    local s = nn.Sequential { nn.Linear(2, 3), nn.ReLU(), nn.TransformerBlock(4, 2), nn.Sequential { nn.LayerNorm(4) } }
    local names = {}
    for i, p in ipairs(s:named_parameters()) do names[i] = p[1] end
    assert.are.equal("1.weight", names[1])
    assert.are.equal("1.bias", names[2])
    assert.are.equal("3.ln1.weight", names[3])
    assert.are.equal("3.attn.qkv.weight", names[5])
    assert.are.equal("4.1.weight", names[#names - 1])
    local ps = s:parameters()
    assert.are.equal(#names, #ps)
    assert.are.same(flat(s[1].weight), flat(ps[1]))
    local total = 0
    for _, p in ipairs(ps) do total = total + p:numel() end
    assert.are.equal(total, s:num_parameters())
  end)

  it("shared layers contribute their parameters once", function()
    local l = nn.Linear(3, 3)
    local s = nn.Sequential { l, nn.ReLU(), l }
    assert.are.equal(2, #s:parameters())
  end)

  it("train() and eval() switch every nested module", function()
    local s = nn.Sequential { nn.TransformerBlock(4, 2, 0.1), nn.Dropout(0.5) }
    assert.is_true(s[1].attn:is_training())
    assert.are.equal(s, s:eval())
    assert.is_false(s[1].attn:is_training())
    assert.is_false(s[2]:is_training())
    s:train()
    assert.is_true(s[1].mlp:is_training())
  end)

  it("zero_grad() clears every gradient", function()
    local s = nn.Sequential { nn.Linear(3, 2) }
    s(remat.randn(2, 3)):sum():backward()
    assert.truthy(s[1].weight.grad)
    s:zero_grad()
    assert.is_nil(s[1].weight.grad)
    assert.is_nil(s[1].bias.grad)
  end)

  it("prints its layers with parameter counts and a total", function()
    local s = nn.Sequential { nn.Linear(784, 256), nn.GELU(), nn.Linear(256, 10) }
    local text = tostring(s)
    assert.truthy(text:find("Sequential (203,530 parameters)", 1, true))
    assert.truthy(text:find("(1) Linear(784 -> 256)", 1, true))
    assert.truthy(text:find("200,960", 1, true))
    assert.truthy(text:find("(2) GELU()", 1, true))
    assert.truthy(text:find("total", 1, true))
  end)

  it("to() converts every parameter and returns self", function()
    local s = nn.Sequential { nn.Linear(3, 2), nn.LayerNorm(2) }
    local before = flat(s[1].weight)
    assert.are.equal(s, s:to("float64"))
    for _, p in ipairs(s:parameters()) do
      assert.are.equal("float64", p:dtype())
      assert.is_true(p:requires_grad())
    end
    assert.are.same(before, flat(s[1].weight))
    s:to("float32")
    assert.are.equal("float32", s[2].bias:dtype())
    assert.has_error(function() s:to("float128") end)
  end)
end)

describe("state dicts", function()
  local function make() return nn.Sequential { nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2) } end

  it("round trip: loading A's state into B gives A's outputs", function()
    remat.manual_seed(1)
    local a = make()
    remat.manual_seed(2)
    local b = make()
    local x = remat.randn(5, 3)
    assert.are_not.same(flat(a(x)), flat(b(x)))
    assert.are.equal(b, b:load_state_dict(a:state_dict()))
    assert.are.same(flat(a(x)), flat(b(x)))
    -- values were copied: changing A afterwards does not change B
    local w = b[1].weight
    a:load_state_dict(make():state_dict())
    assert.are.same(flat(w), flat(b[1].weight))
  end)

  it("converts dtypes while loading", function()
    local a = make()
    local b = make():to("float64")
    b:load_state_dict(a:state_dict())
    assert.are.equal("float64", b[1].weight:dtype())
    local x = remat.randn(2, 3)
    assert_close(b(x:to("float64")), a(x):to("float64"), 1e-6)
  end)

  it("names missing keys, unexpected keys and wrong sizes", function()
    local m = make()
    local sd = m:state_dict()
    sd["1.bias"] = nil
    sd["5.weight"] = remat.zeros(2)
    sd["3.weight"] = remat.zeros(4, 2)
    local ok, err = pcall(m.load_state_dict, m, sd)
    assert.is_false(ok)
    assert.truthy(err:find("missing keys: 1.bias", 1, true))
    assert.truthy(err:find("unexpected keys: 5.weight", 1, true))
    assert.truthy(err:find("wrong sizes: 3.weight (got 4x2, expected 2x4)", 1, true))
  end)
end)

describe("errors", function()
  it("a Linear given the wrong number of features says so, naming the layer", function()
    local s = nn.Sequential { nn.Linear(784, 256), nn.ReLU() }
    local ok, err = pcall(s, remat.randn(32, 100))
    assert.is_false(ok)
    assert.truthy(err:find("Linear(784 -> 256): the input has 100 features in its last dimension (size 32x100), expected 784", 1, true), err)
    assert.truthy(err:find("layer 1", 1, true), err)
    assert.truthy(err:find("nn_spec.lua", 1, true), err)
  end)

  it("attention wants a 3-d input", function()
    local ok, err = pcall(nn.CausalSelfAttention(4, 2), remat.randn(3, 4))
    assert.is_false(ok)
    assert.truthy(err:find("at least 3 dimensions", 1, true), err)
  end)

  it("forward without a tensor", function()
    assert.has_error(function() nn.ReLU()(nil) end, nil)
  end)
end)

describe("Lua-defined modules", function()
  local function scale(d)
    return nn.module {
      name = "Scale",
      w = remat.ones(d):requires_grad(true),
      forward = function(self, x) return x * self.w end,
    }
  end

  it("run inside Sequential, forward and backward, with their parameters listed", function()
    local s = nn.Sequential { nn.Linear(3, 4), scale(4), nn.Linear(4, 2) }
    local names = {}
    for i, p in ipairs(s:named_parameters()) do names[i] = p[1] end
    assert.are.same({ "1.weight", "1.bias", "2.w", "3.weight", "3.bias" }, names)
    s[2]:load_state_dict({ w = remat.tensor({ 1, 2, 3, 4 }) })
    local x = remat.randn(2, 3)
    local ref = s[3](s[1](x) * remat.tensor({ 1, 2, 3, 4 }))
    assert_close(s(x), ref, 1e-6, "forward")
    s:to("float64")
    gradcheck_module(s, rand64({ 2, 3 }), { check_input = true })
    assert.truthy(tostring(s):find("(2) Scale()", 1, true))
  end)

  it("register parameters with :param and children as fields", function()
    local m = nn.module {
      lin = nn.Linear(2, 2),
      forward = function(self, x) return self.lin(x) + self.b end,
    }
    m:param("b", remat.zeros(2))
    local names = {}
    for i, p in ipairs(m:named_parameters()) do names[i] = p[1] end
    assert.are.same({ "b", "lin.weight", "lin.bias" }, names)
    local x = remat.randn(3, 2)
    assert.are.same(flat(m.lin(x)), flat(m(x)))
    m.counter = 5
    assert.are.equal(5, m.counter)
  end)

  it("raise their errors with the original message through the C forward", function()
    local bad = nn.module { forward = function() error("boom in forward") end }
    local s = nn.Sequential { nn.Linear(2, 2), bad }
    local ok, err = pcall(s, remat.randn(1, 2))
    assert.is_false(ok)
    assert.truthy(err:find("boom in forward", 1, true), err)
    assert.truthy(err:find("nn_spec.lua", 1, true), err)
    -- non-string error values pass through unchanged
    local obj = { code = 42 }
    local s2 = nn.Sequential { nn.module { forward = function() error(obj) end } }
    ok, err = pcall(s2, remat.randn(1, 2))
    assert.are.equal(obj, err)
    -- and the model is still usable afterwards
    local good = nn.Sequential { nn.ReLU() }
    assert.are.same({ 1, 2 }, good(remat.randn(1, 2)):shape())
  end)

  it("must return a tensor", function()
    local s = nn.Sequential { nn.module { forward = function() return 3 end } }
    local ok, err = pcall(s, remat.randn(1, 2))
    assert.is_false(ok)
    assert.truthy(err:find("forward must return a tensor, got number", 1, true), err)
    assert.has_error(function() nn.module { } end,
      "nn.module: the table needs a forward function (forward = function(self, x) ... end)")
  end)

  it("nest: a Lua module calling a Sequential containing a Lua module", function()
    local inner = nn.Sequential { scale(2), nn.ReLU() }
    local outer = nn.module { inner = inner, forward = function(self, x) return self.inner(x) * 2 end }
    local s = nn.Sequential { outer }
    local x = remat.tensor({ { -1, 2 } })
    assert.are.same({ 0, 4 }, flat(s(x)))
  end)
end)

describe("Dropout", function()
  it("drops about p of the elements and rescales the rest in training", function()
    local m = nn.Dropout(0.25)
    local x = remat.ones(100, 100)
    local v = flat(m(x))
    local zeros = 0
    for i = 1, #v do
      if v[i] == 0 then zeros = zeros + 1 else assert.is_true(math.abs(v[i] - 1 / 0.75) < 1e-6) end
    end
    assert.is_true(zeros > 2200 and zeros < 2800, "zeros: " .. zeros)
    -- a new call draws a new mask; the same seed gives the same mask
    assert.are_not.same(v, flat(m(x)))
    remat.manual_seed(99)
    local a = flat(m(x))
    remat.manual_seed(99)
    assert.are.same(a, flat(m(x)))
  end)

  it("is the identity in eval mode, also inside attention, MLP and blocks", function()
    local x = remat.randn(2, 3, 8)
    local d = nn.Dropout(0.5):eval()
    assert.are.same(flat(x), flat(d(x)))
    local b = nn.TransformerBlock(8, 2, 0.5):eval()
    assert.are.same(flat(b(x)), flat(b(x)))
    b:train()
    assert.are_not.same(flat(b(x)), flat(b(x)))
  end)
end)

describe("initialisation", function()
  local function stats(t)
    local v = flat(t)
    local lo, hi, sum, sq = math.huge, -math.huge, 0, 0
    for i = 1, #v do
      lo, hi = math.min(lo, v[i]), math.max(hi, v[i])
      sum, sq = sum + v[i], sq + v[i] * v[i]
    end
    local mean = sum / #v
    return lo, hi, mean, math.sqrt(sq / #v - mean * mean)
  end

  it("Linear: weight and bias uniform in +-1/sqrt(in)", function()
    local m = nn.Linear(400, 300)
    local bound = 1 / math.sqrt(400)
    local lo, hi, mean, sd = stats(m.weight)
    assert.is_true(lo >= -bound and hi <= bound)
    assert.is_true(hi > 0.95 * bound and lo < -0.95 * bound)
    assert.is_true(math.abs(mean) < 0.01 * bound * 10)
    assert.is_true(math.abs(sd - bound / math.sqrt(3)) < 0.02 * bound)
    lo, hi = stats(m.bias)
    assert.is_true(lo >= -bound and hi <= bound)
  end)

  it("Embedding: standard normal; norms: ones and zeros", function()
    local _, _, mean, sd = stats(nn.Embedding(200, 100).weight)
    assert.is_true(math.abs(mean) < 0.03)
    assert.is_true(math.abs(sd - 1) < 0.03)
    local ln = nn.LayerNorm(5)
    assert.are.same({ 1, 1, 1, 1, 1 }, flat(ln.weight))
    assert.are.same({ 0, 0, 0, 0, 0 }, flat(ln.bias))
    assert.are.same({ 1, 1, 1 }, flat(nn.RMSNorm(3).weight))
  end)

  it("parameters are leaves that require grad, in the param category", function()
    local before = remat.memory.stats().by_category.param
    local m = nn.Linear(10, 10)
    assert.are.equal(before + 110 * 4, remat.memory.stats().by_category.param)
    for _, p in ipairs(m:parameters()) do assert.is_true(p:requires_grad()) end
  end)

  it("comes from remat's generator: the same seed gives the same model", function()
    remat.manual_seed(5)
    local a = nn.TransformerBlock(8, 2)
    remat.manual_seed(5)
    local b = nn.TransformerBlock(8, 2)
    local pa, pb = a:parameters(), b:parameters()
    for i = 1, #pa do assert.are.same(flat(pa[i]), flat(pb[i])) end
  end)
end)

describe("losses", function()
  it("cross_entropy flattens (B, T, C) logits with (B, T) labels", function()
    local logits = remat.randn(2, 3, 5)
    local labels = remat.tensor({ { 1, 5, 2 }, { 3, 3, 4 } })
    local flat_loss = nn.cross_entropy(logits:reshape(6, 5), labels:reshape(6))
    assert.are.equal(flat_loss:item(), nn.cross_entropy(logits, labels):item())
    local ok, err = pcall(nn.cross_entropy, logits, remat.tensor({ 1, 2 }))
    assert.is_false(ok)
    assert.truthy(err:find("do not match logits of size 2x3x5", 1, true), err)
  end)

  it("mse is the mean squared difference", function()
    local a, b = remat.tensor({ 1, 2, 3 }), remat.tensor({ 1, 0, 0 })
    assert.is_true(math.abs(nn.mse(a, b):item() - 13 / 3) < 1e-6)
  end)
end)

describe("training", function()
  -- a few SGD steps on a fixed seed; parameters updated through load_state_dict
  local function run()
    remat.manual_seed(123)
    local model = nn.Sequential { nn.Embedding(7, 8), nn.TransformerBlock(8, 2, 0.1), nn.LayerNorm(8), nn.Linear(8, 7) }
    local x = remat.tensor({ { 1, 2, 3, 4 }, { 5, 6, 7, 1 } })
    local y = remat.tensor({ { 2, 3, 4, 5 }, { 6, 7, 1, 2 } })
    local losses = {}
    for step = 1, 5 do
      model:zero_grad()
      local loss = nn.cross_entropy(model(x), y)
      loss:backward()
      losses[step] = loss:item()
      remat.no_grad(function()
        local sd = {}
        for _, np in ipairs(model:named_parameters()) do sd[np[1]] = np[2] - np[2].grad * 0.5 end
        model:load_state_dict(sd)
      end)
    end
    return losses
  end

  it("gives the same loss curve twice, and the loss falls", function()
    local a, b = run(), run()
    assert.are.same(a, b)
    assert.is_true(a[5] < a[1], ("loss %g -> %g"):format(a[1], a[5]))
  end)
end)
