-- Spec cases for min, sort, topk and cumsum (see spec/ops_spec.lua for the contract).
-- References are naive Lua over the values the tensors hold, column by column.
local remat = require "remat"
local kit = require "support.kit"
local C = remat._C

local nan, inf = 0 / 0, math.huge
local ALL = math.mininteger

-- Columns of a row-major tensor of `shape` along 0-based dim d: a list of lists of
-- flat (1-based) positions, in (outer, inner) order.
local function columns(shape, d)
  local outer, inner = 1, 1
  for k = 1, d do outer = outer * shape[k] end
  for k = d + 2, #shape do inner = inner * shape[k] end
  local n = shape[d + 1]
  local cols = {}
  for o = 0, outer - 1 do
    for i = 0, inner - 1 do
      local c = {}
      for e = 0, n - 1 do c[#c + 1] = o * n * inner + e * inner + i + 1 end
      cols[#cols + 1] = c
    end
  end
  return cols, outer, n, inner
end

-- Does (a, i) come before (b, j)? NaN above every number; ties by position.
local function before(a, i, b, j, desc)
  local na, nb = a ~= a, b ~= b
  if na or nb then
    if na and nb then return i < j end
    if na then return desc end
    return not desc
  end
  if a == b then return i < j end
  if desc then return a > b end
  return a < b
end

-- Values and 1-based indices of the first k of each column in order, laid out with
-- size k along dim d.
local function sorted_ref(v, shape, d, k, desc)
  local cols, outer, _, inner = columns(shape, d)
  local vals, idx = {}, {}
  for q, c in ipairs(cols) do
    local o, i = (q - 1) // inner, (q - 1) % inner
    local order = {}
    for e = 1, #c do order[e] = e end
    table.sort(order, function(x, y) return before(v[c[x]], x, v[c[y]], y, desc) end)
    for r = 1, k do
      local pos = o * k * inner + (r - 1) * inner + i + 1
      vals[pos], idx[pos] = v[c[order[r]]], order[r]
    end
  end
  return vals, idx
end

local function min_ref(v, shape, d)
  local cols = d and columns(shape, d) or { (function()
    local c = {}
    for i = 1, #v do c[i] = i end
    return c
  end)() }
  local vals, idx = {}, {}
  for q, c in ipairs(cols) do
    local best, bi = v[c[1]], 1
    for e = 2, #c do
      if best ~= best then break end
      local x = v[c[e]]
      if x < best or x ~= x then best, bi = x, e end
    end
    vals[q], idx[q] = best, bi
  end
  return vals, idx
end

local function cumsum_ref(v, shape, d, rev)
  local cols = columns(shape, d)
  local out = {}
  for _, c in ipairs(cols) do
    local s = 0
    for e = 1, #c do
      local p = rev and c[#c + 1 - e] or c[e]
      s = s + v[p]
      out[p] = s
    end
  end
  return out
end

local function without(shape, d, keep)
  local s = {}
  for k = 1, #shape do
    if k ~= d + 1 then s[#s + 1] = shape[k] elseif keep then s[#s + 1] = 1 end
  end
  return s
end

local function with_size(shape, d, k)
  local s = { table.unpack(shape) }
  s[d + 1] = k
  return s
end

-- Small whole numbers: many ties, which a stable order must keep in place.
local function ties(shape)
  local v = kit.values(shape, 0, 4)
  for i = 1, #v do v[i] = math.floor(v[i]) + 0.0 end
  return v
end

return function(K)
  local function op(name, attrs, ...) return C.op(C.ops[name], attrs, ...) end
  local function ints(shape) return K.tensor(ties(shape), shape) end

  local function check_min(t, shape, d, keep)
    local v = C.flat(K.device == "cpu" and t or C.to_device(t, "cpu"))
    local ev, ei = min_ref(v, shape, d)
    local oshape = d and without(shape, d, keep) or {}
    local val, idx = op("min", { dim = d or ALL, keepdim = keep and true or false }, t)
    K.check(val, ev, oshape, nil, "min values")
    K.check(idx, ei, oshape, 0, "min indices")
  end

  local function check_sort(name, t, shape, d, k, desc)
    local v = C.flat(K.device == "cpu" and t or C.to_device(t, "cpu"))
    local ev, ei = sorted_ref(v, shape, d, k, desc)
    local attrs = name == "sort" and { dim = d, descending = desc and true or false } or { dim = d, k = k, largest = desc and true or false }
    local val, idx = op(name, attrs, t)
    K.check(val, ev, with_size(shape, d, k), 0, name .. " values")
    K.check(idx, ei, with_size(shape, d, k), 0, name .. " indices")
  end

  local function check_cumsum(t, shape, d, rev)
    local v = C.flat(K.device == "cpu" and t or C.to_device(t, "cpu"))
    K.check(op("cumsum", { dim = d, reverse = rev and true or false }, t), cumsum_ref(v, shape, d, rev), shape)
  end

  local SPECIAL = { 0.5, nan, -inf, 2, inf, nan, -1, 0.5 }

  return {
    min = {
      forward = {
        ["odd sizes 3x5x7 along every dim, keepdim or not"] = function()
          local t = K.rand_stored({ 3, 5, 7 })
          for d = 0, 2 do
            check_min(t, { 3, 5, 7 }, d, false)
            check_min(t, { 3, 5, 7 }, d, true)
          end
          check_min(t, { 3, 5, 7 }, nil, false)
        end,
        ["ties give the first minimum; size-1 dims; 0-d"] = function()
          check_min(ints({ 4, 9 }), { 4, 9 }, 1, false)
          check_min(ints({ 1, 6, 1 }), { 1, 6, 1 }, 1, true)
          check_min(ints({ 1, 6, 1 }), { 1, 6, 1 }, 0, false)
          local z = K.rand_stored({})
          local v = op("min", { dim = ALL, keepdim = false }, z)
          K.check(v, C.flat(K.device == "cpu" and z or C.to_device(z, "cpu")), {})
        end,
        ["non-contiguous input"] = function()
          local t = K.noncontig({ 5, 6 })
          check_min(t, { 5, 6 }, 0, false)
          check_min(t, { 5, 6 }, 1, false)
        end,
        ["the first NaN wins; -inf is a value"] = function()
          check_min(K.tensor(SPECIAL, { 2, 4 }), { 2, 4 }, 1, false)
          check_min(K.tensor(SPECIAL, { 2, 4 }), { 2, 4 }, 0, false)
          check_min(K.tensor({ 3, -inf, 1 }, { 3 }), { 3 }, 0, false)
        end,
        ["an empty dimension is an error"] = function()
          kit.raises("min: cannot reduce over an empty dimension", op, "min", { dim = 1, keepdim = false }, K.tensor({}, { 2, 0 }))
        end,
      },
      grad = {
        ["3x4 along dim 2 and over everything"] = function()
          kit.gradcheck(function(x) return (op("min", { dim = 1, keepdim = false }, x)) end, { { shape = { 3, 4 } } })
          kit.gradcheck(function(x) return (op("min", { dim = 0, keepdim = true }, x)) end, { { shape = { 3, 4 } } })
          kit.gradcheck(function(x) return (op("min", { dim = ALL, keepdim = false }, x)) end, { { shape = { 3, 4 } } })
        end,
      },
    },
    sort = {
      forward = {
        ["odd sizes 3x5x7 along every dim, both directions"] = function()
          local t = K.rand_stored({ 3, 5, 7 })
          for d = 0, 2 do
            check_sort("sort", t, { 3, 5, 7 }, d, ({ 3, 5, 7 })[d + 1], false)
            check_sort("sort", t, { 3, 5, 7 }, d, ({ 3, 5, 7 })[d + 1], true)
          end
        end,
        ["stable with ties; size-1 dims; a long column"] = function()
          check_sort("sort", ints({ 3, 20 }), { 3, 20 }, 1, 20, false)
          check_sort("sort", ints({ 3, 20 }), { 3, 20 }, 1, 20, true)
          check_sort("sort", ints({ 1, 5, 1 }), { 1, 5, 1 }, 2, 1, false)
          check_sort("sort", ints({ 1, 5, 1 }), { 1, 5, 1 }, 1, 5, true)
          check_sort("sort", K.rand_stored({ 1000 }), { 1000 }, 0, 1000, false)
        end,
        ["non-contiguous input"] = function()
          check_sort("sort", K.noncontig({ 6, 7 }), { 6, 7 }, 0, 6, false)
          check_sort("sort", K.noncontig({ 6, 7 }), { 6, 7 }, 1, 7, true)
        end,
        ["NaN sorts above every number, infinities in place"] = function()
          check_sort("sort", K.tensor(SPECIAL, { 8 }), { 8 }, 0, 8, false)
          check_sort("sort", K.tensor(SPECIAL, { 8 }), { 8 }, 0, 8, true)
        end,
        ["a 0-d tensor is an error"] = function()
          kit.raises("sort: expected at least a 1-d tensor", op, "sort", { dim = 0, descending = false }, K.tensor({ 1 }, {}))
        end,
      },
      grad = {
        ["3x5 along dim 2, descending"] = function()
          kit.gradcheck(function(x) return (op("sort", { dim = 1, descending = true }, x)) end, { { shape = { 3, 5 } } })
          kit.gradcheck(function(x) return (op("sort", { dim = 0, descending = false }, x)) end, { { shape = { 3, 5 } } })
        end,
      },
    },
    topk = {
      forward = {
        ["k of 1, 3 and all along every dim of 4x6x5, largest and smallest"] = function()
          local shape = { 4, 6, 5 }
          local t = K.rand_stored(shape)
          for d = 0, 2 do
            for _, k in ipairs({ 1, 3, shape[d + 1] }) do
              check_sort("topk", t, shape, d, k, true)
              check_sort("topk", t, shape, d, k, false)
            end
          end
        end,
        ["ties keep their order; NaN counts as the largest; k = 0"] = function()
          check_sort("topk", ints({ 2, 15 }), { 2, 15 }, 1, 4, true)
          check_sort("topk", K.tensor(SPECIAL, { 8 }), { 8 }, 0, 3, true)
          check_sort("topk", K.tensor(SPECIAL, { 8 }), { 8 }, 0, 3, false)
          local v, i = op("topk", { dim = 0, k = 0, largest = true }, (K.rand({ 4 })))
          K.check(v, {}, { 0 })
          K.check(i, {}, { 0 })
        end,
        ["non-contiguous input"] = function()
          check_sort("topk", K.noncontig({ 7, 5 }), { 7, 5 }, 0, 2, true)
        end,
        ["k out of range is an error"] = function()
          kit.raises("topk: k = 5 is out of range for dimension 1 of size 4", op, "topk", { dim = 0, k = 5, largest = true }, (K.rand({ 4 })))
        end,
      },
      grad = {
        ["top 2 of 3x5 along dim 2"] = function()
          kit.gradcheck(function(x) return (op("topk", { dim = 1, k = 2, largest = true }, x)) end, { { shape = { 3, 5 } } })
          kit.gradcheck(function(x) return (op("topk", { dim = 0, k = 2, largest = false }, x)) end, { { shape = { 3, 5 } } })
        end,
      },
    },
    cumsum = {
      forward = {
        ["odd sizes 3x5x7 along every dim, forwards and reversed"] = function()
          local t = K.rand_stored({ 3, 5, 7 })
          for d = 0, 2 do
            check_cumsum(t, { 3, 5, 7 }, d, false)
            check_cumsum(t, { 3, 5, 7 }, d, true)
          end
        end,
        ["size-1 dims, empty, non-contiguous"] = function()
          check_cumsum(K.rand_stored({ 1, 4, 1 }), { 1, 4, 1 }, 1, false)
          check_cumsum(K.rand_stored({ 1, 4, 1 }), { 1, 4, 1 }, 0, false)
          check_cumsum(K.tensor({}, { 0, 3 }), { 0, 3 }, 0, false)
          check_cumsum(K.noncontig({ 6, 5 }), { 6, 5 }, 0, false)
          check_cumsum(K.noncontig({ 6, 5 }), { 6, 5 }, 1, true)
        end,
        ["NaN and inf propagate down the column"] = function()
          check_cumsum(K.tensor(SPECIAL, { 8 }), { 8 }, 0, false)
          check_cumsum(K.tensor({ 1, inf, -inf, 2 }, { 4 }), { 4 }, 0, false)
        end,
        ["a long float32 column sums in float64"] = function()
          local n = 4097
          local v = {}
          for i = 1, n do v[i] = 0.1 end
          local t = K.tensor(v, { n })
          check_cumsum(t, { n }, 0, false)
        end,
      },
      grad = {
        ["3x4 along both dims, both directions"] = function()
          kit.gradcheck(function(x) return op("cumsum", { dim = 1, reverse = false }, x) end, { { shape = { 3, 4 } } })
          kit.gradcheck(function(x) return op("cumsum", { dim = 0, reverse = true }, x) end, { { shape = { 3, 4 } } })
        end,
      },
    },
  }
end
