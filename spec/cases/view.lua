-- Spec cases for the view ops (see spec/ops_spec.lua for the contract).
local remat = require "remat"
local kit = require "support.kit"
local C = remat._C

return function(K)
  local function op(name, attrs, ...) return C.op(C.ops[name], attrs, ...) end
  return {
    view = {
      forward = {
        ["2x3 as 3x2 keeps row-major order"] = function()
          local t, v = K.rand({ 2, 3 })
          K.check(op("view", { shape = { 3, 2 } }, t), v, { 3, 2 })
        end,
        ["to 0-d and from empty"] = function()
          local t, v = K.rand({ 1, 1 })
          K.check(op("view", { shape = {} }, t), v, {})
          local e = K.tensor({}, { 0, 3 })
          K.check(op("view", { shape = { 3, 0 } }, e), {}, { 3, 0 })
        end,
        ["non-contiguous input is an error"] = function()
          local t = K.noncontig({ 3, 4 })
          local ok, err = pcall(op, "view", { shape = { 12 } }, t)
          assert(not ok and err:find("not contiguous"), err)
        end,
        ["element count mismatch is an error"] = function()
          local t = K.rand({ 2, 3 })
          local ok, err = pcall(op, "view", { shape = { 4 } }, t)
          assert(not ok and err:find("cannot view"), err)
        end,
      },
      grad = {
        ["2x3x1 as 6"] = function()
          kit.gradcheck(function(x) return op("view", { shape = { 6 } }, x) end, { { shape = { 2, 3, 1 } } })
        end,
      },
    },
    transpose = {
      forward = {
        ["3x5 swap"] = function()
          local t, v = K.rand({ 3, 5 })
          local e = {}
          for i = 0, 2 do for j = 0, 4 do e[j * 3 + i + 1] = v[i * 5 + j + 1] end end
          K.check(op("transpose", { dim0 = 0, dim1 = 1 }, t), e, { 5, 3 })
        end,
        ["same dim is identity; size-1 dims"] = function()
          local t, v = K.rand({ 1, 4, 1 })
          K.check(op("transpose", { dim0 = 1, dim1 = 1 }, t), v, { 1, 4, 1 })
          K.check(op("transpose", { dim0 = 0, dim1 = 2 }, t), v, { 1, 4, 1 })
        end,
      },
      grad = {
        ["2x3x4 dims 1 and 3"] = function()
          kit.gradcheck(function(x) return op("copy", nil, op("transpose", { dim0 = 0, dim1 = 2 }, x)) end, { { shape = { 2, 3, 4 } } })
        end,
      },
    },
    narrow = {
      forward = {
        ["rows 2..3 of 4x3"] = function()
          local t, v = K.rand({ 4, 3 })
          local e = {}
          for k = 4, 9 do e[#e + 1] = v[k] end
          K.check(op("narrow", { dim = 0, start = 1, length = 2 }, t), e, { 2, 3 })
        end,
        ["columns of a non-contiguous view"] = function()
          local t, v = K.noncontig({ 3, 4 })
          local e = {}
          for i = 0, 2 do for j = 1, 2 do e[#e + 1] = v[i * 4 + j + 1] end end
          K.check(op("narrow", { dim = 1, start = 1, length = 2 }, t), e, { 3, 2 })
        end,
        ["out of range is an error"] = function()
          local ok, err = pcall(op, "narrow", { dim = 0, start = 3, length = 2 }, (K.rand({ 4 })))
          assert(not ok and err:find("out of range"), err)
        end,
      },
      grad = {
        ["middle of 5x2"] = function()
          kit.gradcheck(function(x) return op("narrow", { dim = 0, start = 1, length = 3 }, x) end, { { shape = { 5, 2 } } })
        end,
      },
    },
    expand = {
      forward = {
        ["3x1 to 2x3x4"] = function()
          local t, v = K.rand({ 3, 1 })
          local e = {}
          for _ = 1, 2 do for i = 1, 3 do for _ = 1, 4 do e[#e + 1] = v[i] end end end
          K.check(op("copy", nil, op("expand", { shape = { 2, 3, 4 } }, t)), e, { 2, 3, 4 })
        end,
        ["incompatible size is an error"] = function()
          local ok, err = pcall(op, "expand", { shape = { 4, 2 } }, (K.rand({ 3, 1 })))
          assert(not ok and err:find("cannot expand"), err)
        end,
      },
      grad = {
        ["1x3 to 4x3"] = function()
          kit.gradcheck(function(x) return op("expand", { shape = { 4, 3 } }, x) end, { { shape = { 1, 3 } } })
        end,
      },
    },
    select = {
      forward = {
        ["row 2 of 3x4"] = function()
          local t, v = K.rand({ 3, 4 })
          K.check(op("select", { dim = 0, index = 1 }, t), { v[5], v[6], v[7], v[8] }, { 4 })
        end,
        ["column of 2x3"] = function()
          local t, v = K.rand({ 2, 3 })
          K.check(op("select", { dim = 1, index = 2 }, t), { v[3], v[6] }, { 2 })
        end,
        ["index out of range is an error"] = function()
          local ok, err = pcall(op, "select", { dim = 0, index = 3 }, (K.rand({ 3 })))
          assert(not ok and err:find("out of range"), err)
        end,
      },
      grad = {
        ["slice 1 of 3x2x2 along dim 2"] = function()
          kit.gradcheck(function(x) return op("select", { dim = 1, index = 1 }, x) end, { { shape = { 3, 2, 2 } } })
        end,
      },
    },
    permute = {
      forward = {
        ["2x3x4 as (3, 1, 2): element (i, j, k) of the output is x[j][k][i]"] = function()
          local t, v = K.rand_stored({ 2, 3, 4 })
          local e = {}
          for a = 0, 3 do for b = 0, 1 do for c = 0, 2 do e[#e + 1] = v[b * 12 + c * 4 + a + 1] end end end
          K.check(op("copy", nil, op("permute", { dims = { 2, 0, 1 } }, t)), e, { 4, 2, 3 })
        end,
        ["of a non-contiguous view; identity; size-1 and 0-d"] = function()
          local t, v = K.noncontig_stored({ 3, 4 })
          local e = {}
          for j = 0, 3 do for i = 0, 2 do e[#e + 1] = v[i * 4 + j + 1] end end
          K.check(op("copy", nil, op("permute", { dims = { 1, 0 } }, t)), e, { 4, 3 })
          K.check(op("copy", nil, op("permute", { dims = { 0, 1 } }, t)), v, { 3, 4 })
          local u, uv = K.rand_stored({ 1, 5, 1 })
          K.check(op("copy", nil, op("permute", { dims = { 2, 1, 0 } }, u)), uv, { 1, 5, 1 })
          local z, zv = K.rand_stored({})
          K.check(op("permute", { dims = {} }, z), zv, {})
        end,
        ["not a permutation is an error"] = function()
          local t = K.rand({ 2, 3 })
          kit.raises("permute: the dimensions are not a permutation of 1..2", op, "permute", { dims = { 0, 0 } }, t)
          kit.raises("permute: 3 dimensions given for a 2-d tensor", op, "permute", { dims = { 0, 1, 2 } }, t)
        end,
      },
      grad = {
        ["2x3x4 as (3, 1, 2)"] = function()
          kit.gradcheck(function(x) return op("permute", { dims = { 2, 0, 1 } }, x) end, { { shape = { 2, 3, 4 } } })
        end,
      },
    },
    squeeze = {
      forward = {
        ["every size-1 dim, one dim, a dim of another size stays"] = function()
          local t, v = K.rand_stored({ 1, 3, 1, 2 })
          K.check(op("squeeze", { dim = math.mininteger }, t), v, { 3, 2 })
          K.check(op("squeeze", { dim = 2 }, t), v, { 1, 3, 2 })
          K.check(op("squeeze", { dim = -4 }, t), v, { 3, 1, 2 })
          K.check(op("squeeze", { dim = 1 }, t), v, { 1, 3, 1, 2 })
          local one, ov = K.rand_stored({ 1, 1 })
          K.check(op("squeeze", { dim = math.mininteger }, one), ov, {})
        end,
        ["non-contiguous input keeps its strides"] = function()
          local t, v = K.noncontig_stored({ 4, 1, 3 })
          K.check(op("copy", nil, op("squeeze", { dim = 1 }, t)), v, { 4, 3 })
        end,
        ["out of range is an error"] = function()
          kit.raises("squeeze: dimension 3 is out of range", op, "squeeze", { dim = 2 }, (K.rand({ 2, 1 })))
        end,
      },
      grad = {
        ["1x3x1x2, every dim"] = function()
          kit.gradcheck(function(x) return op("squeeze", { dim = math.mininteger }, x) end, { { shape = { 1, 3, 1, 2 } } })
        end,
      },
    },
    unsqueeze = {
      forward = {
        ["front, middle, end and from the end"] = function()
          local t, v = K.rand_stored({ 2, 3 })
          K.check(op("unsqueeze", { dim = 0 }, t), v, { 1, 2, 3 })
          K.check(op("unsqueeze", { dim = 1 }, t), v, { 2, 1, 3 })
          K.check(op("unsqueeze", { dim = 2 }, t), v, { 2, 3, 1 })
          K.check(op("unsqueeze", { dim = -1 }, t), v, { 2, 3, 1 })
          local z, zv = K.rand_stored({})
          K.check(op("unsqueeze", { dim = 0 }, z), zv, { 1 })
        end,
        ["non-contiguous input, then expanded along the new dim"] = function()
          local t, v = K.noncontig_stored({ 3, 2 })
          local u = op("unsqueeze", { dim = 1 }, t)
          local e = {}
          for i = 0, 2 do for _ = 1, 4 do for j = 0, 1 do e[#e + 1] = v[i * 2 + j + 1] end end end
          K.check(op("copy", nil, op("expand", { shape = { 3, 4, 2 } }, u)), e, { 3, 4, 2 })
        end,
        ["out of range is an error"] = function()
          kit.raises("unsqueeze: dimension 4 is out of range for a 2-d tensor", op, "unsqueeze", { dim = 3 }, (K.rand({ 2, 1 })))
        end,
      },
      grad = {
        ["2x3 at dim 2"] = function()
          kit.gradcheck(function(x) return op("unsqueeze", { dim = 1 }, x) end, { { shape = { 2, 3 } } })
        end,
      },
    },
  }
end
