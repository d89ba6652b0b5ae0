-- Spec cases for the fused attention op and its backward helper (see spec/ops_spec.lua
-- for the contract). Oracle: the explicit computation, softmax(scale q k^T [mask]) v,
-- written out over flat row-major values with the whole score row in hand.
local remat = require "remat"
local kit = require "support.kit"
local C = remat._C

local nan, inf = 0 / 0, math.huge

-- Geometry of q (..., Tq, hd) and k (..., Tk, hd): leading count, Tq, Tk, hd.
local function geo(qshape, Tk)
  local n = #qshape
  local bh = 1
  for i = 1, n - 2 do bh = bh * qshape[i] end
  return bh, qshape[n - 1], Tk, qshape[n]
end

-- Keys query i (0-based) sees: 0 .. kend-1.
local function kend(i, Tq, Tk, causal) return causal and i + (Tk - Tq) + 1 or Tk end

-- Scores, probabilities and lse of one query row (0-based b, i).
local function row_probs(qv, kv, b, i, Tq, Tk, hd, causal, scale)
  local s, m = {}, -inf
  local ke = kend(i, Tq, Tk, causal)
  for j = 0, ke - 1 do
    local acc = 0
    for d = 1, hd do acc = acc + qv[(b * Tq + i) * hd + d] * kv[(b * Tk + j) * hd + d] end
    s[j] = acc * scale
    if s[j] > m then m = s[j] end
  end
  local l = 0
  for j = 0, ke - 1 do s[j] = math.exp(s[j] - m); l = l + s[j] end
  for j = 0, ke - 1 do s[j] = s[j] / l end
  return s, ke, m + math.log(l)
end

-- y and lse (flat) of attention on flat q, k, v.
local function attention_ref(qv, kv, vv, qshape, Tk, causal, scale)
  local bh, Tq, _, hd = geo(qshape, Tk)
  scale = (scale and scale ~= 0) and scale or 1 / math.sqrt(math.max(hd, 1))
  local y, lse = {}, {}
  for b = 0, bh - 1 do
    for i = 0, Tq - 1 do
      local p, ke, L = row_probs(qv, kv, b, i, Tq, Tk, hd, causal, scale)
      for d = 1, hd do
        local acc = 0
        for j = 0, ke - 1 do acc = acc + p[j] * vv[(b * Tk + j) * hd + d] end
        y[(b * Tq + i) * hd + d] = ke > 0 and acc or 0
      end
      lse[b * Tq + i + 1] = L
    end
  end
  return y, lse
end

-- gq, gk, gv (flat) from the explicit probability matrix.
local function attention_bw_ref(qv, kv, vv, gv, qshape, Tk, causal, scale)
  local bh, Tq, _, hd = geo(qshape, Tk)
  scale = (scale and scale ~= 0) and scale or 1 / math.sqrt(math.max(hd, 1))
  local gq, gk, gvv = {}, {}, {}
  for x = 1, bh * Tq * hd do gq[x] = 0 end
  for x = 1, bh * Tk * hd do gk[x], gvv[x] = 0, 0 end
  for b = 0, bh - 1 do
    for i = 0, Tq - 1 do
      local p, ke = row_probs(qv, kv, b, i, Tq, Tk, hd, causal, scale)
      local dp, D = {}, 0
      for j = 0, ke - 1 do
        local acc = 0
        for d = 1, hd do acc = acc + gv[(b * Tq + i) * hd + d] * vv[(b * Tk + j) * hd + d] end
        dp[j] = acc
        D = D + p[j] * acc
      end
      for j = 0, ke - 1 do
        local ds = p[j] * (dp[j] - D)
        for d = 1, hd do
          local qi, kj = (b * Tq + i) * hd + d, (b * Tk + j) * hd + d
          gq[qi] = gq[qi] + scale * ds * kv[kj]
          gk[kj] = gk[kj] + scale * ds * qv[qi]
          gvv[kj] = gvv[kj] + p[j] * gv[qi]
        end
      end
    end
  end
  return gq, gk, gvv
end

return function(K)
  local function op(name, attrs, ...) return C.op(C.ops[name], attrs, ...) end
  local tol = K.dtype == "float32" and 2e-5 or 1e-10
  local raises = kit.raises
  local function kshape(qshape, Tk)
    local s = {}
    for i = 1, #qshape do s[i] = qshape[i] end
    s[#s - 1] = Tk
    return s
  end
  local function lead(qshape)
    local s = {}
    for i = 1, #qshape - 1 do s[i] = qshape[i] end
    return s
  end
  local function zeros(shape)
    local v = {}
    for i = 1, kit.numel(shape) do v[i] = 0 end
    return K.tensor(v, shape)
  end
  local function attrs(causal, scale) return { causal = causal and true or false, scale = scale or 0 } end
  -- A (B, H, T, D) view of a contiguous (B, T, H, D) tensor (rows H*D apart), as the
  -- module passes q, k, v: the CPU kernels read such views in place.
  local function packed(shape)
    local base = K.rand({ shape[1], shape[3], shape[2], shape[4] })
    local t = op("transpose", { dim0 = 1, dim1 = 2 }, base)
    return t, C.flat(t)
  end

  -- Runs attention on q (qshape) with Tk keys against the oracle; maker(shape) gives
  -- a tensor and its flat values (K.rand or K.noncontig).
  local function check(qshape, Tk, causal, scale, maker)
    maker = maker or K.rand
    local ks = kshape(qshape, Tk)
    local q, qv = maker(qshape)
    local k, kv = maker(ks)
    local v, vv = maker(ks)
    local y = op("attention", attrs(causal, scale), q, k, v)
    K.check(y, (attention_ref(qv, kv, vv, qshape, Tk, causal, scale)), qshape, tol, "y")
  end

  -- y and lse through op_into (contiguous inputs; outputs preallocated).
  local function with_lse(q, k, v, qshape, causal, scale)
    local y, lse = zeros(qshape), zeros(lead(qshape))
    C.op_into(C.ops.attention, attrs(causal, scale), { q, k, v }, { y, lse })
    return y, lse
  end

  local forward = {
    ["2x3x5x4, causal and not"] = function()
      check({ 2, 3, 5, 4 }, 5, true)
      check({ 2, 3, 5, 4 }, 5, false)
    end,
    ["odd sizes, Tq ~= Tk (3 queries, 7 keys; 7 queries, 2 keys), explicit scale"] = function()
      check({ 2, 3, 5 }, 7, true, 0.7)
      check({ 2, 3, 5 }, 7, false)
      check({ 1, 7, 3 }, 2, false, -0.3)
    end,
    ["hd = 1, batch dims of size 1, a 2-D input, one query"] = function()
      check({ 1, 1, 6, 1 }, 6, true)
      check({ 5, 3 }, 5, true)
      check({ 1, 2, 1, 4 }, 1, true)
      check({ 3, 1, 2 }, 4, true)
    end,
    ["non-contiguous q, k, v (transposed views)"] = function()
      check({ 2, 6, 3 }, 6, true, nil, K.noncontig)
      check({ 4, 5 }, 3, false, nil, K.noncontig)
    end,
    ["lse is the log-sum-exp of each scaled, masked score row"] = function()
      for _, c in ipairs({ { { 2, 4, 3 }, 4, true }, { { 3, 2, 5 }, 6, false, 0.5 }, { { 2, 5, 1 }, 7, true } }) do
        local qshape, Tk, causal, scale = c[1], c[2], c[3], c[4]
        local q, qv = K.rand(qshape, -2, 2)
        local k, kv = K.rand(kshape(qshape, Tk), -2, 2)
        local v, vv = K.rand(kshape(qshape, Tk))
        local y, lse = with_lse(q, k, v, qshape, causal, scale)
        local ey, else_ = attention_ref(qv, kv, vv, qshape, Tk, causal, scale)
        K.check(y, ey, qshape, tol, "y")
        K.check(lse, else_, lead(qshape), tol, "lse")
      end
    end,
    ["large scores stay finite (the row maximum is subtracted)"] = function()
      check({ 2, 4, 3 }, 4, true, 40)
    end,
    ["NaN: a NaN key reaches exactly the queries that see it; a NaN value one column"] = function()
      local shape = { 1, 4, 2 }
      local qv, kv, vv = kit.values(shape), kit.values(shape), kit.values(shape)
      kv[2 * 2 + 1] = nan -- key 3 (1-based)
      local y = op("attention", attrs(true), K.tensor(qv, shape), K.tensor(kv, shape), K.tensor(vv, shape))
      local ey = attention_ref(qv, kv, vv, shape, 4, true)
      K.check(y, ey, shape, tol, "y")
      local got = C.flat(K.device == "cpu" and y or C.to_device(y, "cpu"))
      assert(got[1] == got[1] and got[3] == got[3], "queries before the NaN key stay finite")
      assert(got[5] ~= got[5] and got[8] ~= got[8], "queries that see the NaN key are NaN")
      kv[2 * 2 + 1] = 0.5
      vv[1 * 2 + 2] = nan -- value 2, column 2
      local y2 = op("attention", attrs(false), K.tensor(qv, shape), K.tensor(kv, shape), K.tensor(vv, shape))
      K.check(y2, (attention_ref(qv, kv, vv, shape, 4, false)), shape, tol, "y")
    end,
    ["empty: no leading entries, no queries, no head dim, no keys (y = 0, lse = -inf)"] = function()
      check({ 0, 3, 2 }, 3, true)
      check({ 2, 0, 2 }, 3, false)
      check({ 2, 3, 0 }, 4, true)
      local q = K.rand({ 2, 3, 2 })
      local k = zeros({ 2, 0, 2 })
      local y, lse = with_lse(q, k, k, { 2, 3, 2 }, false)
      K.check(y, { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }, { 2, 3, 2 }, 0, "y")
      K.check(lse, { -inf, -inf, -inf, -inf, -inf, -inf }, { 2, 3 }, 0, "lse")
    end,
    ["large (parallel over rows, several row blocks)"] = function()
      check({ 2, 3, 37, 16 }, 37, true)
      check({ 1, 2, 20, 8 }, 45, false)
    end,
    ["many query blocks (the CPU takes 16384 / Tk rows at a time), packed (B, H, T, D) views"] = function()
      check({ 1, 2, 400, 2 }, 400, true, nil, packed)
      check({ 2, 1, 100, 3 }, 300, true, 0.8, packed)
      check({ 1, 1, 90, 2 }, 600, false)
    end,
    ["errors: shapes, causal with more queries than keys, dtypes, attrs"] = function()
      local q = (K.rand({ 2, 3, 4 }))
      raises("k has shape 2x3x5 but q has shape 2x3x4", op, "attention", nil, q, (K.rand({ 2, 3, 5 })), (K.rand({ 2, 3, 5 })))
      raises("k has shape 3x3x4", op, "attention", nil, q, (K.rand({ 3, 3, 4 })), (K.rand({ 3, 3, 4 })))
      raises("v has shape 2x3x2, expected 2x3x4", op, "attention", nil, q, (K.rand({ 2, 3, 4 })), (K.rand({ 2, 3, 2 })))
      raises("must be (..., T, head_dim)", op, "attention", nil, (K.rand({ 4 })), (K.rand({ 4 })), (K.rand({ 4 })))
      raises("at least as many keys as queries (3 queries, 2 keys)", op, "attention", attrs(true), q,
        (K.rand({ 2, 2, 4 })), (K.rand({ 2, 2, 4 })))
      raises("attribute 'causal' must be a boolean, got number", op, "attention", { causal = 2 }, q, q, q)
      raises("takes 3 inputs", op, "attention", nil, q, q)
      local other = K.dtype == "float32" and "float64" or "float32"
      if K.device == "cpu" then
        raises("input 2 is", op, "attention", nil, q, C.from_table(kit.values({ 2, 3, 4 }), { 2, 3, 4 }, other), q)
      end
    end,
  }

  -- attention_backward called directly: (q, k, v, y, lse, gy) with y and lse from the
  -- forward, against the explicit-matrix gradient.
  local function bw_check(qshape, Tk, causal, scale, maker, qkv_maker)
    maker, qkv_maker = maker or K.rand, qkv_maker or K.rand
    local ks = kshape(qshape, Tk)
    local q, qv = qkv_maker(qshape)
    local k, kv = qkv_maker(ks)
    local v, vv = qkv_maker(ks)
    local y, lse = with_lse(q, k, v, qshape, causal, scale)
    local gy, gyv = maker(qshape)
    local gq, gk, gv = op("attention_backward", attrs(causal, scale), q, k, v, y, lse, gy)
    local eq, ek, ev = attention_bw_ref(qv, kv, vv, gyv, qshape, Tk, causal, scale)
    K.check(gq, eq, qshape, tol, "gq")
    K.check(gk, ek, ks, tol, "gk")
    K.check(gv, ev, ks, tol, "gv")
  end

  local backward_helper = {
    forward = {
      ["causal and not, square, 2x3x5x4"] = function()
        bw_check({ 2, 3, 5, 4 }, 5, true)
        bw_check({ 2, 3, 5, 4 }, 5, false)
      end,
      ["Tq ~= Tk, explicit scale, hd = 1, non-contiguous gy"] = function()
        bw_check({ 2, 3, 5 }, 7, true, 0.6, K.noncontig)
        bw_check({ 1, 6, 2 }, 3, false)
        bw_check({ 1, 1, 4, 1 }, 4, true)
      end,
      ["several row and key blocks (parallel passes)"] = function()
        bw_check({ 2, 35, 8 }, 35, true)
        bw_check({ 1, 18, 4 }, 40, true)
      end,
      ["many query blocks accumulating gk and gv, packed (B, H, T, D) views"] = function()
        bw_check({ 1, 2, 300, 2 }, 300, true, nil, packed, packed)
        bw_check({ 2, 1, 100, 3 }, 300, true, 0.8, K.noncontig, packed)
        bw_check({ 1, 1, 90, 2 }, 600, false)
      end,
      ["empty: no queries (gk, gv are zeros), no keys (gq is zero)"] = function()
        bw_check({ 2, 0, 3 }, 4, false)
        bw_check({ 2, 3, 3 }, 0, false)
      end,
      ["equals the gradient of the composed ops (matmul, causal_mask, softmax, matmul)"] = function()
        local shape = { 2, 6, 4 }
        local q, k, v = K.rand(shape), K.rand(shape), K.rand(shape)
        local y, lse = with_lse(q, k, v, shape, true)
        local gy = K.rand(shape)
        local gq, gk, gv = op("attention_backward", attrs(true), q, k, v, y, lse, gy)
        local leaves = {}
        for i, t in ipairs({ q, k, v }) do
          leaves[i] = op("copy", nil, t)
          C.requires_grad(leaves[i], true)
        end
        local s = op("matmul", nil, leaves[1], op("transpose", { dim0 = 1, dim1 = 2 }, leaves[2]))
        s = op("mul_scalar", { value = 0.5 }, s)
        local p = op("softmax", { dim = -1 }, op("causal_mask", nil, s))
        C.backward(op("matmul", nil, p, leaves[3]), gy)
        local ctol = K.dtype == "float32" and 1e-5 or 1e-12
        K.check(gq, C.flat(C.grad(leaves[1])), shape, ctol, "gq")
        K.check(gk, C.flat(C.grad(leaves[2])), shape, ctol, "gk")
        K.check(gv, C.flat(C.grad(leaves[3])), shape, ctol, "gv")
      end,
      ["errors: lse and gy shapes, lse dtype"] = function()
        local q = (K.rand({ 2, 3, 4 }))
        raises("lse has shape 2x4, expected 2x3", op, "attention_backward", nil, q, q, q, q, (K.rand({ 2, 4 })), q)
        raises("gy has shape 2x3x2", op, "attention_backward", nil, q, q, q, q, (K.rand({ 2, 3 })), (K.rand({ 2, 3, 2 })))
        raises("takes 6 inputs", op, "attention_backward", nil, q, q, q)
      end,
    },
    nodiff = "internal backward helper of attention; its own gradient is never taken " ..
      "(checked through the gradchecks of attention)",
  }

  local gc = kit.gradcheck
  local function att(causal, scale)
    return function(q, k, v) return op("attention", attrs(causal, scale), q, k, v) end
  end

  return {
    attention = {
      forward = forward,
      grad = {
        ["causal, 1x2x4x3"] = function()
          gc(att(true), { { shape = { 1, 2, 4, 3 } }, { shape = { 1, 2, 4, 3 } }, { shape = { 1, 2, 4, 3 } } })
        end,
        ["not causal, 3 queries, 5 keys, scale 0.7"] = function()
          gc(att(false, 0.7), { { shape = { 2, 3, 2 } }, { shape = { 2, 5, 2 } }, { shape = { 2, 5, 2 } } })
        end,
        ["causal, fewer queries than keys (offset mask), hd = 1"] = function()
          gc(att(true), { { shape = { 2, 2, 1 } }, { shape = { 2, 4, 1 } }, { shape = { 2, 4, 1 } } })
        end,
        ["only some inputs require grad"] = function()
          gc(att(true), { { shape = { 3, 2 }, grad = false }, { shape = { 3, 2 } }, { shape = { 3, 2 }, grad = false } })
          gc(att(false), { { shape = { 3, 2 } }, { shape = { 3, 2 }, grad = false }, { shape = { 3, 2 } } })
        end,
      },
    },
    attention_backward = backward_helper,
  }
end
