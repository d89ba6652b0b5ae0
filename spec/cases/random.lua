-- Spec cases for the random ops (see spec/ops_spec.lua for the contract). The oracle
-- is a Lua Philox4x32-10 written from core/philox.h's description, so the bits are
-- checked, not only the statistics: every device must produce exactly these values.
local remat = require "remat"
local kit = require "support.kit"
local C = remat._C

local M32 = 0xffffffff

-- Philox4x32-10 on a 64-bit counter (high words zero) and a 64-bit key. Lua integers
-- wrap mod 2^64, so the 32x32 -> 64-bit products are exact; >> is a logical shift.
local function philox(counter, key)
  local c0, c1, c2, c3 = counter & M32, (counter >> 32) & M32, 0, 0
  local k0, k1 = key & M32, (key >> 32) & M32
  for _ = 1, 10 do
    local p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
    local n0 = ((p1 >> 32) ~ c1 ~ k0) & M32
    local n2 = ((p0 >> 32) ~ c3 ~ k1) & M32
    c1, c3, c0, c2 = p1 & M32, p0 & M32, n0, n2
    k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
  end
  return { c0, c1, c2, c3 }
end

-- Element e (0-based) of a uniform draw at (seed, offset): counter offset/4 + e/4, lane e%4.
local function uniform(seed, offset, e)
  local r = philox(offset // 4 + e // 4, seed)
  return (r[e % 4 + 1] + 1.0) * (1.0 / 4294967296.0)
end

-- Element e of a normal draw: counter offset/4 + e/2, lanes 2(e%2), 2(e%2)+1, Box-Muller.
local function normal(seed, offset, e)
  local r = philox(offset // 4 + e // 2, seed)
  local l = (e % 2) * 2
  local u1 = (r[l + 1] + 1.0) * (1.0 / 4294967296.0)
  local u2 = r[l + 2] * (1.0 / 4294967296.0)
  return math.sqrt(-2.0 * math.log(u1)) * math.cos(6.283185307179586 * u2)
end

local function moments(v)
  local s, s2 = 0, 0
  for i = 1, #v do s = s + v[i] end
  local mean = s / #v
  for i = 1, #v do s2 = s2 + (v[i] - mean) ^ 2 end
  return mean, s2 / #v
end

return function(K)
  local DT = { float32 = 0, float64 = 1 }
  local DEV = { cpu = 0, cuda = 1 }
  local function flat(t) return C.flat(K.device == "cpu" and t or C.to_device(t, "cpu")) end
  local function draw(name, shape) return C.op(C.ops[name], { dtype = DT[K.dtype], device = DEV[K.device], shape = shape }) end
  local function dropout(x, p) return C.op(C.ops.dropout, { p = p }, x) end
  local raises = kit.raises
  local function same_bits(a, b, what)
    assert(#a == #b, what .. ": lengths differ")
    for i = 1, #a do
      assert(a[i] == b[i] or (a[i] ~= a[i] and b[i] ~= b[i]), ("%s[%d]: %s vs %s"):format(what, i, a[i], b[i]))
    end
  end
  -- Expected values of a draw of `n` elements at the current generator state.
  local function reference(f, n)
    local seed, offset = C.rng_state()
    local e = {}
    for i = 0, n - 1 do e[i + 1] = f(seed, offset, i) end
    return e
  end

  -- Shared cases for rand and randn.
  local function draw_cases(name, f, stats)
    return {
      nodiff = "a random draw has no inputs",
      forward = {
        ["bits match the Philox reference (odd size, offset not from 0)"] = function()
          C.manual_seed(1234)
          draw(name, { 3 }) -- moves the offset on
          local e = reference(f, 3 * 5 * 7)
          K.check(draw(name, { 3, 5, 7 }), e, { 3, 5, 7 })
        end,
        ["same seed and offset give the same bits; the generator moves on"] = function()
          C.manual_seed(7)
          local a = flat(draw(name, { 5, 3 }))
          local _, off = C.rng_state()
          assert(off == 32, "offset after 15 elements: " .. off .. ", expected 2*15 rounded up to 4 = 32")
          local b = flat(draw(name, { 5, 3 }))
          C.manual_seed(7)
          same_bits(a, flat(draw(name, { 5, 3 })), name .. " replay")
          local differs = false
          for i = 1, #a do differs = differs or a[i] ~= b[i] end
          assert(differs, name .. ": two successive draws gave the same values")
          C.set_rng_state(7, 32)
          same_bits(b, flat(draw(name, { 5, 3 })), name .. " from a saved state")
        end,
        ["statistics of 10^5 samples"] = function()
          C.manual_seed(99)
          stats(flat(draw(name, { 100000 })))
        end,
        ["0-d, size-1 dims and empty"] = function()
          C.manual_seed(3)
          local e = reference(f, 1)
          K.check(draw(name, {}), e, {})
          e = reference(f, 4)
          K.check(draw(name, { 1, 4, 1 }), e, { 1, 4, 1 })
          local _, off = C.rng_state()
          K.check(draw(name, { 0, 5 }), {}, { 0, 5 })
          assert(select(2, C.rng_state()) == off, name .. ": an empty draw moved the generator")
        end,
        ["bad shape or dtype is an error naming the op"] = function()
          raises(name .. ": size -3 of dimension 2 is negative", C.op, C.ops[name], { dtype = 0, device = 0, shape = { 2, -3 } })
          raises(name .. ": unknown dtype", C.op, C.ops[name], { dtype = 9, device = 0, shape = { 2 } })
          raises(name .. ": unknown device", C.op, C.ops[name], { dtype = 0, device = 9, shape = { 2 } })
        end,
      },
    }
  end

  local cases = {}
  cases.rand = draw_cases("rand", uniform, function(v)
    for i = 1, #v do assert(v[i] > 0 and v[i] <= 1, "rand: value " .. v[i] .. " outside (0, 1]") end
    local m, var = moments(v)
    assert(math.abs(m - 0.5) < 0.005, "rand: mean " .. m)
    assert(math.abs(var - 1 / 12) < 0.003, "rand: variance " .. var)
  end)
  cases.randn = draw_cases("randn", normal, function(v)
    local m, var = moments(v)
    assert(math.abs(m) < 0.015, "randn: mean " .. m)
    assert(math.abs(var - 1) < 0.03, "randn: variance " .. var)
    local inside = 0
    for i = 1, #v do if math.abs(v[i]) < 1 then inside = inside + 1 end end
    assert(math.abs(inside / #v - 0.6827) < 0.01, "randn: P(|z| < 1) = " .. inside / #v)
  end)

  -- dropout: y = x * keep / (1 - p), keep = uniform(seed, offset, e) > p
  local function dropout_ref(vals, p, seed, offset)
    local e = {}
    for i = 1, #vals do
      local keep = uniform(seed, offset, i - 1) > p
      e[i] = vals[i] * ((keep and 1 or 0) / (1 - p))
    end
    return e
  end

  -- The kernels' exact output: x * (keep ? scale : 0) in the tensor's dtype, with
  -- scale = 1/(1-p) rounded to it (a float32 product of two floats is exact in double,
  -- so rounding the double product once gives the float32 product).
  local function round(v)
    if K.dtype == "float32" then return (string.unpack("f", string.pack("f", v))) end
    return v
  end
  local function dropout_exact(vals, p, seed, offset)
    local scale, e, r = round(1 / (1 - p)), {}, nil
    for i = 1, #vals do
      if (i - 1) % 4 == 0 then r = philox(offset // 4 + (i - 1) // 4, seed) end
      local keep = (r[(i - 1) % 4 + 1] + 1.0) * (1.0 / 4294967296.0) > p
      e[i] = round(vals[i] * (keep and scale or 0))
    end
    return e
  end
  -- Bit for bit (NaN payloads aside): the sign of a zero counts.
  local function exact(got, want, what)
    assert(#got == #want, what .. ": " .. #got .. " values, expected " .. #want)
    for i = 1, #got do
      local g, w = got[i], want[i]
      local ok
      if w ~= w then ok = g ~= g
      elseif w == 0 then ok = g == 0 and 1 / g == 1 / w
      else ok = g == w end
      assert(ok, ("%s[%d]: %s, expected %s"):format(what, i, string.format("%a", g), string.format("%a", w)))
    end
  end
  -- n values in runs of 32 (the AVX2 kernel's unit; the portable one's is 64): dense
  -- runs, runs of +0, -0 or both, and zeros around one inf, NaN, -inf or a value so
  -- small that only its bits tell it from 0 (2^-149, float32's least subnormal); in the
  -- portable kernel's blocks too, each of these is alone with zeros.
  local function edge_values(n)
    local v = {}
    for i = 0, n - 1 do
      local run, at, j = (i // 32) % 12, i % 32, i // 32
      local x = (run == 2 or run == 5 or run == 9 and at % 3 == 0) and -0.0 or 0.0
      if run == 0 then x = ((i * 37) % 101 - 50) / 7
      elseif run == 4 and at == (j * 5) % 32 then x = math.huge
      elseif run == 6 and at == (j * 3) % 32 then x = 0 / 0
      elseif run == 8 and at == 31 then x = 2.0 ^ -149
      elseif run == 10 and at == 0 then x = -math.huge end
      v[i + 1] = x
    end
    return v
  end
  -- Dropout of edge_values at each size and p, forward and backward (through autograd,
  -- a gradient of edge values), against dropout_exact at the generator's state.
  local function exact_sweep(sizes, ps, big_state)
    for si, n in ipairs(sizes) do
      for pi, p in ipairs(ps) do
        if big_state then
          -- a 64-bit key, and counters that carry into their high word within a group
          C.set_rng_state(0x9E3779B97F4A7C15 + si, 4 * (0x100000000 - 3 - pi))
        else
          C.manual_seed(100 * si + pi)
          draw("rand", { si + pi }) -- an offset that is not 0
        end
        local seed, offset = C.rng_state()
        local xv = edge_values(n)
        local x = K.tensor(xv, { n })
        C.requires_grad(x, true)
        local y = dropout(x, p)
        local what = ("dropout n=%d p=%g offset=%d"):format(n, p, offset)
        exact(flat(y), dropout_exact(flat(x), p, seed, offset), what)
        local gv = edge_values(n + 32)
        table.remove(gv, 1) -- other runs than x's
        local g = K.tensor({ table.unpack(gv, 1, n) }, { n })
        C.backward(y, g)
        exact(flat(C.grad(x)), dropout_exact(flat(g), p, seed, offset), "grad of " .. what)
      end
    end
  end

  -- The bit sweep above in another process with variable `var` set to 1: its
  -- remat.info().vector_path must compare as `path_test` (a Lua comparison, so that an
  -- ignored variable fails), and the sweep must pass there; `what` names the path.
  local function bits_under(var, path_test, what)
    local script = ("local C = require('remat')._C; local K = require('support.kit').new(%q, 'cpu'); "
      .. "assert(require('remat').info().vector_path %s, '%s was ignored'); "
      .. "require('cases.random')(K).dropout.forward['bits of the kernels at odd sizes and p, zeros, -0, NaN, inf, forward and backward'](); "
      .. "print('path ok')"):format(K.dtype, path_test, var)
    local exe = (os.getenv("REMAT_BUILD") or "build") .. "/remat"
    local pipe = assert(io.popen(("env %s=1 %s -e %q 2>&1"):format(var, exe, script)))
    local out = pipe:read("a")
    pipe:close()
    assert(out:find("path ok", 1, true), what .. ": " .. out)
  end

  cases.dropout = {
    forward = {
      ["matches the Philox mask, odd sizes"] = function()
        C.manual_seed(11)
        local x = K.rand({ 3, 5, 7 })
        local seed, offset = C.rng_state()
        K.check(dropout(x, 0.3), dropout_ref(flat(x), 0.3, seed, offset), { 3, 5, 7 })
      end,
      ["matches the Philox mask across the kernel's vector blocks and chunks (p = 0.1)"] = function()
        C.manual_seed(12)
        draw("rand", { 6 }) -- an offset not at a block's start
        local x = K.rand({ 7, 641 }) -- 4487 elements: 70 blocks of 64 (two chunks) and a tail
        local seed, offset = C.rng_state()
        K.check(dropout(x, 0.1), dropout_ref(flat(x), 0.1, seed, offset), { 7, 641 })
      end,
      ["bits of the kernels at odd sizes and p, zeros, -0, NaN, inf, forward and backward"] = function()
        exact_sweep({ 1, 3, 63, 64, 65, 100, 1000, 4097 }, { 0, 1e-10, 0.1, 0.5, 0.999 })
        exact_sweep({ 67, 4100 }, { 0.3, 0.9 }, true)
      end,
      ["the portable kernel (REMAT_NO_AVX2) gives the same bits"] = function()
        if K.device ~= "cpu" then return end -- a CPU path; the case above checks this device
        bits_under("REMAT_NO_AVX2", "== 'portable'", "the portable kernel")
      end,
      ["the AVX2 kernel (REMAT_NO_AVX512, on an AVX-512 machine) gives the same bits"] = function()
        if K.device ~= "cpu" then return end
        if K.dtype ~= "float32" then return end -- float64 has no AVX-512 path
        bits_under("REMAT_NO_AVX512", "~= 'avx512'", "the AVX2 kernel")
      end,
      ["p = 0 is the identity (NaN and inf included)"] = function()
        local v = { 1.5, -2, 0 / 0, math.huge, -math.huge, 0 }
        same_bits(flat(dropout(K.tensor(v, { 6 }), 0)), flat(K.tensor(v, { 6 })), "dropout p=0")
        local x = K.rand({ 4, 3 })
        same_bits(flat(dropout(x, 0)), flat(x), "dropout p=0")
      end,
      ["mask rate and scaling on 10^5 elements"] = function()
        C.manual_seed(5)
        local y = flat(dropout(C.full({ 100000 }, 1, K.dtype, K.device), 0.3))
        local zeros, scale = 0, flat(K.tensor({ 1 / 0.7 }, { 1 }))[1]
        for i = 1, #y do
          if y[i] == 0 then zeros = zeros + 1
          else assert(math.abs(y[i] - scale) <= 1e-6 * scale, "dropout: kept value " .. y[i]) end
        end
        assert(math.abs(zeros / #y - 0.3) < 0.01, "dropout: drop rate " .. zeros / #y)
      end,
      ["reproducible from a saved state; non-contiguous input uses output order"] = function()
        C.manual_seed(21)
        local x = K.noncontig({ 4, 6 })
        local seed, offset = C.rng_state()
        local y = dropout(x, 0.5)
        K.check(y, dropout_ref(flat(x), 0.5, seed, offset), { 4, 6 })
        C.set_rng_state(seed, offset)
        same_bits(flat(y), flat(dropout(x, 0.5)), "dropout replay")
        local x1 = K.noncontig({ 7 })
        seed, offset = C.rng_state()
        K.check(dropout(x1, 0.2), dropout_ref(flat(x1), 0.2, seed, offset), { 7 })
      end,
      ["0-d, size-1 dims, empty"] = function()
        C.manual_seed(2)
        local x = K.rand({ 1, 5, 1 })
        local seed, offset = C.rng_state()
        K.check(dropout(x, 0.4), dropout_ref(flat(x), 0.4, seed, offset), { 1, 5, 1 })
        K.check(dropout(K.rand({ 0, 3 }), 0.4), {}, { 0, 3 })
        local s = K.rand({})
        seed, offset = C.rng_state()
        K.check(dropout(s, 0.4), dropout_ref(flat(s), 0.4, seed, offset), {})
      end,
      ["a dropped NaN or inf gives NaN (x * 0), a kept one passes"] = function()
        C.manual_seed(4)
        local v = {}
        for i = 1, 16 do v[i] = i % 2 == 0 and 0 / 0 or math.huge end
        local seed, offset = C.rng_state()
        K.check(dropout(K.tensor(v, { 16 }), 0.5), dropout_ref(v, 0.5, seed, offset), { 16 })
      end,
      ["p outside [0, 1) is an error"] = function()
        local x = K.rand({ 3 })
        for _, p in ipairs({ 1, 1.5, -0.1, 0 / 0 }) do raises("dropout: p must be in [0, 1)", dropout, x, p) end
      end,
    },
    grad = {
      ["gradient is mask / (1 - p), the forward's mask"] = function()
        C.manual_seed(8)
        local x = C.from_table(kit.values({ 5, 7 }, 0.5, 1.5), { 5, 7 }, "float64")
        C.requires_grad(x, true)
        local y = dropout(x, 0.4)
        C.op(C.ops.rand, { dtype = 1, device = 0, shape = { 100 } }) -- other draws in between must not matter
        local g = {}
        for i = 1, 35 do g[i] = i end
        C.backward(y, C.from_table(g, { 5, 7 }, "float64"))
        local xv, yv, gx = C.flat(x), C.flat(y), C.flat(C.grad(x))
        for i = 1, 35 do
          local kept = yv[i] ~= 0
          local want = kept and g[i] / 0.6 or 0
          assert(math.abs(gx[i] - want) < 1e-12, ("dropout grad[%d]: %g, expected %g"):format(i, gx[i], want))
          if kept then assert(math.abs(yv[i] - xv[i] / 0.6) < 1e-12) end
        end
      end,
      ["central differences with the generator state fixed"] = function()
        C.manual_seed(9)
        local seed, offset = C.rng_state()
        kit.gradcheck(function(x)
          C.set_rng_state(seed, offset)
          return dropout(C.op(C.ops.transpose, { dim0 = 0, dim1 = 1 }, x), 0.35)
        end, { { shape = { 4, 3 } } })
      end,
    },
  }

  cases.dropout_backward = {
    nodiff = "internal backward helper of dropout (checked through dropout's gradient)",
    forward = {
      ["regenerates the mask of the given seed and offset"] = function()
        -- from Lua the attrs carry seed 0 and offset 0
        local g = K.rand({ 3, 5 })
        K.check(C.op(C.ops.dropout_backward, { p = 0.25 }, g), dropout_ref(flat(g), 0.25, 0, 0), { 3, 5 })
        C.set_rng_state(0, 0)
        same_bits(flat(C.op(C.ops.dropout_backward, { p = 0.25 }, g)), flat(dropout(g, 0.25)), "dropout_backward vs dropout")
      end,
      ["does not move the generator; p = 0 is the identity"] = function()
        C.manual_seed(6)
        local g = K.rand({ 9 })
        C.op(C.ops.dropout_backward, { p = 0.5 }, g)
        local _, off = C.rng_state()
        assert(off == 0, "dropout_backward moved the generator to " .. off)
        same_bits(flat(C.op(C.ops.dropout_backward, { p = 0 }, g)), flat(g), "p = 0")
      end,
      ["p outside [0, 1) is an error"] = function()
        raises("dropout_backward: p must be in [0, 1)", C.op, C.ops.dropout_backward, { p = 1 }, (K.rand({ 2 })))
      end,
    },
  }

  return cases
end
