-- Elementwise, softmax and reduction throughput in GB/s at a few sizes, next to the
-- machine's memory bandwidth measured by a large copy (x:clone()).
-- Usage: build/remat bench/ops.lua [device] [max_log2_size]   (device: cpu or cuda)
local remat = require "remat"

local device = arg and arg[1] or "cpu"
local max_log2 = tonumber(arg and arg[2]) or 24
if device == "cuda" and not remat.cuda.available() then
  print("cuda is not available; running on the cpu")
  device = "cpu"
end

local function sync(t)
  -- reading one element waits for the device to finish the work queued before it
  if device ~= "cpu" then t:narrow(1, 1, 1):sum():item() end
end

-- Seconds per call of fn(), repeated until at least `budget` seconds have passed.
local function time_it(fn, budget)
  budget = budget or 0.25
  local out = fn()
  sync(out)
  out:free()
  local n, t0 = 0, remat.now()
  local elapsed = 0
  repeat
    local r = fn()
    n = n + 1
    if n % 8 == 0 or remat.now() - t0 > budget then sync(r) end
    r:free()
    elapsed = remat.now() - t0
  until elapsed >= budget and n >= 3
  return elapsed / n
end

local function gbs(bytes, s) return bytes / s / 1e9 end

-- The reference: a large copy (read + write) into a preallocated tensor, 256 MiB of
-- float32 (less if asked): what memory can do without allocation in the way.
local copy_n = 1 << math.min(26, max_log2 + 2)
local big, dst = remat.rand(copy_n, device), remat.zeros(copy_n, device)
local copy_s = time_it(function() dst:copy_(big); return dst:narrow(1, 1, 1) end, 0.5)
local copy_gbs = gbs(2 * 4 * copy_n, copy_s)
-- the same copy with a fresh output each time (x:clone()): what every op below pays
local clone_s = time_it(function() return big:clone() end, 0.5)
big:free()
dst:free()

print(("remat %s on %s; threads: %s"):format(remat.version, device, os.getenv("OMP_NUM_THREADS") or "all"))
print(("memory bandwidth (copy of %s into a preallocated tensor, read + write): %.1f GB/s"):format(
  remat.memory.format(4 * copy_n), copy_gbs))
print(("the same copy into a fresh allocation (x:clone()):                     %.1f GB/s"):format(
  gbs(2 * 4 * copy_n, clone_s)))
print("(op times below include allocating their output, as a script sees them)")
print()
print(("%-8s %12s %10s %9s %8s"):format("op", "elements", "time", "GB/s", "of copy"))
print(string.rep("-", 51))

-- bytes moved per element (float32): inputs read plus outputs written, the minimum
-- traffic an ideal kernel needs
local ops = {
  { "add", 12, function(a, b) return a + b end },
  { "mul", 12, function(a, b) return a * b end },
  { "exp", 8, function(a) return a:exp() end },
  { "gelu", 8, function(a) return a:gelu() end },
  { "softmax", 8, function(a) return a:softmax(2) end },
  { "sum", 4, function(a) return a:sum() end },
}

local sizes = {}
for l = 16, max_log2, 4 do sizes[#sizes + 1] = l end

for _, o in ipairs(ops) do
  local name, per, fn = o[1], o[2], o[3]
  for _, l in ipairs(sizes) do
    local n = 1 << l
    local a = remat.rand(n // 1024, 1024, device)
    local b = remat.rand(n // 1024, 1024, device)
    local s = time_it(function() return fn(a, b) end)
    local g = gbs(per * n, s)
    print(("%-8s %12d %8.3f ms %9.1f %7.0f%%"):format(name, n, s * 1e3, g, 100 * g / copy_gbs))
    a:free()
    b:free()
  end
end

-- The composed attention's score ops (the path a TransformerBlock takes while training
-- with dropout: q k^T -> mul_scalar -> causal_mask -> softmax, and their backwards) on
-- (B, H, T, T) scores, per call. Causally masked softmax rows skip their -inf tails
-- (about half the exponentials); "bytes" is the traffic of a full read + write.
print()
print(("%-26s %14s %10s %9s"):format("score op (2, 4, T, T)", "T", "time", "GB/s"))
print(string.rep("-", 62))
local C = remat._C
local function op(name, attrs, ...) return C.op(C.ops[name], attrs, ...) end
for _, T in ipairs({ 256, 1024 }) do
  local s = remat.randn(2, 4, T, T):to(device)
  local masked = op("causal_mask", nil, s)
  local y = op("softmax", { dim = -1 }, masked)
  local g = remat.randn(2, 4, T, T):to(device)
  local rows = {
    { "mul_scalar", 8, function() return op("mul_scalar", { value = 0.125 }, s) end },
    { "causal_mask", 8, function() return op("causal_mask", nil, s) end },
    { "causal_mask (backward)", 8, function() return op("causal_mask", { zeros = true }, g) end },
    { "softmax (unmasked)", 8, function() return op("softmax", { dim = -1 }, s) end },
    { "softmax (masked)", 8, function() return op("softmax", { dim = -1 }, masked) end },
    { "softmax_backward", 12, function() return op("softmax_backward", { dim = -1 }, y, g) end },
  }
  for _, r in ipairs(rows) do
    local t = time_it(r[3])
    print(("%-26s %14d %8.3f ms %9.1f"):format(r[1], T, t * 1e3, gbs(r[2] * 8 * T * T, t)))
  end
  for _, t in ipairs({ s, masked, y, g }) do t:free() end
end
