-- CausalSelfAttention's two paths: the composed ops ({fused = false}; the default only
-- while training with dropout) and the fused "attention" op (the default otherwise, on
-- every device). Same function, same gradients; the fused path keeps no T x T matrix;
-- checkpoint policies can name "attention".
local remat = require "remat"
local nn, policy = remat.nn, remat.policy
local C = remat._C

local function max_diff(a, b)
  local av, bv = C.flat(a), C.flat(b)
  assert.equal(#av, #bv)
  local m = 0
  for i = 1, #av do
    local d = math.abs(av[i] - bv[i]) / math.max(1, math.abs(bv[i]))
    if d ~= d then return math.huge end
    if d > m then m = d end
  end
  return m
end

-- Builds a (fused, composed) pair with the same parameters.
local function pair(make, opts_fused, opts_comp)
  remat.manual_seed(5)
  local f = make(opts_fused)
  local c = make(opts_comp)
  c:load_state_dict(f:state_dict())
  return f, c
end

-- Output, input gradient and parameter gradients of m on x, with loss sum(y * w).
local function run(m, x0, w)
  local x = x0:detach():requires_grad(true)
  local y = m(x)
  local loss = (y * w):sum()
  loss:backward()
  local grads = {}
  for i, p in ipairs(m:parameters()) do grads[i] = p.grad end
  return y, x.grad, grads
end

local function assert_same_run(f, c, x, tol)
  remat.manual_seed(9)
  local w = remat.randn(table.unpack(x:shape())):to(x:dtype())
  local yf, gxf, gf = run(f, x, w)
  local yc, gxc, gc = run(c, x, w)
  assert(max_diff(yf, yc) <= tol, "outputs differ by " .. max_diff(yf, yc))
  assert(max_diff(gxf, gxc) <= tol, "input gradients differ by " .. max_diff(gxf, gxc))
  assert.equal(#gc, #gf)
  for i = 1, #gc do
    local d = max_diff(gf[i], gc[i])
    assert(d <= tol, ("parameter %d gradients differ by %g"):format(i, d))
  end
end

describe("CausalSelfAttention fused vs composed", function()
  it("same forward and gradients in float32 (odd sizes, several heads)", function()
    local f, c = pair(function(o) return nn.CausalSelfAttention(12, 3, 0, o) end, { fused = true }, { fused = false })
    remat.manual_seed(2)
    assert_same_run(f, c, remat.randn(3, 7, 12), 2e-5)
    assert_same_run(f, c, remat.randn(1, 1, 12), 2e-5)
  end)

  it("same forward and gradients in float64 (to rounding)", function()
    local f, c = pair(function(o) return nn.CausalSelfAttention(8, 2, 0, o) end, { fused = true }, nil)
    f:to("float64")
    c:to("float64")
    remat.manual_seed(3)
    assert_same_run(f, c, remat.randn(2, 5, 8):to("float64"), 1e-12)
  end)

  it("TransformerBlock passes the option to its attention", function()
    local f, c = pair(function(o) return nn.TransformerBlock(16, 4, 0, o) end, { fused = true }, { fused = false })
    assert.truthy(tostring(f):find("CausalSelfAttention(16, heads=4, fused)", 1, true))
    assert.truthy(tostring(c):find("CausalSelfAttention(16, heads=4, composed)", 1, true))
    remat.manual_seed(4)
    assert_same_run(f, c, remat.randn(2, 11, 16), 2e-5)
  end)

  it("eval mode of a module with dropout equals the fused path", function()
    remat.manual_seed(5)
    local c = nn.CausalSelfAttention(8, 2, 0.3)
    local f = nn.CausalSelfAttention(8, 2, 0, { fused = true })
    f:load_state_dict(c:state_dict())
    c:eval()
    local x = remat.randn(2, 6, 8)
    assert(max_diff(f(x), c(x)) <= 2e-5)
  end)

  it("keeps no T x T matrix: less activation memory than the composed path; the default is fused", function()
    local function saved(m, x)
      collectgarbage()
      collectgarbage()
      remat.memory.reset_peak()
      local before = remat.memory.stats().by_category.activation or 0
      local y = m(x)
      local after = remat.memory.stats().by_category.activation or 0
      y = nil
      return after - before
    end
    remat.manual_seed(6)
    local f = nn.CausalSelfAttention(16, 2, 0, { fused = true })
    local c = nn.CausalSelfAttention(16, 2, 0, { fused = false })
    local d, dd = nn.CausalSelfAttention(16, 2), nn.CausalSelfAttention(16, 2, 0.1)
    c:load_state_dict(f:state_dict())
    local B, T = 2, 64
    local x = remat.randn(B, T, 16):requires_grad(true)
    local sf, sc = saved(f, x), saved(c, x)
    assert.equal(sf, saved(d, x)) -- the default: fused (on the CPU too)
    assert(saved(dd, x) >= sc, "training with dropout: the composed path")
    -- the composed path keeps the softmax output (B, heads, T, T); the fused one its
    -- output (B, heads, T, 8) and lse (B, heads, T) instead (float32)
    local tt, kept = B * 2 * T * T * 4, B * 2 * T * (8 + 1) * 4
    assert(sc - sf >= 0.95 * (tt - kept), ("fused %d bytes, composed %d bytes"):format(sf, sc))
  end)
end)

describe("CausalSelfAttention's fused path: attention on the packed qkv", function()
  local function op(name, attrs, ...) return C.op(C.ops[name], attrs, ...) end

  -- What the fused path computed before the packed form: the three-input op on
  -- (B, H, T, D) views of the projection (selects and transposes), y transposed back
  -- and reshaped; its gradient reaches qkv through three select backwards and two adds.
  local function three_input(lq, lp, x, H)
    local B, T, C3 = table.unpack(x:shape())
    local D = C3 // H
    local t5 = op("view", { shape = { B, T, 3, H, D } }, lq(x))
    local qkv = {}
    for i = 0, 2 do qkv[i + 1] = op("transpose", { dim0 = 1, dim1 = 2 }, op("select", { dim = 2, index = i }, t5)) end
    local y = op("attention", { causal = true, scale = 1 / math.sqrt(D) }, qkv[1], qkv[2], qkv[3])
    y = op("transpose", { dim0 = 1, dim1 = 2 }, y):reshape(B, T, H * D)
    return lp(y)
  end

  it("gradients equal the three-input form's bit for bit (float32, odd sizes, several heads)", function()
    for _, c in ipairs({ { 12, 3, 3, 7 }, { 10, 2, 2, 1 }, { 6, 1, 1, 33 } }) do
      local d, H, B, T = table.unpack(c)
      remat.manual_seed(11)
      local m = nn.CausalSelfAttention(d, H, 0, { fused = true })
      local sd = m:state_dict()
      local lq, lp = nn.Linear(d, 3 * d), nn.Linear(d, d)
      lq:load_state_dict({ weight = sd["qkv.weight"], bias = sd["qkv.bias"] })
      lp:load_state_dict({ weight = sd["proj.weight"], bias = sd["proj.bias"] })
      local x0, w = remat.randn(B, T, d), remat.randn(B, T, d)
      local x1, x2 = x0:detach():requires_grad(true), x0:detach():requires_grad(true)
      local y1, y2 = m(x1), three_input(lq, lp, x2, H)
      assert.equal(0, max_diff(y1, y2))
      ;(y1 * w):sum():backward()
      ;(y2 * w):sum():backward()
      assert.equal(0, max_diff(x1.grad, x2.grad))
      local og = { ["qkv.weight"] = lq.weight.grad, ["qkv.bias"] = lq.bias.grad, ["proj.weight"] = lp.weight.grad,
                   ["proj.bias"] = lp.bias.grad }
      local n = 0
      for _, np in ipairs(m:named_parameters()) do
        local name, t = np[1], np[2]
        assert.equal(0, max_diff(t.grad, og[name]), name)
        n = n + 1
      end
      assert.equal(4, n)
    end
  end)

  it("its backward writes one dqkv: no select backwards, no per-head copies", function()
    remat.manual_seed(12)
    local m = nn.CausalSelfAttention(12, 3, 0, { fused = true })
    local x = remat.randn(2, 9, 12):requires_grad(true)
    C.op_timers(true)
    local ok, err = pcall(function() m(x):sum():backward() end)
    local t = C.op_timing()
    C.op_timers(false)
    assert(ok, err)
    assert.equal(1, t.attention.calls)
    assert.equal(1, t.attention_qkv_backward.calls)
    assert.is_nil(t.narrow_backward)
    assert.is_nil(t.attention_backward)
    assert.is_nil(t.select)
  end)
end)

describe("CausalSelfAttention options", function()
  it("fused with attention dropout is a clear error; fused = false with dropout is fine", function()
    local ok, err = pcall(nn.CausalSelfAttention, 8, 2, 0.1, { fused = true })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("nn.CausalSelfAttention: fused attention cannot apply dropout", 1, true), err)
    assert.truthy(tostring(err):find("nn_attention_spec.lua", 1, true), err)
    ok, err = pcall(nn.TransformerBlock, 8, 2, 0.1, { fused = true })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("use dropout = 0 or fused = false", 1, true), err)
    local m = nn.TransformerBlock(8, 2, 0.1, { fused = false })
    assert.truthy(tostring(m):find("composed", 1, true))
  end)

  it("bad options name the constructor and the problem", function()
    local cases = {
      { { fsed = true }, "unknown option 'fsed' (known: fused)" },
      { { fused = 1 }, "fused must be a boolean, got number" },
      { 3, "options must be a table, got number" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(nn.CausalSelfAttention, 8, 2, 0, c[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find("nn.CausalSelfAttention: " .. c[2], 1, true), err)
    end
    local m = nn.CausalSelfAttention(8, 2, 0, {})
    assert.equal("CausalSelfAttention(8, heads=2)", tostring(m):match("^[^\n]*%)"):gsub(" %(.*parameters%)$", ""))
  end)
end)

describe("checkpointing fused attention", function()
  local function gpt(fused)
    remat.manual_seed(11)
    local layers = { nn.Embedding(13, 16) }
    for _ = 1, 3 do layers[#layers + 1] = nn.TransformerBlock(16, 2, 0, { fused = fused }) end
    layers[#layers + 1] = nn.LayerNorm(16)
    layers[#layers + 1] = nn.Linear(16, 13)
    return nn.Sequential(layers)
  end
  local tokens, labels = {}, {}
  for b = 1, 2 do
    tokens[b], labels[b] = {}, {}
    for t = 1, 9 do tokens[b][t], labels[b][t] = (b * 5 + t * 3) % 13 + 1, (b + t * 7) % 13 + 1 end
  end
  local x, lab = remat.tensor(tokens), remat.tensor(labels)
  local function loss_fn(y) return nn.cross_entropy(y, lab) end

  local function grads_under(p, fused)
    local m = gpt(fused)
    m:checkpoint(p)
    local loss = loss_fn(m(x))
    loss:backward()
    local g = {}
    for i, t in ipairs(m:parameters()) do g[i] = C.flat(t.grad) end
    return g, loss:item(), m
  end

  local ref, ref_loss = grads_under(policy.none(), true)

  for _, c in ipairs {
    { "selective{\"attention\"}", policy.selective { "attention" } },
    { "selective{\"attention\", \"gelu\"}", policy.selective { "attention", "gelu" } },
    { "every(1)", policy.every(1) },
    { "sqrt()", policy.sqrt() },
  } do
    it("gradients under " .. c[1] .. " equal none(), bit for bit", function()
      local g, loss = grads_under(c[2], true)
      assert.equal(ref_loss, loss)
      for i = 1, #ref do
        for k = 1, #ref[i] do
          if ref[i][k] ~= g[i][k] then
            error(("parameter %d element %d differs: %.17g vs %.17g"):format(i, k, ref[i][k], g[i][k]))
          end
        end
      end
    end)
  end

  it("selective{\"attention\"} plans recompute work and save memory", function()
    local m = gpt(true)
    m:checkpoint(policy.none())
    local keep = m:plan(x, { loss = loss_fn })
    m:checkpoint(policy.selective { "attention" })
    local sel = m:plan(x, { loss = loss_fn })
    assert(sel.recompute_flops > 0, "recompute flops " .. tostring(sel.recompute_flops))
    assert(sel.predicted_peak < keep.predicted_peak,
      ("selective peak %d, keep peak %d"):format(sel.predicted_peak, keep.predicted_peak))
  end)

  it("the composed model gives the same loss and gradients within float32 tolerance", function()
    local g, loss = grads_under(policy.none(), false)
    assert(math.abs(loss - ref_loss) <= 1e-5 * math.max(1, math.abs(ref_loss)))
    for i = 1, #ref do
      for k = 1, #ref[i] do
        assert(math.abs(g[i][k] - ref[i][k]) <= 1e-4 * math.max(1, math.abs(ref[i][k])),
          ("parameter %d element %d: %.9g vs %.9g"):format(i, k, g[i][k], ref[i][k]))
      end
    end
  end)
end)

describe("CausalSelfAttention on CUDA #gpu", function()
  local available = remat.cuda.available()
  it("uses the fused op by default and matches the CPU composed path", function()
    if not available then pending("no CUDA device") return end
    remat.manual_seed(8)
    local c = nn.CausalSelfAttention(64, 4)
    local g = nn.CausalSelfAttention(64, 4)
    g:load_state_dict(c:state_dict())
    g:to("cuda")
    local x = remat.randn(2, 70, 64)
    local w = remat.randn(2, 70, 64)
    local yc, gxc = run(c, x, w)
    local yg, gxg = run(g, x:cuda(), w:cuda())
    assert(max_diff(yg:cpu(), yc) <= 1e-4)
    assert(max_diff(gxg:cpu(), gxc) <= 1e-3)
  end)
end)
