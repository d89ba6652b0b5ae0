-- Test kit for op specs: deterministic random inputs, non-contiguous views, tolerant
-- comparison with NaN/inf handling, and gradient checks by central differences.
-- Only the C entry points (remat._C) are used, so the kit does not depend on the
-- tensor API it is used to test.
local remat = require "remat"
local C = remat._C

local kit = {}

-- Deterministic Lua-side generator (xorshift), independent of remat's own.
local state = 0x2545F491
local function rnd()
  state = state ~ (state << 13) & 0xffffffff
  state = state ~ (state >> 17)
  state = state ~ (state << 5) & 0xffffffff
  return (state & 0xffffff) / 0x1000000
end
function kit.seed(s) state = s & 0xffffffff; if state == 0 then state = 1 end end

local function numel(shape) local n = 1 for _, d in ipairs(shape) do n = n * d end return n end
kit.numel = numel

-- Flat row-major values in [lo, hi).
function kit.values(shape, lo, hi)
  lo, hi = lo or -1, hi or 1
  local v = {}
  for i = 1, numel(shape) do v[i] = lo + (hi - lo) * rnd() end
  return v
end

-- Asserts that f(...) raises an error whose text contains pattern (plain text).
function kit.raises(pattern, f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok, "expected an error matching '" .. pattern .. "'")
  assert(tostring(err):find(pattern, 1, true), ("error '%s' does not mention '%s'"):format(tostring(err), pattern))
end

-- A kit bound to a dtype and device.
function kit.new(dtype, device)
  local K = { dtype = dtype or "float32", device = device or "cpu" }

  -- Moves a CPU tensor to K.device (identity on the CPU).
  function K.place(t)
    if K.device == "cpu" then return t end
    return C.to_device(t, K.device)
  end

  -- Tensor from flat values and a shape.
  function K.tensor(vals, shape) return K.place(C.from_table(vals, shape, K.dtype)) end

  -- Random tensor and its flat values.
  function K.rand(shape, lo, hi)
    local v = kit.values(shape, lo, hi)
    return K.tensor(v, shape), v
  end

  -- A non-contiguous tensor of logical shape `shape` (a transposed view when it has
  -- two or more dims, else a strided narrow) and its flat values in logical order.
  function K.noncontig(shape, lo, hi)
    local nd = #shape
    if nd >= 2 then
      local s = {}
      for i = 1, nd do s[i] = shape[i] end
      s[nd - 1], s[nd] = shape[nd], shape[nd - 1]
      local base, bv = K.rand(s, lo, hi)
      local t = C.op(C.ops.transpose, { dim0 = nd - 2, dim1 = nd - 1 }, base)
      -- logical values: element (.., i, j) of t is element (.., j, i) of base
      local v, R, Cc = {}, shape[nd - 1], shape[nd]
      local outer = numel(shape) // math.max(1, R * Cc)
      for o = 0, outer - 1 do
        for i = 0, R - 1 do
          for j = 0, Cc - 1 do
            v[o * R * Cc + i * Cc + j + 1] = bv[o * R * Cc + j * R + i + 1]
          end
        end
      end
      return t, v
    end
    local n = shape[1] or 1
    local base, bv = K.rand({ n, 2 }, lo, hi)
    local t = C.op(C.ops.select, { dim = 1, index = 0 }, base)
    local v = {}
    for i = 1, n do v[i] = bv[(i - 1) * 2 + 1] end
    return t, v
  end

  -- K.rand and K.noncontig with the values as stored (rounded to the dtype), which is
  -- what an oracle computing in double must be given.
  function K.rand_stored(shape, lo, hi)
    local t = K.rand(shape, lo, hi)
    return t, C.flat(t)
  end
  function K.noncontig_stored(shape, lo, hi)
    local t = K.noncontig(shape, lo, hi)
    return t, C.flat(t)
  end

  K.tol = K.dtype == "float64" and 1e-10 or 2e-5

  -- Asserts that tensor t has `shape` and values close to `expected` (flat).
  function K.check(t, expected, shape, tol, what)
    tol = tol or K.tol
    what = what or "values"
    if shape then
      local s = C.info(t)
      assert(#s == #shape, ("%s: got %d dims, expected %d"):format(what, #s, #shape))
      for i = 1, #shape do
        assert(s[i] == shape[i], ("%s: size of dim %d is %d, expected %d"):format(what, i, s[i], shape[i]))
      end
    end
    local got = C.flat(K.device == "cpu" and t or C.to_device(t, "cpu"))
    assert(#got == #expected, ("%s: %d values, expected %d"):format(what, #got, #expected))
    for i = 1, #got do
      local g, e = got[i], expected[i]
      if e ~= e then
        assert(g ~= g, ("%s[%d]: got %s, expected nan"):format(what, i, g))
      elseif e == math.huge or e == -math.huge then
        assert(g == e, ("%s[%d]: got %s, expected %s"):format(what, i, g, e))
      else
        local err = math.abs(g - e) / math.max(1, math.abs(e))
        assert(err <= tol, ("%s[%d]: got %.9g, expected %.9g (rel err %.3g > %.3g)"):format(what, i, g, e, err, tol))
      end
    end
  end
  return K
end

-- Gradient check in float64: fn(t1, ..., tn) -> one tensor. specs: list of
-- { shape = {...}, values = {...} (optional), grad = true/false, lo =, hi = }.
-- Compares backward (with a random output weighting) against central differences.
function kit.gradcheck(fn, specs, opts)
  opts = opts or {}
  local eps, tol = opts.eps or 1e-6, opts.tol or 1e-5
  local vals = {}
  for i, s in ipairs(specs) do vals[i] = s.values or kit.values(s.shape, s.lo, s.hi) end
  local function build(with_grad)
    local ts = {}
    for i, s in ipairs(specs) do
      ts[i] = C.from_table(vals[i], s.shape, "float64")
      if with_grad and s.grad ~= false then C.requires_grad(ts[i], true) end
    end
    return ts
  end
  local ts = build(true)
  local out = fn(table.unpack(ts, 1, #specs))
  local oshape = C.info(out)
  local w = kit.values(oshape)
  C.backward(out, C.from_table(w, oshape, "float64"))
  local function f()
    local o = C.scoped(nil, false, fn, table.unpack(build(false), 1, #specs))
    local ov, acc = C.flat(o), 0
    for k = 1, #ov do acc = acc + ov[k] * w[k] end
    return acc
  end
  for i, s in ipairs(specs) do
    if s.grad ~= false then
      local g = C.grad(ts[i])
      assert(g, ("gradcheck: input %d got no gradient"):format(i))
      local gv = C.flat(g)
      for k = 1, #vals[i] do
        local x0 = vals[i][k]
        vals[i][k] = x0 + eps
        local fp = f()
        vals[i][k] = x0 - eps
        local fm = f()
        vals[i][k] = x0
        local num = (fp - fm) / (2 * eps)
        local err = math.abs(num - gv[k]) / math.max(1, math.abs(num))
        assert(err <= tol, ("gradcheck: input %d element %d: analytic %.10g, numeric %.10g"):format(i, k, gv[k], num))
      end
    end
  end
  return true
end

return kit
