-- Spec cases for the losses (see spec/ops_spec.lua for the contract). Labels are
-- 1-based floats; the losses are means and return 0-d tensors.
local remat = require "remat"
local kit = require "support.kit"
local C = remat._C

-- log(sum(exp(row))) of row r (0-based) of a flat N x C table, stably.
local function lse(v, r, ncls)
  local m = -math.huge
  for j = 1, ncls do m = math.max(m, v[r * ncls + j]) end
  local s = 0
  for j = 1, ncls do s = s + math.exp(v[r * ncls + j] - m) end
  return m + math.log(s)
end

local function ref_ce(v, labels, ncls)
  local n, acc = #labels, 0
  for r = 0, n - 1 do acc = acc + lse(v, r, ncls) - v[r * ncls + labels[r + 1]] end
  return acc / n
end

local function ref_ce_backward(v, labels, ncls, g)
  local n, out = #labels, {}
  for r = 0, n - 1 do
    local l = lse(v, r, ncls)
    for j = 1, ncls do
      out[r * ncls + j] = (math.exp(v[r * ncls + j] - l) - (j == labels[r + 1] and 1 or 0)) * g / n
    end
  end
  return out
end

local function ref_mse(a, b)
  local acc = 0
  for i = 1, #a do acc = acc + (a[i] - b[i]) ^ 2 end
  return acc / #a
end

local raises = kit.raises

local function labels_for(n, ncls)
  local l = {}
  for r = 1, n do l[r] = (r * 7) % ncls + 1 end
  return l
end

return function(K)
  local function op(name, attrs, ...) return C.op(C.ops[name], attrs, ...) end
  local inf, nan = math.huge, 0 / 0
  local function lab(vals) return K.tensor(vals, { #vals }) end

  return {
    cross_entropy = {
      forward = {
        ["7x5 random logits"] = function()
          local x, v = K.rand({ 7, 5 }, -3, 3)
          local l = labels_for(7, 5)
          K.check(op("cross_entropy", nil, x, lab(l)), { ref_ce(v, l, 5) }, {})
        end,
        ["1x1 is zero; one class per row"] = function()
          K.check(op("cross_entropy", nil, K.tensor({ 3.5 }, { 1, 1 }), lab({ 1 })), { 0 }, {})
          K.check(op("cross_entropy", nil, K.tensor({ 1, -2, 4 }, { 3, 1 }), lab({ 1, 1, 1 })), { 0 }, {})
        end,
        ["large logits are stable"] = function()
          local v = { 1000, 999, -1000, 500, 1e4, 1e4 - 1 }
          K.check(op("cross_entropy", nil, K.tensor(v, { 3, 2 }), lab({ 2, 1, 1 })), { ref_ce(v, { 2, 1, 1 }, 2) }, {})
        end,
        ["non-contiguous logits, float64 labels"] = function()
          local x, v = K.noncontig({ 4, 6 })
          local l = labels_for(4, 6)
          local labels = K.place(C.from_table(l, { 4 }, "float64"))
          K.check(op("cross_entropy", nil, x, labels), { ref_ce(v, l, 6) }, {})
        end,
        ["NaN or +inf logits give NaN; -inf away from the label is fine"] = function()
          K.check(op("cross_entropy", nil, K.tensor({ 0, nan, 1, 2 }, { 2, 2 }), lab({ 1, 1 })), { nan }, {})
          K.check(op("cross_entropy", nil, K.tensor({ inf, 0 }, { 1, 2 }), lab({ 2 })), { nan }, {})
          K.check(op("cross_entropy", nil, K.tensor({ -inf, 0 }, { 1, 2 }), lab({ 2 })), { 0 }, {})
          K.check(op("cross_entropy", nil, K.tensor({ -inf, 0 }, { 1, 2 }), lab({ 1 })), { inf }, {})
        end,
        ["empty batch is NaN"] = function()
          K.check(op("cross_entropy", nil, K.tensor({}, { 0, 3 }), K.tensor({}, { 0 })), { nan }, {})
        end,
        ["label out of range is an error naming the row"] = function()
          local x = K.rand({ 4, 10 })
          raises("cross_entropy: label 11 is out of range 1..10 (row 3)", op, "cross_entropy", nil, x, lab({ 1, 2, 11, 1 }))
          raises("cross_entropy: label 0 is out of range 1..10 (row 1)", op, "cross_entropy", nil, x, lab({ 0, 2, 1, 1 }))
          raises("cross_entropy: label 2.5 is not a whole number in 1..10 (row 2)", op, "cross_entropy", nil, x,
                 lab({ 1, 2.5, 1, 1 }))
        end,
        ["shape errors"] = function()
          raises("cross_entropy: the logits must be 2-D (N x C), got 2x3x4", op, "cross_entropy", nil,
                 K.rand({ 2, 3, 4 }), lab({ 1, 1 }))
          raises("cross_entropy: the labels must be 1-D with one label per row of the logits (4x3), got 3", op,
                 "cross_entropy", nil, K.rand({ 4, 3 }), lab({ 1, 1, 1 }))
          raises("one label per row", op, "cross_entropy", nil, K.rand({ 2, 3 }), K.tensor({ 1, 1 }, { 2, 1 }))
        end,
      },
      grad = {
        ["5x4 logits"] = function()
          kit.gradcheck(function(x, l) return op("cross_entropy", nil, x, l) end,
            { { shape = { 5, 4 }, lo = -2, hi = 2 }, { shape = { 5 }, values = labels_for(5, 4), grad = false } })
        end,
        ["1x3 logits"] = function()
          kit.gradcheck(function(x, l) return op("cross_entropy", nil, x, l) end,
            { { shape = { 1, 3 } }, { shape = { 1 }, values = { 2 }, grad = false } })
        end,
      },
    },

    cross_entropy_backward = {
      nodiff = "internal backward of cross_entropy",
      forward = {
        ["(softmax - onehot) * g / N"] = function()
          local x, v = K.rand({ 3, 4 }, -2, 2)
          local l = labels_for(3, 4)
          K.check(op("cross_entropy_backward", nil, x, lab(l), K.tensor({ 0.5 }, {})), ref_ce_backward(v, l, 4, 0.5), { 3, 4 })
        end,
        ["non-contiguous logits, large values"] = function()
          local x, v = K.noncontig({ 2, 3 }, 100, 120)
          local l = { 3, 1 }
          K.check(op("cross_entropy_backward", nil, x, lab(l), K.tensor({ -2 }, {})), ref_ce_backward(v, l, 3, -2), { 2, 3 })
        end,
        ["-inf logits (masked classes) and logits far below the max get 0, not NaN"] = function()
          local v = { 1, -inf, 2, 0.5, 3, 1e30, -1e30, 0, -inf, 0, -200, 4 }
          local l = { 1, 2, 4 }
          K.check(op("cross_entropy_backward", nil, K.tensor(v, { 3, 4 }), lab(l), K.tensor({ 1 }, {})),
                  ref_ce_backward(v, l, 4, 1), { 3, 4 })
        end,
        ["vocabulary-wide rows (the vector loop and its tail), labels at the ends"] = function()
          local x, v = K.rand({ 3, 1037 }, -8, 8)
          local l = { 1, 1037, 500 }
          K.check(op("cross_entropy_backward", nil, x, lab(l), K.tensor({ 0.75 }, {})), ref_ce_backward(v, l, 1037, 0.75),
                  { 3, 1037 })
          K.check(op("cross_entropy", nil, x, lab(l)), { ref_ce(v, l, 1037) }, {})
        end,
        ["errors"] = function()
          raises("cross_entropy_backward: the loss gradient must have one element", op, "cross_entropy_backward", nil,
                 K.rand({ 2, 3 }), lab({ 1, 1 }), (K.rand({ 2 })))
          raises("cross_entropy_backward: label 4 is out of range 1..3 (row 2)", op, "cross_entropy_backward", nil,
                 K.rand({ 2, 3 }), lab({ 1, 4 }), K.tensor({ 1 }, {}))
        end,
      },
    },

    mse = {
      forward = {
        ["3x5"] = function()
          local a, va = K.rand({ 3, 5 })
          local b, vb = K.rand({ 3, 5 })
          K.check(op("mse", nil, a, b), { ref_mse(va, vb) }, {})
        end,
        ["non-contiguous, 0-d, size-1 dims"] = function()
          local a, va = K.noncontig({ 4, 3 })
          local b, vb = K.rand({ 4, 3 })
          K.check(op("mse", nil, a, b), { ref_mse(va, vb) }, {})
          K.check(op("mse", nil, K.tensor({ 3 }, {}), K.tensor({ 1 }, {})), { 4 }, {})
          local c, vc = K.rand({ 1, 7, 1 })
          local d, vd = K.rand({ 1, 7, 1 })
          K.check(op("mse", nil, c, d), { ref_mse(vc, vd) }, {})
        end,
        ["empty is NaN; inf and NaN propagate"] = function()
          K.check(op("mse", nil, K.tensor({}, { 0, 2 }), K.tensor({}, { 0, 2 })), { nan }, {})
          K.check(op("mse", nil, K.tensor({ inf, 1 }, { 2 }), K.tensor({ 0, 1 }, { 2 })), { inf }, {})
          K.check(op("mse", nil, K.tensor({ nan, 1 }, { 2 }), K.tensor({ 0, 1 }, { 2 })), { nan }, {})
        end,
        ["shape mismatch is an error (no broadcasting)"] = function()
          raises("mse: the prediction is 2x3 but the target is 3 (shapes must match; no broadcasting)", op, "mse", nil,
                 K.rand({ 2, 3 }), (K.rand({ 3 })))
        end,
      },
      grad = {
        ["both inputs, 3x4"] = function()
          kit.gradcheck(function(a, b) return op("mse", nil, a, b) end, { { shape = { 3, 4 } }, { shape = { 3, 4 } } })
        end,
        ["prediction only, 5"] = function()
          kit.gradcheck(function(a, b) return op("mse", nil, a, b) end, { { shape = { 5 } }, { shape = { 5 }, grad = false } })
        end,
        ["target only, 2x1"] = function()
          kit.gradcheck(function(a, b) return op("mse", nil, a, b) end, { { shape = { 2, 1 }, grad = false }, { shape = { 2, 1 } } })
        end,
      },
    },
  }
end
