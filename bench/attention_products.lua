-- The six products of a composed causal attention layer, plain against triangular
-- (matmul's tri attrs, core/ops.def), at bench/checkpoint.lua's GPT shape: batch 2,
-- 4 heads, T = 256, head size 32, q, k and v as the strided views of one (B, T, 3, H, D)
-- projection that nn.TransformerBlock makes. Forward: scores S = q k^T (tri = 1, -inf
-- above the diagonal) and O = P v (tri = 2); backward: gP = gO v^T (tri = 1), gV = P^T gO
-- (tri = 2, upper), gQ = gS k (tri = 2), gK^T = q^T gS (tri = 3).
-- hot: the least mean time of 10 calls in a row over 40 batches (inputs in cache);
-- cold: the least of 15 calls, each after a pass over 64 MiB (inputs and output in
-- memory, as a replay in backward finds them).
-- Then the replay of the probabilities P = softmax(S) (scaled, causal) from q and k: the
-- two ops (the triangular S, then the softmax) against matmul_softmax, the one op the
-- checkpoint engine replays them as where the CPU's tiles run (S is never stored).
-- Run: remat bench/attention_products.lua   (OMP_NUM_THREADS=1 for one thread)
local remat = require "remat"
local C = remat._C

remat.manual_seed(1)
local qkv = remat.randn(2, 256, 3, 4, 32)
local q = qkv:select(3, 1):transpose(2, 3)                      -- (B, H, T, D)
local k = qkv:select(3, 2):transpose(2, 3)
local v = qkv:select(3, 3):transpose(2, 3)
local kt, vt, qt = k:transpose(3, 4), v:transpose(3, 4), q:transpose(3, 4)
local p = C.op(C.ops.softmax, { dim = 3, scale = 32 ^ -0.5, causal = true }, C.op(C.ops.matmul, nil, q, kt))
local pt = p:transpose(3, 4)
local go, gs = remat.randn(2, 4, 256, 32), remat.randn(2, 4, 256, 256)
local big = remat.randn(16 * 1024 * 1024)

local function hot(f)
  local best = math.huge
  for _ = 1, 40 do
    local t0 = remat.now()
    for _ = 1, 10 do C.free(f()) end
    best = math.min(best, (remat.now() - t0) / 10)
  end
  return best * 1e6
end
local function cold(f)
  local best = math.huge
  for _ = 1, 15 do
    C.free(C.op(C.ops.add_scalar, { value = 1 }, big))
    local t0 = remat.now()
    local y = f()
    best = math.min(best, remat.now() - t0)
    C.free(y)
  end
  return best * 1e6
end
local function mm(at, a, b) return function() return C.op(C.ops.matmul, at, a, b) end end

local rows = {
  { "S = q k^T", mm(nil, q, kt), mm({ tri = 1, neg_inf = true }, q, kt) },
  { "O = P v", mm(nil, p, v), mm({ tri = 2 }, p, v) },
  { "gP = gO v^T", mm(nil, go, vt), mm({ tri = 1 }, go, vt) },
  { "gV = P^T gO", mm(nil, pt, go), mm({ tri = 2, upper = true }, pt, go) },
  { "gQ = gS k", mm(nil, gs, k), mm({ tri = 2 }, gs, k) },
  { "gK^T = q^T gS", mm(nil, qt, gs), mm({ tri = 3 }, qt, gs) },
}
print(("threads %s, vector path %s (the triangular tiles need avx512)"):format(
  os.getenv("OMP_NUM_THREADS") or "default", remat.info().vector_path))
print(("%-14s %10s %10s %6s %10s %10s %6s"):format("product", "plain us", "tri us", "ratio", "cold plain", "cold tri", "ratio"))
local sum = { 0, 0, 0, 0 }
for _, r in ipairs(rows) do
  local a, b, c, d = hot(r[2]), hot(r[3]), cold(r[2]), cold(r[3])
  sum[1], sum[2], sum[3], sum[4] = sum[1] + a, sum[2] + b, sum[3] + c, sum[4] + d
  print(("%-14s %10.0f %10.0f %6.2f %10.0f %10.0f %6.2f"):format(r[1], a, b, b / a, c, d, d / c))
end
print(("%-14s %10.0f %10.0f %6.2f %10.0f %10.0f %6.2f"):format("all six", sum[1], sum[2], sum[2] / sum[1], sum[3],
  sum[4], sum[4] / sum[3]))

local sc = 32 ^ -0.5
local two = function()
  local sm = C.op(C.ops.matmul, { tri = 1, neg_inf = true }, q, kt)
  local y = C.op(C.ops.softmax, { dim = 3, scale = sc, causal = true }, sm)
  C.free(sm)
  return y
end
local one = function()
  return C.op(C.ops.matmul_softmax, { tri = 1, neg_inf = true, dim = 3, scale = sc, causal = true }, q, kt)
end
local a, b, c, d = hot(two), hot(one), cold(two), cold(one)
print(("%-14s %10s %10s %6s %10s %10s %6s"):format("P from q, k", "two ops", "one op", "ratio", "cold two", "cold one", "ratio"))
print(("%-14s %10.0f %10.0f %6.2f %10.0f %10.0f %6.2f"):format("softmax(q k^T)", a, b, b / a, c, d, d / c))
