-- Autograd, the generator, memory accounting and timing, as Lua functions.
local remat = package.loaded.remat
local C = remat._C
local Tensor = remat.Tensor

-- t:requires_grad(flag) sets and returns t; t:requires_grad() tells.
function Tensor:requires_grad(flag)
  if flag == nil then return C.requires_grad(self) end
  return C.requires_grad(self, flag)
end

function Tensor:backward(grad) C.backward(self, grad) end
function Tensor:detach() return C.detach(self) end
function Tensor:zero_grad() C.set_grad(self, nil) end

-- Runs fn(...) with gradient recording off; returns what fn returns.
function remat.no_grad(fn, ...)
  if type(fn) ~= "function" then
    error("remat.no_grad: expected a function, got " .. type(fn), 2)
  end
  return C.scoped(nil, false, fn, ...)
end

function remat.grad_enabled() local g = C.grad_enabled() return g end

function remat.manual_seed(n)
  if math.type(n) ~= "integer" then
    error("remat.manual_seed: expected an integer seed, got " .. tostring(n), 2)
  end
  C.manual_seed(n)
end

remat.now = C.now

local memory = {}
remat.memory = memory
function memory.stats(device) return C.memory_stats(device) end
function memory.reset_peak(device) C.reset_peak(device) end
function memory.limit(bytes, device) return C.memory_limit(bytes, device) end
function memory.fail_at(k) C.fail_at(k) end
-- Gives cached blocks back to the system (CPU or "cuda"); returns the bytes released.
function memory.empty_cache(device) return C.empty_cache(device) end
function memory.parse(s) return C.parse_bytes(s) end
-- Whether a training step (a forward with grad, not nested in another) begins with a
-- full collection of Lua's garbage (default true): without it, tensors of earlier steps
-- held only by garbage handles count against the step's plan. Returns the old setting.
function memory.step_collect(flag) return C.step_collect(flag) end

-- "1.50 MiB" from bytes.
function memory.format(b)
  if type(b) ~= "number" or b ~= b then
    error("memory.format: expected a number of bytes, got " .. (type(b) == "number" and "nan" or type(b)), 2)
  end
  local units = { "B", "KiB", "MiB", "GiB", "TiB" }
  local u = 1
  while b >= 1024 and u < #units do b = b / 1024; u = u + 1 end
  if u == 1 then return string.format("%.0f B", b) end
  return string.format("%.2f %s", b, units[u])
end

-- CUDA device control (each raises a clear error when CUDA is not available).
remat.cuda = remat.cuda or {}
function remat.cuda.synchronize() C.cuda_synchronize() end
function remat.cuda.empty_cache() return C.cuda_empty_cache() end
function remat.cuda.info() return C.cuda_info() end
-- remat.cuda.profile([reset]) -> { {name=, ms=, calls=}, ... } per op, most GPU time first,
-- or nil unless REMAT_CUDA_PROFILE=1 was set when CUDA started (then every op is timed
-- with CUDA events, synchronising after each: per-op times, not overlap).
function remat.cuda.profile(reset) return C.cuda_profile(reset) end

-- What runs: version, blas (library), blas_core (its kernels), blas_core_from (who chose
-- them), blas_path, threads (OpenMP, BLAS included), simd (the CPU's level), omp_wait
-- (libgomp's wait policy as the environment set it; lua/main.c), vector_path (the CPU
-- kernels' hand-vectorised path: "avx512", "avx2" or "portable"), cuda.
function remat.info()
  local t = C.runtime_info()
  t.cuda = remat.cuda.available()
  return t
end

return true
