-- Data-parallel step time at 1 and 2 processes on this machine, and the bytes each rank
-- sends per step against the model's gradient size.
--
--   remat bench/dist.lua [--steps 20] [--batch 128]
--
-- For each model (models/mlp.lua's residual MLP at two sizes) and each process count it
-- launches `mpirun -np P remat bench/dist.lua --worker ...`: global batch B split over
-- the ranks, AdamW (or sharded AdamW), the median step time over --steps steps after 3
-- warm-up steps. Bytes per step are the payload this rank handed to collectives
-- (gradient buckets, plus the parameter all_gather with ZeRO-1). Each rank runs with
-- OMP_NUM_THREADS = --threads (default 1): OpenMP's spinning barriers degrade badly when
-- the cores are shared (other jobs, or 2 ranks x 2 threads on 2 cores), so the same
-- threads per process make the two process counts comparable. The load average is
-- printed with the table.
local remat = require "remat"
local argv = { ... }
if #argv == 0 and arg then argv = arg end

local function opt(name, default)
  for i = 1, #argv do if argv[i] == name then return argv[i + 1] end end
  return default
end
local function flag(name)
  for i = 1, #argv do if argv[i] == name then return true end end
  return false
end

if flag("--worker") then
  local dist, nn, optim = remat.dist, remat.nn, remat.optim
  dist.run(function()
    dist.init()
    local W = dist.world_size()
    local steps, B = tonumber(opt("--steps", "10")), tonumber(opt("--batch", "128"))
    local def = assert(loadfile("models/mlp.lua"))("--plan", "--width", opt("--width", "256"), "--blocks", opt("--blocks", "8"))
    local model = dist.DataParallel(def.model)
    local o = flag("--zero") and dist.ShardedAdamW or optim.AdamW
    local adam = o(model:parameters(), { lr = 1e-3 })
    remat.manual_seed(dist.rank())
    local x = remat.rand(B // W, 784)
    local labels = {}
    for i = 1, B // W do labels[i] = i % 10 + 1 end
    local y = remat.tensor(labels)
    local times = {}
    for k = 1, steps + 3 do
      if k == 4 then dist.reset_stats() end
      dist.barrier()
      local t0 = remat.now()
      local logits <close> = model(x)
      local loss <close> = nn.cross_entropy(logits, y)
      model:backward(loss)
      adam:step()
      adam:zero_grad()
      if k > 3 then times[#times + 1] = remat.now() - t0 end
    end
    -- the slowest rank sets the pace
    local med = remat.tensor { (function() table.sort(times) return times[(#times + 1) // 2] end)() }
    dist.allreduce(med, "max")
    local info = model:info()
    if dist.is_main() then
      print(("BENCH step_ms %.3f"):format(1000 * med:item()))
      print(("BENCH bytes %d"):format(dist.stats().bytes // steps))
      print(("BENCH grad %d"):format(info.grad_bytes))
      print(("BENCH buckets %d"):format(#info.buckets))
      print(("BENCH early %d"):format(info.started_during_backward or 0))
    end
    model:close()
    dist.finalize()
  end)
  return
end

local fmt = remat.memory.format
local steps, B = opt("--steps", "10"), opt("--batch", "128")
local threads = tonumber(opt("--threads", "1"))
local cores = tonumber(io.popen("nproc"):read("l")) or 1
if not os.execute("command -v mpirun >/dev/null 2>&1") then
  print("bench/dist.lua: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)")
  return
end
local exe = arg and arg[-1] or "remat"
local function run(np, width, blocks, zero)
  local cmd = ("OMP_NUM_THREADS=%d timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS " ..
    "-x LUA_PATH -x LUA_CPATH -np %d %s bench/dist.lua --worker --steps %s --batch %s --width %d --blocks %d %s 2>&1")
    :format(threads, np, exe, steps, B, width, blocks, zero and "--zero" or "")
  local out = io.popen(cmd):read("a")
  local r = {}
  for k, v in out:gmatch("BENCH (%S+) (%S+)") do r[k] = tonumber(v) end
  if not r.step_ms then error("bench/dist.lua: the worker failed:\n" .. out, 0) end
  return r
end

local load = (io.open("/proc/loadavg") or io.stdin):read("l") or "?"
print(("data-parallel step time on %d cores, load average %s (global batch %s, median of %s steps, %d OpenMP thread(s) per process), AdamW")
  :format(cores, load:match("^%S+") or "?", B, steps, threads))
print(("%-26s %5s %10s %8s %14s %14s %10s %8s"):format("model", "procs", "ms/step", "speedup", "grad size",
  "sent/step", "sent/grad", "buckets"))
for _, m in ipairs { { 256, 8 }, { 512, 8 } } do
  local label = ("mlp width %d, %d blocks"):format(m[1], m[2])
  local base
  for _, case in ipairs { { 1, false }, { 2, false }, { 2, true } } do
    local np, zero = case[1], case[2]
    local r = run(np, m[1], m[2], zero)
    base = base or r.step_ms
    print(("%-26s %5s %10.2f %7.2fx %14s %14s %10.2f %8d"):format(label, np .. (zero and " z" or ""), r.step_ms,
      base / r.step_ms, fmt(r.grad), fmt(r.bytes), r.bytes / r.grad, r.buckets))
  end
end
print("procs 'z': sharded AdamW (ZeRO-1): the parameter all_gather adds 1/world of the parameters to what is sent.")
print("sent/step: payload this rank handed to MPI per step; a 2-rank allreduce moves about that much each way.")
