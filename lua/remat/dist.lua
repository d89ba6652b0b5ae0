-- remat.dist: data-parallel training across processes and machines (MPI) and GPUs
-- (NCCL, bootstrapped over MPI).
--
--   local remat = require "remat"
--   local dist = remat.dist
--   dist.run(function()                     -- an error on any rank ends the whole job
--     dist.init()                           -- world size 1 when not started by mpirun
--     local train = remat.data.fashion_mnist("train", { rank = dist.rank(), world_size = dist.world_size() })
--     local model = dist.DataParallel(build_model())   -- parameters broadcast from rank 1
--     local opt = dist.ShardedAdamW(model:parameters(), { lr = 1e-3 })  -- or optim.AdamW
--     for xb, yb in train:batches(64) do
--       local loss = remat.nn.cross_entropy(model(xb), yb)
--       loss:backward()                     -- buckets reduce during backward; when it returns
--                                           -- every rank holds the average
--       opt:step(); opt:zero_grad()
--       dist.print("loss", loss:item())     -- rank 1 prints
--     end
--   end)
--
--   mpirun -np 2 remat train.lua
--
-- Ranks are 1-based like every index of the Lua API: dist.rank() is 1..world_size(),
-- rank 1 is the main rank (it broadcasts the initial parameters, prints, saves).
--
-- The library never prints or exits on its own. dist.run(fn) is the launcher side: it
-- runs fn, and when fn raises an error it prints "[rank r/W] <error>" to stderr, tells
-- the other ranks (each of them fails in its next collective with "rank r failed:
-- <error>", prints it, and stops in turn) and ends the job with MPI_Abort. Without
-- dist.run an error still ends the job: the failing rank's process ends, and a rank
-- waiting for it in a collective fails after a few seconds ("rank r ended while ...").
-- A collective that waits longer than the timeout (dist.init{timeout = s}, default
-- 600 s) fails with an error naming it. After any such error the job must end: MPI
-- cannot cancel a collective that started.
local remat = package.loaded.remat
local C = remat._C
local dist = {}
remat.dist = dist

local fail = remat._fail

local is_tensor = remat.is_tensor
local function numel(t) local n = 1 for _, d in ipairs((C.info(t))) do n = n * d end return n end

local S = { inited = false, rank = 1, size = 1, local_rank = 1, backend = "none" }

---------------------------------------------------------------- the world ----

-- dist.init([opts]) -> dist. opts.timeout: seconds a collective may wait for the other
-- ranks before failing (default 600; 0: no limit). Reads the world from the MPI
-- environment when started by mpirun (loading libremat_mpi.so), else it is one process.
-- Calling it again only changes the timeout. The other functions call it when needed.
function dist.init(opts)
  opts = opts or {}
  if type(opts) ~= "table" then fail("dist.init: options must be a table, got " .. type(opts)) end
  for k in pairs(opts) do
    if k ~= "timeout" then fail(("dist.init: unknown option '%s' (timeout)"):format(tostring(k))) end
  end
  if opts.timeout ~= nil and (type(opts.timeout) ~= "number" or opts.timeout < 0) then
    fail("dist.init: timeout must be a number of seconds >= 0, got " .. tostring(opts.timeout))
  end
  S.rank, S.size, S.local_rank, S.backend = C.dist_init(opts.timeout)
  S.inited = true
  return dist
end

local function ensure() if not S.inited then dist.init() end end

-- dist.rank() -> 1..world_size() (1-based; rank 1 is the main rank).
function dist.rank() ensure() return S.rank end
-- dist.world_size() -> the number of processes in the job (1 without mpirun).
function dist.world_size() ensure() return S.size end
-- dist.local_rank() -> 1-based rank among the processes on this machine (pick a GPU).
function dist.local_rank() ensure() return S.local_rank end
-- dist.backend() -> "mpi" or "none" (one process).
function dist.backend() ensure() return S.backend end
-- dist.is_main() -> whether this is rank 1 (the one that prints and saves by default).
function dist.is_main() return dist.rank() == 1 end

-- dist.print(...): print on rank 1 only (dist.print_all prints on every rank, prefixed).
function dist.print(...) if dist.is_main() then print(...) end end
function dist.print_all(...)
  local parts = table.pack(...)
  for i = 1, parts.n do parts[i] = tostring(parts[i]) end
  io.stdout:write(("[rank %d/%d] %s\n"):format(dist.rank(), dist.world_size(), table.concat(parts, "\t", 1, parts.n)))
  io.stdout:flush()
end

-- dist.set_timeout(seconds): how long a collective may wait (0: no limit).
function dist.set_timeout(s)
  if type(s) ~= "number" or s < 0 then fail("dist.set_timeout: expected seconds >= 0, got " .. tostring(s)) end
  C.dist_set_timeout(s)
end

-- dist.stats() -> { bytes =, calls = }: payload this rank passed to collectives since
-- the last dist.reset_stats() (a gradient bucket counts its size once).
function dist.stats()
  local bytes, calls = C.dist_stats()
  return { bytes = bytes, calls = calls }
end
function dist.reset_stats() C.dist_reset_stats() end

-- dist.finalize(): ends this rank's part of the job (waits up to the timeout for the
-- other ranks to end too). Closing the Lua state does it too.
function dist.finalize()
  C.dist_finalize()
  S.inited, S.rank, S.size, S.local_rank, S.backend = false, 1, 1, 1, "none"
end

---------------------------------------------------------------- collectives ----

local function check(fn, t)
  if not is_tensor(t) then fail(("%s: expected a tensor, got %s"):format(fn, type(t))) end
  if C.is_freed(t) then fail(fn .. ": the tensor was freed") end
  ensure()
end

-- dist.barrier(): waits until every rank has reached it.
function dist.barrier() ensure() C.dist_barrier() end

-- dist.allreduce(t[, op]) -> t: replaces t (contiguous, in place) with the elementwise
-- "sum" (default), "mean" or "max" over every rank's t.
function dist.allreduce(t, op)
  check("dist.allreduce", t)
  return C.dist_allreduce(t, op or "sum")
end

-- dist.broadcast(t[, root = 1]) -> t: every rank's t (contiguous, in place) receives
-- rank root's values.
function dist.broadcast(t, root)
  check("dist.broadcast", t)
  return C.dist_broadcast(t, root or 1)
end

-- dist.all_gather(t[, {list = true}]) -> a new tensor: every rank's t concatenated
-- along the first dimension in rank order (shape {W * n1, n2, ...}; a 0-d t gives
-- {W}). Every rank must pass the same shape. With list = true: a list of W tensors
-- (rank order), each of t's shape.
function dist.all_gather(t, opts)
  check("dist.all_gather", t)
  local all = C.dist_all_gather(t)
  if not (opts and opts.list) then return all end
  local shape = C.info(t)
  local n, out = #shape == 0 and 1 or shape[1], {}
  for r = 1, S.size do
    local piece = C.op(C.ops.narrow, { dim = 0, start = (r - 1) * n, length = n }, all)
    out[r] = #shape == 0 and C.op(C.ops.view, { shape = {} }, piece) or piece
  end
  C.free(all)
  return out
end

---------------------------------------------------------------- launcher side ----

-- dist.run(fn, ...) -> fn's results. Runs fn; on an error prints it on stderr with the
-- rank, makes every other rank fail with it (they print it too) and ends the job
-- (MPI_Abort, exit code 1). In one process it re-raises the error instead. This is
-- where printing and exiting happen; the rest of remat.dist never does either.
function dist.run(fn, ...)
  if type(fn) ~= "function" then fail("dist.run: expected a function, got " .. type(fn)) end
  local trace
  local function handler(e)
    trace = debug.traceback(tostring(e), 2)
    return e
  end
  local res = table.pack(xpcall(fn, handler, ...))
  if res[1] then return table.unpack(res, 2, res.n) end
  if S.inited and S.size > 1 then
    io.stderr:write(("[rank %d/%d] error: %s\n"):format(S.rank, S.size, trace))
    io.stderr:flush()
    C.dist_abort(tostring(res[2]):match("^[^\n]*"), 2.0)
  end
  error(res[2], 0)
end

---------------------------------------------------------------- data parallelism ----

local DP = {}
local DP_mt = {}

local function human(b) return remat.memory.format(b) end

-- dist.DataParallel(model[, opts]) -> wrapped model (dist.wrap is the same).
-- opts.bucket: bucket size (bytes or "4MiB"; default a quarter of the gradients,
-- clamped to 256 KiB .. 25 MiB); opts.broadcast (default true): copy rank 1's
-- parameters to every rank now. The wrapper calls like the model and forwards its
-- methods (checkpoint, plan, parameters, state_dict, ...). As PyTorch's DDP, when
-- loss:backward() returns each rank holds the average of every rank's gradients (the
-- reducer subscribes to the end of backward). Checkpoint policies compose: each rank
-- plans its own memory. In one process it is the model itself.
function dist.DataParallel(model, opts)
  local fn = "dist.DataParallel"
  opts = opts or {}
  if type(opts) ~= "table" then fail(fn .. ": options must be a table, got " .. type(opts)) end
  for k in pairs(opts) do
    if k ~= "bucket" and k ~= "broadcast" then fail(("%s: unknown option '%s' (bucket, broadcast)"):format(fn, tostring(k))) end
  end
  if model == nil or (type(model) ~= "table" and type(model) ~= "userdata") or not model.parameters then
    fail(fn .. ": expected a model (with :parameters()), got " .. type(model))
  end
  ensure()
  local params = model:parameters()
  for _, p in ipairs(params) do
    local o = remat.optim.owner_of(p)
    if o and o.in_backward then
      fail(fn .. ": the model's parameters have an optimizer with in_backward = true, which would update them "
        .. "before their gradients are averaged across ranks; use an ordinary optimizer")
    end
  end
  local total = 0
  for _, p in ipairs(params) do
    local shape, dtype = C.info(p)
    local n = 1
    for _, s in ipairs(shape) do n = n * s end
    total = total + n * (dtype == "float64" and 8 or (dtype == "float32" and 4 or 2))
  end
  local cap = opts.bucket
  if cap == nil then
    cap = math.max(256 * 1024, math.min(25 * 1024 * 1024, total // 4))
  else
    cap = C.parse_bytes(cap)
    if not cap or cap < 1 then fail(fn .. ": bucket must be a size such as 4MiB or a number of bytes, got " .. tostring(opts.bucket)) end
  end
  local self = setmetatable({ module = model, grad_bytes = total, bucket_bytes = cap }, DP_mt)
  if S.size > 1 then
    if opts.broadcast ~= false then
      for _, p in ipairs(params) do C.dist_broadcast(p, 1) end
    end
    self.reducer = C.dist_reducer(params, cap)
  end
  return self
end
dist.wrap = dist.DataParallel

DP_mt.__index = function(self, k)
  local v = DP[k]
  if v ~= nil then return v end
  local m = rawget(self, "module")
  local mv = m[k]
  if type(mv) == "function" then
    return function(s, ...)
      if s == self then s = m end
      local r = table.pack(mv(s, ...))
      if r.n == 1 and r[1] == m then return self end   -- chaining returns the wrapper
      return table.unpack(r, 1, r.n)
    end
  end
  return mv
end
DP_mt.__call = function(self, ...) return self.module(...) end
DP_mt.__len = function(self) return #self.module end
DP_mt.__tostring = function(self)
  return ("DataParallel(%d ranks, buckets of %s)\n%s"):format(S.size, human(self.bucket_bytes), tostring(self.module))
end

-- dp:sync(): reduces what backward passes run inside no_sync left unreduced (when no
-- backward follows them); otherwise nothing: backward already averaged the gradients.
function DP:sync()
  if self.reducer then C.dist_reducer_sync(self.reducer) end
  return self
end

-- dp:backward(loss): loss:backward() (which reduces the gradients).
function DP:backward(loss)
  loss:backward()
  return self
end

-- dp:no_sync(fn, ...): runs fn (forward and backward passes whose gradients accumulate
-- locally); the next backward outside reduces the accumulated sum.
function DP:no_sync(fn, ...)
  if not self.reducer then return fn(...) end
  C.dist_reducer_arm(self.reducer, false)
  local res = table.pack(pcall(fn, ...))
  C.dist_reducer_arm(self.reducer, true)
  if not res[1] then error(res[2], 0) end
  return table.unpack(res, 2, res.n)
end

-- dp:info() -> { world =, grad_bytes =, buckets = { {bytes =, params =}, ... } }
function DP:info()
  local info = self.reducer and C.dist_reducer_info(self.reducer) or { buckets = {}, bytes = 0 }
  info.world, info.grad_bytes = S.size, self.grad_bytes
  return info
end

-- dp:close(): unhooks the reducer from backward and frees its buffers (a context has
-- one DataParallel at a time).
function DP:close()
  if self.reducer then C.dist_reducer_close(self.reducer) end
  self.reducer = nil
end

---------------------------------------------------------------- ZeRO stage 1 ----

-- dist.ShardedAdamW(params[, opts]) -> an optim.AdamW (same options, semantics and
-- hyperparameters: lr may be changed, schedulers work) whose state is sharded: the
-- parameters are laid end to end (in list order) and split into world_size equal
-- element ranges; rank r keeps Adam's m and v for range r only (memory category optim
-- falls by the world size), updates that range, and the updated ranges are gathered
-- (one all_gather of a flat buffer). It expects the gradients every rank holds to be
-- equal (after dp:sync()). All parameters must share one dtype and device.
-- opt:memory() -> { bytes = this rank's state, full = unsharded state, world = W };
-- opt:memory_report() -> a line saying so.
function dist.ShardedAdamW(params, opts)
  local fn = "dist.ShardedAdamW"
  local opt = remat.optim.AdamW(params, opts)
  ensure()
  local W, r = S.size, S.rank
  local dtype, device
  local layout, total = {}, 0
  for i, p in ipairs(opt.params) do
    local shape, dt, dev = C.info(p)
    if dtype and (dt ~= dtype or dev ~= device) then
      fail(("%s: parameter %d is %s on %s, the first is %s on %s (one dtype and device)"):format(fn, i, dt, dev, dtype, device))
    end
    dtype, device = dt, dev
    local n = 1
    for _, s in ipairs(shape) do n = n * s end
    layout[i] = { off = total, n = n }
    total = total + n
  end
  local chunk = (total + W - 1) // W
  local lo, hi = (r - 1) * chunk, math.min(r * chunk, total)
  local elsize = dtype == "float64" and 8 or 4
  opt.shard = { lo = lo, hi = hi, chunk = chunk, total = total, world = W, rank = r }
  -- the pieces of this rank's range: parameter i's elements [a, a + n)
  local pieces = {}
  for i, l in ipairs(layout) do
    local a, b = math.max(lo, l.off), math.min(hi, l.off + l.n)
    if b > a then pieces[#pieces + 1] = { i = i, a = a - l.off, n = b - a, pos = a - lo } end
  end
  opt.pieces = pieces

  -- Views without history, each freed at once by the caller: a view left to the
  -- collector would keep a dropped gradient's memory alive.
  local function slice(t, a, n) return C.op(C.ops.narrow, { dim = 0, start = a, length = n }, t) end
  local function flat(t, n, a, len)
    local d = C.detach(t)
    local v = C.op(C.ops.view, { shape = { n } }, d)
    C.free(d)
    if not a then return v end
    local s = slice(v, a, len)
    C.free(v)
    return s
  end
  local function zeros(n)
    return C.scoped("optim", nil, C.full, { n }, 0, dtype, device)
  end

  function opt.step(s)
    s:check()
    s.steps = s.steps + 1
    for k, pc in ipairs(pieces) do
      local p = s.params[pc.i]
      local g = C.grad(p)
      if g then
        local st = s.state[k]
        if not st then
          st = { step = 0, exp_avg = zeros(pc.n), exp_avg_sq = zeros(pc.n) }
          s.state[k] = st
        end
        st.step = st.step + 1
        local gc = C.is_contiguous(g) and g or C.op(C.ops.copy, nil, g)
        local pv, gv = flat(p, layout[pc.i].n, pc.a, pc.n), flat(gc, layout[pc.i].n, pc.a, pc.n)
        C.op_into(C.ops.adamw_step, { lr = s.lr, beta1 = s.betas[1], beta2 = s.betas[2], eps = s.eps, step = st.step, decoupled = true, weight_decay = s.weight_decay }, { pv, gv, st.exp_avg, st.exp_avg_sq }, { pv, st.exp_avg, st.exp_avg_sq })
        C.free(pv); C.free(gv)
        if not rawequal(gc, g) then C.free(gc) end
        C.free(g)
      end
    end
    if W == 1 then return end
    -- gather: this rank's range into a flat buffer, all ranges to every rank
    local ok, err = pcall(C.scoped, "temp", nil, function()
      local send = C.full({ chunk }, 0, dtype, device)
      for _, pc in ipairs(pieces) do
        local src = flat(s.params[pc.i], layout[pc.i].n, pc.a, pc.n)
        local dst = slice(send, pc.pos, pc.n)
        C.copy_into(dst, src)
        C.free(src); C.free(dst)
      end
      local all = C.dist_all_gather(send)
      C.free(send)
      for i, l in ipairs(layout) do
        local dst = flat(s.params[i], l.n)
        local src = slice(all, l.off, l.n)
        C.copy_into(dst, src)
        C.free(dst); C.free(src)
      end
      C.free(all)
    end)
    if not ok then error(err, 0) end
  end

  function opt.memory(s)
    local bytes = 0
    for _, st in pairs(s.state) do
      for _, v in pairs(st) do
        if is_tensor(v) then bytes = bytes + numel(v) * elsize end
      end
    end
    return { bytes = bytes, full = 2 * total * elsize, world = W }
  end

  function opt.memory_report(s)
    local m = s:memory()
    return ("optimizer state (AdamW m, v): %s on rank %d, %s unsharded: sharded over %d ranks (1/%d each)"):format(
      human(m.bytes), r, human(m.full), W, W)
  end

  local function unsupported() fail(fn .. ": state_dict/load_state_dict of a sharded optimizer are not supported yet") end
  opt.state_dict, opt.load_state_dict = unsupported, unsupported
  opt.sharded = true
  return opt
end

return dist
