-- Spec cases for the elementwise ops (see spec/ops_spec.lua for the contract).
-- References are naive Lua over the flat values the tensors actually hold (so float32
-- rounding of the inputs does not count as an error); most cases are generated from
-- the tables `unary` and `binary` below, one reference function per op.
local remat = require "remat"
local kit = require "support.kit"
local C = remat._C

local nan, inf = 0 / 0, math.huge

-- ---- reference math (Lua has no tanh or erf) ----

local function tanh(x)
  if x ~= x then return x end
  local t = math.exp(-2 * math.abs(x))
  local r = (1 - t) / (1 + t)
  return x < 0 and -r or r
end

-- erf(z) = 2/sqrt(pi) exp(-z^2) sum_n 2^n z^(2n+1) / (2n+1)!!: every term has z's
-- sign, so there is no cancellation; |z| > 6 is +-1 to double precision.
local function erf(z)
  if z ~= z then return z end
  if z > 6 then return 1.0 elseif z < -6 then return -1.0 end
  local z2, term, sum, n = z * z, z, z, 0
  repeat
    n = n + 1
    term = term * 2 * z2 / (2 * n + 1)
    sum = sum + term
  until math.abs(term) <= 1e-17 * math.abs(sum)
  return 2 / math.sqrt(math.pi) * math.exp(-z2) * sum
end

local function sigmoid(x) return 1 / (1 + math.exp(-x)) end
local function Phi(x) return 0.5 * (1 + erf(x / math.sqrt(2))) end
-- gelu/silu and their derivatives take their limits at +-inf (see kernels/cpu/elementwise.c)
local function gelu(x)
  if x == inf then return inf elseif x == -inf then return 0.0 end
  return x * Phi(x)
end
local function gelu_grad(x)
  if x == inf then return 1.0 elseif x == -inf then return 0.0 end
  return Phi(x) + x * math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
end
-- the tanh approximation, naively as written (GPT-2's gelu); kernels use x sigmoid(2u)
local GC = math.sqrt(2 / math.pi)
local function gelu_tanh(x)
  if x == inf then return inf elseif x == -inf then return 0.0 end
  return 0.5 * x * (1 + tanh(GC * (x + 0.044715 * x ^ 3)))
end
local function gelu_tanh_grad(x)
  if x == inf then return 1.0 elseif x == -inf then return 0.0 end
  local t = tanh(GC * (x + 0.044715 * x ^ 3))
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GC * (1 + 3 * 0.044715 * x * x)
end
local function silu(x)
  if x == inf then return inf elseif x == -inf then return 0.0 end
  return x / (1 + math.exp(-x))
end
local function silu_grad(x)
  if x == inf then return 1.0 elseif x == -inf then return 0.0 end
  local s = sigmoid(x)
  return s * (1 + x * (1 - s))
end
local function bool(c) return c and 1.0 or 0.0 end

-- ---- op tables ----

-- f(x, s): reference; s: attrs f[0]; lo/hi: forward input range; glo/ghi: gradient range.
local unary = {
  neg = { f = function(x) return -x end },
  exp = { f = math.exp, lo = -3, hi = 3 },
  log = { f = math.log, lo = 0.1, hi = 4, glo = 0.5, ghi = 2 },
  tanh = { f = tanh, lo = -3, hi = 3 },
  sqrt = { f = math.sqrt, lo = 0, hi = 4, glo = 0.5, ghi = 2 },
  abs = { f = math.abs },
  relu = { f = function(x) return x < 0 and 0.0 or x end },
  gelu = { f = gelu, lo = -4, hi = 4 },
  gelu_tanh = { f = gelu_tanh, lo = -4, hi = 4 },
  silu = { f = silu, lo = -4, hi = 4 },
  sigmoid = { f = sigmoid, lo = -4, hi = 4 },
  copy = { f = function(x) return x end },
  add_scalar = { s = 0.75, f = function(x, s) return x + s end },
  mul_scalar = { s = -1.5, f = function(x, s) return x * s end },
  pow_scalar = { s = 3, f = function(x, s) return x ^ s end },
  rdiv_scalar = { s = 2, f = function(x, s) return s / x end, lo = 0.2, hi = 2, glo = 0.5, ghi = 2 },
  -- bounds inside the sampled range; gradient points land on both sides of both bounds
  clamp = { attrs = { lo = -0.4, hi = 0.3 }, f = function(x)
    if x ~= x then return x end
    return x < -0.4 and -0.4 or x > 0.3 and 0.3 or x
  end },
}

-- f(a, b): reference; a and b ranges; ints: small integers (ties for comparisons);
-- nodiff: why the op has no gradient case.
local CMP = "a comparison is piecewise constant: its gradient is zero almost everywhere"
local HELPER = "internal backward helper (gelu/gelu_tanh/silu backward); checked through their gradients"
local binary = {
  add = { f = function(a, b) return a + b end },
  sub = { f = function(a, b) return a - b end },
  mul = { f = function(a, b) return a * b end },
  div = { f = function(a, b) return a / b end, blo = 0.5, bhi = 2 },
  pow = { f = function(a, b) return a ^ b end, lo = 0.2, hi = 2, blo = -2, bhi = 2 },
  maximum = { f = function(a, b)
    if a ~= a or b ~= b then return nan end
    return a > b and a or b
  end },
  eq = { f = function(a, b) return bool(a == b) end, ints = true, nodiff = CMP },
  ne = { f = function(a, b) return bool(a ~= b) end, ints = true, nodiff = CMP },
  lt = { f = function(a, b) return bool(a < b) end, ints = true, nodiff = CMP },
  le = { f = function(a, b) return bool(a <= b) end, ints = true, nodiff = CMP },
  gt = { f = function(a, b) return bool(a > b) end, ints = true, nodiff = CMP },
  ge = { f = function(a, b) return bool(a >= b) end, ints = true, nodiff = CMP },
  gelu_backward = { f = function(x, g) return g * gelu_grad(x) end, lo = -4, hi = 4, nodiff = HELPER },
  silu_backward = { f = function(x, g) return g * silu_grad(x) end, lo = -4, hi = 4, nodiff = HELPER },
  gelu_tanh_backward = { f = function(x, g) return g * gelu_tanh_grad(x) end, lo = -4, hi = 4, nodiff = HELPER },
}

-- Ops whose cases include large tensors (the OpenMP and blocked-walk paths are shared
-- by every op of a kind, so a few representatives keep the suite fast). Costly ops go
-- parallel sooner (the kernels weigh size by cost), so theirs are smaller.
local BIG = { n = 40001, rows = 5, row = 8200, nc = { 150, 301 } }
local SMALLER = { n = 3001, rows = 5, row = 700, nc = { 50, 61 } }
local LARGE = { add = BIG, relu = BIG, exp = BIG, copy = BIG,
                gelu = SMALLER, gelu_backward = SMALLER, gelu_tanh = SMALLER, gelu_tanh_backward = SMALLER }

local SPECIAL = { nan, inf, -inf, 0.0, 1.0, -1.0, 0.5 }
local PAIRS = { { nan, 1 }, { 1, nan }, { nan, nan }, { inf, 1 }, { -inf, 2 }, { inf, inf },
                { inf, -inf }, { 0, 0 }, { 1, 0 }, { -1, 0 }, { 2, 3 }, { 1, 1 } }

-- ---- shape helpers ----

-- Flat offset into a tensor of shape `s` of output element i (0-based) of shape `out`
-- when s is broadcast to out (numpy rules).
local function bindex(s, out, i)
  local off, mul = 0, 1
  for d = #out, 1, -1 do
    local od = out[d]
    local k = i % od
    i = i // od
    local sd = s[d - (#out - #s)]
    if sd then
      if sd ~= 1 then off = off + k * mul end
      mul = mul * sd
    end
  end
  return off
end

local function bshape(...)
  local shapes, n = { ... }, 0
  for _, s in ipairs(shapes) do n = math.max(n, #s) end
  local out = {}
  for d = 1, n do
    local v = 1
    for _, s in ipairs(shapes) do
      local sd = s[d - (n - #s)]
      if sd and sd ~= 1 then v = sd end
    end
    out[d] = v
  end
  return out
end

return function(K)
  local function op(name, attrs, ...) return C.op(C.ops[name], attrs, ...) end
  local function flat(t) return C.flat(K.device == "cpu" and t or C.to_device(t, "cpu")) end
  local other_dtype = K.dtype == "float32" and "float64" or "float32"

  -- Random contiguous tensor with values in [lo, hi) (or small integers).
  local function gen(shape, lo, hi, ints)
    local v = kit.values(shape, lo, hi)
    if ints then for i = 1, #v do v[i] = math.floor(v[i] * 1.5) + 0.0 end end
    return K.tensor(v, shape)
  end
  -- A non-contiguous tensor of logical shape `shape` (transposed or strided view).
  local function gen_nc(shape, lo, hi, ints)
    local nd = #shape
    if nd >= 2 then
      local s = { table.unpack(shape) }
      s[nd - 1], s[nd] = shape[nd], shape[nd - 1]
      return op("transpose", { dim0 = nd - 2, dim1 = nd - 1 }, gen(s, lo, hi, ints))
    end
    return op("select", { dim = 1, index = 0 }, gen({ shape[1] or 1, 2 }, lo, hi, ints))
  end

  -- Expected values of f over broadcast inputs ts (flat references).
  local function expect(f, ts, s)
    local shapes, vals = {}, {}
    for k, t in ipairs(ts) do shapes[k], vals[k] = C.info(t), flat(t) end
    local out = bshape(table.unpack(shapes))
    local e, args = {}, {}
    for i = 0, kit.numel(out) - 1 do
      for k = 1, #ts do args[k] = vals[k][bindex(shapes[k], out, i) + 1] end
      if s ~= nil then args[#ts + 1] = s end
      e[i + 1] = f(table.unpack(args, 1, #ts + (s ~= nil and 1 or 0)))
    end
    return e, out
  end
  local function check_op(name, attrs, f, s, ts, tol)
    local e, out = expect(f, ts, s)
    K.check(op(name, attrs, table.unpack(ts)), e, out, tol)
  end
  local raises = kit.raises

  local cases = {}

  -- ---- unary and scalar ops ----
  for name, u in pairs(unary) do
    local at = u.attrs or (u.s and { value = u.s }) or nil
    local lo, hi = u.lo or -1, u.hi or 1
    local glo, ghi = u.glo or lo, u.ghi or hi
    local function chk(ts) check_op(name, at, u.f, u.s, ts) end
    local case = {
      forward = {
        ["odd sizes 3x5x7"] = function() chk({ gen({ 3, 5, 7 }, lo, hi) }) end,
        ["size-1 dims and 0-d"] = function()
          chk({ gen({ 1, 4, 1 }, lo, hi) })
          chk({ gen({}, lo, hi) })
        end,
        ["empty 0x3"] = function() chk({ gen({ 0, 3 }, lo, hi) }) end,
        ["non-contiguous (transposed, strided)"] = function()
          chk({ gen_nc({ 4, 7 }, lo, hi) })
          chk({ gen_nc({ 2, 3, 5 }, lo, hi) })
          chk({ gen_nc({ 9 }, lo, hi) })
        end,
        ["NaN and inf propagate"] = function() chk({ K.tensor(SPECIAL, { #SPECIAL }) }) end,
      },
      grad = {
        ["3x4"] = function()
          kit.gradcheck(function(x) return op(name, at, x) end, { { shape = { 3, 4 }, lo = glo, hi = ghi } })
        end,
        ["non-contiguous input"] = function()
          kit.gradcheck(function(x) return op(name, at, op("transpose", { dim0 = 0, dim1 = 1 }, x)) end,
                        { { shape = { 4, 3 }, lo = glo, hi = ghi } })
        end,
      },
    }
    local L = LARGE[name]
    if L then
      case.forward["large contiguous and strided (OpenMP, blocked walk)"] = function()
        chk({ gen({ L.n }, lo, hi) })
        chk({ gen_nc({ L.n }, lo, hi) })
        chk({ gen_nc(L.nc, lo, hi) })
      end
    end
    cases[name] = case
  end

  cases.pow_scalar.forward["exponents 2 (multiply path), 0.5, -1, 0"] = function()
    for _, s in ipairs({ 2, 0.5, -1, 0 }) do
      local t = s == 0.5 and gen({ 3, 5 }, 0, 3) or gen({ 3, 5 })
      check_op("pow_scalar", { value = s }, unary.pow_scalar.f, s, { t })
      check_op("pow_scalar", { value = s }, unary.pow_scalar.f, s, { K.tensor(SPECIAL, { #SPECIAL }) })
    end
  end
  cases.pow_scalar.grad["exponents 2 and 0.5"] = function()
    kit.gradcheck(function(x) return op("pow_scalar", { value = 2 }, x) end, { { shape = { 5 } } })
    kit.gradcheck(function(x) return op("pow_scalar", { value = 0.5 }, x) end, { { shape = { 5 }, lo = 0.5, hi = 2 } })
  end
  cases.clamp.forward["one-sided bounds, equal bounds, bad bounds"] = function()
    local t = K.tensor(SPECIAL, { #SPECIAL })
    local function ref(lo, hi) return function(x)
      if x ~= x then return x end
      return x < lo and lo or x > hi and hi or x
    end end
    check_op("clamp", { lo = -inf, hi = 0.25 }, ref(-inf, 0.25), nil, { t })
    check_op("clamp", { lo = 0, hi = inf }, ref(0, inf), nil, { t })
    check_op("clamp", { lo = 0.5, hi = 0.5 }, ref(0.5, 0.5), nil, { t })
    raises("clamp: the bounds must satisfy min <= max", op, "clamp", { lo = 1, hi = 0 }, t)
  end
  cases.clamp.grad["gradient passes at the bounds"] = function()
    local x = C.from_table({ -0.4, 0.3, 0.0, 2.0 }, { 4 }, "float64")
    C.requires_grad(x, true)
    local y = op("clamp", { lo = -0.4, hi = 0.3 }, x)
    local s = op("sum", { dim = math.mininteger, keepdim = false }, y)
    C.backward(s)
    local g = C.flat(C.grad(x))
    assert(g[1] == 1 and g[2] == 1 and g[3] == 1 and g[4] == 0, "clamp gradient at the bounds: " .. table.concat(g, " "))
  end
  cases.relu.forward["negative zero and tiny values"] = function()
    check_op("relu", nil, unary.relu.f, nil, { K.tensor({ -0.0, 1e-30, -1e-30, 3 }, { 4 }) })
  end
  cases.gelu.forward["tails: large |x| stays accurate"] = function()
    check_op("gelu", nil, gelu, nil, { K.tensor({ -10, -6, -3, 3, 6, 10 }, { 6 }) })
  end
  cases.gelu_tanh.forward["tails and huge |x|: limits, no inf * 0"] = function()
    local xs = { -1e30, -40, -10, -6, -3, 3, 6, 10, 40, 1e30 }
    check_op("gelu_tanh", nil, gelu_tanh, nil, { K.tensor(xs, { #xs }) })
    check_op("gelu_tanh_backward", nil, function(x, g) return g * gelu_tanh_grad(x) end, nil,
             { K.tensor(xs, { #xs }), K.tensor({ 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 }, { #xs }) })
    -- relative accuracy in the left tail (1 + tanh(u) would cancel): x sigmoid(2u)
    local y = flat(op("gelu_tanh", nil, K.tensor({ -5 }, { 1 })))[1]
    local u = 2 * GC * (-5 + 0.044715 * -125)
    local r = -5 * math.exp(u) / (1 + math.exp(u))
    assert(math.abs(y - r) <= (K.dtype == "float64" and 1e-13 or 1e-6) * math.abs(r), ("gelu_tanh(-5): %.17g vs %.17g"):format(y, r))
  end
  cases.gelu_tanh.forward["differs from the exact gelu as the approximation does"] = function()
    local t = K.tensor({ -3, -1, 0.5, 1, 2 }, { 5 })
    local a, b = flat(op("gelu_tanh", nil, t)), flat(op("gelu", nil, t))
    local worst = 0
    for i = 1, 5 do worst = math.max(worst, math.abs(a[i] - b[i])) end
    assert(worst > 1e-4 and worst < 2e-3, "gelu_tanh - gelu: " .. worst)
  end

  -- ---- binary ops (broadcasting) ----
  for name, b in pairs(binary) do
    local lo, hi = b.lo or -1, b.hi or 1
    local blo, bhi = b.blo or lo, b.bhi or hi
    local function A(shape, nc) return (nc and gen_nc or gen)(shape, lo, hi, b.ints) end
    local function B(shape, nc) return (nc and gen_nc or gen)(shape, blo, bhi, b.ints) end
    local function chk(x, y) check_op(name, nil, b.f, nil, { x, y }) end
    local case = {
      forward = {
        ["same shape 3x5x7"] = function() chk(A({ 3, 5, 7 }), B({ 3, 5, 7 })) end,
        ["broadcast 4x1x3 with 5x1, row, column and 0-d"] = function()
          chk(A({ 4, 1, 3 }), B({ 5, 1 }))
          chk(A({ 2, 3 }), B({ 3 }))
          chk(A({ 3, 1 }), B({ 3, 4 }))
          chk(A({}), B({ 3, 4 }))
          chk(A({ 2, 3 }), B({}))
        end,
        ["broadcast with the lower-rank input first"] = function()
          chk(A({ 2, 4 }), B({ 3, 1, 1 }))
          chk(A({ 5, 1 }), B({ 4, 1, 3 }))
        end,
        ["size-1 dims"] = function() chk(A({ 1, 4, 1 }), B({ 1, 4, 1 })) end,
        ["empty"] = function()
          chk(A({ 0, 3 }), B({ 3 }))
          chk(A({ 2, 0 }), B({ 1 }))
        end,
        ["non-contiguous, alone and broadcast"] = function()
          chk(A({ 4, 6 }, true), B({ 4, 6 }, true))
          chk(A({ 5, 3 }, true), B({ 3 }))
          chk(A({ 2, 3, 4 }), B({ 3, 4 }, true))
          chk(A({ 7 }, true), B({ 7 }))
        end,
        ["NaN and inf propagate"] = function()
          local x, y = {}, {}
          for k, p in ipairs(PAIRS) do x[k], y[k] = p[1], p[2] end
          chk(K.tensor(x, { #x }), K.tensor(y, { #y }))
        end,
        ["incompatible shapes are an error naming the op"] = function()
          raises(name .. ": shapes 2x3 and 4 cannot be broadcast", op, name, nil, A({ 2, 3 }), B({ 4 }))
        end,
        ["dtype mismatch and wrong arity are errors"] = function()
          if K.device == "cpu" then
            local y = C.from_table({ 1, 2 }, { 2 }, other_dtype)
            raises(name .. ": input 2 is " .. other_dtype .. " but input 1 is " .. K.dtype, op, name, nil, A({ 2 }), y)
          end
          raises(name .. " takes 2 inputs (got 1)", op, name, nil, A({ 2 }))
        end,
      },
    }
    if C.device_available("cuda") and K.device == "cuda" then
      case.forward["device mismatch is an error"] = function()
        raises(name .. ": input 2 is on cpu but input 1 is on cuda", op, name, nil, A({ 2 }),
               C.from_table({ 1, 2 }, { 2 }, K.dtype))
      end
    end
    local L = LARGE[name]
    if L then
      case.forward["large: contiguous, column broadcast, strided (OpenMP, blocked walk)"] = function()
        chk(A({ L.n }), B({ L.n }))
        chk(A({ L.rows, L.row }), B({ L.rows, 1 }))
        chk(A(L.nc, true), B(L.nc, true))
      end
    end
    if b.nodiff then
      case.nodiff = b.nodiff
    else
      case.grad = {
        ["same shape 3x4"] = function()
          kit.gradcheck(function(x, y) return op(name, nil, x, y) end,
                        { { shape = { 3, 4 }, lo = lo, hi = hi }, { shape = { 3, 4 }, lo = blo, hi = bhi } })
        end,
        ["broadcast 3x1x4 with 2x4 and 0-d"] = function()
          kit.gradcheck(function(x, y) return op(name, nil, x, y) end,
                        { { shape = { 3, 1, 4 }, lo = lo, hi = hi }, { shape = { 2, 4 }, lo = blo, hi = bhi } })
          kit.gradcheck(function(x, y) return op(name, nil, x, y) end,
                        { { shape = {}, lo = lo, hi = hi }, { shape = { 2, 3 }, lo = blo, hi = bhi } })
        end,
        ["non-contiguous inputs"] = function()
          kit.gradcheck(function(x, y) return op(name, nil, op("transpose", { dim0 = 0, dim1 = 1 }, x), y) end,
                        { { shape = { 4, 3 }, lo = lo, hi = hi }, { shape = { 3, 4 }, lo = blo, hi = bhi } })
        end,
      }
    end
    cases[name] = case
  end

  cases.maximum.forward["ties and signed zeros"] = function()
    check_op("maximum", nil, binary.maximum.f, nil, { K.tensor({ 1, 2, -3, 0 }, { 4 }), K.tensor({ 1, 2, -3, 0 }, { 4 }) })
  end
  cases.maximum.grad["ties split the gradient"] = function()
    local x = C.from_table({ 1, 2, 3 }, { 3 }, "float64")
    local y = C.from_table({ 1, 0, 5 }, { 3 }, "float64")
    C.requires_grad(x, true)
    C.requires_grad(y, true)
    C.backward(op("maximum", nil, x, y), C.from_table({ 1, 1, 1 }, { 3 }, "float64"))
    local gx, gy = C.flat(C.grad(x)), C.flat(C.grad(y))
    assert(gx[1] == 0.5 and gy[1] == 0.5 and gx[2] == 1 and gy[2] == 0 and gx[3] == 0 and gy[3] == 1,
           "maximum: gradient split " .. table.concat(gx, ",") .. " / " .. table.concat(gy, ","))
  end
  cases.pow.grad["zero base"] = function()
    -- d(0^b)/db is taken as 0 (the limit), not 0 * log 0 = NaN
    local a = C.from_table({ 0, 0 }, { 2 }, "float64")
    local b = C.from_table({ 2, 0.5 }, { 2 }, "float64")
    C.requires_grad(b, true)
    C.backward(op("pow", nil, a, b), C.from_table({ 1, 1 }, { 2 }, "float64"))
    local g = C.flat(C.grad(b))
    assert(g[1] == 0 and g[2] == 0, "pow: gradient w.r.t. the exponent at base 0: " .. table.concat(g, ","))
  end

  -- ---- where(cond, a, b) ----
  local function pick(c, x, y) if c ~= 0 then return x end return y end
  local function cond(shape, nc)
    return (nc and gen_nc or gen)(shape, 0, 1.34, true) -- values 0 and 1
  end
  cases.where = {
    forward = {
      ["same shape 3x5x7"] = function()
        check_op("where", nil, pick, nil, { cond({ 3, 5, 7 }), gen({ 3, 5, 7 }), gen({ 3, 5, 7 }) })
      end,
      ["broadcast cond 3x1, a 3x4, b 4 and 0-d"] = function()
        check_op("where", nil, pick, nil, { cond({ 3, 1 }), gen({ 3, 4 }), gen({ 4 }) })
        check_op("where", nil, pick, nil, { cond({ 2, 5 }), gen({}), gen({ 1, 5 }) })
        check_op("where", nil, pick, nil, { cond({ 4 }), gen({ 3, 1 }), gen({ 2, 1, 1 }) })
      end,
      ["empty and size-1 dims"] = function()
        check_op("where", nil, pick, nil, { cond({ 0, 3 }), gen({ 3 }), gen({ 0, 1 }) })
        check_op("where", nil, pick, nil, { cond({ 1, 4, 1 }), gen({ 1, 4, 1 }), gen({ 1, 4, 1 }) })
      end,
      ["non-contiguous inputs"] = function()
        check_op("where", nil, pick, nil, { cond({ 4, 6 }, true), gen({ 4, 6 }, -1, 1), gen({ 4, 6 }, -1, 1, false) })
        check_op("where", nil, pick, nil, { cond({ 5, 3 }), gen_nc({ 5, 3 }), gen_nc({ 5, 3 }) })
      end,
      ["NaN and inf: a NaN cond picks a, NaN values pass through"] = function()
        check_op("where", nil, pick, nil, { K.tensor({ nan, 0, 1, 0, 1 }, { 5 }), K.tensor({ 1, 2, nan, inf, -inf }, { 5 }),
                                            K.tensor({ -1, nan, 3, 4, 5 }, { 5 }) })
      end,
      ["large broadcast (OpenMP, blocked walk)"] = function()
        check_op("where", nil, pick, nil, { cond({ 5, 1 }), gen({ 5, 8200 }), gen({ 8200 }) })
        check_op("where", nil, pick, nil, { cond({ 40001 }), gen({ 40001 }), gen({ 40001 }) })
      end,
      ["bad shapes, dtypes and arity are errors"] = function()
        raises("where: shapes", op, "where", nil, cond({ 2, 3 }), gen({ 2, 3 }), gen({ 4 }))
        if K.device == "cpu" then
          raises("where: input 3 is " .. other_dtype, op, "where", nil, cond({ 2 }), gen({ 2 }),
                 C.from_table({ 1, 2 }, { 2 }, other_dtype))
        end
        raises("where takes 3 inputs (got 2)", op, "where", nil, cond({ 2 }), gen({ 2 }))
      end,
    },
    grad = {
      ["a and b, cond gets none"] = function()
        local cv = { 1, 0, 0, 1, 1, 0 }
        kit.gradcheck(function(c, x, y) return op("where", nil, c, x, y) end,
                      { { shape = { 2, 3 }, values = cv, grad = false }, { shape = { 2, 3 } }, { shape = { 2, 3 } } })
      end,
      ["broadcast cond 3x1, a 3x4, b 4"] = function()
        kit.gradcheck(function(c, x, y) return op("where", nil, c, x, y) end,
                      { { shape = { 3, 1 }, values = { 1, 0, 1 }, grad = false }, { shape = { 3, 4 } }, { shape = { 4 } } })
      end,
      ["non-contiguous a"] = function()
        kit.gradcheck(function(c, x, y) return op("where", nil, c, op("transpose", { dim0 = 0, dim1 = 1 }, x), y) end,
                      { { shape = { 3, 2 }, values = { 0, 1, 1, 0, 1, 1 }, grad = false }, { shape = { 2, 3 } }, { shape = { 3, 2 } } })
      end,
    },
  }

  -- ---- cast, fill ----
  local DT = { float32 = 0, float64 = 1 }
  local DEV = { cpu = 0, cuda = 1 }
  cases.cast = {
    forward = {
      ["to the other dtype and back"] = function()
        if K.device ~= "cpu" then return end
        local t = gen({ 3, 5, 7 })
        local c = op("cast", { dtype = DT[other_dtype] }, t)
        assert(select(2, C.info(c)) == other_dtype, "cast: wrong dtype")
        K.check(c, flat(t), { 3, 5, 7 }, 1e-6)
        local back = op("cast", { dtype = DT[K.dtype] }, c)
        assert(select(2, C.info(back)) == K.dtype, "cast: wrong dtype back")
        K.check(back, flat(c), { 3, 5, 7 }, 1e-6)
      end,
      ["same dtype is a copy"] = function()
        local t = gen({ 4, 3 })
        K.check(op("cast", { dtype = DT[K.dtype] }, t), flat(t), { 4, 3 })
      end,
      ["non-contiguous, empty, 0-d and large"] = function()
        local tgt = K.device == "cpu" and other_dtype or K.dtype
        for _, t in ipairs({ gen_nc({ 4, 7 }), gen_nc({ 9 }), gen({ 0, 3 }), gen({}), gen_nc({ 150, 301 }) }) do
          K.check(op("cast", { dtype = DT[tgt] }, t), flat(t), C.info(t), 1e-6)
        end
      end,
      ["NaN and inf survive"] = function()
        local tgt = K.device == "cpu" and other_dtype or K.dtype
        K.check(op("cast", { dtype = DT[tgt] }, K.tensor(SPECIAL, { #SPECIAL })), SPECIAL, { #SPECIAL })
      end,
      ["unknown dtype is an error"] = function()
        raises("cast: unknown dtype", op, "cast", { dtype = 9 }, gen({ 2 }))
      end,
    },
    grad = {
      ["float64 to float64"] = function()
        kit.gradcheck(function(x) return op("cast", { dtype = 1 }, x) end, { { shape = { 3, 4 } } })
      end,
      ["round trip through float32, non-contiguous"] = function()
        kit.gradcheck(function(x)
          return op("cast", { dtype = 1 }, op("cast", { dtype = 0 }, op("transpose", { dim0 = 0, dim1 = 1 }, x)))
        end, { { shape = { 3, 4 } } }, { eps = 1e-2, tol = 1e-4 })
      end,
    },
  }

  local function fill(v, shape) return op("fill", { value = v, dtype = DT[K.dtype], device = DEV[K.device], shape = shape }) end
  local function rep(v, n) local e = {} for i = 1, n do e[i] = v end return e end
  cases.fill = {
    nodiff = "a constant: it has no inputs",
    forward = {
      ["odd sizes, 0-d, empty"] = function()
        K.check(fill(2.5, { 3, 5, 7 }), rep(2.5, 105), { 3, 5, 7 })
        K.check(fill(-1, {}), { -1 }, {})
        K.check(fill(7, { 0, 4 }), {}, { 0, 4 })
      end,
      ["NaN and inf"] = function()
        K.check(fill(nan, { 3 }), rep(nan, 3), { 3 })
        K.check(fill(-inf, { 2 }), rep(-inf, 2), { 2 })
      end,
      ["large (OpenMP)"] = function() K.check(fill(0.25, { 40001 }), rep(0.25, 40001), { 40001 }) end,
      ["negative size, unknown dtype or device are errors"] = function()
        raises("fill: size -2 of dimension 2 is negative", op, "fill", { dtype = 0, device = 0, shape = { 3, -2 } })
        raises("fill: unknown dtype", op, "fill", { dtype = 9, device = 0, shape = { 3 } })
        raises("fill: unknown device", op, "fill", { dtype = 0, device = 7, shape = { 3 } })
      end,
    },
  }

  return cases
end
