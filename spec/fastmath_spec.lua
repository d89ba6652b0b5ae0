-- The float32 transcendental kernels (kernels/cpu/fastmath.h) swept over dense input
-- ranges against float64 math done here in Lua, with the error bounds the header
-- states. Errors are in ulps of the float32 result (ulp(r) = 2^(e - 23) for r in
-- [2^e, 2^(e+1)), 2^-149 for subnormal r), so a correctly rounded result is 0.5 ulp.
-- The CPU backend only (other backends have their own math). With FASTMATH_REPORT=1
-- in the environment, the measured maxima are printed.
local remat = require "remat"
local C = remat._C

local inf, nan = math.huge, 0 / 0
local TINY = 2.0 ^ -149 -- the smallest subnormal float
local function report(what, err, at)
  if os.getenv("FASTMATH_REPORT") then
    io.stderr:write(("\n%-14s max %.3f ulp at x = %.9g"):format(what, err, at or 0 / 0))
  end
end

-- ---- float64 references ----

-- tanh: Lambert's continued fraction x / (1 + x^2 / (3 + x^2 / (5 + ...))) for
-- |x| < 1 (no cancellation near 0), (1 - e^-2x) / (1 + e^-2x) above.
local function tanh(x)
  if x ~= x then return x end
  local a = math.abs(x)
  local r
  if a < 1 then
    local x2, d = a * a, 0
    for k = 40, 1, -1 do d = x2 / (2 * k + 1 + d) end
    r = a / (1 + d)
  else
    local t = math.exp(-2 * a)
    r = (1 - t) / (1 + t)
  end
  return x < 0 and -r or r
end

-- sigmoid(x) and sigmoid(-x) = 1 - sigmoid(x), each without cancellation.
local function sigmoid(x)
  if x >= 0 then return 1 / (1 + math.exp(-x)) end
  local e = math.exp(x)
  return e / (1 + e)
end

-- erfc(z) for z >= 0 without exp(-z^2) (the caller applies it exactly): below 3 as
-- (1 - erf(z)) e^(z^2) with erf's series (every term has z's sign), above by the
-- continued fraction erfc(z) e^(z^2) = 1/sqrt(pi) / (z + (1/2) / (z + 1 / (z + ...))).
local function erfc_scaled(z)
  if z < 3 then
    local z2, term, sum, n = z * z, z, z, 0
    repeat
      n = n + 1
      term = term * 2 * z2 / (2 * n + 1)
      sum = sum + term
    until math.abs(term) <= 1e-17 * math.abs(sum)
    return (1 - 2 / math.sqrt(math.pi) * math.exp(-z2) * sum) * math.exp(z2)
  end
  local d = 0
  for k = 120, 1, -1 do d = (k / 2) / (z + d) end
  return 1 / math.sqrt(math.pi) / (z + d)
end

-- Phi(-a) for a >= 0: erfc(a / sqrt 2) / 2, with exp(-a^2 / 2) exact in double for a
-- float a (a^2 has at most 48 bits).
local function Phi_tail(a)
  return 0.5 * math.exp(-a * a / 2) * erfc_scaled(a / math.sqrt(2))
end
local function phi(x) return math.exp(-x * x / 2) / math.sqrt(2 * math.pi) end

local function gelu(x)
  if x == inf then return inf elseif x == -inf then return 0.0 end
  local q = Phi_tail(math.abs(x))
  return x < 0 and x * q or x * (1 - q)
end
-- gelu' = Phi(x) + x phi(x); also the magnitude of its terms, the scale its error is
-- measured against (it crosses 0 near x = -0.75, where a relative error means nothing)
local function gelu_grad(x)
  if x == inf then return 1.0, 1.0 elseif x == -inf then return 0.0, 0.0 end
  local q = Phi_tail(math.abs(x))
  local P = x < 0 and q or 1 - q
  return P + x * phi(x), P + math.abs(x) * phi(x)
end
local function silu(x)
  if x == inf then return inf elseif x == -inf then return 0.0 end
  return x * sigmoid(x)
end
-- silu' = s (1 + x (1 - s)) (0 near x = -1.28) and the scale s (1 + |x| (1 - s))
local function silu_grad(x)
  if x == inf then return 1.0, 1.0 elseif x == -inf then return 0.0, 0.0 end
  local s, sc = sigmoid(x), sigmoid(-x)
  return s * (1 + x * sc), s * (1 + math.abs(x) * sc)
end

-- the tanh GELU, x sigmoid(2u) with 2u = 2 sqrt(2/pi) (x + 0.044715 x^3) (the same
-- function as 0.5 x (1 + tanh(u)), without its cancellation), and its derivative
-- s + x s' 2u' with the scale s + |x| s' 2u' (it crosses 0 near x = -0.75)
local GT = 2 * math.sqrt(2 / math.pi)
local function sig_pair(x)
  local u = GT * (x + 0.044715 * x ^ 3)
  local e = math.exp(-math.abs(u))
  local s = u >= 0 and 1 / (1 + e) or e / (1 + e)
  return s, e / (1 + e) ^ 2
end
local function gelu_tanh(x)
  if x == inf then return inf elseif x == -inf then return 0.0 end
  return x * (sig_pair(x))
end
local function gelu_tanh_grad(x)
  if x ~= x then return x, x end
  if math.abs(x) > 30 then return x > 0 and 1.0 or 0.0, x > 0 and 1.0 or 0.0 end
  local s, ds = sig_pair(x)
  local d = ds * GT * (1 + 3 * 0.044715 * x * x)
  return s + x * d, s + math.abs(x) * d
end

-- ---- measuring ----

local function ulp(r)
  local a = math.abs(r)
  if a < 2.0 ^ -126 then return TINY end
  if a == inf then return inf end
  local e = math.floor(math.log(a, 2))
  if 2.0 ^ e > a then e = e - 1 elseif 2.0 ^ (e + 1) <= a then e = e + 1 end
  return 2.0 ^ (e - 23)
end

-- Inputs as float32 values (rounded by storing them): specials, a dense grid over
-- [-100, 100] (step 1/128), a finer one over [-2, 2], and powers of two (and 1.5
-- times them) from the smallest subnormal to 2^126, both signs.
local function inputs()
  local v = { 0.0, -0.0, inf, -inf, nan, TINY, -TINY, 2.0 ^ -126, -(2.0 ^ -126), 1e-40, -1e-40,
              3.4028234663852886e38, -3.4028234663852886e38, 88.72283935546875, 88.7228469848632812,
              -103.97208404541016, -103.27892303466797, 9.01, -9.01 }
  for i = -12800, 12800 do v[#v + 1] = i / 128 end
  for i = -8192, 8192 do v[#v + 1] = i / 4096 + 1 / 65536 end
  for e = -149, 126 do
    for _, m in ipairs({ 1, 1.5 }) do
      v[#v + 1] = m * 2.0 ^ e
      v[#v + 1] = -m * 2.0 ^ e
    end
  end
  local t = C.from_table(v, { #v }, "float32")
  return t, C.flat(t)
end

-- Runs op over the inputs; for each input calls check(x, got) which returns the error
-- (nil when exact by rule) and an explanation. Returns the largest error and where.
local function sweep(op, check)
  local t, xs = inputs()
  local got = C.flat(C.op(C.ops[op], nil, t))
  local worst, at = 0, nil
  for i, x in ipairs(xs) do
    local err = check(x, got[i])
    if err and err > worst then worst, at = err, x end
  end
  return worst, at
end

-- Checks an op whose reference f(x) is compared in ulps of the result: NaN in, NaN
-- out; infinite references must be matched exactly; err = |got - ref| / ulp(ref)
-- (plus `extra(x)` ulps where the op documents a looser region).
local function check_ulps(op, f, bound, extra)
  local worst, at = sweep(op, function(x, g)
    local r = f(x)
    if r ~= r then
      assert(g ~= g, ("%s(%.9g): got %.9g, expected nan"):format(op, x, g))
      return nil
    end
    if r == inf or r == -inf or math.abs(r) > 3.4028235677973366e38 then
      assert(g == (r > 0 and inf or -inf), ("%s(%.9g): got %.9g, expected %s"):format(op, x, g, r))
      return nil
    end
    local e = math.abs(g - r) / ulp(r)
    local lim = bound + (extra and extra(x) or 0)
    assert(e <= lim, ("%s(%.9g): got %.9g, expected %.17g (%.2f ulp > %.2f)"):format(op, x, g, r, e, lim))
    return lim == bound and e or nil
  end)
  report(op, worst, at)
  return worst, at
end

describe("float32 fast math (kernels/cpu/fastmath.h)", function()
  it("exp: <= 1.1 ulp over the whole range, inf above 88.72, 0 below -103.97, subnormals", function()
    check_ulps("exp", math.exp, 1.1)
    -- 88.7228317 is the last float whose exp is finite (ln FLT_MAX = 88.72283911)
    local g = C.flat(C.op(C.ops.exp, nil, C.from_table({ 88.72283172607422, 88.72283935546875, -104, -inf, inf, -0.0 }, { 6 }, "float32")))
    assert(g[1] < inf and g[2] == inf and g[3] == 0 and g[4] == 0 and g[5] == inf and g[6] == 1,
           "exp limits: " .. table.concat(g, ", "))
  end)

  it("tanh: <= 2.5 ulp, exactly +-1 far out, tanh(+-0) = +-0, odd", function()
    check_ulps("tanh", tanh, 2.5)
    local g = C.flat(C.op(C.ops.tanh, nil, C.from_table({ 20, -20, inf, -inf, -0.0, 1e-30 }, { 6 }, "float32")))
    assert(g[1] == 1 and g[2] == -1 and g[3] == 1 and g[4] == -1, "tanh limits")
    assert(1 / g[5] == -inf, "tanh(-0) is -0")
    assert(math.abs(g[6] - 1e-30) <= 1e-30 * 2 ^ -23, "tanh(1e-30) = 1e-30")
  end)

  it("sigmoid: <= 2.5 ulp, including its left tail down to subnormals", function()
    check_ulps("sigmoid", sigmoid, 2.5)
  end)

  it("silu: <= 3.5 ulp where sigmoid(x) is a normal float (x >= -87.3)", function()
    -- below, x sigmoid(x) multiplies a subnormal (already rounded to 2^-149) by up to
    -- 104: at most 52 of the result's subnormal ulps, 2^-149 each
    check_ulps("silu", silu, 3.5, function(x) return x < -87.3 and 0.5 * math.abs(x) or 0 end)
  end)

  it("gelu: <= 9 ulp everywhere (relative 6e-7), the left tail included", function()
    local worst = check_ulps("gelu", gelu, 9)
    -- the tail keeps relative accuracy: x Phi(x) at -10 is 7.6e-23
    local g = C.flat(C.op(C.ops.gelu, nil, C.from_table({ -10, -13 }, { 2 }, "float32")))
    local xs = C.flat(C.from_table({ -10, -13 }, { 2 }, "float32"))
    for i = 1, 2 do
      local r = gelu(xs[i])
      assert(math.abs(g[i] - r) <= 6e-7 * math.abs(r), ("gelu(%g): %.9g vs %.9g"):format(xs[i], g[i], r))
    end
    assert(worst > 0)
  end)

  -- The float32 argument 2u carries its own rounding (~1.5 ulp of |2u|, as in any float32
  -- tanh GELU); in the left tail exp(2u) turns that into ~|2u| ulp of relative error: up
  -- to ~2 |2u| ulp more there (3 allowed; relative 2e-5 at x = -10, where gelu_tanh is 1e-36).
  local function arg_extra(x) return x < 0 and 3 * math.abs(GT * (x + 0.044715 * x ^ 3)) or 0 end
  it("gelu_tanh: <= 4 ulp, plus 3 |2u| ulp for x < 0 (its float32 argument's rounding)", function()
    check_ulps("gelu_tanh", gelu_tanh, 4, arg_extra)
    -- near 0 and on the right, where the argument is small or s ~ 1: plain 4 ulp
    local t = C.from_table({ -0.5, -0.25, 0.1, 1, 3, 9 }, { 6 }, "float32")
    local g, xs = C.flat(C.op(C.ops.gelu_tanh, nil, t)), C.flat(t)
    for i = 1, #xs do
      local r = gelu_tanh(xs[i])
      assert(math.abs(g[i] - r) <= 4 * ulp(r), ("gelu_tanh(%g): %.9g vs %.9g"):format(xs[i], g[i], r))
    end
  end)

  -- gelu' and silu' cross 0, so their error is measured in ulps of the size of the
  -- terms that are added (Phi + |x| phi; s (1 + |x| (1 - s))).
  local function check_grad(op, f, bound, extra)
    local t, xs = inputs()
    local one = {}
    for i = 1, #xs do one[i] = 1 end
    local ones = C.from_table(one, { #xs }, "float32")
    local got = C.flat(C.op(C.ops[op], nil, t, ones))
    local worst, at = 0, nil
    for i, x in ipairs(xs) do
      local r, scale = f(x)
      local g = got[i]
      if r ~= r then
        assert(g ~= g, ("%s(%.9g): got %.9g, expected nan"):format(op, x, g))
      else
        local e = math.abs(g - r) / ulp(scale)
        local lim = bound + (extra and extra(x) or 0)
        assert(e <= lim, ("%s(%.9g): got %.9g, expected %.17g (%.2f ulp of %.3g > %.2f)"):format(
          op, x, g, r, e, scale, lim))
        if e > worst and lim == bound then worst, at = e, x end
      end
    end
    report(op, worst, at)
  end

  it("gelu_backward: <= 12 ulp of Phi(x) + |x| phi(x)", function()
    check_grad("gelu_backward", gelu_grad, 12)
  end)

  -- gelu and gelu' take a cheaper form within |x| <= 5 (RM_GELU_NEAR); the array kernels
  -- run it alone on blocks of 16 inputs all inside, and send a mixed block's outside
  -- elements to the general form. A result must not depend on its neighbours: the same
  -- inputs give the same bits whether their block is all inside, mixed or all outside.
  it("gelu and gelu_backward: each result depends on its own input only (blocks near 0, mixed, far)", function()
    local n = 16 * 24 + 5 -- a tail past the last whole block
    local near, mixed = {}, {}
    for i = 1, n do
      near[i] = ((i * 37) % 1001) / 100 - 5 -- within [-5, 5]
      mixed[i] = near[i]
    end
    -- blocks 3..24: one, several or all elements moved outside (and NaN, inf), in and
    -- past the tail too
    local far = { 5.0000005, -5.0000005, 7.5, -9.25, 30, -14, nan, inf, -inf }
    for b = 2, 23 do
      local k = (b % 16) + 1
      for j = 1, (b < 20) and k or 16 do
        local at = b * 16 + ((j * 5 + b) % 16) + 1
        mixed[at] = far[(at % #far) + 1]
      end
    end
    mixed[n - 1] = 6.5
    for _, op in ipairs({ "gelu", "gelu_backward" }) do
      local function run(v)
        local t, ones = C.from_table(v, { #v }, "float32"), {}
        for i = 1, #v do ones[i] = 1 end
        local g1 = C.from_table(ones, { #v }, "float32")
        return C.flat(op == "gelu" and C.op(C.ops.gelu, nil, t) or C.op(C.ops.gelu_backward, nil, t, g1))
      end
      local a, b = run(near), run(mixed)
      -- each moved value is compared with itself alone, a 1-element tensor (the tail loop)
      local changed = 0
      for i = 1, n do
        if mixed[i] == near[i] then
          assert(a[i] == b[i], ("%s(%.9g) at %d: %.9g among near inputs, %.9g in a mixed block"):format(op, near[i], i, a[i], b[i]))
        else
          changed = changed + 1
          local alone = run({ mixed[i] })
          local same = (alone[1] ~= alone[1] and b[i] ~= b[i]) or alone[1] == b[i]
          assert(same, ("%s(%.9g): %.9g in a block, %.9g alone"):format(op, mixed[i], b[i], alone[1]))
        end
      end
      assert(changed > 100, "the mixed input moves many elements outside")
    end
  end)

  it("gelu_tanh_backward: <= 6 ulp of s + |x| s' 2u', plus 3 |2u| ulp for x < 0", function()
    check_grad("gelu_tanh_backward", gelu_tanh_grad, 6, arg_extra)
  end)

  it("silu_backward: <= 6 ulp of s (1 + |x| (1 - s)) for x >= -87.3", function()
    check_grad("silu_backward", silu_grad, 6, function(x) return x < -87.3 and 0.5 * math.abs(x) or 0 end)
  end)

  -- rows of logits over [-100, 100]: every exp is within 1.01 ulp, but x - max rounds
  -- in float32, by half an ulp of the difference, which moves exp by |x - max| 2^-24
  -- relative (the same as before these kernels: the difference is float32 input data);
  -- then the same rows masked at the end as a causal mask does (row r ends in 67 r - 1
  -- -inf for r >= 1: the kernel runs max, exp and sum on the live prefix only)
  it("softmax and log_softmax rows: <= 4 ulp + |x - max| 2^-24 relative, plain and causally masked", function()
    for _, masked in ipairs({ false, true }) do
      local rows, n = 8, 509
      local v = {}
      local seed = 12345
      for i = 1, rows * n do
        seed = (seed * 1103515245 + 12345) % 2147483648
        v[i] = (seed / 2147483648) * 200 - 100
      end
      v[3] = -inf
      if masked then
        for r = 0, rows - 1 do for k = math.max(1, n - 67 * r + 2), n do v[r * n + k] = -inf end end
      end
      local t = C.from_table(v, { rows, n }, "float32")
      local xs = C.flat(t)
      local sm = C.flat(C.op(C.ops.softmax, { dim = 1 }, t))
      local ls = C.flat(C.op(C.ops.log_softmax, { dim = 1 }, t))
      for r = 0, rows - 1 do
        local m, s = -inf, 0
        for k = 1, n do m = math.max(m, xs[r * n + k]) end
        for k = 1, n do s = s + math.exp(xs[r * n + k] - m) end
        local lse = m + math.log(s)
        for k = 1, n do
          local x = xs[r * n + k]
          local p, lp = math.exp(x - lse), x - lse
          local tolp = p == 0 and 0 or 4 * ulp(p) + math.abs(x - m) * 2 ^ -24 * p
          assert(math.abs(sm[r * n + k] - p) <= tolp, ("softmax row %d col %d: %.9g vs %.9g"):format(r + 1, k, sm[r * n + k], p))
          if lp == -inf then
            assert(ls[r * n + k] == -inf, "log_softmax of -inf")
          else
            local tolq = 2 * ulp(lp) + 2 * ulp(lse)
            assert(math.abs(ls[r * n + k] - lp) <= tolq, ("log_softmax row %d col %d: %.9g vs %.9g"):format(r + 1, k, ls[r * n + k], lp))
          end
        end
      end
    end
  end)
end)
