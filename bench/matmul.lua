-- Matmul throughput on the CPU: GFLOP/s of remat's matmul (float32, square n x n) for
-- n = 64..2048, next to OpenBLAS called directly from C (bench/sgemm_direct.c, built here
-- with cc when it can be: same thread count, preallocated output), an estimate of the
-- machine's peak, and the fixed cost of one op dispatch measured on a 1x1 product.
-- Run: remat bench/matmul.lua [max_n]   (or lua5.4 with LUA_CPATH pointing at remat.so)
local remat = require "remat"
local C = remat._C

local max_n = tonumber(arg and arg[1]) or 2048
local dtype = "float32"

-- Runs fn repeatedly for at least `budget` seconds (after one warm-up call);
-- returns the mean seconds per call.
local function time(fn, budget)
  fn()
  local reps, t0 = 0, C.now()
  local el
  repeat
    fn()
    reps = reps + 1
    el = C.now() - t0
  until el >= budget
  return el / reps
end

local function product(n)
  local a = C.full({ n, n }, 0.5, dtype)
  local b = C.full({ n, n }, 0.25, dtype)
  return function() C.free(C.op(C.ops.matmul, nil, a, b)) end
end

-- Peak estimate: cores x clock x FLOP/cycle, assuming two FMA units per core: 64
-- float32 FLOP/cycle with AVX-512, 32 with AVX2 (an upper bound: clocks drop under load).
local function peak_estimate()
  local f = io.open("/proc/cpuinfo")
  if not f then return nil end
  local cores, mhz, fpc = 0, nil, 16
  for line in f:lines() do
    if line:match("^processor") then cores = cores + 1 end
    mhz = mhz or tonumber(line:match("^cpu MHz%s*:%s*([%d.]+)"))
    if line:match("^flags") then
      if line:match(" avx512f") then fpc = 64 elseif line:match(" avx2") and fpc < 32 then fpc = 32 end
    end
  end
  f:close()
  if not mhz or cores == 0 then return nil end
  return cores * mhz * 1e6 * fpc / 1e9, cores, mhz, fpc
end

local dispatch = time(product(1), 0.2)
print(("dispatch overhead (1x1 matmul): %.2f us per op"):format(dispatch * 1e6))
local peak, cores, mhz, fpc = peak_estimate()
if peak then
  print(("peak estimate: %.0f GFLOP/s (%d cores x %.0f MHz x %d FLOP/cycle)"):format(peak, cores, mhz, fpc))
end

-- The direct OpenBLAS program, compiled next to this script's output when cc can.
local direct = os.tmpname()
local here = (arg and arg[0] or "bench/matmul.lua"):match("^(.*)/[^/]*$") or "."
local built = os.execute(("cc -O2 -o %s %s/sgemm_direct.c $(pkg-config --cflags --libs openblas) 2>/dev/null")
  :format(direct, here))
local function direct_seconds(n, budget)
  if not built then return nil end
  local p = io.popen(("%s %d %g"):format(direct, n, budget))
  local out = p:read("a")
  p:close()
  return tonumber(out)
end

print()
print(("%6s %12s %12s %14s %10s %s"):format("n", "ms", "GFLOP/s", "OpenBLAS GF/s", "remat/BLAS", peak and "% of peak" or ""))
local n = 64
while n <= max_n do
  local budget = n >= 1024 and 1.0 or 0.3
  local s = time(product(n), budget)
  local gf = 2 * n * n * n / s / 1e9
  local d = direct_seconds(n, budget)
  local dgf = d and 2 * n * n * n / d / 1e9
  print(("%6d %12.3f %12.1f %14s %10s %s"):format(n, s * 1e3, gf, dgf and ("%.1f"):format(dgf) or "-",
    dgf and ("%.2f"):format(gf / dgf) or "-", peak and ("%9.1f"):format(100 * gf / peak) or ""))
  collectgarbage()
  n = n * 2
end
os.remove(direct)
if not built then print("(OpenBLAS direct: could not build bench/sgemm_direct.c with cc)") end
