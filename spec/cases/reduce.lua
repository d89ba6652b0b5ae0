-- Spec cases for reductions and softmax (see spec/ops_spec.lua for the contract).
-- Oracles are naive Lua loops over flat row-major values; dims in attrs are 0-based.
local remat = require "remat"
local kit = require "support.kit"
local C = remat._C

local ALL = math.mininteger  -- RM_DIM_ALL
local nan, inf = 0 / 0, math.huge

-- The lanes of a reduction of `shape` over dim d (0-based, negative from the end, ALL):
-- a list (one per output element, row-major) of lists of 1-based flat indices.
local function lanes(shape, d)
  local n = kit.numel(shape)
  if d == ALL or #shape == 0 then
    local l = {}
    for i = 1, n do l[i] = i end
    return { l }
  end
  if d < 0 then d = d + #shape end
  local outer, inner = 1, 1
  for k = 1, d do outer = outer * shape[k] end
  for k = d + 2, #shape do inner = inner * shape[k] end
  local len, out = shape[d + 1], {}
  for o = 0, outer - 1 do
    for j = 0, inner - 1 do
      local l = {}
      for k = 0, len - 1 do l[#l + 1] = o * len * inner + k * inner + j + 1 end
      out[#out + 1] = l
    end
  end
  return out
end

-- Output shape of reducing `shape` over d with keepdim.
local function rshape(shape, d, keep)
  local s = {}
  if d == ALL or #shape == 0 then
    if keep then for i = 1, #shape do s[i] = 1 end end
    return s
  end
  if d < 0 then d = d + #shape end
  for i = 1, #shape do
    if i ~= d + 1 then s[#s + 1] = shape[i] elseif keep then s[#s + 1] = 1 end
  end
  return s
end

local function sum_ref(v, shape, d)
  local e = {}
  for i, l in ipairs(lanes(shape, d)) do
    local s = 0
    for _, k in ipairs(l) do s = s + v[k] end
    e[i] = s
  end
  return e
end

local function mean_ref(v, shape, d)
  local e = {}
  for i, l in ipairs(lanes(shape, d)) do
    local s = 0
    for _, k in ipairs(l) do s = s + v[k] end
    e[i] = s / #l
  end
  return e
end

-- First maximum; the first NaN wins. Returns values and 1-based positions.
local function max_ref(v, shape, d)
  local val, idx = {}, {}
  for i, l in ipairs(lanes(shape, d)) do
    local b, bi = v[l[1]], 1
    for p = 2, #l do
      if b ~= b then break end
      local x = v[l[p]]
      if x ~= x or x > b then b, bi = x, p end
    end
    val[i], idx[i] = b, bi
  end
  return val, idx
end

-- softmax / log_softmax along d (in place over a copy of v).
local function softmax_ref(v, shape, d, log)
  local e = {}
  for _, l in ipairs(lanes(shape, d)) do
    local m = -inf
    for _, k in ipairs(l) do if v[k] > m then m = v[k] end end
    local s = 0
    for _, k in ipairs(l) do s = s + math.exp(v[k] - m) end
    for _, k in ipairs(l) do
      if log then e[k] = v[k] - m - math.log(s) else e[k] = math.exp(v[k] - m) / s end
    end
  end
  return e
end

return function(K)
  local function op(name, attrs, ...) return C.op(C.ops[name], attrs, ...) end
  local rand, noncontig = K.rand_stored, K.noncontig_stored
  local raises = kit.raises

  -- Runs a reduction op over several dims/keepdims of (t, v, shape) against ref.
  local function check_reduce(name, ref, t, v, shape, dims)
    for _, d in ipairs(dims) do
      for _, keep in ipairs({ false, true }) do
        local got = op(name, { dim = d, keepdim = keep and true or false }, t)
        K.check(got, ref(v, shape, d), rshape(shape, d, keep), nil, ("%s dim %s keep %s"):format(name, d, keep))
      end
    end
  end

  -- Forward cases shared by sum and mean.
  local function sum_like(name, ref)
    return {
      ["3x5 over each dim, negative dims, keepdim"] = function()
        local t, v = rand({ 3, 5 })
        check_reduce(name, ref, t, v, { 3, 5 }, { 0, 1, -1, -2 })
      end,
      ["all dims gives 0-d (keepdim: all ones)"] = function()
        local t, v = rand({ 2, 3, 4 })
        check_reduce(name, ref, t, v, { 2, 3, 4 }, { ALL })
        local s, sv = rand({})
        check_reduce(name, ref, s, sv, {}, { ALL, 0, -1 })
      end,
      ["odd sizes and size-1 dims, 4-D middle dims"] = function()
        local t, v = rand({ 1, 7, 1, 3 })
        check_reduce(name, ref, t, v, { 1, 7, 1, 3 }, { 0, 1, 2, 3, ALL })
        local u, uv = rand({ 2, 3, 4, 5 })
        check_reduce(name, ref, u, uv, { 2, 3, 4, 5 }, { 1, 2 })
      end,
      ["empty tensors"] = function()
        local t = K.tensor({}, { 0, 3 })
        check_reduce(name, ref, t, {}, { 0, 3 }, { 0, 1, ALL })
      end,
      ["non-contiguous input"] = function()
        local t, v = noncontig({ 4, 6 })
        check_reduce(name, ref, t, v, { 4, 6 }, { 0, 1, ALL })
        local u, uv = noncontig({ 2, 3, 5 })
        check_reduce(name, ref, u, uv, { 2, 3, 5 }, { 0, 1, 2 })
      end,
      ["NaN and inf propagate"] = function()
        local v = { 1, nan, 3, inf, 2, 5, -inf, 1, inf }
        local t = K.tensor(v, { 3, 3 })
        check_reduce(name, ref, t, v, { 3, 3 }, { 0, 1, ALL })
      end,
      ["large inputs (parallel paths)"] = function()
        local t, v = rand({ 300, 701 })
        check_reduce(name, ref, t, v, { 300, 701 }, { 0, 1 })
        local u, uv = rand({ 270001 })
        K.check(op(name, { dim = ALL }, u), ref(uv, { 270001 }, ALL), {}, K.dtype == "float32" and 1e-5 or 1e-9)
      end,
      ["dim out of range is an error"] = function()
        raises("out of range", op, name, { dim = 2 }, (rand({ 2, 3 })))
        raises("out of range", op, name, { dim = -3 }, (rand({ 2, 3 })))
      end,
    }
  end

  local function max_like(name)
    local function run(t, v, shape, dims)
      for _, d in ipairs(dims) do
        for _, keep in ipairs({ false, true }) do
          local val, idx = max_ref(v, shape, d)
          local s = rshape(shape, d, keep)
          if name == "max" then
            local gv, gi = op("max", { dim = d, keepdim = keep and true or false }, t)
            K.check(gv, val, s, nil, "max values")
            K.check(gi, idx, s, 0, "max indices")
          else
            K.check(op("argmax", { dim = d, keepdim = keep and true or false }, t), idx, s, 0, "argmax")
          end
        end
      end
    end
    return {
      ["3x5 over each dim, keepdim, negative dims"] = function()
        local t, v = rand({ 3, 5 })
        run(t, v, { 3, 5 }, { 0, 1, -1 })
      end,
      ["all dims: flat 1-based index; 0-d input"] = function()
        local t, v = rand({ 2, 3, 4 })
        run(t, v, { 2, 3, 4 }, { ALL })
        local s, sv = rand({})
        run(s, sv, {}, { ALL, 0 })
      end,
      ["ties go to the first occurrence"] = function()
        local v = { 1, 3, 3, 2, 5, 5, 5, 5 }
        run(K.tensor(v, { 2, 4 }), v, { 2, 4 }, { 1, ALL })
      end,
      ["NaN wins and propagates; infinities"] = function()
        local v = { 1, nan, 5, nan, -inf, -inf, -inf, -inf, 2, inf, 7, inf, nan, 1, 2, 3 }
        run(K.tensor(v, { 4, 4 }), v, { 4, 4 }, { 0, 1, ALL })
      end,
      ["size-1 dims, strided middle dim, non-contiguous input"] = function()
        local t, v = rand({ 1, 5, 1 })
        run(t, v, { 1, 5, 1 }, { 0, 1, 2 })
        local u, uv = rand({ 3, 4, 5 })
        run(u, uv, { 3, 4, 5 }, { 0, 1, 2 })
        local w, wv = noncontig({ 4, 6 })
        run(w, wv, { 4, 6 }, { 0, 1 })
      end,
      ["empty: reducing nothing is an error, empty kept dims are fine"] = function()
        local t = K.tensor({}, { 0, 3 })
        raises("empty", op, name, { dim = 0 }, t)
        raises("empty", op, name, { dim = ALL }, t)
        run(t, {}, { 0, 3 }, { 1 })
      end,
      ["dim out of range is an error"] = function()
        raises("out of range", op, name, { dim = 3 }, (rand({ 2, 3 })))
      end,
    }
  end

  -- n random values in [lo, hi] as the dtype stores them (for oracles in double)
  local function stored(n, lo, hi) return C.flat(C.from_table(kit.values({ n }, lo, hi), { n }, K.dtype)) end

  local function softmax_like(name, log)
    local function run(t, v, shape, dims)
      for _, d in ipairs(dims) do
        K.check(op(name, { dim = d }, t), softmax_ref(v, shape, d, log), shape, nil, name .. " dim " .. d)
      end
    end
    return {
      ["3x5 over each dim, negative dim"] = function()
        local t, v = rand({ 3, 5 }, -3, 3)
        run(t, v, { 3, 5 }, { 0, 1, -1 })
      end,
      ["middle dim of 2x3x4 (strided), size-1 dims, 0-d"] = function()
        local t, v = rand({ 2, 3, 4 }, -3, 3)
        run(t, v, { 2, 3, 4 }, { 1 })
        local u, uv = rand({ 1, 7, 1 })
        run(u, uv, { 1, 7, 1 }, { 0, 1, 2 })
        local s, sv = rand({})
        run(s, sv, {}, { 0 })
      end,
      ["large values are stable (subtract the max)"] = function()
        local v = { 1000, 1001, 1002, -1000, -1001, -1002 }
        run(K.tensor(v, { 2, 3 }), v, { 2, 3 }, { 1 })
      end,
      ["NaN poisons its row; -inf entries get 0; an all -inf row is NaN"] = function()
        local v = { 1, nan, 2, 0, -inf, 1, -inf, -inf, -inf }
        local e = softmax_ref({ 0, -inf, 1 }, { 3 }, 0, log)
        local got = C.flat(op(name, { dim = 1 }, K.tensor(v, { 3, 3 })))
        for k = 1, 3 do assert(got[k] ~= got[k], "row with NaN: " .. got[k]) end
        K.check(K.tensor({ got[4], got[5], got[6] }, { 3 }), e, { 3 })
        for k = 7, 9 do assert(got[k] ~= got[k], "all -inf row: " .. got[k]) end
      end,
      -- the float32 CPU kernel skips a row's trailing run of -inf (causal masking): the
      -- skipped entries must still come out as the full row gives them (0 / -inf, or
      -- NaN when the row is NaN), rows of only -inf stay NaN, and -inf elsewhere is
      -- no run; T = 1, 2, 7, 33, 256 covers rows shorter and longer than a vector
      ["causally masked rows (trailing -inf) against the reference, T = 1 .. 256"] = function()
        for _, T in ipairs({ 1, 2, 7, 33, 256 }) do
          local v = stored(T * T, -4, 4)
          for i = 0, T - 1 do for j = i + 1, T - 1 do v[i * T + j + 1] = -inf end end
          run(K.tensor(v, { T, T }), v, { T, T }, { 1 })
          -- the same rows along dim 0 (strided columns): the transpose of the mask
          local w = {}
          for i = 0, T - 1 do for j = 0, T - 1 do w[j * T + i + 1] = v[i * T + j + 1] end end
          run(K.tensor(w, { T, T }), w, { T, T }, { 0 })
        end
      end,
      ["masked rows with NaN, +inf, -inf inside, or only -inf"] = function()
        local T = 33
        local v = stored(6 * T, -4, 4)
        local function row(r) return (r - 1) * T end
        for r = 1, 6 do for j = 21, T do v[row(r) + j] = -inf end end  -- 13-long tails
        v[row(1) + 5] = nan             -- NaN in the live prefix: the whole row is NaN
        v[row(2) + 20] = inf            -- +inf just before the tail: NaN row
        v[row(3) + 3], v[row(3) + 11] = -inf, -inf  -- -inf inside: 0 / -inf there only
        for j = 1, T do v[row(4) + j] = -inf end    -- only -inf: NaN
        v[row(5) + 1] = nan             -- NaN first, all the rest masked
        for j = 2, T do v[row(5) + j] = -inf end
        v[row(6) + 7] = inf             -- +inf alone in the prefix
        local got = C.flat(op(name, { dim = 1 }, K.tensor(v, { 6, T })))
        for _, r in ipairs({ 1, 2, 4, 5, 6 }) do
          for j = 1, T do assert(got[row(r) + j] ~= got[row(r) + j], ("row %d col %d: %s, expected nan"):format(r, j, got[row(r) + j])) end
        end
        assert(got[row(3) + 3] == (log and -inf or 0) and got[row(3) + T] == (log and -inf or 0), "masked entries of row 3")
        run(K.tensor(v, { 6, T }), v, { 6, T }, { 1 })
      end,
      ["log_softmax keeps -inf where softmax gives 0 (masked 2x4x8)"] = function()
        local v = stored(64, -2, 2)
        for b = 0, 7 do for j = 1, 7 do if j > b then v[b * 8 + j + 1] = -inf end end end
        local got = C.flat(op(name, { dim = -1 }, K.tensor(v, { 2, 4, 8 })))
        for b = 0, 7 do for j = 0, 7 do
          local g = got[b * 8 + j + 1]
          if j > b then assert(g == (log and -inf or 0), ("row %d col %d: %s"):format(b + 1, j + 1, g)) end
        end end
      end,
      -- scale and causal: softmax of scale * x with row i of each (T, T) seeing columns
      -- j <= i, against the reference on the masked, scaled values; on the CPU also
      -- bit for bit against the three ops it replaces (mul_scalar, causal_mask, softmax)
      ["scale and causal against the reference and the composed ops, T = 1 .. 256"] = function()
        for _, T in ipairs({ 1, 2, 7, 33, 256 }) do
          for _, sc in ipairs({ 0.125, 1, -0.7 }) do
            local shape = { 2, T, T }
            local t, v = rand(shape, -4, 4)
            local w = {}
            for k = 0, 2 * T * T - 1 do
              local i, j = (k // T) % T, k % T
              w[k + 1] = j <= i and v[k + 1] * sc or -inf
            end
            local got = op(name, { dim = -1, scale = sc, causal = true }, t)
            K.check(got, softmax_ref(w, shape, 2, log), shape, nil, ("%s T %d scale %g"):format(name, T, sc))
            if K.device == "cpu" then
              local composed = op(name, { dim = -1 }, op("causal_mask", nil, op("mul_scalar", { value = sc }, t)))
              local a, b = C.flat(got), C.flat(composed)
              for k = 1, #a do
                assert(a[k] == b[k], ("%s T %d scale %g: element %d is %s, composed ops give %s"):format(name, T, sc, k, a[k], b[k]))
              end
            end
          end
        end
      end,
      ["scale alone over a middle (strided) dim and over the last; NaN in a masked entry is not read"] = function()
        local shape = { 3, 4, 5 }
        local t, v = rand(shape, -3, 3)
        for _, d in ipairs({ 1, 2 }) do
          local w = {}
          for k = 1, #v do w[k] = v[k] * 2.5 end
          K.check(op(name, { dim = d, scale = 2.5 }, t), softmax_ref(w, shape, d, log), shape, nil, name .. " scaled dim " .. d)
        end
        local x = { 1, nan, nan, 2, 3, nan, 4, 5, 6 }
        local got = C.flat(op(name, { dim = 1, causal = true }, K.tensor(x, { 3, 3 })))
        for k = 1, 9 do assert(got[k] == got[k], ("element %d is nan: masked NaNs must not be read"):format(k)) end
        local y = { nan, 1, 2, 3, 4, 5, 6, 7, 8 }  -- NaN on the diagonal: row 1 is NaN, the rest is not
        got = C.flat(op(name, { dim = 1, causal = true }, K.tensor(y, { 3, 3 })))
        assert(got[1] ~= got[1] and got[4] == got[4] and got[9] == got[9], "a live NaN poisons its row only")
        -- rows of 40: the float32 kernel takes 16 columns at a time, masking the lanes
        -- past a row's last live column, then the last 8 one by one
        local T = 40
        local z = stored(T * T, -3, 3)
        local function at(i, j) return i * T + j + 1 end  -- 0-based row i, column j
        for j = 21, 31 do z[at(20, j)] = nan end  -- masked lanes of row 20's second chunk
        z[at(34, 39)] = nan                       -- masked, in the one-by-one columns
        z[at(36, 33)] = nan                       -- live, in the one-by-one columns
        z[at(25, 17)] = inf                       -- live +inf: NaN row
        got = C.flat(op(name, { dim = 1, scale = 0.5, causal = true }, K.tensor(z, { T, T })))
        for i = 0, T - 1 do
          local poisoned = i == 36 or i == 25
          for j = 0, T - 1 do
            local g = got[at(i, j)]
            assert((g ~= g) == poisoned, ("row %d col %d: %s"):format(i, j, g))
          end
        end
      end,
      ["causal needs (..., T, T) and the last dim; scale must be finite"] = function()
        raises("must be (..., T, T)", op, name, { dim = -1, causal = true }, (rand({ 3, 4 })))
        raises("must be (..., T, T)", op, name, { dim = -1, causal = true }, (rand({ 4 })))
        raises("over the last dim, not dim 0", op, name, { dim = 0, causal = true }, (rand({ 4, 4 })))
        raises("scale must be a finite number", op, name, { dim = -1, scale = inf }, (rand({ 2, 2 })))
        raises("scale must be a finite number", op, name, { dim = -1, scale = nan }, (rand({ 2, 2 })))
      end,
      ["non-contiguous input, empty tensors"] = function()
        local t, v = noncontig({ 4, 5 })
        run(t, v, { 4, 5 }, { 0, 1 })
        run(K.tensor({}, { 0, 4 }), {}, { 0, 4 }, { 0, 1 })
      end,
      ["large rows (parallel path)"] = function()
        local t, v = rand({ 200, 300 }, -5, 5)
        run(t, v, { 200, 300 }, { 1, 0 })
      end,
      ["dim out of range is an error"] = function()
        raises("out of range", op, name, { dim = 2 }, (rand({ 2, 3 })))
      end,
    }
  end

  local function sum_to_ref(v, shape, target)
    -- index arithmetic: each input element adds into its broadcast-source element
    local nd, off = #shape, #shape - #target
    local out = {}
    for i = 1, kit.numel(target) do out[i] = 0 end
    for i = 0, kit.numel(shape) - 1 do
      local q, o, mult = i, 0, 1
      for d = nd, 1, -1 do
        local c = q % shape[d]
        q = q // shape[d]
        local td = d - off
        if td >= 1 then
          if target[td] ~= 1 then o = o + c * mult end
          mult = mult * target[td]
        end
      end
      out[o + 1] = out[o + 1] + v[i + 1]
    end
    return out
  end

  local function softmax_bw_ref(y, g, shape, d, log)
    local e = {}
    for _, l in ipairs(lanes(shape, d)) do
      local s = 0
      for _, k in ipairs(l) do s = s + (log and g[k] or g[k] * y[k]) end
      for _, k in ipairs(l) do
        if log then e[k] = g[k] - math.exp(y[k]) * s else e[k] = y[k] * (g[k] - s) end
      end
    end
    return e
  end

  local function softmax_bw_cases(name, log)
    return {
      forward = {
        ["matches the formula over the last and a middle dim"] = function()
          for _, c in ipairs({ { { 3, 5 }, 1 }, { { 2, 3, 4 }, 1 }, { { 4, 3 }, -2 } }) do
            local shape, d = c[1], c[2]
            local x = rand(shape, -2, 2)
            local y = op(log and "log_softmax" or "softmax", { dim = d }, x)
            local g, gv = rand(shape)
            K.check(op(name, { dim = d }, y, g), softmax_bw_ref(C.flat(y), gv, shape, d, log), shape)
          end
        end,
        -- contiguous rows of 33 and 256 (the float32 SIMD path) from masked logits:
        -- y is 0 (softmax) or -inf (log_softmax) on the tail; a NaN gradient there
        -- still makes its row NaN, an inf one too (0 * inf in softmax's sum), and
        -- the other rows stay finite
        ["masked rows, long rows, NaN and inf gradients on the masked tail"] = function()
          for _, T in ipairs({ 33, 256 }) do
            local v = stored(4 * T, -3, 3)
            for r = 0, 3 do for j = r * 7 + 1, T - 1 do v[r * T + j + 1] = -inf end end
            local y = op(log and "log_softmax" or "softmax", { dim = 1 }, K.tensor(v, { 4, T }))
            local gv = stored(4 * T, -1, 1)
            gv[T] = inf            -- row 1, masked column
            gv[2 * T] = nan        -- row 2, masked column
            local got = op(name, { dim = 1 }, y, K.tensor(gv, { 4, T }))
            local flat = C.flat(K.device == "cpu" and got or C.to_device(got, "cpu"))
            -- (log_softmax_backward: sum(g) = inf gives -inf on row 1's live entries)
            for j = log and T + 1 or 1, 2 * T do assert(flat[j] ~= flat[j], ("T %d: element %d is %s, expected nan"):format(T, j, flat[j])) end
            for j = 2 * T + 1, 4 * T do assert(flat[j] == flat[j], ("T %d: element %d is nan"):format(T, j)) end
            local yv = C.flat(K.device == "cpu" and y or C.to_device(y, "cpu"))
            K.check(got, softmax_bw_ref(yv, gv, { 4, T }, 1, log), { 4, T })
          end
        end,
        -- with the forward's scale and causal mask: scale times the formula over each
        -- row's live entries; the masked entries' dx is 0 and their g is not read
        ["scale and causal: scale x the formula over the live entries, 0 where masked"] = function()
          for _, T in ipairs({ 5, 33 }) do
            local shape, sc = { 2, T, T }, -0.6
            local attrs = { dim = -1, scale = sc, causal = true }
            local y = op(log and "log_softmax" or "softmax", attrs, (rand(shape, -3, 3)))
            local g, gv = rand(shape)
            gv = table.move(gv, 1, #gv, 1, {})
            gv[T] = nan   -- row 1's masked column: not read
            -- masked columns within 16 of the live ones (where a SIMD loop padded past
            -- the live prefix would reach): not read either
            gv[T + 9] = nan                    -- row 2, column 9 (T 5: row 3, column 4)
            if T > 6 then gv[6] = inf end      -- row 1, column 6
            g = K.tensor(gv, shape)
            local yv = C.flat(K.device == "cpu" and y or C.to_device(y, "cpu"))
            local e = {}
            for r = 0, 2 * T - 1 do
              local i, sum = r % T, 0
              for j = 0, i do local k = r * T + j + 1; sum = sum + (log and gv[k] or gv[k] * yv[k]) end
              for j = 0, T - 1 do
                local k = r * T + j + 1
                if j > i then e[k] = 0
                elseif log then e[k] = sc * (gv[k] - math.exp(yv[k]) * sum)
                else e[k] = sc * yv[k] * (gv[k] - sum) end
              end
            end
            K.check(op(name, attrs, y, g), e, shape, nil, ("%s T %d"):format(name, T))
          end
        end,
        ["shape mismatch is an error"] = function()
          raises("differ in shape", op, name, { dim = 0 }, (rand({ 2, 3 })), (rand({ 3, 2 })))
        end,
      },
      nodiff = "internal backward helper of " .. (log and "log_softmax" or "softmax") ..
        "; its own gradient is never taken (covered by the " .. (log and "log_softmax" or "softmax") .. " gradchecks)",
    }
  end

  local function gc(fn, specs, opts) return kit.gradcheck(fn, specs, opts) end

  return {
    sum = {
      forward = sum_like("sum", sum_ref),
      grad = {
        ["over dim 1 of 2x3x4"] = function() gc(function(x) return op("sum", { dim = 1 }, x) end, { { shape = { 2, 3, 4 } } }) end,
        ["over all dims, keepdim"] = function() gc(function(x) return op("sum", { dim = ALL, keepdim = true }, x) end, { { shape = { 3, 2 } } }) end,
        ["negative dim"] = function() gc(function(x) return op("sum", { dim = -1 }, x) end, { { shape = { 3, 4 } } }) end,
      },
    },
    mean = {
      forward = sum_like("mean", mean_ref),
      grad = {
        ["over dim 0 of 3x4, keepdim"] = function() gc(function(x) return op("mean", { dim = 0, keepdim = true }, x) end, { { shape = { 3, 4 } } }) end,
        ["over all dims"] = function() gc(function(x) return op("mean", { dim = ALL }, x) end, { { shape = { 2, 3, 2 } } }) end,
      },
    },
    max = {
      forward = max_like("max"),
      grad = {
        ["over dim 1 of 3x4 (to the max position)"] = function()
          gc(function(x) return (op("max", { dim = 1 }, x)) end, { { shape = { 3, 4 } } })
        end,
        ["middle dim, keepdim"] = function()
          gc(function(x) return (op("max", { dim = 1, keepdim = true }, x)) end, { { shape = { 2, 3, 2 } } })
        end,
        ["over all dims"] = function()
          gc(function(x) return (op("max", { dim = ALL }, x)) end, { { shape = { 2, 3 } } })
        end,
        ["ties: the first maximum gets the gradient"] = function()
          local x = C.from_table({ 1, 4, 4, 2 }, { 4 }, "float64")
          C.requires_grad(x, true)
          local v = op("max", { dim = 0 }, x)
          C.backward(v)
          K.check(C.grad(x), { 0, 1, 0, 0 }, { 4 })
        end,
      },
    },
    argmax = { forward = max_like("argmax"), nodiff = "returns indices (piecewise constant)" },
    sum_to = {
      forward = {
        ["2x3x4 to 3x1, 1x4, 4, 0-d, 2x1x1 and itself"] = function()
          local shape = { 2, 3, 4 }
          local t, v = rand(shape)
          for _, target in ipairs({ { 3, 1 }, { 1, 4 }, { 4 }, {}, { 2, 1, 1 }, { 2, 3, 4 }, { 1, 3, 4 } }) do
            K.check(op("sum_to", { shape = target }, t), sum_to_ref(v, shape, target), target)
          end
        end,
        ["row-bias gradient shapes (large, parallel)"] = function()
          local shape = { 257, 300 }
          local t, v = rand(shape)
          for _, target in ipairs({ { 300 }, { 257, 1 }, { 1, 1 } }) do
            K.check(op("sum_to", { shape = target }, t), sum_to_ref(v, shape, target), target)
          end
        end,
        ["non-contiguous input, empty input, NaN"] = function()
          local t, v = noncontig({ 3, 5 })
          K.check(op("sum_to", { shape = { 5 } }, t), sum_to_ref(v, { 3, 5 }, { 5 }), { 5 })
          K.check(op("sum_to", { shape = { 3 } }, K.tensor({}, { 0, 3 })), { 0, 0, 0 }, { 3 })
          local w = { 1, nan, 2, 3 }
          K.check(op("sum_to", { shape = { 1, 2 } }, K.tensor(w, { 2, 2 })), { 3, nan }, { 1, 2 })
        end,
        ["a shape that is not a broadcast source is an error"] = function()
          raises("cannot sum", op, "sum_to", { shape = { 4 } }, (rand({ 2, 3 })))
          raises("cannot sum", op, "sum_to", { shape = { 1, 2, 3 } }, (rand({ 2, 3 })))
        end,
      },
      grad = {
        ["2x3x4 to 3x1"] = function() gc(function(x) return op("sum_to", { shape = { 3, 1 } }, x) end, { { shape = { 2, 3, 4 } } }) end,
        ["to a 0-d tensor"] = function() gc(function(x) return op("sum_to", { shape = {} }, x) end, { { shape = { 2, 2 } } }) end,
      },
    },
    softmax = {
      forward = softmax_like("softmax", false),
      grad = {
        ["3x4 over dim 1"] = function() gc(function(x) return op("softmax", { dim = 1 }, x) end, { { shape = { 3, 4 } } }) end,
        ["2x3x4 over the middle dim"] = function() gc(function(x) return op("softmax", { dim = 1 }, x) end, { { shape = { 2, 3, 4 } } }) end,
        ["scaled, causal 2x5x5"] = function()
          gc(function(x) return op("softmax", { dim = -1, scale = -0.8, causal = true }, x) end, { { shape = { 2, 5, 5 } } })
        end,
        ["scaled over the middle dim"] = function()
          gc(function(x) return op("softmax", { dim = 1, scale = 1.7 }, x) end, { { shape = { 2, 3, 4 } } })
        end,
      },
    },
    log_softmax = {
      forward = softmax_like("log_softmax", true),
      grad = {
        ["3x4 over dim 1"] = function() gc(function(x) return op("log_softmax", { dim = 1 }, x) end, { { shape = { 3, 4 } } }) end,
        ["2x3x4 over dim 0"] = function() gc(function(x) return op("log_softmax", { dim = 0 }, x) end, { { shape = { 2, 3, 4 } } }) end,
        -- the masked outputs are -inf: zeroed (causal_mask's backward form) before the check
        ["scaled, causal 2x5x5"] = function()
          gc(function(x)
            return op("causal_mask", { zeros = true }, op("log_softmax", { dim = -1, scale = 0.6, causal = true }, x))
          end, { { shape = { 2, 5, 5 } } })
        end,
      },
    },
    softmax_backward = softmax_bw_cases("softmax_backward", false),
    log_softmax_backward = softmax_bw_cases("log_softmax_backward", true),
  }
end
