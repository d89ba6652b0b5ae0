-- Spec cases for matmul and linear (see spec/ops_spec.lua for the contract). The
-- oracle is a naive triple loop over flat row-major values with numpy's broadcasting
-- and 1-D promotion rules.
local remat = require "remat"
local kit = require "support.kit"
local C = remat._C

local nan, inf = 0 / 0, math.huge

-- Naive matmul of flat values; returns values and the result shape.
local function mm_ref(av, ash, bv, bsh)
  local a1, b1 = #ash == 1, #bsh == 1
  local as = a1 and { 1, ash[1] } or ash
  local bs = b1 and { bsh[1], 1 } or bsh
  local M, K, N = as[#as - 1], as[#as], bs[#bs]
  local ba, bb = {}, {}
  for i = 1, #as - 2 do ba[i] = as[i] end
  for i = 1, #bs - 2 do bb[i] = bs[i] end
  local nb = math.max(#ba, #bb)
  local bo = {}
  for i = 1, nb do
    local x = ba[i - (nb - #ba)] or 1
    local y = bb[i - (nb - #bb)] or 1
    bo[i] = x == 1 and y or x
  end
  -- flat batch index of an operand from the output batch multi-index
  local function bidx(bshape, multi)
    local off, idx = nb - #bshape, 0
    for i = 1, #bshape do
      local c = bshape[i] == 1 and 0 or multi[i + off]
      idx = idx * bshape[i] + c
    end
    return idx
  end
  local out, nbatch = {}, kit.numel(bo)
  for q = 0, nbatch - 1 do
    local multi, r = {}, q
    for i = nb, 1, -1 do multi[i] = r % bo[i]; r = r // bo[i] end
    local oa, ob = bidx(ba, multi) * M * K, bidx(bb, multi) * K * N
    for i = 0, M - 1 do
      for j = 0, N - 1 do
        local s = 0
        for k = 0, K - 1 do s = s + av[oa + i * K + k + 1] * bv[ob + k * N + j + 1] end
        out[#out + 1] = s
      end
    end
  end
  local shape = {}
  for i = 1, nb do shape[i] = bo[i] end
  if not a1 then shape[#shape + 1] = M end
  if not b1 then shape[#shape + 1] = N end
  return out, shape
end

-- A triangular product's oracle (matmul's tri attrs, core/ops.def): the triangular
-- operand masked to 0 outside its triangle (whatever it holds there, NaN included), the
-- naive product, and a triangular result filled outside its triangle.
local function inside(i, j, upper) if upper then return j >= i end return j <= i end
local function tri_mask(v, sh, upper, fill)
  local R, Cc, out = sh[#sh - 1], sh[#sh], {}
  for e = 1, #v do
    local j, i = (e - 1) % Cc, ((e - 1) // Cc) % R
    out[e] = inside(i, j, upper) and v[e] or fill
  end
  return out
end
local function mm_tri_ref(av, ash, bv, bsh, at)
  if at.tri == 2 then av = tri_mask(av, ash, at.upper, 0) end
  if at.tri == 3 then bv = tri_mask(bv, bsh, at.upper, 0) end
  local out, shape = mm_ref(av, ash, bv, bsh)
  if at.tri == 1 then out = tri_mask(out, shape, at.upper, at.neg_inf and -math.huge or 0) end
  return out, shape
end

-- y = x w^T + b over the last dim of x.
local function linear_ref(xv, xsh, wv, wsh, bv)
  local fout, fin = wsh[1], wsh[2]
  local R = fin > 0 and #xv // fin or 1
  if fin == 0 then R = 1; for i = 1, #xsh - 1 do R = R * xsh[i] end end
  local out = {}
  for r = 0, R - 1 do
    for o = 0, fout - 1 do
      local s = bv and bv[o + 1] or 0
      for i = 0, fin - 1 do s = s + xv[r * fin + i + 1] * wv[o * fin + i + 1] end
      out[#out + 1] = s
    end
  end
  local shape = {}
  for i = 1, #xsh - 1 do shape[i] = xsh[i] end
  shape[#shape + 1] = fout
  return out, shape
end

-- the tanh-approximate GELU, naively (spec/cases/elementwise.lua has its full cases)
local function gelu_tanh(v)
  local u = math.sqrt(2 / math.pi) * (v + 0.044715 * v ^ 3)
  local t = math.exp(-2 * math.abs(u))
  local th = (1 - t) / (1 + t)
  return 0.5 * v * (1 + (u < 0 and -th or th))
end

-- softmax over the last dim of sc * v (rows of n), row i of each (T, T) matrix seeing
-- columns j <= i when causal (the rest 0); a row with a NaN or +inf is NaN, as exp's is
local function softmax_rows_ref(v, n, sc, causal)
  local out = {}
  for r0 = 0, #v - 1, n do
    local live = causal and (r0 // n) % n + 1 or n
    local m, bad = -math.huge, false
    for j = 1, live do
      local x = v[r0 + j] * sc
      if x ~= x or x == math.huge then bad = true elseif x > m then m = x end
    end
    local sum = 0
    for j = 1, live do sum = sum + math.exp(v[r0 + j] * sc - m) end
    for j = 1, n do
      if bad then out[r0 + j] = 0 / 0
      elseif j > live then out[r0 + j] = 0
      else out[r0 + j] = math.exp(v[r0 + j] * sc - m) / sum end
    end
  end
  return out
end

return function(K)
  local function op(name, attrs, ...) return C.op(C.ops[name], attrs, ...) end
  local tol = K.dtype == "float32" and 1e-4 or 1e-10
  -- op's float32 forward cases named again in a subprocess under REMAT_NO_AVX512 (the
  -- paths other CPUs take), on an AVX-512 machine (elsewhere the cases ran them already)
  local function without_avx512(opname, names)
    if K.device ~= "cpu" or K.dtype ~= "float32" or remat.info().vector_path ~= "avx512" then return end
    local calls = {}
    for _, n in ipairs(names) do calls[#calls + 1] = ("cases[%q]()"):format(n) end
    local script = ("local K = require('support.kit').new('float32', 'cpu'); "
      .. "assert(require('remat').info().vector_path ~= 'avx512', 'REMAT_NO_AVX512 was ignored'); "
      .. "local cases = require('cases.matmul')(K)[%q].forward; %s; print('fallback ok')"):format(opname,
        table.concat(calls, "; "))
    local exe = (os.getenv("REMAT_BUILD") or "build") .. "/remat"
    local pipe = assert(io.popen(("env REMAT_NO_AVX512=1 %s -e %q 2>&1"):format(exe, script)))
    local out = pipe:read("a")
    pipe:close()
    assert(out:find("fallback ok", 1, true), "the fallback path: " .. out)
  end
  -- a fused op's y and the unfused ops' r hold the same bits (the sign of a zero and a
  -- NaN's payload too); on CUDA, values within tol of r's, NaN where r has NaN
  local function check_bits(y, r, what)
    local a = C.flat(K.device == "cpu" and y or C.to_device(y, "cpu"))
    local b = C.flat(K.device == "cpu" and r or C.to_device(r, "cpu"))
    assert(#a == #b, what .. ": sizes differ")
    for i = 1, #a do
      if K.device == "cpu" then
        assert(string.pack("<d", a[i]) == string.pack("<d", b[i]), ("%s[%d]: %.17g, unfused %.17g"):format(what, i, a[i], b[i]))
      elseif b[i] ~= b[i] then assert(a[i] ~= a[i], ("%s[%d]: %.17g, unfused NaN"):format(what, i, a[i]))
      else assert(math.abs(a[i] - b[i]) <= tol * math.max(1, math.abs(b[i])), what .. " vs unfused at " .. i) end
    end
  end
  local rand, noncontig = K.rand_stored, K.noncontig_stored
  local raises = kit.raises
  -- matmul of (ta, va, sa) and (tb, vb, sb) against the oracle.
  local function check_mm(ta, va, sa, tb, vb, sb, what)
    local e, shape = mm_ref(va, sa, vb, sb)
    K.check(op("matmul", nil, ta, tb), e, shape, tol, what)
  end
  local function mm_shapes(sa, sb)
    local ta, va = rand(sa)
    local tb, vb = rand(sb)
    check_mm(ta, va, sa, tb, vb, sb, table.concat(sa, "x") .. " @ " .. table.concat(sb, "x"))
  end
  -- a triangular product of (ta, va, sa) and (tb, vb, sb) against its oracle
  local function check_tri(ta, va, sa, tb, vb, sb, at, what)
    local e, shape = mm_tri_ref(va, sa, vb, sb, at)
    K.check(op("matmul", at, ta, tb), e, shape, tol, ("%s tri=%d%s%s"):format(what, at.tri,
      at.upper and " upper" or "", at.neg_inf and " neg_inf" or ""))
  end
  -- operand shapes of a triangular product: T x T triangle, D the other size
  local function tri_shapes(tri, T, D, batch)
    local sa, sb
    if tri == 1 then sa, sb = { T, D }, { D, T }
    elseif tri == 2 then sa, sb = { T, T }, { T, D }
    else sa, sb = { D, T }, { T, T } end
    if batch then table.insert(sa, 1, batch); table.insert(sb, 1, batch) end
    return sa, sb
  end
  local function tri_attrs()
    return { { tri = 1 }, { tri = 1, upper = true }, { tri = 1, neg_inf = true }, { tri = 1, upper = true, neg_inf = true },
             { tri = 2 }, { tri = 2, upper = true }, { tri = 3 }, { tri = 3, upper = true } }
  end
  local function check_lin(x, xv, xs, w, wv, ws, b, bv)
    local e, shape = linear_ref(xv, xs, wv, ws, bv)
    local y = b and op("linear", nil, x, w, b) or op("linear", nil, x, w)
    K.check(y, e, shape, tol)
  end
  local gc = kit.gradcheck
  local function check_lg(x, xv, xs, w, wv, ws, b, bv)
    local e, shape = linear_ref(xv, xs, wv, ws, bv)
    for i = 1, #e do e[i] = gelu_tanh(e[i]) end
    local y = b and op("linear_gelu", nil, x, w, b) or op("linear_gelu", nil, x, w)
    K.check(y, e, shape, tol)
    -- the unfused pair: the same bits on the CPU (the same two kernels); on CUDA the
    -- cublasLt epilogue may round differently
    check_bits(y, op("gelu_tanh", nil, b and op("linear", nil, x, w, b) or op("linear", nil, x, w)), "linear_gelu")
  end

  return {
    matmul = {
      forward = {
        ["2-D with odd sizes and size-1 dims"] = function()
          mm_shapes({ 3, 5 }, { 5, 7 })
          mm_shapes({ 1, 4 }, { 4, 1 })
          mm_shapes({ 4, 1 }, { 1, 3 })
          mm_shapes({ 1, 1 }, { 1, 1 })
        end,
        ["1-D operands: dot, vector-matrix, matrix-vector, batched"] = function()
          mm_shapes({ 5 }, { 5 })
          mm_shapes({ 3 }, { 3, 4 })
          mm_shapes({ 4, 3 }, { 3 })
          mm_shapes({ 3 }, { 2, 3, 4 })
          mm_shapes({ 2, 4, 3 }, { 3 })
        end,
        ["batched, and broadcast batch dims"] = function()
          mm_shapes({ 2, 3, 4 }, { 2, 4, 5 })
          mm_shapes({ 2, 1, 3, 4 }, { 5, 4, 2 })
          mm_shapes({ 1, 3, 2 }, { 4, 2, 3 })
        end,
        ["batched against a shared 2-D operand (one folded GEMM) and the reverse"] = function()
          mm_shapes({ 3, 5, 4 }, { 4, 6 })
          mm_shapes({ 5, 4 }, { 3, 4, 6 })
          mm_shapes({ 2, 3, 1, 4 }, { 4, 2 })
        end,
        ["transposed (non-contiguous) operands go to BLAS as they are"] = function()
          local ta, va = noncontig({ 3, 5 })
          local tb, vb = noncontig({ 5, 4 })
          check_mm(ta, va, { 3, 5 }, tb, vb, { 5, 4 }, "both transposed")
          local tc, vc = rand({ 5, 4 })
          check_mm(ta, va, { 3, 5 }, tc, vc, { 5, 4 }, "left transposed")
          local td, vd = noncontig({ 2, 4, 3 })
          local te, ve = noncontig({ 2, 3, 5 })
          check_mm(td, vd, { 2, 4, 3 }, te, ve, { 2, 3, 5 }, "batched transposed")
          local tv, vv = noncontig({ 5 })
          check_mm(tv, vv, { 5 }, tb, vb, { 5, 4 }, "strided vector")
        end,
        ["operands BLAS cannot read are copied (strided columns, expanded)"] = function()
          local base = K.rand({ 3, 4, 2 })
          local t = op("select", { dim = 2, index = 1 }, base)   -- 3x4 with strides (8, 2)
          local tb, vb = rand({ 4, 3 })
          check_mm(t, C.flat(t), { 3, 4 }, tb, vb, { 4, 3 }, "strided columns")
          local row = K.rand({ 1, 4 })
          local ex = op("expand", { shape = { 3, 4 } }, row)  -- stride 0 rows
          check_mm(ex, C.flat(ex), { 3, 4 }, tb, vb, { 4, 3 }, "expanded rows")
        end,
        ["empty dims: M = 0 gives empty, K = 0 gives zeros"] = function()
          check_mm(K.tensor({}, { 0, 3 }), {}, { 0, 3 }, (rand({ 3, 4 })), C.flat((rand({ 3, 4 }))), { 3, 4 }, "M = 0")
          local z = K.tensor({}, { 3, 0 })
          local w = K.tensor({}, { 0, 4 })
          K.check(op("matmul", nil, z, w), { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }, { 3, 4 })
          K.check(op("matmul", nil, K.tensor({}, { 2, 0, 3 }), (rand({ 3, 2 }))), {}, { 2, 0, 2 })
        end,
        ["NaN and inf propagate"] = function()
          local a = { 1, nan, 2, 3, inf, 1 }
          local b = { 1, 0, 2, 1, 0, 1 }
          check_mm(K.tensor(a, { 2, 3 }), a, { 2, 3 }, K.tensor(b, { 3, 2 }), b, { 3, 2 }, "nan/inf")
        end,
        ["large (parallel BLAS)"] = function()
          mm_shapes({ 64, 96 }, { 96, 80 })
        end,
        ["split by rows over the threads: odd row counts, transposed operands"] = function()
          mm_shapes({ 100, 37 }, { 37, 45 })
          mm_shapes({ 3, 67, 9 }, { 9, 20 })
          local ta, va = noncontig({ 131, 24 })
          local tb, vb = noncontig({ 24, 19 })
          check_mm(ta, va, { 131, 24 }, tb, vb, { 24, 19 }, "both transposed, 131 rows")
        end,
        -- small products of 64 rows and more run one per thread (kernels/cpu/matmul.c)
        ["split by batch over the threads: 64+ rows, broadcast batch dims, transposed operands"] = function()
          mm_shapes({ 3, 70, 9 }, { 3, 9, 66 })
          mm_shapes({ 5, 1, 65, 8 }, { 3, 8, 67 })
          local td, vd = noncontig({ 4, 64, 12 })
          local te, ve = noncontig({ 4, 12, 80 })
          check_mm(td, vd, { 4, 64, 12 }, te, ve, { 4, 12, 80 }, "batched transposed, 64 rows")
        end,
        ["triangular: every tri and triangle, sizes around the CPU's 8 x 32 tiles"] = function()
          for _, T in ipairs({ 1, 9, 33, 40 }) do
            for _, D in ipairs({ 1, 5, 33 }) do
              for _, at in ipairs(tri_attrs()) do
                local sa, sb = tri_shapes(at.tri, T, D, 2)
                local ta, va = rand(sa)
                local tb, vb = rand(sb)
                check_tri(ta, va, sa, tb, vb, sb, at, ("T=%d D=%d"):format(T, D))
              end
            end
          end
        end,
        ["triangular: transposed operands (attention's k^T, p^T, q^T views)"] = function()
          for _, at in ipairs(tri_attrs()) do
            local sa, sb = tri_shapes(at.tri, 37, 6, 2)
            local ta, va = noncontig(sa)
            local tb, vb = rand(sb)
            check_tri(ta, va, sa, tb, vb, sb, at, "a transposed")
            local tc, vc = noncontig(sb)
            check_tri(ta, va, sa, tc, vc, sb, at, "both transposed")
            local td, vd = rand(sa)
            check_tri(td, vd, sa, tc, vc, sb, at, "b transposed")
          end
        end,
        ["triangular: broadcast batch dims, one product split over the threads, many"] = function()
          for _, at in ipairs(tri_attrs()) do
            local sa, sb = tri_shapes(at.tri, 12, 7)
            table.insert(sa, 1, 1); table.insert(sa, 1, 2); table.insert(sb, 1, 3)
            local ta, va = rand(sa)
            local tb, vb = rand(sb)
            check_tri(ta, va, sa, tb, vb, sb, at, "broadcast")
            local sa1, sb1 = tri_shapes(at.tri, 100, 20)
            local t1, v1 = rand(sa1)
            local t2, v2 = rand(sb1)
            check_tri(t1, v1, sa1, t2, v2, sb1, at, "one product")
            local sa8, sb8 = tri_shapes(at.tri, 64, 16, 8)
            local t3, v3 = rand(sa8)
            local t4, v4 = rand(sb8)
            check_tri(t3, v3, sa8, t4, v4, sb8, at, "8 products")
          end
        end,
        ["triangular: an operand's entries outside its triangle are not read (NaN, inf)"] = function()
          for _, at in ipairs({ { tri = 2 }, { tri = 2, upper = true }, { tri = 3 }, { tri = 3, upper = true } }) do
            local T, D = 35, 3
            local sa, sb = tri_shapes(at.tri, T, D)
            local _, va = rand(sa)
            local _, vb = rand(sb)
            local tv = at.tri == 2 and va or vb
            for e = 1, #tv do
              local j, i = (e - 1) % T, (e - 1) // T
              if not inside(i, j, at.upper) then tv[e] = (e % 2 == 0) and nan or inf end
            end
            check_tri(K.tensor(va, sa), va, sa, K.tensor(vb, sb), vb, sb, at, "NaN outside")
            tv[1] = nan   -- (0, 0) is inside every triangle: its row (tri = a) or column (b) turns NaN
            check_tri(K.tensor(va, sa), va, sa, K.tensor(vb, sb), vb, sb, at, "NaN inside")
          end
        end,
        ["triangular: an inf or NaN of the other operand makes NaN where it meets the zeros outside"] = function()
          -- as the plain product of a copy zeroed outside the triangle (0 x inf): the
          -- CPU's tiles never visit those terms and write the NaN afterwards
          for _, at in ipairs({ { tri = 2 }, { tri = 2, upper = true }, { tri = 3 }, { tri = 3, upper = true } }) do
            local T, D = 37, 5
            local sa, sb = tri_shapes(at.tri, T, D, 2)
            local _, va = rand(sa)
            local _, vb = rand(sb)
            local other = at.tri == 2 and vb or va
            other[3] = inf; other[#other // 2] = nan; other[#other - 1] = -inf
            -- two in one column of b (tri = a) or one row of a (tri = b): the first and the
            -- last of them decide different rows or columns
            if at.tri == 2 then other[2 * D + 2], other[30 * D + 2] = inf, nan
            else other[T + 5], other[T + 33] = -inf, inf end
            check_tri(K.tensor(va, sa), va, sa, K.tensor(vb, sb), vb, sb, at, "non-finite other operand")
          end
        end,
        ["triangular: float32 gradients through the tiles are those of the masked plain product"] = function()
          for _, at in ipairs(tri_attrs()) do
            local sa, sb = tri_shapes(at.tri, 19, 6, 2)
            local ta = rand(sa)
            local tb = rand(sb)
            local gy
            local function grads(f)
              local a, b = C.detach(ta), C.detach(tb)
              C.requires_grad(a, true); C.requires_grad(b, true)
              local y = f(a, b)
              gy = gy or K.rand((C.info(y)))
              C.backward(y, gy)
              return C.flat(C.grad(a)), C.flat(C.grad(b))
            end
            local ga, gb = grads(function(a, b) return op("matmul", at, a, b) end)
            local ea, eb = grads(function(a, b)
              local m = ({ [2] = a, [3] = b })[at.tri]
              if m then
                local s = C.info(m)
                local keep = K.tensor(tri_mask(kit.values(s, 1, 1), s, at.upper, 0), s)
                if at.tri == 2 then a = C.op(C.ops.mul, nil, a, keep) else b = C.op(C.ops.mul, nil, b, keep) end
              end
              local y = op("matmul", nil, a, b)
              if at.tri == 1 then
                local s = C.info(y)
                y = C.op(C.ops.mul, nil, y, K.tensor(tri_mask(kit.values(s, 1, 1), s, at.upper, 0), s))
              end
              return y
            end)
            local function close(g, e, what)
              for i = 1, #e do
                assert(math.abs(g[i] - e[i]) <= tol * math.max(1, math.abs(e[i])),
                       ("%s tri=%d%s [%d]: %.9g vs %.9g"):format(what, at.tri, at.upper and " upper" or "", i, g[i], e[i]))
              end
            end
            close(ga, ea, "grad a")
            close(gb, eb, "grad b")
          end
        end,
        ["triangular: the same on the fallback path (REMAT_NO_AVX512, on an AVX-512 machine)"] = function()
          without_avx512("matmul", {
            "triangular: every tri and triangle, sizes around the CPU's 8 x 32 tiles",
            "triangular: transposed operands (attention's k^T, p^T, q^T views)",
            "triangular: an inf or NaN of the other operand makes NaN where it meets the zeros outside",
            "triangular: float32 gradients through the tiles are those of the masked plain product",
          })
        end,
        ["triangular: K = 0 gives zeros inside the triangle, the fill outside"] = function()
          K.check(op("matmul", { tri = 1, neg_inf = true }, K.tensor({}, { 2, 0 }), K.tensor({}, { 0, 2 })),
                  { 0, -inf, 0, 0 }, { 2, 2 })
          K.check(op("matmul", { tri = 1, upper = true }, K.tensor({}, { 2, 0 }), K.tensor({}, { 0, 2 })),
                  { 0, 0, 0, 0 }, { 2, 2 })
        end,
        ["triangular: errors name what was wrong"] = function()
          local sq, r = rand({ 3, 3 }), rand({ 3, 2 })
          raises("matmul: tri must be 0 (none), 1 (the result), 2 (a) or 3 (b), got 4", op, "matmul", { tri = 4 }, sq, sq)
          raises("matmul: neg_inf fills a triangular result (tri = 1), got tri = 2", op, "matmul", { tri = 2, neg_inf = true }, sq, r)
          raises("matmul: upper and neg_inf describe a triangular product: set tri too", op, "matmul", { upper = true }, sq, sq)
          raises("matmul: tri = 1 makes the result triangular, which needs it square, got shapes 3x3 and 3x2 (3 x 2)",
                 op, "matmul", { tri = 1 }, sq, r)
          raises("matmul: tri = 2 makes a triangular, which needs it square, got shapes 3x2 and 2x3 (3 x 2)",
                 op, "matmul", { tri = 2 }, r, (rand({ 2, 3 })))
          raises("matmul: tri = 3 makes b triangular, which needs it square", op, "matmul", { tri = 3 }, r, (rand({ 2, 3 })))
          raises("matmul: a triangular product needs 2-D or batched operands, got shapes 3 and 3x3", op, "matmul",
                 { tri = 3 }, (rand({ 3 })), sq)
        end,
        ["errors name both shapes"] = function()
          raises("matmul: shapes 2x3 and 4x5 do not match (3 vs 4)", op, "matmul", nil, (rand({ 2, 3 })), (rand({ 4, 5 })))
          raises("cannot be broadcast", op, "matmul", nil, (rand({ 2, 3, 4 })), (rand({ 3, 4, 2 })))
          raises("at least 1 dimension", op, "matmul", nil, (rand({})), (rand({ 2 })))
          raises("float", op, "matmul", nil, C.from_table({ 1 }, { 1, 1 }, "float32"), C.from_table({ 1 }, { 1, 1 }, "float64"))
        end,
      },
      grad = {
        ["2-D"] = function() gc(function(a, b) return op("matmul", nil, a, b) end, { { shape = { 3, 4 } }, { shape = { 4, 2 } } }) end,
        ["broadcast batch dims"] = function()
          gc(function(a, b) return op("matmul", nil, a, b) end, { { shape = { 2, 1, 2, 3 } }, { shape = { 3, 3, 2 } } })
        end,
        ["batched against a 2-D weight"] = function()
          gc(function(a, b) return op("matmul", nil, a, b) end, { { shape = { 2, 3, 4 } }, { shape = { 4, 2 } } })
        end,
        ["1-D operands"] = function()
          gc(function(a, b) return op("matmul", nil, a, b) end, { { shape = { 3 } }, { shape = { 3 } } })
          gc(function(a, b) return op("matmul", nil, a, b) end, { { shape = { 3 } }, { shape = { 2, 3, 4 } } })
          gc(function(a, b) return op("matmul", nil, a, b) end, { { shape = { 4, 3 } }, { shape = { 3 } } })
        end,
        ["triangular: every tri and triangle (their gradients are triangular products)"] = function()
          for _, at in ipairs(tri_attrs()) do
            if not at.neg_inf then
              local sa, sb = tri_shapes(at.tri, 4, 3)
              gc(function(a, b) return op("matmul", at, a, b) end, { { shape = sa }, { shape = sb } })
            end
          end
        end,
        ["triangular: batched, broadcast, a transposed operand"] = function()
          gc(function(a, b) return op("matmul", { tri = 2, upper = true }, op("transpose", { dim0 = 1, dim1 = 2 }, a), b) end,
            { { shape = { 2, 3, 3 } }, { shape = { 3, 2 } } })
          gc(function(a, b) return op("matmul", { tri = 3 }, a, b) end, { { shape = { 2, 1, 2, 3 } }, { shape = { 3, 3, 3 } } })
        end,
        ["triangular: q k^T with -inf above the diagonal, through the causal softmax"] = function()
          gc(function(q, k)
            local s = op("matmul", { tri = 1, neg_inf = true }, q, op("transpose", { dim0 = 0, dim1 = 1 }, k))
            return op("softmax", { dim = 1, causal = true }, s)
          end, { { shape = { 5, 3 } }, { shape = { 5, 3 } } })
        end,
        ["transposed operand, one side without grad"] = function()
          gc(function(a, b) return op("matmul", nil, op("transpose", { dim0 = 0, dim1 = 1 }, a), b) end,
            { { shape = { 4, 3 } }, { shape = { 4, 2 }, grad = false } })
        end,
      },
    },
    linear = {
      forward = {
        ["2-D input with and without bias"] = function()
          local x, xv = rand({ 4, 3 })
          local w, wv = rand({ 5, 3 })
          local b, bv = rand({ 5 })
          check_lin(x, xv, { 4, 3 }, w, wv, { 5, 3 }, b, bv)
          check_lin(x, xv, { 4, 3 }, w, wv, { 5, 3 })
        end,
        ["3-D and 1-D inputs, size-1 dims"] = function()
          local x, xv = rand({ 2, 3, 7 })
          local w, wv = rand({ 5, 7 })
          local b, bv = rand({ 5 })
          check_lin(x, xv, { 2, 3, 7 }, w, wv, { 5, 7 }, b, bv)
          local v, vv = rand({ 7 })
          check_lin(v, vv, { 7 }, w, wv, { 5, 7 }, b, bv)
          local o, ov = rand({ 1, 1 })
          local w1, w1v = rand({ 1, 1 })
          check_lin(o, ov, { 1, 1 }, w1, w1v, { 1, 1 })
        end,
        ["non-contiguous input, weight and bias"] = function()
          local x, xv = noncontig({ 4, 6 })
          local w, wv = noncontig({ 3, 6 })
          local b, bv = noncontig({ 3 })
          check_lin(x, xv, { 4, 6 }, w, wv, { 3, 6 }, b, bv)
          local x3, x3v = noncontig({ 2, 4, 6 })
          check_lin(x3, x3v, { 2, 4, 6 }, w, wv, { 3, 6 }, b, bv)
        end,
        ["empty rows, no input features (bias only)"] = function()
          local w, wv = rand({ 3, 2 })
          local b, bv = rand({ 3 })
          check_lin(K.tensor({}, { 0, 2 }), {}, { 0, 2 }, w, wv, { 3, 2 }, b, bv)
          K.check(op("linear", nil, K.tensor({}, { 2, 0 }), K.tensor({}, { 3, 0 }), b), { bv[1], bv[2], bv[3], bv[1], bv[2], bv[3] }, { 2, 3 })
        end,
        ["NaN propagates to its row"] = function()
          local xv = { 1, nan, 2, 3 }
          local w, wv = rand({ 2, 2 })
          check_lin(K.tensor(xv, { 2, 2 }), xv, { 2, 2 }, w, wv, { 2, 2 })
        end,
        ["large (one GEMM over the flattened rows)"] = function()
          local x, xv = rand({ 3, 40, 50 })
          local w, wv = rand({ 30, 50 })
          local b, bv = rand({ 30 })
          check_lin(x, xv, { 3, 40, 50 }, w, wv, { 30, 50 }, b, bv)
        end,
        ["errors: feature mismatch, weight rank, bias shape"] = function()
          raises("linear: input has 784 features but the weight expects 512", op, "linear", nil, (rand({ 2, 784 })), (rand({ 10, 512 })))
          raises("weight must be 2-D", op, "linear", nil, (rand({ 2, 3 })), (rand({ 3 })))
          raises("bias has shape 4", op, "linear", nil, (rand({ 2, 3 })), (rand({ 5, 3 })), (rand({ 4 })))
        end,
      },
      grad = {
        ["with bias"] = function()
          gc(function(x, w, b) return op("linear", nil, x, w, b) end, { { shape = { 4, 3 } }, { shape = { 2, 3 } }, { shape = { 2 } } })
        end,
        ["without bias"] = function()
          gc(function(x, w) return op("linear", nil, x, w) end, { { shape = { 3, 5 } }, { shape = { 4, 5 } } })
        end,
        ["3-D and 1-D inputs"] = function()
          gc(function(x, w, b) return op("linear", nil, x, w, b) end, { { shape = { 2, 3, 4 } }, { shape = { 3, 4 } }, { shape = { 3 } } })
          gc(function(x, w, b) return op("linear", nil, x, w, b) end, { { shape = { 4 } }, { shape = { 3, 4 } }, { shape = { 3 } } })
        end,
      },
    },
    linear_gelu = {
      forward = {
        ["2-D with and without bias, against the naive reference and the unfused pair"] = function()
          local x, xv = rand({ 4, 3 }, -2, 2)
          local w, wv = rand({ 5, 3 }, -2, 2)
          local b, bv = rand({ 5 })
          check_lg(x, xv, { 4, 3 }, w, wv, { 5, 3 }, b, bv)
          check_lg(x, xv, { 4, 3 }, w, wv, { 5, 3 })
        end,
        ["3-D and 1-D inputs, odd sizes, outputs a multiple of 8 (the cublasLt epilogue)"] = function()
          local x, xv = rand({ 2, 7, 9 }, -2, 2)
          local w, wv = rand({ 16, 9 }, -2, 2)
          local b, bv = rand({ 16 })
          check_lg(x, xv, { 2, 7, 9 }, w, wv, { 16, 9 }, b, bv)
          check_lg(x, xv, { 2, 7, 9 }, w, wv, { 16, 9 })
          local x1, x1v = rand({ 9 }, -2, 2)
          check_lg(x1, x1v, { 9 }, w, wv, { 16, 9 }, b, bv)
        end,
        ["non-contiguous input and weight"] = function()
          local x, xv = noncontig({ 5, 6 }, -2, 2)
          local w, wv = noncontig({ 8, 6 }, -2, 2)
          local b, bv = rand({ 8 })
          check_lg(x, xv, { 5, 6 }, w, wv, { 8, 6 }, b, bv)
        end,
        ["empty rows and zero features"] = function()
          local b, bv = rand({ 3 })
          local w, wv = rand({ 3, 4 })
          check_lg(K.tensor({}, { 0, 4 }), {}, { 0, 4 }, w, wv, { 3, 4 }, b, bv)
          check_lg(K.tensor({}, { 2, 0 }), {}, { 2, 0 }, K.tensor({}, { 3, 0 }), {}, { 3, 0 }, b, bv)
        end,
        ["errors: feature mismatch, weight rank, bias shape"] = function()
          raises("linear_gelu: input has 784 features but the weight expects 512", op, "linear_gelu", nil, (rand({ 2, 784 })), (rand({ 10, 512 })))
          raises("linear_gelu: weight must be 2-D", op, "linear_gelu", nil, (rand({ 2, 3 })), (rand({ 3 })))
          raises("linear_gelu: bias has shape 4", op, "linear_gelu", nil, (rand({ 2, 3 })), (rand({ 5, 3 })), (rand({ 4 })))
        end,
      },
      grad = {
        ["with bias"] = function()
          gc(function(x, w, b) return op("linear_gelu", nil, x, w, b) end, { { shape = { 4, 3 }, lo = -2, hi = 2 }, { shape = { 2, 3 }, lo = -2, hi = 2 }, { shape = { 2 } } })
        end,
        ["without bias, 3-D input, non-contiguous weight"] = function()
          gc(function(x, w) return op("linear_gelu", nil, x, w) end, { { shape = { 3, 5 } }, { shape = { 4, 5 } } })
          gc(function(x, w, b) return op("linear_gelu", nil, x, op("transpose", { dim0 = 0, dim1 = 1 }, w), b) end,
             { { shape = { 2, 3, 4 }, lo = -2, hi = 2 }, { shape = { 4, 3 } }, { shape = { 3 } } })
        end,
      },
    },
    -- softmax(matmul(a, b)) in one op: the checkpoint engine's replay of a causal
    -- softmax with its scores (core/op.c); its bits are the two ops'
    matmul_softmax = {
      nodiff = "internal: the replay of a softmax with its scores' product rebuilds a tensor the tape " ..
        "already has; its own gradient is never taken (the gradients through the replay are checked in " ..
        "spec/checkpoint_spec.lua)",
      forward = {
        ["attention's shapes: the causal softmax of q k^T, k^T a transposed view; naive reference and the two ops' bits"] = function()
          for _, T in ipairs { 1, 2, 7, 16, 33, 40 } do
            for _, D in ipairs { 1, 5, 16 } do
              local q, qv = rand({ 3, T, D }, -2, 2)
              local k, kv = noncontig({ 3, D, T }, -2, 2)
              for _, at in ipairs { { tri = 1, neg_inf = true }, { tri = 1 }, {} } do
                local sc = D == 5 and 0.37 or 0
                local e = softmax_rows_ref(mm_tri_ref(qv, { 3, T, D }, kv, { 3, D, T }, at), T, sc ~= 0 and sc or 1, true)
                local fa = { tri = at.tri or 0, neg_inf = at.neg_inf, dim = -1, scale = sc, causal = true }
                local y = op("matmul_softmax", fa, q, k)
                local what = ("T=%d D=%d tri=%d%s"):format(T, D, fa.tri, at.neg_inf and " neg_inf" or "")
                K.check(y, e, { 3, T, T }, tol, what)
                check_bits(y, op("softmax", { dim = -1, scale = sc, causal = true }, op("matmul", at, q, k)), what)
              end
            end
          end
        end,
        ["the tiles' path where the CPU has them: no product in its workspace, whole products per thread too"] = function()
          if K.device ~= "cpu" or K.dtype ~= "float32" or remat.info().vector_path ~= "avx512" then return end
          -- batch 8 >= 2 threads each: whole products per thread; batch 1: row tiles over
          -- the threads; the workspace peak tells the tiles (packed k^T and a few rows of
          -- scores per thread) from the two kernels (the whole product)
          for _, B in ipairs { 8, 1 } do
            local T, D = 64, 16
            local q = K.rand({ B, T, D }, -2, 2)
            local k = K.noncontig({ B, D, T }, -2, 2)
            local fa = { tri = 1, neg_inf = true, dim = -1, scale = 0.25, causal = true }
            remat.memory.reset_peak()
            local y = op("matmul_softmax", fa, q, k)
            local ws = remat.memory.stats().peak_by_category.workspace
            assert(ws < B * T * T * 4, ("batch %d: workspace peak %d bytes, the product's %d"):format(B, ws, B * T * T * 4))
            check_bits(y, op("softmax", { dim = -1, scale = 0.25, causal = true }, op("matmul", { tri = 1, neg_inf = true }, q, k)),
              "batch " .. B)
          end
        end,
        ["not causal, another dim, broadcast batch dims, size-1 dims"] = function()
          local a, av = rand({ 2, 1, 4, 3 }, -2, 2)
          local b, bv = rand({ 5, 3, 6 }, -2, 2)
          local y = op("matmul_softmax", { dim = -1, scale = 0.5 }, a, b)
          local p, shape = mm_ref(av, { 2, 1, 4, 3 }, bv, { 5, 3, 6 })
          K.check(y, softmax_rows_ref(p, 6, 0.5, false), shape, tol, "broadcast")
          check_bits(y, op("softmax", { dim = -1, scale = 0.5 }, op("matmul", nil, a, b)), "broadcast")
          local u, v = rand({ 3 }), rand({ 3 })
          check_bits(op("matmul_softmax", { dim = -1 }, u, v), op("softmax", { dim = -1 }, op("matmul", nil, u, v)), "two vectors")
          local z = op("matmul_softmax", { dim = 0 }, a, b)
          check_bits(z, op("softmax", { dim = 0 }, op("matmul", nil, a, b)), "dim 0")
          local o = op("matmul_softmax", { tri = 1, neg_inf = true, dim = -1, causal = true }, K.tensor({ 2 }, { 1, 1 }), K.tensor({ 3 }, { 1, 1 }))
          K.check(o, { 1 }, { 1, 1 }, tol, "1 x 1")
          local none = op("matmul_softmax", { tri = 1, neg_inf = true, dim = -1, causal = true }, K.tensor({}, { 2, 0 }), K.tensor({}, { 0, 2 }))
          check_bits(none, op("softmax", { dim = -1, causal = true }, op("matmul", { tri = 1, neg_inf = true }, K.tensor({}, { 2, 0 }), K.tensor({}, { 0, 2 }))), "K = 0")
        end,
        ["NaN and inf in q reach only the rows that read them"] = function()
          local T, D = 20, 4
          local qv = kit.values({ T, D }, -1, 1)
          qv[3 * D + 2] = nan      -- row 3 (0-based)
          qv[11 * D + 1] = inf     -- row 11
          local q = K.tensor(qv, { T, D })
          local k, kv = noncontig({ D, T }, -1, 1)
          local y = op("matmul_softmax", { tri = 1, neg_inf = true, dim = -1, causal = true }, q, k)
          local e = softmax_rows_ref(mm_tri_ref(C.flat(K.device == "cpu" and q or C.to_device(q, "cpu")), { T, D }, kv, { D, T },
            { tri = 1, neg_inf = true }), T, 1, true)
          K.check(y, e, { T, T }, tol, "NaN and inf rows")
          check_bits(y, op("softmax", { dim = -1, causal = true }, op("matmul", { tri = 1, neg_inf = true }, q, k)), "NaN and inf rows")
        end,
        ["the same on the paths without the tiles (REMAT_NO_AVX512, on an AVX-512 machine)"] = function()
          without_avx512("matmul_softmax", {
            "attention's shapes: the causal softmax of q k^T, k^T a transposed view; naive reference and the two ops' bits",
            "NaN and inf in q reach only the rows that read them",
          })
        end,
        ["bad attrs and shapes raise, naming what was wrong"] = function()
          local a, b = K.rand({ 3, 4 }), K.rand({ 4, 5 })
          raises("matmul_softmax: a causal softmax runs over the last dim of a (..., T, T) product, got dim 1 of a 2-D product whose last two sizes are 3 and 5",
            op, "matmul_softmax", { dim = -1, causal = true }, a, b)
          raises("dim", op, "matmul_softmax", { dim = 2 }, a, b)
          raises("matmul_softmax: scale must be a finite number", op, "matmul_softmax", { dim = -1, scale = 0 / 0 }, a, b)
          raises("matmul: shapes", op, "matmul_softmax", { dim = -1 }, a, (K.rand({ 5, 4 })))
          raises("matmul: neg_inf fills a triangular result (tri = 1), got tri = 2", op, "matmul_softmax",
            { tri = 2, neg_inf = true, dim = -1 }, (K.rand({ 4, 4 })), (K.rand({ 4, 4 })))
        end,
      },
    },
  }
end
