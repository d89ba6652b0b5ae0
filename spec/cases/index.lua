-- Spec cases for the indexing ops (see spec/ops_spec.lua for the contract). Index
-- values are 1-based floats; dims in attrs are 0-based (C convention).
local remat = require "remat"
local kit = require "support.kit"
local C = remat._C

-- Row-major helpers over flat (1-based) value tables and 0-based coordinates.
local function unravel(i, shape)
  local c = {}
  for d = #shape, 1, -1 do
    c[d] = i % shape[d]
    i = i // shape[d]
  end
  return c
end

local function ravel(c, shape)
  local i = 0
  for d = 1, #shape do i = i * shape[d] + c[d] end
  return i
end

local function copy(t) local r = {} for k, v in ipairs(t) do r[k] = v end return r end

-- Naive references. d is 0-based as in the attrs.
local function ref_index_select(v, shape, d, idx)
  local oshape = copy(shape)
  oshape[d + 1] = #idx
  local out = {}
  for p = 0, kit.numel(oshape) - 1 do
    local c = unravel(p, oshape)
    c[d + 1] = idx[c[d + 1] + 1] - 1
    out[p + 1] = v[ravel(c, shape) + 1]
  end
  return out, oshape
end

local function ref_gather(v, shape, d, idx, ishape)
  local out = {}
  for p = 0, kit.numel(ishape) - 1 do
    local c = unravel(p, ishape)
    c[d + 1] = idx[p + 1] - 1
    out[p + 1] = v[ravel(c, shape) + 1]
  end
  return out
end

local function ref_scatter_add(v, shape, d, idx, oshape)
  local out = {}
  for p = 1, kit.numel(oshape) do out[p] = 0 end
  for p = 0, kit.numel(shape) - 1 do
    local c = unravel(p, shape)
    c[d + 1] = idx[p + 1] - 1
    local q = ravel(c, oshape) + 1
    out[q] = out[q] + v[p + 1]
  end
  return out
end

local function ref_index_add(v, shape, d, idx, size)
  local oshape = copy(shape)
  oshape[d + 1] = size
  local out = {}
  for p = 1, kit.numel(oshape) do out[p] = 0 end
  for p = 0, kit.numel(shape) - 1 do
    local c = unravel(p, shape)
    c[d + 1] = idx[c[d + 1] + 1] - 1
    local q = ravel(c, oshape) + 1
    out[q] = out[q] + v[p + 1]
  end
  return out, oshape
end

local function ref_concat(parts, d)
  local oshape = copy(parts[1].shape)
  oshape[d + 1] = 0
  for _, p in ipairs(parts) do oshape[d + 1] = oshape[d + 1] + p.shape[d + 1] end
  local out = {}
  for q = 0, kit.numel(oshape) - 1 do
    local c = unravel(q, oshape)
    local k = c[d + 1]
    for _, p in ipairs(parts) do
      if k < p.shape[d + 1] then
        c[d + 1] = k
        out[q + 1] = p.values[ravel(c, p.shape) + 1]
        break
      end
      k = k - p.shape[d + 1]
    end
  end
  return out, oshape
end

local function ref_causal(v, shape, fill)
  local T = shape[#shape]
  local out = {}
  for p = 0, #v - 1 do
    local i, j = (p // T) % T, p % T
    out[p + 1] = j > i and fill or v[p + 1]
  end
  return out
end

local raises = kit.raises

return function(K)
  local function op(name, attrs, ...) return C.op(C.ops[name], attrs, ...) end
  -- Index tensors in K's dtype, or float64 whatever K's dtype is.
  local function ix(vals, shape) return K.tensor(vals, shape or { #vals }) end
  local function ix64(vals, shape) return K.place(C.from_table(vals, shape or { #vals }, "float64")) end
  local inf, nan = math.huge, 0 / 0

  return {
    index_select = {
      forward = {
        ["rows of 4x3 with repeats"] = function()
          local x, v = K.rand({ 4, 3 })
          local idx = { 3, 1, 3, 4 }
          local e, s = ref_index_select(v, { 4, 3 }, 0, idx)
          K.check(op("index_select", { dim = 0 }, x, ix(idx)), e, s)
        end,
        ["middle dim of a non-contiguous 2x5x3"] = function()
          local x, v = K.noncontig({ 2, 5, 3 })
          local idx = { 5, 2, 2 }
          local e, s = ref_index_select(v, { 2, 5, 3 }, 1, idx)
          K.check(op("index_select", { dim = 1 }, x, ix(idx)), e, s)
        end,
        ["last dim (negative dim), float64 indices"] = function()
          local x, v = K.rand({ 3, 7 })
          local idx = { 7, 1, 4, 4, 2 }
          local e, s = ref_index_select(v, { 3, 7 }, 1, idx)
          K.check(op("index_select", { dim = -1 }, x, ix64(idx)), e, s)
        end,
        ["size-1 dims and empty index"] = function()
          local x, v = K.rand({ 1, 4, 1 })
          K.check(op("index_select", { dim = 1 }, x, ix({ 4, 2 })), { v[4], v[2] }, { 1, 2, 1 })
          K.check(op("index_select", { dim = 1 }, x, ix({}, { 0 })), {}, { 1, 0, 1 })
          local e = K.tensor({}, { 0, 3 })
          K.check(op("index_select", { dim = 1 }, e, ix({ 3, 1 })), {}, { 0, 2 })
        end,
        ["NaN and inf are copied"] = function()
          local x = K.tensor({ nan, inf, -inf, 1 }, { 4 })
          K.check(op("index_select", { dim = 0 }, x, ix({ 2, 1, 3, 4 })), { inf, nan, -inf, 1 }, { 4 })
        end,
        ["out-of-range and fractional indices are errors"] = function()
          local x = K.rand({ 4, 2 })
          raises("index_select: index 5 is out of range 1..4 (dimension 1, position 2)",
                 op, "index_select", { dim = 0 }, x, ix({ 1, 5 }))
          raises("index 0 is out of range 1..2", op, "index_select", { dim = 1 }, x, ix({ 0 }))
          raises("index 1.5 is not a whole number in 1..4", op, "index_select", { dim = 0 }, x, ix({ 1.5 }))
          raises("index nan", op, "index_select", { dim = 0 }, x, ix({ nan }))
          raises("index 1 is out of range 1..0", op, "index_select", { dim = 0 }, K.tensor({}, { 0, 2 }), ix({ 1 }))
        end,
        ["bad shapes and dims are errors"] = function()
          local x = K.rand({ 4, 2 })
          raises("index_select: the indices must be 1-D, got 1x2", op, "index_select", { dim = 0 }, x, ix({ 1, 2 }, { 1, 2 }))
          raises("index_select: dimension 3 is out of range", op, "index_select", { dim = 2 }, x, ix({ 1 }))
          raises("index_select: cannot index a 0-d tensor", op, "index_select", { dim = 0 }, K.tensor({ 1 }, {}), ix({ 1 }))
        end,
      },
      grad = {
        ["dim 0 with duplicate indices"] = function()
          kit.gradcheck(function(x, i) return op("index_select", { dim = 0 }, x, i) end,
            { { shape = { 4, 3 } }, { shape = { 5 }, values = { 2, 4, 2, 2, 1 }, grad = false } })
        end,
        ["dim 1 of 2x5x3"] = function()
          kit.gradcheck(function(x, i) return op("index_select", { dim = 1 }, x, i) end,
            { { shape = { 2, 5, 3 } }, { shape = { 3 }, values = { 5, 1, 5 }, grad = false } })
        end,
      },
    },

    gather = {
      forward = {
        ["dim 1 of 3x4 (torch.gather)"] = function()
          local x, v = K.rand({ 3, 4 })
          local idx = { 4, 1, 1, 2, 3, 3, 4, 4, 1 }
          K.check(op("gather", { dim = 1 }, x, ix(idx, { 3, 3 })), ref_gather(v, { 3, 4 }, 1, idx, { 3, 3 }), { 3, 3 })
        end,
        ["dim 0, indices smaller than the input, non-contiguous"] = function()
          local x, v = K.noncontig({ 5, 4 })
          local idx = { 5, 1, 2, 2, 3, 4 }
          K.check(op("gather", { dim = 0 }, x, ix64(idx, { 2, 3 })), ref_gather(v, { 5, 4 }, 0, idx, { 2, 3 }), { 2, 3 })
        end,
        ["middle dim of 2x3x5 with repeats"] = function()
          local x, v = K.rand({ 2, 3, 5 })
          local ishape = { 2, 4, 5 }
          local idx = {}
          for k = 1, kit.numel(ishape) do idx[k] = (k * 7) % 3 + 1 end
          K.check(op("gather", { dim = 1 }, x, ix(idx, ishape)), ref_gather(v, { 2, 3, 5 }, 1, idx, ishape), ishape)
        end,
        ["empty indices and size-1 dims"] = function()
          local x, v = K.rand({ 1, 3 })
          K.check(op("gather", { dim = 1 }, x, ix({}, { 1, 0 })), {}, { 1, 0 })
          K.check(op("gather", { dim = 0 }, x, ix({ 1, 1 }, { 1, 2 })), { v[1], v[2] }, { 1, 2 })
        end,
        ["errors: range, ndim, sizes"] = function()
          local x = K.rand({ 3, 4 })
          raises("gather: index 5 is out of range 1..4 (dimension 2, position 3)", op, "gather", { dim = 1 }, x,
                 ix({ 1, 2, 5 }, { 1, 3 }))
          raises("must have as many dimensions", op, "gather", { dim = 1 }, x, ix({ 1 }, { 1 }))
          raises("larger than the input (3x4) in dimension 1", op, "gather", { dim = 1 }, x, ix({ 1, 1, 1, 1 }, { 4, 1 }))
        end,
      },
      grad = {
        ["dim 1 of 3x4 with repeats"] = function()
          kit.gradcheck(function(x, i) return op("gather", { dim = 1 }, x, i) end,
            { { shape = { 3, 4 } }, { shape = { 3, 5 }, values = { 1, 1, 4, 2, 1, 3, 3, 3, 4, 1, 2, 4, 2, 2, 1 }, grad = false } })
        end,
        ["dim 0 of 4x3, smaller indices"] = function()
          kit.gradcheck(function(x, i) return op("gather", { dim = 0 }, x, i) end,
            { { shape = { 4, 3 } }, { shape = { 2, 2 }, values = { 4, 4, 1, 2 }, grad = false } })
        end,
      },
    },

    concat = {
      forward = {
        ["three tensors along dims 0, 1 and 2"] = function()
          for d = 0, 2 do
            local parts, ts = {}, {}
            for k = 1, 3 do
              local s = { 2, 3, 4 }
              s[d + 1] = k
              local t, v = K.rand(s)
              parts[k] = { shape = s, values = v }
              ts[k] = t
            end
            local e, s = ref_concat(parts, d)
            K.check(op("concat", { dim = d }, table.unpack(ts)), e, s, nil, "dim " .. d)
          end
        end,
        ["non-contiguous, empty and single inputs"] = function()
          local a, va = K.noncontig({ 3, 2 })
          local b = K.tensor({}, { 3, 0 })
          local c, vc = K.rand({ 3, 1 })
          local e, s = ref_concat({ { shape = { 3, 2 }, values = va }, { shape = { 3, 0 }, values = {} },
                                    { shape = { 3, 1 }, values = vc } }, 1)
          K.check(op("concat", { dim = -1 }, a, b, c), e, s)
          K.check(op("concat", { dim = 0 }, c), vc, { 3, 1 })
        end,
        ["inf and NaN pass through"] = function()
          local a = K.tensor({ inf, nan }, { 2 })
          local b = K.tensor({ -inf }, { 1 })
          K.check(op("concat", { dim = 0 }, a, b), { inf, nan, -inf }, { 3 })
        end,
        ["errors: sizes, dtypes, none, 0-d, dim"] = function()
          local a, b = K.rand({ 2, 3 }), K.rand({ 2, 4 })
          raises("concat: tensor 2 is 2x4 but tensor 1 is 2x3 (sizes must match except in dimension 1)",
                 op, "concat", { dim = 0 }, a, b)
          local other = K.place(C.from_table({ 1, 2, 3 }, { 1, 3 }, K.dtype == "float32" and "float64" or "float32"))
          raises("concat: input 2 is", op, "concat", { dim = 0 }, a, other)
          raises("concat: needs at least one tensor", op, "concat", { dim = 0 })
          raises("concat: cannot concatenate 0-d tensors", op, "concat", { dim = 0 }, K.tensor({ 1 }, {}))
          raises("concat: dimension 3 is out of range", op, "concat", { dim = 2 }, a, a)
          raises("concat: tensor 2 is 6 but tensor 1 is 2x3", op, "concat", { dim = 0 }, a, (K.rand({ 6 })))
        end,
      },
      grad = {
        ["three inputs along dim 1, one not requiring grad"] = function()
          kit.gradcheck(function(a, b, c) return op("concat", { dim = 1 }, a, b, c) end,
            { { shape = { 2, 3 } }, { shape = { 2, 1 }, grad = false }, { shape = { 2, 2 } } })
        end,
        ["along dim 0"] = function()
          kit.gradcheck(function(a, b) return op("concat", { dim = 0 }, a, b) end,
            { { shape = { 1, 3 } }, { shape = { 2, 3 } } })
        end,
      },
    },

    embedding = {
      forward = {
        ["5x3 table, 2x4 indices with repeats"] = function()
          local w, v = K.rand({ 5, 3 })
          local idx = { 5, 1, 1, 2, 3, 5, 4, 1 }
          local e = {}
          for _, k in ipairs(idx) do for j = 1, 3 do e[#e + 1] = v[(k - 1) * 3 + j] end end
          K.check(op("embedding", nil, w, ix(idx, { 2, 4 })), e, { 2, 4, 3 })
          K.check(op("embedding", nil, w, ix64(idx, { 8 })), e, { 8, 3 })
        end,
        ["0-d and empty indices, non-contiguous weight"] = function()
          local w, v = K.noncontig({ 3, 2 })
          K.check(op("embedding", nil, w, ix({ 2 }, {})), { v[3], v[4] }, { 2 })
          K.check(op("embedding", nil, w, ix({}, { 0, 4 })), {}, { 0, 4, 2 })
          K.check(op("embedding", nil, K.tensor({}, { 3, 0 }), ix({ 1, 3 })), {}, { 2, 0 })
        end,
        ["errors: range, weight shape"] = function()
          local w = K.rand({ 10, 2 })
          raises("embedding: index 11 is out of range 1..10 (position 3)", op, "embedding", nil, w, ix({ 1, 2, 11 }))
          raises("embedding: index 0 is out of range", op, "embedding", nil, w, ix({ 0 }))
          raises("embedding: the weight must be 2-D (vocabulary x dim), got 10", op, "embedding", nil, K.rand({ 10 }), ix({ 1 }))
        end,
      },
      grad = {
        ["duplicate indices accumulate"] = function()
          kit.gradcheck(function(w, i) return op("embedding", nil, w, i) end,
            { { shape = { 4, 3 } }, { shape = { 2, 3 }, values = { 2, 4, 2, 2, 1, 4 }, grad = false } })
        end,
        ["0-d index"] = function()
          kit.gradcheck(function(w, i) return op("embedding", nil, w, i) end,
            { { shape = { 3, 2 } }, { shape = {}, values = { 3 }, grad = false } })
        end,
      },
    },

    causal_mask = {
      forward = {
        ["2x4x4: -inf above the diagonal"] = function()
          local x, v = K.rand({ 2, 4, 4 })
          K.check(op("causal_mask", nil, x), ref_causal(v, { 2, 4, 4 }, -inf), { 2, 4, 4 })
        end,
        ["non-contiguous 3x3, 1x1, empty"] = function()
          local x, v = K.noncontig({ 3, 3 })
          K.check(op("causal_mask", nil, x), ref_causal(v, { 3, 3 }, -inf), { 3, 3 })
          local one, v1 = K.rand({ 1, 1 })
          K.check(op("causal_mask", nil, one), v1, { 1, 1 })
          K.check(op("causal_mask", nil, K.tensor({}, { 2, 0, 0 })), {}, { 2, 0, 0 })
        end,
        ["NaN below the diagonal stays, above becomes -inf"] = function()
          local x = K.tensor({ nan, nan, 1, nan }, { 2, 2 })
          K.check(op("causal_mask", nil, x), { nan, -inf, 1, nan }, { 2, 2 })
        end,
        ["i[0] = 1 fills zeros (the backward)"] = function()
          local x, v = K.rand({ 3, 3 })
          K.check(op("causal_mask", { zeros = true }, x), ref_causal(v, { 3, 3 }, 0), { 3, 3 })
        end,
        ["non-square scores are an error"] = function()
          raises("causal_mask: the scores must be (..., T, T), got 2x3", op, "causal_mask", nil, (K.rand({ 2, 3 })))
          raises("causal_mask: the scores must be (..., T, T), got 4", op, "causal_mask", nil, (K.rand({ 4 })))
        end,
      },
      grad = {
        ["through gather of the visible entries"] = function()
          -- the masked entries are -inf: pick, per row, only columns j <= i (the
          -- diagonal stands in for the masked ones) so the output is finite
          local T = 4
          local idx = {}
          for i = 0, T - 1 do for j = 0, T - 1 do idx[#idx + 1] = math.min(i, j) + 1 end end
          kit.gradcheck(function(x, i) return op("gather", { dim = 1 }, op("causal_mask", nil, x), i) end,
            { { shape = { T, T } }, { shape = { T, T }, values = idx, grad = false } })
        end,
        ["gradient is zero where masked"] = function()
          local x = C.from_table(kit.values({ 2, 3, 3 }), { 2, 3, 3 }, "float64")
          C.requires_grad(x, true)
          local w = kit.values({ 2, 3, 3 })
          C.backward(op("causal_mask", nil, x), C.from_table(w, { 2, 3, 3 }, "float64"))
          K.check(C.grad(x), ref_causal(w, { 2, 3, 3 }, 0), { 2, 3, 3 })
        end,
      },
    },

    index_add = {
      nodiff = "internal backward helper of index_select and embedding",
      forward = {
        ["dim 0 into 5 rows with duplicates"] = function()
          local s, v = K.rand({ 4, 3 })
          local idx = { 2, 5, 2, 2 }
          local e, sh = ref_index_add(v, { 4, 3 }, 0, idx, 5)
          K.check(op("index_add", { dim = 0, size = 5 }, s, ix(idx)), e, sh)
        end,
        ["middle dim, non-contiguous source, float64 indices"] = function()
          local s, v = K.noncontig({ 2, 3, 5 })
          local idx = { 1, 1, 4 }
          local e, sh = ref_index_add(v, { 2, 3, 5 }, 1, idx, 4)
          K.check(op("index_add", { dim = 1, size = 4 }, s, ix64(idx)), e, sh)
        end,
        ["wide rows (several tiles) and empty"] = function()
          local s, v = K.rand({ 3, 1100 })
          local idx = { 1, 2, 1 }
          local e, sh = ref_index_add(v, { 3, 1100 }, 0, idx, 2)
          K.check(op("index_add", { dim = 0, size = 2 }, s, ix(idx)), e, sh)
          K.check(op("index_add", { dim = 0, size = 3 }, K.tensor({}, { 0, 2 }), ix({}, { 0 })), { 0, 0, 0, 0, 0, 0 }, { 3, 2 })
        end,
        ["errors"] = function()
          raises("index_add: index 3 is out of range 1..2", op, "index_add", { dim = 0, size = 2 }, K.rand({ 1, 2 }), ix({ 3 }))
          raises("index_add: the indices (2) must be 1-D with one index per slice", op, "index_add", { dim = 0, size = 2 },
                 K.rand({ 1, 2 }), ix({ 1, 1 }))
        end,
      },
    },

    scatter_add = {
      nodiff = "internal backward helper of gather",
      forward = {
        ["dim 1 into 3x4 with repeats"] = function()
          local s, v = K.rand({ 3, 3 })
          local idx = { 4, 1, 4, 2, 2, 2, 1, 3, 4 }
          K.check(op("scatter_add", { dim = 1, shape = { 3, 4 } }, s, ix(idx, { 3, 3 })),
                  ref_scatter_add(v, { 3, 3 }, 1, idx, { 3, 4 }), { 3, 4 })
        end,
        ["dim 0, source smaller than output, non-contiguous"] = function()
          local s, v = K.noncontig({ 2, 3 })
          local idx = { 4, 4, 1, 4, 2, 1 }
          K.check(op("scatter_add", { dim = 0, shape = { 4, 5 } }, s, ix64(idx, { 2, 3 })),
                  ref_scatter_add(v, { 2, 3 }, 0, idx, { 4, 5 }), { 4, 5 })
        end,
        ["empty source gives zeros"] = function()
          K.check(op("scatter_add", { dim = 0, shape = { 2, 1 } }, K.tensor({}, { 0, 1 }), ix({}, { 0, 1 })),
                  { 0, 0 }, { 2, 1 })
        end,
        ["errors"] = function()
          raises("scatter_add: index 3 is out of range 1..2", op, "scatter_add", { dim = 1, shape = { 1, 2 } },
                 K.rand({ 1, 1 }), ix({ 3 }, { 1, 1 }))
          raises("must have the source's shape", op, "scatter_add", { dim = 1, shape = { 1, 2 } },
                 K.rand({ 1, 1 }), ix({ 1, 1 }, { 1, 2 }))
          raises("does not fit the output", op, "scatter_add", { dim = 1, shape = { 1, 2 } },
                 K.rand({ 2, 1 }), ix({ 1, 1 }, { 2, 1 }))
        end,
      },
    },

    narrow_backward = {
      nodiff = "internal backward helper of narrow and select",
      forward = {
        ["window 2..3 of dim 1 (size 5)"] = function()
          local g, v = K.rand({ 2, 2, 3 })
          local e = {}
          for o = 0, 1 do
            for k = 0, 4 do
              for i = 0, 2 do
                e[#e + 1] = (k >= 1 and k <= 2) and v[o * 6 + (k - 1) * 3 + i + 1] or 0
              end
            end
          end
          K.check(op("narrow_backward", { dim = 1, start = 1, size = 5 }, g), e, { 2, 5, 3 })
        end,
        ["non-contiguous g, empty window"] = function()
          local g, v = K.noncontig({ 3, 2 })
          local e = {}
          for r = 0, 2 do e[#e + 1] = 0; e[#e + 1] = v[r * 2 + 1]; e[#e + 1] = v[r * 2 + 2] end
          K.check(op("narrow_backward", { dim = 1, start = 1, size = 3 }, g), e, { 3, 3 })
          K.check(op("narrow_backward", { dim = 0, start = 2, size = 2 }, K.tensor({}, { 0, 2 })), { 0, 0, 0, 0 }, { 2, 2 })
        end,
        ["window out of range is an error"] = function()
          raises("narrow_backward: window 2..4 does not fit in size 3", op, "narrow_backward", { dim = 0, start = 1, size = 3 }, (K.rand({ 3 })))
        end,
      },
    },
  }
end
