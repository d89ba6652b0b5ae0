-- Spec cases for batchnorm (training mode: per-channel statistics over every dim but
-- dim 2) and its internal backward helper (see spec/ops_spec.lua for the contract).
-- Oracles: loops over flat row-major values, channel by channel.
local remat = require "remat"
local kit = require "support.kit"
local C = remat._C

local nan = 0 / 0

-- N, C, S (S: the product of the dims after the channel) and the flat index (1-based)
-- of (n, c, s), all 0-based.
local function dims(shape)
  local S = 1
  for d = 3, #shape do S = S * shape[d] end
  return shape[1], shape[2], S
end
local function at(Cc, S, n, c, s) return (n * Cc + c) * S + s + 1 end

-- y, and per-channel mean and biased variance.
local function bn_ref(xv, shape, wv, bv, eps)
  local N, Cc, S = dims(shape)
  local y, mean, var = {}, {}, {}
  for c = 0, Cc - 1 do
    local m, v = 0, 0
    for n = 0, N - 1 do for s = 0, S - 1 do m = m + xv[at(Cc, S, n, c, s)] end end
    m = m / (N * S)
    for n = 0, N - 1 do for s = 0, S - 1 do local d = xv[at(Cc, S, n, c, s)] - m; v = v + d * d end end
    v = v / (N * S)
    local rstd = 1 / math.sqrt(v + eps)
    for n = 0, N - 1 do
      for s = 0, S - 1 do
        local k = at(Cc, S, n, c, s)
        y[k] = (xv[k] - m) * rstd * (wv and wv[c + 1] or 1) + (bv and bv[c + 1] or 0)
      end
    end
    mean[c + 1], var[c + 1] = m, v
  end
  return y, mean, var
end

-- gx, gw, gb from the stored mean and variance.
local function bn_bw_ref(xv, shape, mean, var, gv, wv, eps)
  local N, Cc, S = dims(shape)
  local M = N * S
  local gx, gw, gb = {}, {}, {}
  for c = 0, Cc - 1 do
    local rstd = 1 / math.sqrt(var[c + 1] + eps)
    local sa, sb = 0, 0
    for n = 0, N - 1 do
      for s = 0, S - 1 do
        local k = at(Cc, S, n, c, s)
        sa = sa + gv[k]
        sb = sb + gv[k] * (xv[k] - mean[c + 1]) * rstd
      end
    end
    gw[c + 1], gb[c + 1] = sb, sa
    local w = wv and wv[c + 1] or 1
    for n = 0, N - 1 do
      for s = 0, S - 1 do
        local k = at(Cc, S, n, c, s)
        gx[k] = w * rstd * (gv[k] - sa / M - (xv[k] - mean[c + 1]) * rstd * sb / M)
      end
    end
  end
  return gx, gw, gb
end

return function(K)
  local function op(name, attrs, ...) return C.op(C.ops[name], attrs, ...) end
  local tol = K.dtype == "float32" and 1e-4 or 1e-9
  local rand, noncontig = K.rand_stored, K.noncontig_stored
  local raises = kit.raises

  local function check(x, xv, shape, eps, w, wv, b, bv)
    local args = { x }
    if w then args[#args + 1] = w end
    if b then args[#args + 1] = b end
    local y, mean, var = op("batchnorm", { eps = eps }, table.unpack(args))
    local ey, em, ev = bn_ref(xv, shape, wv, bv, eps)
    K.check(y, ey, shape, tol, "y")
    K.check(mean, em, { shape[2] }, tol, "mean")
    K.check(var, ev, { shape[2] }, tol, "var")
  end

  local function bw(shape, affine, mask)
    local x, xv = rand(shape, -2, 2)
    local w, wv
    if affine then w, wv = rand({ shape[2] }, 0.5, 1.5) end
    local g, gv = rand(shape)
    local _, mean, var = bn_ref(xv, shape, nil, nil, 1e-5)
    local m, v = K.tensor(mean, { shape[2] }), K.tensor(var, { shape[2] })
    local egx, egw, egb = bn_bw_ref(xv, shape, C.flat(m), C.flat(v), gv, wv, 1e-5)
    local args = { x, m, v, g }
    if w then args[5] = w end
    local gx, gw, gb = op("batchnorm_backward", { eps = 1e-5, want = mask }, table.unpack(args))
    local zero = {}
    for k = 1, #egx do zero[k] = 0 end
    K.check(gx, mask & 1 ~= 0 and egx or zero, shape, tol, "gx")
    K.check(gw, egw, { shape[2] }, tol, "gw")
    K.check(gb, egb, { shape[2] }, tol, "gb")
  end

  local gc = kit.gradcheck
  local function bn(...) return (op("batchnorm", { eps = 1e-5 }, ...)) end

  return {
    batchnorm = {
      forward = {
        ["(N, C), (N, C, L) and (N, C, H, W) with odd sizes, affine or not"] = function()
          local x, xv = rand({ 5, 3 }, -2, 3)
          check(x, xv, { 5, 3 }, 1e-5)
          local x3, xv3 = rand({ 3, 4, 5 }, -2, 3)
          local w, wv = rand({ 4 }, 0.5, 1.5)
          local b, bv = rand({ 4 })
          check(x3, xv3, { 3, 4, 5 }, 1e-5, w, wv, b, bv)
          local x4, xv4 = rand({ 2, 3, 5, 7 }, -2, 3)
          local w3, wv3 = rand({ 3 }, 0.5, 1.5)
          local b3, bv3 = rand({ 3 })
          check(x4, xv4, { 2, 3, 5, 7 }, 1e-5, w3, wv3, b3, bv3)
        end,
        ["size-1 dims and a large eps"] = function()
          local x, xv = rand({ 2, 1, 1, 3 })
          check(x, xv, { 2, 1, 1, 3 }, 0.5)
          local y, yv = rand({ 1, 2, 3 })
          check(y, yv, { 1, 2, 3 }, 1e-5)
        end,
        ["non-contiguous input"] = function()
          local x, xv = noncontig({ 6, 4 })
          check(x, xv, { 6, 4 }, 1e-5)
        end,
        ["NaN stays in its channel"] = function()
          local xv = { 1, nan, 3, 4, 5, 6, 7, 8 }
          check(K.tensor(xv, { 4, 2 }), xv, { 4, 2 }, 1e-5)
        end,
        ["large (parallel over channels)"] = function()
          local x, xv = rand({ 16, 9, 11, 13 }, -2, 2)
          local w, wv = rand({ 9 }, 0.5, 1.5)
          local b, bv = rand({ 9 })
          check(x, xv, { 16, 9, 11, 13 }, 1e-5, w, wv, b, bv)
        end,
        ["errors: parameter shape, 1-d input, dtype mismatch, eps"] = function()
          raises("weight", op, "batchnorm", { eps = 1e-5 }, (rand({ 2, 3 })), (rand({ 4 })))
          raises("at least 2 dims", op, "batchnorm", { eps = 1e-5 }, (rand({ 6 })))
          raises("float", op, "batchnorm", { eps = 1e-5 }, C.from_table({ 1, 2 }, { 1, 2 }, "float32"),
                 C.from_table({ 1, 2 }, { 2 }, "float64"))
          raises("eps must be > 0", op, "batchnorm", { eps = 0 }, (rand({ 2, 3 })))
        end,
      },
      grad = {
        ["without affine, (4, 3)"] = function() gc(bn, { { shape = { 4, 3 } } }) end,
        ["affine (x, w, b), (3, 2, 2, 3)"] = function()
          gc(bn, { { shape = { 3, 2, 2, 3 } }, { shape = { 2 }, lo = 0.5, hi = 1.5 }, { shape = { 2 } } })
        end,
        ["x without grad, (2, 3, 4)"] = function()
          gc(bn, { { shape = { 2, 3, 4 }, grad = false }, { shape = { 3 } }, { shape = { 3 } } })
        end,
      },
    },
    batchnorm_backward = {
      nodiff = "internal backward helper of batchnorm; its own gradient is never taken (checked through the gradchecks of batchnorm)",
      forward = {
        ["all gradients, affine, (3, 5) and (2, 3, 2, 7)"] = function()
          bw({ 3, 5 }, true, 7)
          bw({ 2, 3, 2, 7 }, true, 7)
        end,
        ["no affine parameters; gx not asked (zeros)"] = function()
          bw({ 4, 3, 2 }, false, 1)
          bw({ 4, 3, 2 }, true, 6)
        end,
        ["statistics of the wrong shape are an error"] = function()
          local x, g, s = rand({ 3, 4 }), rand({ 3, 4 }), rand({ 3 })
          raises("statistic", op, "batchnorm_backward", { eps = 1e-5 }, x, s, s, g)
        end,
      },
    },
  }
end
