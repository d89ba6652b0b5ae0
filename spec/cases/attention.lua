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

-- The packed form's layouts (flat, 1-based), nl leading entries: qkv (nl, T, 3, H, D)
-- -> q, k, v as (nl, H, T, D); rows (nl, T, H, D) <-> heads (nl, H, T, D).
local function unpack_qkv(vals, nl, T, H, D)
  local parts = { {}, {}, {} }
  for b = 0, nl - 1 do
    for t = 0, T - 1 do
      for p = 0, 2 do
        for h = 0, H - 1 do
          for d = 1, D do parts[p + 1][((b * H + h) * T + t) * D + d] = vals[(((b * T + t) * 3 + p) * H + h) * D + d] end
        end
      end
    end
  end
  return parts[1], parts[2], parts[3]
end

local function pack_qkv(q, k, v, nl, T, H, D)
  local out, parts = {}, { q, k, v }
  for b = 0, nl - 1 do
    for t = 0, T - 1 do
      for p = 0, 2 do
        for h = 0, H - 1 do
          for d = 1, D do out[(((b * T + t) * 3 + p) * H + h) * D + d] = parts[p + 1][((b * H + h) * T + t) * D + d] end
        end
      end
    end
  end
  return out
end

local function heads_to_rows(vals, nl, T, H, D, back)
  local out = {}
  for b = 0, nl - 1 do
    for h = 0, H - 1 do
      for t = 0, T - 1 do
        for d = 1, D do
          local hi, ri = ((b * H + h) * T + t) * D + d, ((b * T + t) * H + h) * D + d
          if back then out[hi] = vals[ri] else out[ri] = vals[hi] end
        end
      end
    end
  end
  return out
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

  -- The packed form: qkv (lead..., T, 3 H D) with heads H.
  local function pattrs(causal, scale, heads) return { causal = causal and true or false, scale = scale or 0, heads = heads } end
  local function cat(a, b)
    local s = {}
    for _, x in ipairs(a) do s[#s + 1] = x end
    for _, x in ipairs(b) do s[#s + 1] = x end
    return s
  end
  -- The three-input form's operands: (lead..., H, T, D) views of qkv's parts (views of
  -- views, as the module used to pass them).
  local function part_views(qkv, lead, T, H, D)
    local n = #lead
    local t5 = op("view", { shape = cat(lead, { T, 3, H, D }) }, op("copy", nil, qkv))
    local r = {}
    for i = 0, 2 do
      r[i + 1] = op("transpose", { dim0 = n, dim1 = n + 1 }, op("select", { dim = n + 1, index = i }, t5))
    end
    return r[1], r[2], r[3]
  end
  local function heads_view(y, lead, T, H, D) -- (lead..., T, H D) -> (lead..., H, T, D)
    local n = #lead
    return op("transpose", { dim0 = n, dim1 = n + 1 }, op("view", { shape = cat(lead, { T, H, D }) }, op("copy", nil, y)))
  end

  -- Packed forward against the oracle (y and lse), and against the three-input form on
  -- the parts' views: the same numbers, bit for bit.
  local function check_packed(lead, T, H, D, causal, scale, maker)
    maker = maker or K.rand
    local nl = kit.numel(lead)
    local qkv, vals = maker(cat(lead, { T, 3 * H * D }))
    local yshape, lshape = cat(lead, { T, H * D }), cat(lead, { H, T })
    local y, lse = zeros(yshape), zeros(lshape)
    C.op_into(C.ops.attention, pattrs(causal, scale, H), { qkv }, { y, lse })
    local qv, kv, vv = unpack_qkv(vals, nl, T, H, D)
    local ey, else_ = attention_ref(qv, kv, vv, { nl * H, T, D }, T, causal, scale)
    K.check(y, heads_to_rows(ey, nl, T, H, D), yshape, tol, "y")
    K.check(lse, else_, lshape, tol, "lse")
    K.check(op("attention", pattrs(causal, scale, H), qkv), C.flat(y), yshape, 0, "y of op()")
    local q, k, v = part_views(qkv, lead, T, H, D)
    local y3 = zeros(cat(lead, { H, T, D }))
    local lse3 = zeros(lshape)
    C.op_into(C.ops.attention, attrs(causal, scale), { q, k, v }, { y3, lse3 })
    K.check(y, heads_to_rows(C.flat(K.device == "cpu" and y3 or C.to_device(y3, "cpu")), nl, T, H, D), yshape, 0,
      "y against the three-input form")
    K.check(lse, C.flat(K.device == "cpu" and lse3 or C.to_device(lse3, "cpu")), lshape, 0,
      "lse against the three-input form")
  end

  local forward = {
    ["packed qkv: odd sizes (T 5, 3 heads of 2; T 7, 1 head of 3; 2 x 2 leading), causal and not"] = function()
      check_packed({ 2 }, 5, 3, 2, true)
      check_packed({ 2 }, 5, 3, 2, false, 0.7)
      check_packed({}, 7, 1, 3, true)
      check_packed({ 2, 2 }, 3, 2, 1, true, -0.4)
    end,
    ["packed qkv: one token, many query blocks (T 300), a non-contiguous qkv"] = function()
      check_packed({ 3 }, 1, 2, 2, true)
      check_packed({ 1 }, 300, 2, 2, true)
      check_packed({ 2 }, 6, 2, 3, true, nil, K.noncontig)
    end,
    ["packed qkv: empty (no tokens, no leading entries)"] = function()
      check_packed({ 2 }, 0, 2, 2, true)
      check_packed({ 0 }, 4, 2, 2, true)
    end,
    ["packed qkv: errors (heads, width, input count)"] = function()
      local qkv = (K.rand({ 2, 3, 12 }))
      raises("needs heads >= 1 (got 0)", op, "attention", pattrs(true), qkv)
      raises("got 2x3x12 with heads = 5", op, "attention",
        pattrs(true, 0, 5), qkv)
      raises("heads (2) is for the packed form", op, "attention", pattrs(true, 0, 2), qkv, qkv, qkv)
      raises("takes q, k, v or one packed qkv (got 2 inputs)", op, "attention", nil, qkv, qkv)
      raises("qkv must be", op, "attention", pattrs(true, 0, 1), (K.rand({ 6 })))
    end,
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
      raises("takes q, k, v or one packed qkv", op, "attention", nil, q, q)
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

  -- attention_qkv_backward(qkv, y, lse, gy) against the oracle, and against
  -- attention_backward on the parts' views: the same numbers, bit for bit.
  local function qkv_bw_check(lead, T, H, D, causal, scale, maker)
    maker = maker or K.rand
    local nl = kit.numel(lead)
    local qkv, vals = K.rand(cat(lead, { T, 3 * H * D }))
    local yshape, lshape = cat(lead, { T, H * D }), cat(lead, { H, T })
    local y, lse = zeros(yshape), zeros(lshape)
    C.op_into(C.ops.attention, pattrs(causal, scale, H), { qkv }, { y, lse })
    local gy, gyv = maker(yshape)
    local g = op("attention_qkv_backward", pattrs(causal, scale, H), qkv, y, lse, gy)
    local qv, kv, vv = unpack_qkv(vals, nl, T, H, D)
    local eq, ek, ev = attention_bw_ref(qv, kv, vv, heads_to_rows(gyv, nl, T, H, D, true), { nl * H, T, D }, T,
      causal, scale)
    local gshape = cat(lead, { T, 3 * H * D })
    K.check(g, pack_qkv(eq, ek, ev, nl, T, H, D), gshape, tol, "dqkv")
    local q, k, v = part_views(qkv, lead, T, H, D)
    local gq, gk, gv = op("attention_backward", attrs(causal, scale), q, k, v, heads_view(y, lead, T, H, D), lse,
      heads_view(gy, lead, T, H, D))
    local function flat(t) return C.flat(K.device == "cpu" and t or C.to_device(t, "cpu")) end
    K.check(g, pack_qkv(flat(gq), flat(gk), flat(gv), nl, T, H, D), gshape, 0, "dqkv against attention_backward")
  end

  local qkv_backward_helper = {
    forward = {
      ["odd sizes (T 5, 3 heads of 2; T 7, 1 head of 3; 2 x 2 leading), causal and not"] = function()
        qkv_bw_check({ 2 }, 5, 3, 2, true)
        qkv_bw_check({ 2 }, 5, 3, 2, false, 0.6, K.noncontig)
        qkv_bw_check({}, 7, 1, 3, true)
        qkv_bw_check({ 2, 2 }, 3, 2, 1, true, -0.4)
      end,
      ["many query blocks accumulating gk and gv (T 300)"] = function()
        qkv_bw_check({ 1 }, 300, 2, 2, true)
      end,
      ["empty (no tokens, no leading entries)"] = function()
        qkv_bw_check({ 2 }, 0, 2, 2, true)
        qkv_bw_check({ 0 }, 4, 2, 2, true)
      end,
      ["errors: y, lse and gy shapes"] = function()
        local qkv = (K.rand({ 2, 3, 12 }))
        local y, lse = (K.rand({ 2, 3, 4 })), (K.rand({ 2, 2, 3 }))
        raises("y has shape 2x3x12, expected 2x3x4", op, "attention_qkv_backward", pattrs(true, 0, 2), qkv, qkv, lse, y)
        raises("lse has shape 2x3, expected 2x2x3", op, "attention_qkv_backward", pattrs(true, 0, 2), qkv, y,
          (K.rand({ 2, 3 })), y)
        raises("gy has shape 2x3x2", op, "attention_qkv_backward", pattrs(true, 0, 2), qkv, y, lse, (K.rand({ 2, 3, 2 })))
        raises("needs heads >= 1", op, "attention_qkv_backward", pattrs(true), qkv, y, lse, y)
      end,
    },
    nodiff = "internal backward helper of the packed attention; its own gradient is never taken " ..
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
        ["packed qkv: causal, T 3, 2 heads of 2, 2 leading"] = function()
          gc(function(qkv) return op("attention", pattrs(true, 0, 2), qkv) end, { { shape = { 2, 3, 12 } } })
        end,
        ["packed qkv: not causal, T 4, 3 heads of 1, scale 0.8, 2-D"] = function()
          gc(function(qkv) return op("attention", pattrs(false, 0.8, 3), qkv) end, { { shape = { 4, 9 } } })
        end,
        ["only some inputs require grad"] = function()
          gc(att(true), { { shape = { 3, 2 }, grad = false }, { shape = { 3, 2 } }, { shape = { 3, 2 }, grad = false } })
          gc(att(false), { { shape = { 3, 2 } }, { shape = { 3, 2 }, grad = false }, { shape = { 3, 2 } } })
        end,
      },
    },
    attention_backward = backward_helper,
    attention_qkv_backward = qkv_backward_helper,
  }
end
