-- Dropout and dropout_backward throughput on the CPU, in ns per element: dense inputs
-- and causal attention probabilities (upper triangle exactly 0, which the kernel copies
-- without drawing random numbers). Threads: OMP_NUM_THREADS.
-- Wall time, and the process's CPU time (os.clock: all threads, spinning included; at
-- one thread, a figure a loaded machine disturbs less).
-- Usage: build/remat bench/dropout.lua [dtype]   (float32 or float64; default float32)
local remat = require "remat"
local C = remat._C
local dtype = arg and arg[1] or "float32"

-- Median wall and CPU seconds per call over 7 rounds of at least 20 ms each.
local function time_it(fn)
  fn():free()
  local wall, cpu = {}, {}
  for r = 1, 7 do
    local n, t0, c0 = 0, remat.now(), os.clock()
    repeat fn():free(); n = n + 1 until remat.now() - t0 >= 0.02 and n >= 3
    wall[r], cpu[r] = (remat.now() - t0) / n, (os.clock() - c0) / n
  end
  table.sort(wall)
  table.sort(cpu)
  return wall[4], cpu[4]
end

local function causal_probs(n)
  local T = n >= 65536 and 256 or 128
  local att = C.op(C.ops.causal_mask, {}, remat.randn(n // (T * T), T, T, dtype))
  return C.op(C.ops.softmax, { dim = -1 }, att)
end

print(string.format("dtype %s, OMP_NUM_THREADS=%s", dtype, os.getenv("OMP_NUM_THREADS") or "(unset)"))
for _, n in ipairs({ 32768, 524288 }) do
  for _, kind in ipairs({ "dense", "causal" }) do
    local x = kind == "dense" and remat.randn(n, dtype) or causal_probs(n)
    for _, op in ipairs({ "dropout", "dropout_backward" }) do
      local w, c = time_it(function() return C.op(C.ops[op], { p = 0.1 }, x) end)
      print(string.format("%-17s %-7s n=%-7d %6.3f ns/element (cpu %6.3f)", op, kind, n, w / n * 1e9, c / n * 1e9))
    end
  end
end
