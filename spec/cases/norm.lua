-- Spec cases for layernorm and rmsnorm over the last dim, and their internal backward
-- helpers (see spec/ops_spec.lua for the contract). Oracles: per-row loops over flat
-- row-major values.
local remat = require "remat"
local kit = require "support.kit"
local C = remat._C

local nan = 0 / 0

-- Rows of x: R rows of C features.
local function rows(shape)
  local Cf = shape[#shape]
  local R = 1
  for i = 1, #shape - 1 do R = R * shape[i] end
  return R, Cf
end

-- layernorm (rms = false) or rmsnorm (rms = true): y, and per-row mean, rstd.
local function norm_ref(xv, shape, wv, bv, eps, rms)
  local R, Cf = rows(shape)
  local y, mu, rs = {}, {}, {}
  for r = 0, R - 1 do
    local m, v = 0, 0
    if not rms then
      for j = 1, Cf do m = m + xv[r * Cf + j] end
      m = m / Cf
    end
    for j = 1, Cf do local d = xv[r * Cf + j] - m; v = v + d * d end
    local rstd = 1 / math.sqrt(v / Cf + eps)
    for j = 1, Cf do
      local h = (xv[r * Cf + j] - m) * rstd
      y[r * Cf + j] = h * (wv and wv[j] or 1) + (bv and bv[j] or 0)
    end
    mu[r + 1], rs[r + 1] = m, rstd
  end
  return y, mu, rs
end

-- Gradients of the normalisation: gx, gw, gb (formulas written out per row).
local function norm_bw_ref(xv, shape, mu, rs, gv, wv, rms)
  local R, Cf = rows(shape)
  local gx, gw, gb = {}, {}, {}
  for j = 1, Cf do gw[j], gb[j] = 0, 0 end
  for r = 0, R - 1 do
    local m, rstd = rms and 0 or mu[r + 1], rs[r + 1]
    local sa, sb = 0, 0
    for j = 1, Cf do
      local gy = gv[r * Cf + j] * (wv and wv[j] or 1)
      local h = (xv[r * Cf + j] - m) * rstd
      sa, sb = sa + gy, sb + gy * h
      gw[j] = gw[j] + gv[r * Cf + j] * h
      gb[j] = gb[j] + gv[r * Cf + j]
    end
    for j = 1, Cf do
      local gy = gv[r * Cf + j] * (wv and wv[j] or 1)
      local h = (xv[r * Cf + j] - m) * rstd
      gx[r * Cf + j] = rstd * (gy - (rms and 0 or sa / Cf) - h * sb / Cf)
    end
  end
  return gx, gw, gb
end

return function(K)
  local function op(name, attrs, ...) return C.op(C.ops[name], attrs, ...) end
  local tol = K.dtype == "float32" and 1e-4 or 1e-9
  local rand, noncontig = K.rand_stored, K.noncontig_stored
  local raises = kit.raises
  local function leading(shape)
    local s = {}
    for i = 1, #shape - 1 do s[i] = shape[i] end
    return s
  end

  -- Runs name on x (and w, b when given) against the oracle.
  local function check(name, x, xv, shape, eps, w, wv, b, bv)
    local rms = name == "rmsnorm"
    local args = { x }
    if w then args[#args + 1] = w end
    if b then args[#args + 1] = b end
    local y = op(name, { eps = eps }, table.unpack(args))
    K.check(y, (norm_ref(xv, shape, wv, bv, eps, rms)), shape, tol, name)
  end

  local function forward_cases(name)
    local rms = name == "rmsnorm"
    local function params(Cf)
      local w, wv = rand({ Cf }, 0.5, 1.5)
      local b, bv
      if not rms then b, bv = rand({ Cf }) end
      return w, wv, b, bv
    end
    return {
      ["4x7 without affine parameters"] = function()
        local x, xv = rand({ 4, 7 }, -2, 3)
        check(name, x, xv, { 4, 7 }, 1e-5)
      end,
      ["2x3x5 with affine parameters (and weight only)"] = function()
        local x, xv = rand({ 2, 3, 5 }, -2, 3)
        local w, wv, b, bv = params(5)
        check(name, x, xv, { 2, 3, 5 }, 1e-5, w, wv, b, bv)
        check(name, x, xv, { 2, 3, 5 }, 1e-5, w, wv)
      end,
      ["1-D input, one feature, size-1 dims, large eps"] = function()
        local x, xv = rand({ 6 })
        check(name, x, xv, { 6 }, 1e-5)
        local o, ov = rand({ 3, 1 })
        local w, wv, b, bv = params(1)
        check(name, o, ov, { 3, 1 }, 1e-5, w, wv, b, bv)
        local u, uv = rand({ 1, 1, 4 })
        check(name, u, uv, { 1, 1, 4 }, 0.5)
      end,
      ["non-contiguous input and weight"] = function()
        local x, xv = noncontig({ 5, 6 })
        local w, wv = noncontig({ 6 })
        check(name, x, xv, { 5, 6 }, 1e-5, w, wv)
      end,
      ["empty rows"] = function()
        check(name, K.tensor({}, { 0, 4 }), {}, { 0, 4 }, 1e-5)
      end,
      ["NaN stays in its row"] = function()
        local xv = { 1, 2, nan, 4, 1, 2, 3, 5 }
        check(name, K.tensor(xv, { 2, 4 }), xv, { 2, 4 }, 1e-5)
      end,
      ["large (parallel over rows)"] = function()
        local x, xv = rand({ 300, 129 }, -2, 2)
        local w, wv, b, bv = params(129)
        check(name, x, xv, { 300, 129 }, 1e-5, w, wv, b, bv)
      end,
      ["errors: parameter shape, 0-d input, dtype mismatch"] = function()
        raises("weight has shape 4", op, name, { eps = 1e-5 }, (rand({ 2, 3 })), (rand({ 4 })))
        raises("at least 1 dimension", op, name, { eps = 1e-5 }, (rand({})))
        raises("float", op, name, { eps = 1e-5 }, C.from_table({ 1, 2 }, { 1, 2 }, "float32"), C.from_table({ 1, 2 }, { 2 }, "float64"))
        if not rms then
          raises("bias has shape 2", op, name, { eps = 1e-5 }, (rand({ 2, 3 })), (rand({ 3 })), (rand({ 2 })))
        end
      end,
    }
  end

  -- Calls the backward helper directly: (x, stats..., g[, w]) with the wanted mask.
  local function bw_cases(name)
    local rms = name == "rmsnorm_backward"
    local function run(shape, affine, mask)
      local x, xv = rand(shape, -2, 2)
      local Cf = shape[#shape]
      local w, wv
      if affine then w, wv = rand({ Cf }, 0.5, 1.5) end
      local g, gv = rand(shape)
      local _, mu, rs = norm_ref(xv, shape, nil, nil, 1e-5, rms)
      local ls = leading(shape)
      local args = { x }
      if not rms then args[#args + 1] = K.tensor(mu, ls) end
      args[#args + 1] = K.tensor(rs, ls)
      args[#args + 1] = g
      if w then args[#args + 1] = w end
      -- statistics go through the dtype too: use the stored ones in the oracle
      local rsv = C.flat(args[rms and 2 or 3])
      local muv = rms and mu or C.flat(args[2])
      local egx, egw, egb = norm_bw_ref(xv, shape, muv, rsv, gv, wv, rms)
      local outs = { op(name, { want = mask }, table.unpack(args)) }
      local zero = {}
      for j = 1, Cf do zero[j] = 0 end
      if mask & 1 ~= 0 then K.check(outs[1], egx, shape, tol, "gx") end
      K.check(outs[2], mask & 2 ~= 0 and egw or zero, { Cf }, tol, "gw")
      if not rms then K.check(outs[3], mask & 4 ~= 0 and egb or zero, { Cf }, tol, "gb") end
    end
    return {
      forward = {
        ["all gradients, affine, 3x5 and 2x2x7"] = function()
          run({ 3, 5 }, true, 7)
          run({ 2, 2, 7 }, true, 7)
        end,
        ["no affine parameters; only some gradients asked (others are zeros)"] = function()
          run({ 4, 3 }, false, 1)
          run({ 4, 3 }, true, 2)
          run({ 4, 3 }, true, 4)
        end,
        ["large (parallel rows and column blocks)"] = function()
          run({ 150, 200 }, true, 7)
        end,
        ["statistics of the wrong shape are an error"] = function()
          local x, g = rand({ 3, 4 }), rand({ 3, 4 })
          local s = rand({ 4 })
          if rms then raises("statistic", op, name, nil, x, s, g)
          else raises("statistic", op, name, nil, x, s, s, g) end
        end,
      },
      nodiff = "internal backward helper of " .. (rms and "rmsnorm" or "layernorm") ..
        "; its own gradient is never taken (checked through the gradchecks of the forward op)",
    }
  end

  local gc = kit.gradcheck
  local function ln(...) return op("layernorm", { eps = 1e-5 }, ...) end
  local function rmsn(...) return op("rmsnorm", { eps = 1e-5 }, ...) end

  return {
    layernorm = {
      forward = forward_cases("layernorm"),
      grad = {
        ["without affine, 3x5"] = function() gc(ln, { { shape = { 3, 5 } } }) end,
        ["affine (x, w, b), 2x2x4"] = function()
          gc(ln, { { shape = { 2, 2, 4 } }, { shape = { 4 }, lo = 0.5, hi = 1.5 }, { shape = { 4 } } })
        end,
        ["weight only; x without grad"] = function()
          gc(ln, { { shape = { 3, 4 } }, { shape = { 4 } } })
          gc(ln, { { shape = { 3, 4 }, grad = false }, { shape = { 4 } }, { shape = { 4 } } })
        end,
      },
    },
    rmsnorm = {
      forward = forward_cases("rmsnorm"),
      grad = {
        ["without weight, 3x5"] = function() gc(rmsn, { { shape = { 3, 5 } } }) end,
        ["with weight, 2x2x4"] = function() gc(rmsn, { { shape = { 2, 2, 4 } }, { shape = { 4 }, lo = 0.5, hi = 1.5 } }) end,
      },
    },
    layernorm_backward = bw_cases("layernorm_backward"),
    rmsnorm_backward = bw_cases("rmsnorm_backward"),
  }
end
