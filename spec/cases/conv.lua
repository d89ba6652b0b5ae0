-- Spec cases for unfold (im2col), fold (col2im) and max pooling (see spec/ops_spec.lua for the
-- contract). References are naive Lua loops over the stored values.
local remat = require "remat"
local kit = require "support.kit"
local C = remat._C

local inf = math.huge

-- geometry { kh, kw, sh, sw, ph, pw, dh, dw }
local function out_size(n, k, s, p, d) return (n + 2 * p - d * (k - 1) - 1) // s + 1 end

local function unfold_ref(v, B, Cc, H, W, g, pad)
  local kh, kw, sh, sw, ph, pw, dh, dw = table.unpack(g)
  local Ho, Wo = out_size(H, kh, sh, ph, dh), out_size(W, kw, sw, pw, dw)
  local out = {}
  for b = 0, B - 1 do
    for c = 0, Cc - 1 do
      for i = 0, kh - 1 do
        for j = 0, kw - 1 do
          for oh = 0, Ho - 1 do
            for ow = 0, Wo - 1 do
              local h, w = oh * sh - ph + i * dh, ow * sw - pw + j * dw
              local val = pad
              if h >= 0 and h < H and w >= 0 and w < W then val = v[((b * Cc + c) * H + h) * W + w + 1] end
              out[#out + 1] = val
            end
          end
        end
      end
    end
  end
  return out, { B, Cc * kh * kw, Ho * Wo }
end

-- The adjoint: scatter-add every column entry back onto the pixel it read.
local function fold_ref(cv, B, Cc, H, W, g)
  local kh, kw, sh, sw, ph, pw, dh, dw = table.unpack(g)
  local Ho, Wo = out_size(H, kh, sh, ph, dh), out_size(W, kw, sw, pw, dw)
  local out = {}
  for k = 1, B * Cc * H * W do out[k] = 0 end
  local pos = 0
  for b = 0, B - 1 do
    for c = 0, Cc - 1 do
      for i = 0, kh - 1 do
        for j = 0, kw - 1 do
          for oh = 0, Ho - 1 do
            for ow = 0, Wo - 1 do
              pos = pos + 1
              local h, w = oh * sh - ph + i * dh, ow * sw - pw + j * dw
              if h >= 0 and h < H and w >= 0 and w < W then
                local k = ((b * Cc + c) * H + h) * W + w + 1
                out[k] = out[k] + cv[pos]
              end
            end
          end
        end
      end
    end
  end
  return out
end

local GEOS = {
  { name = "3x3, stride 1, no padding", g = { 3, 3, 1, 1, 0, 0, 1, 1 } },
  { name = "3x3, stride 2, padding 1", g = { 3, 3, 2, 2, 1, 1, 1, 1 } },
  { name = "2x3 kernel, strides 2x1, padding 0x2, dilation 2x1", g = { 2, 3, 2, 1, 0, 2, 2, 1 } },
  { name = "1x1", g = { 1, 1, 1, 1, 0, 0, 1, 1 } },
  { name = "5x5 over a 5x7 image with dilation 1x2", g = { 5, 2, 1, 3, 1, 0, 1, 2 } },
}

-- Max pooling: per window the first maximum in window order (padding reads -inf, the
-- first NaN wins); returns the values and, per output, the flat input index (1-based)
-- it came from (false: padding).
local function maxpool_ref(v, B, Cc, H, W, g)
  local kh, kw, sh, sw, ph, pw, dh, dw = table.unpack(g)
  local Ho, Wo = out_size(H, kh, sh, ph, dh), out_size(W, kw, sw, pw, dw)
  local out, from = {}, {}
  for b = 0, B - 1 do
    for c = 0, Cc - 1 do
      for oh = 0, Ho - 1 do
        for ow = 0, Wo - 1 do
          local best, at
          for i = 0, kh - 1 do
            for j = 0, kw - 1 do
              local h, w = oh * sh - ph + i * dh, ow * sw - pw + j * dw
              local x, k = -inf, false
              if h >= 0 and h < H and w >= 0 and w < W then
                k = ((b * Cc + c) * H + h) * W + w + 1
                x = v[k]
              end
              if best == nil or (best == best and (x > best or x ~= x)) then best, at = x, k end
            end
          end
          out[#out + 1], from[#from + 1] = best, at
        end
      end
    end
  end
  return out, from, { B, Cc, Ho, Wo }
end

-- Its adjoint: each output gradient added to the input it came from, in output order.
local function maxpool_backward_ref(v, gy, B, Cc, H, W, g)
  local _, from = maxpool_ref(v, B, Cc, H, W, g)
  local gx = {}
  for k = 1, B * Cc * H * W do gx[k] = 0 end
  for o, k in ipairs(from) do
    if k then gx[k] = gx[k] + gy[o] end
  end
  return gx
end

return function(K)
  local function op(name, attrs, ...) return C.op(C.ops[name], attrs, ...) end
  -- unfold/fold attributes from a geometry list { kh, kw, sh, sw, ph, pw, dh, dw }
  local function window(g, more)
    local a = { kh = g[1], kw = g[2], stride_h = g[3], stride_w = g[4], pad_h = g[5], pad_w = g[6],
                dilation_h = g[7], dilation_w = g[8] }
    for k, v in pairs(more or {}) do a[k] = v end
    return a
  end
  local function host(t) return C.flat(K.device == "cpu" and t or C.to_device(t, "cpu")) end

  local function check_unfold(x, shape, g, pad)
    local e, oshape = unfold_ref(host(x), shape[1], shape[2], shape[3], shape[4], g, pad or 0)
    K.check(op("unfold", window(g, { pad_value = pad or 0 }), x), e, oshape)
  end

  local function check_fold(B, Cc, H, W, g)
    local kh, kw, sh, sw, ph, pw, dh, dw = table.unpack(g)
    local L = out_size(H, kh, sh, ph, dh) * out_size(W, kw, sw, pw, dw)
    local c = K.rand_stored({ B, Cc * kh * kw, L })
    K.check(op("fold", window(g, { height = H, width = W }), c), fold_ref(host(c), B, Cc, H, W, g), { B, Cc, H, W }, K.dtype == "float32" and 1e-5 or nil)
  end

  local cases = {
    unfold = {
      forward = {
        ["odd sizes and every geometry"] = function()
          local shape = { 2, 3, 5, 7 }
          local x = K.rand_stored(shape)
          for _, G in ipairs(GEOS) do check_unfold(x, shape, G.g) end
        end,
        ["size-1 batch, channel and image"] = function()
          check_unfold(K.rand_stored({ 1, 1, 1, 1 }), { 1, 1, 1, 1 }, { 1, 1, 1, 1, 0, 0, 1, 1 })
          check_unfold(K.rand_stored({ 1, 1, 1, 1 }), { 1, 1, 1, 1 }, { 3, 3, 1, 1, 1, 1, 1, 1 })
        end,
        ["non-contiguous input"] = function()
          local base = K.rand({ 2, 3, 7, 5 })
          local x = op("transpose", { dim0 = 2, dim1 = 3 }, base)
          check_unfold(x, { 2, 3, 5, 7 }, GEOS[2].g)
        end,
        ["padding value -inf (max pooling) and NaN inputs"] = function()
          local v = kit.values({ 1, 2, 3, 3 })
          v[5] = 0 / 0
          local x = K.tensor(v, { 1, 2, 3, 3 })
          check_unfold(x, { 1, 2, 3, 3 }, { 2, 2, 2, 2, 1, 1, 1, 1 }, -inf)
        end,
        ["bad geometry and shapes are errors"] = function()
          local x = K.rand({ 1, 1, 3, 3 })
          kit.raises("unfold: a 4x4 window", op, "unfold", window({ 4, 4, 1, 1, 0, 0, 1, 1 }), x)
          kit.raises("must be >= 1", op, "unfold", window({ 2, 2, 0, 1, 0, 0, 1, 1 }), x)
          kit.raises("unfold: expected a 4-d input", op, "unfold", window({ 1, 1, 1, 1, 0, 0, 1, 1 }), (K.rand({ 3, 3 })))
        end,
      },
      grad = {
        ["3x3 stride 2 padding 1, and dilated"] = function()
          kit.gradcheck(function(x) return op("unfold", window(GEOS[2].g), x) end, { { shape = { 2, 2, 5, 4 } } })
          kit.gradcheck(function(x) return op("unfold", window(GEOS[3].g), x) end, { { shape = { 1, 2, 5, 6 } } })
        end,
      },
    },
    fold = {
      nodiff = "internal backward helper (unfold's adjoint); its own gradient is never needed",
      forward = {
        ["adjoint of unfold for every geometry"] = function()
          for _, G in ipairs(GEOS) do check_fold(2, 3, 5, 7, G.g) end
        end,
        ["size-1 image with padding"] = function() check_fold(1, 1, 1, 1, { 3, 3, 1, 1, 1, 1, 1, 1 }) end,
        ["mismatched columns are an error"] = function()
          kit.raises("fold: columns of size", op, "fold", window({ 3, 3, 1, 1, 0, 0, 1, 1 }, { height = 5, width = 5 }), (K.rand({ 1, 9, 10 })))
        end,
      },
    },
    maxpool2d = {
      forward = {
        ["odd sizes and every geometry, overlapping windows included"] = function()
          local shape = { 2, 3, 5, 7 }
          local x, v = K.rand_stored(shape)
          for _, G in ipairs(GEOS) do
            local e, _, oshape = maxpool_ref(v, 2, 3, 5, 7, G.g)
            K.check(op("maxpool2d", window(G.g), x), e, oshape)
          end
        end,
        ["size-1 batch, channel and image, with padding"] = function()
          local x, v = K.rand_stored({ 1, 1, 1, 1 })
          local e, _, oshape = maxpool_ref(v, 1, 1, 1, 1, { 3, 3, 1, 1, 1, 1, 1, 1 })
          K.check(op("maxpool2d", window({ 3, 3, 1, 1, 1, 1, 1, 1 }), x), e, oshape)
        end,
        ["non-contiguous input"] = function()
          local base = K.rand({ 2, 3, 7, 5 })
          local x = op("transpose", { dim0 = 2, dim1 = 3 }, base)
          local e, _, oshape = maxpool_ref(host(x), 2, 3, 5, 7, GEOS[2].g)
          K.check(op("maxpool2d", window(GEOS[2].g), x), e, oshape)
        end,
        ["NaN wins, -inf inputs, ties pick the first"] = function()
          local v = { 1, 0 / 0, 3, 3, -inf, -inf, -inf, -inf, 2, 2, 2, 2, 5, 0 / 0, 0 / 0, 7 }
          local x = K.tensor(v, { 1, 4, 2, 2 })
          local e, _, oshape = maxpool_ref(v, 1, 4, 2, 2, { 2, 2, 2, 2, 0, 0, 1, 1 })
          K.check(op("maxpool2d", window({ 2, 2, 2, 2, 0, 0, 1, 1 }), x), e, oshape)
          local gy = K.tensor({ 1, 2, 3, 4 }, { 1, 4, 1, 1 })
          -- the gradient goes to the first NaN, the first -inf and the first of the ties
          K.check(op("maxpool2d_backward", window({ 2, 2, 2, 2, 0, 0, 1, 1 }), x, gy),
                  { 0, 1, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 0, 4, 0, 0 }, { 1, 4, 2, 2 })
        end,
        ["bad geometry and shapes are errors"] = function()
          local x = K.rand({ 1, 1, 3, 3 })
          kit.raises("maxpool2d: a 4x4 window", op, "maxpool2d", window({ 4, 4, 1, 1, 0, 0, 1, 1 }), x)
          kit.raises("maxpool2d: expected a 4-d input", op, "maxpool2d", window({ 2, 2, 2, 2, 0, 0, 1, 1 }), (K.rand({ 3, 3 })))
        end,
      },
      grad = {
        ["non-overlapping, overlapping with padding, and dilated windows"] = function()
          kit.gradcheck(function(x) return op("maxpool2d", window({ 2, 2, 2, 2, 0, 0, 1, 1 }), x) end, { { shape = { 2, 2, 4, 6 } } })
          kit.gradcheck(function(x) return op("maxpool2d", window(GEOS[2].g), x) end, { { shape = { 2, 2, 5, 4 } } })
          kit.gradcheck(function(x) return op("maxpool2d", window(GEOS[3].g), x) end, { { shape = { 1, 2, 5, 6 } } })
        end,
      },
    },
    maxpool2d_backward = {
      nodiff = "internal backward helper (maxpool2d's adjoint); its own gradient is never needed",
      forward = {
        ["the adjoint of maxpool2d for every geometry"] = function()
          for _, G in ipairs(GEOS) do
            local x, v = K.rand_stored({ 2, 3, 5, 7 })
            local _, _, oshape = maxpool_ref(v, 2, 3, 5, 7, G.g)
            local gy, gv = K.rand_stored(oshape)
            K.check(op("maxpool2d_backward", window(G.g), x, gy), maxpool_backward_ref(v, gv, 2, 3, 5, 7, G.g),
                    { 2, 3, 5, 7 }, K.dtype == "float32" and 1e-5 or nil)
          end
        end,
        ["a gradient of the wrong shape is an error"] = function()
          local x = K.rand({ 1, 1, 4, 4 })
          kit.raises("maxpool2d_backward: the gradient", op, "maxpool2d_backward", window({ 2, 2, 2, 2, 0, 0, 1, 1 }), x, (K.rand({ 1, 1, 3, 2 })))
        end,
      },
    },
  }
  return cases
end
