-- remat.train: training loops that share a frame with a host.
--
-- A stepper runs a training loop as a coroutine that yields between steps (and between
-- micro-batches), so a host's frame loop can give it a slice of each frame:
--
--   local s = remat.train.stepper{ model = model, optimizer = opt,
--     data = function() return x, y end, loss = nn.cross_entropy, steps = 1000, budget_ms = 8 }
--   -- each frame:   local r = s:run_for(8)    -- r.steps, r.ms, r.loss, r.done
--   -- or:           local loss = s:step()     -- one whole step, now
--   -- or:           s:resume()                -- one unit; "step", loss | "micro" | nil (done)
--
-- From C, rm_lua_slice(L, ctx, idx, budget_ms, &slice) calls run_for under lua_pcall.
-- remat.log(...) writes through the host's log callback (core/remat.h).
local remat = package.loaded.remat
local C = remat._C
local train = {}
remat.train = train

local now = C.now

local fail = remat._fail
local is_tensor = remat.is_tensor

local function callable(v)
  if type(v) == "function" then return true end
  local mt = getmetatable(v)
  return type(mt) == "table" and mt.__call ~= nil
end

local LEVELS = { info = 0, warn = 1, error = 2 }

-- remat.log(...): the arguments, tostring'ed and tab-separated as print does, to the
-- host's log callback (level info); remat.log.warn(...), remat.log.error(...) likewise.
-- Without a host (a stock lua5.4, the remat command) they go to stderr as
-- "[remat info] ..."; a host's context logs to its callback, or nowhere without one.
local log = setmetatable({}, { __call = function(_, ...) return train._log(0, ...) end })
function train._log(level, ...)
  local n = select("#", ...)
  local parts = {}
  for i = 1, n do parts[i] = tostring((select(i, ...))) end
  C.log(level, table.concat(parts, "\t"))
end
function log.warn(...) return train._log(LEVELS.warn, ...) end
function log.error(...) return train._log(LEVELS.error, ...) end
function log.enabled() return C.has_log() end
remat.log = log

local Stepper = {}
Stepper.__index = Stepper
train.Stepper = Stepper

-- A batch source from opts.data: a function returning x, y (nil when it has no more),
-- or a remat.data dataset, cycled epoch after epoch (opts.epochs limits them) in
-- batches of opts.batch_size. Returns next() and whether the batches are the
-- stepper's to free (a dataset's are new tensors; a function's belong to its author).
local function batch_source(fn, o)
  local d = o.data
  if callable(d) then return d, false end
  if type(d) == "table" and getmetatable(d) == remat.data.Dataset then
    local bs = o.batch_size or 64
    if math.type(bs) ~= "integer" or bs < 1 then
      fail(("%s: batch_size must be a positive integer, got %s"):format(fn, tostring(bs)))
    end
    local epochs = o.epochs
    if epochs ~= nil and (math.type(epochs) ~= "integer" or epochs < 1) then
      fail(("%s: epochs must be a positive integer, got %s"):format(fn, tostring(epochs)))
    end
    local epoch, it = 0, nil
    return function()
      while true do
        if it then
          local x, y = it()
          if x ~= nil then return x, y end
        end
        if epochs and epoch >= epochs then return nil end
        epoch = epoch + 1
        it = d:batches(bs, { shuffle = o.shuffle ~= false, drop_last = true })
      end
    end, true
  end
  fail(("%s: data must be a function returning x, y or a remat.data dataset, got %s"):format(fn, type(d)))
end

local function free_tensor(t, keep1, keep2)
  if is_tensor(t) and not rawequal(t, keep1) and not rawequal(t, keep2) and not C.is_freed(t) then t:free() end
end

-- The standard loop: forward, loss, backward per micro-batch; optimizer step; zero grads.
local function standard_loop(fn, o)
  local model, opt = o.model, o.optimizer
  if not callable(model) then fail(fn .. ": model must be a module (or a function x -> y_hat), got " .. type(model)) end
  local opt_fn
  if callable(opt) and type(opt) == "function" then
    opt_fn = opt
  elseif type(opt) == "table" and type(opt.step) == "function" then
    opt_fn = nil
  else
    fail(fn .. ": optimizer must be an optimizer (with :step()) or a function(model), got " .. type(opt))
  end
  local loss_fn = o.loss or remat.nn.cross_entropy
  if not callable(loss_fn) then fail(fn .. ": loss must be a function(y_hat, y) -> loss tensor, got " .. type(loss_fn)) end
  local mb = o.micro_batches or 1
  if math.type(mb) ~= "integer" or mb < 1 then
    fail(("%s: micro_batches must be a positive integer, got %s"):format(fn, tostring(mb)))
  end
  if mb > 1 and type(opt) == "table" and opt.in_backward then
    fail(fn .. ": micro_batches (gradient accumulation) needs every micro-batch's gradient before the update; "
      .. "an optimizer with in_backward = true updates during each backward")
  end
  local next_batch, owned = batch_source(fn, o)

  local function zero()
    if opt_fn == nil and type(opt.zero_grad) == "function" then opt:zero_grad()
    elseif type(model) ~= "function" then model:zero_grad() end
  end

  return function(yield)
    while true do
      local total = 0
      for m = 1, mb do
        local x, y = next_batch()
        if x == nil then
          if m > 1 then zero() end -- an incomplete accumulation is dropped, not applied
          return
        end
        local y_hat = model(x)
        local l = loss_fn(y_hat, y)
        if not is_tensor(l) then fail(fn .. ": loss returned " .. type(l) .. ", not a tensor") end
        if mb > 1 then
          local scaled = l / mb
          scaled:backward()
          scaled:free()
        else
          l:backward()
        end
        total = total + l:item()
        free_tensor(l, x, y)
        free_tensor(y_hat, x, y)
        if owned then free_tensor(x); free_tensor(y) end
        if m < mb then yield() end
      end
      if opt_fn then opt_fn(model) else opt:step() end
      zero()
      yield(total / mb)
    end
  end
end

-- remat.train.stepper(opts | loop) -> stepper.
-- opts: model (module), optimizer (with :step() and :zero_grad(), or a function(model)
-- that updates parameters from their .grad), data (function returning x, y, nil when
-- done; or a dataset with batch_size [64], epochs [forever], shuffle [true]), loss
-- (function(y_hat, y) -> scalar tensor; default nn.cross_entropy), steps (stop after
-- this many; default: until data runs out), micro_batches (gradient accumulation,
-- a yield between each; default 1), budget_ms (run_for's default; default 8).
-- clock (a function returning seconds, default remat.now: a host may pass its own).
-- loop: a function(yield) running any training loop; it calls yield(loss) after each
-- step (loss: a number) and may call yield() between the parts of a step. Given as
-- stepper(loop) or stepper{ loop = loop, steps =, budget_ms =, clock = }.
function train.stepper(o)
  local fn = "remat.train.stepper"
  local body, opts
  if type(o) == "function" then
    body, opts = o, {}
  elseif type(o) == "table" and o.loop ~= nil then
    if type(o.loop) ~= "function" then fail(fn .. ": loop must be a function(yield), got " .. type(o.loop)) end
    body, opts = o.loop, o
  elseif type(o) == "table" then
    opts = o
    body = standard_loop(fn, o)
  else
    fail(fn .. ": expected a table of options or a loop function(yield), got " .. type(o))
  end
  local clock = opts.clock or now
  if not callable(clock) then fail(fn .. ": clock must be a function returning seconds, got " .. type(clock)) end
  local steps = opts.steps
  if steps ~= nil and (math.type(steps) ~= "integer" or steps < 0) then
    fail(("%s: steps must be a non-negative integer, got %s"):format(fn, tostring(steps)))
  end
  local budget = opts.budget_ms or 8
  if type(budget) ~= "number" or not (budget >= 0) then
    fail(("%s: budget_ms must be a number >= 0, got %s"):format(fn, tostring(budget)))
  end
  local s = setmetatable({
    steps = 0,          -- optimizer steps completed
    units = 0,          -- resumes that ran (steps and micro-batches)
    loss = nil,         -- loss of the last completed step
    time = 0,           -- seconds spent inside the loop
    unit_ms = nil,      -- moving average of one unit's time, to stop before a budget
    max_ms = 0,         -- the longest unit so far
    budget_ms = budget,
    max_steps = steps,
    clock = clock,
    done = steps == 0,
    error = nil,        -- the error (with the loop's traceback) that ended it
  }, Stepper)
  s.thread = coroutine.create(function()
    body(coroutine.yield)
  end)
  return s
end

-- The stepper's clock, checked: a number of seconds that never runs backwards (a
-- clock that does would keep run_for from ever reaching its deadline).
local function read_clock(self)
  local t = self.clock()
  if type(t) ~= "number" or t ~= t or t == math.huge or t == -math.huge then
    fail("remat.train.stepper: the clock returned " .. tostring(t) .. ", not a finite number of seconds")
  end
  if self.last_clock and t < self.last_clock then
    fail(("remat.train.stepper: the clock ran backwards (%.17g after %.17g)"):format(t, self.last_clock))
  end
  self.last_clock = t
  return t
end

local function finish(self)
  self.done = true
  coroutine.close(self.thread) -- releases what the loop held (its tensors can be collected)
end

-- s:resume() -> "step", loss | "micro" | nil (finished). Runs one unit of the loop.
-- An error in the loop ends the stepper and is raised here (and by every later call).
function Stepper:resume()
  if self.error then error(self.error, 0) end
  if self.done then return nil end
  local t0 = read_clock(self)
  -- grad mode belongs to the loop: it runs with its own (the host's at the first
  -- resume) and the host gets its own back, even when the loop yields inside no_grad
  local host_grad = C.grad_enabled()
  if self.grad_mode ~= nil then C.grad_enabled(self.grad_mode) end
  local ok, v = coroutine.resume(self.thread)
  self.grad_mode = C.grad_enabled(host_grad)
  local dt = read_clock(self) - t0
  self.time = self.time + dt
  if not ok then
    self.error = debug.traceback(self.thread, tostring(v))
    finish(self)
    error(self.error, 0)
  end
  if coroutine.status(self.thread) == "dead" then
    self.done = true
    return nil
  end
  local ms = dt * 1000
  self.units = self.units + 1
  self.unit_ms = self.unit_ms and 0.7 * self.unit_ms + 0.3 * ms or ms
  if ms > self.max_ms then self.max_ms = ms end
  if v == nil then return "micro" end
  if type(v) ~= "number" then
    self.error = "remat.train: the loop yielded " .. type(v) .. " (yield(loss) takes the loss as a number)"
    finish(self)
    error(self.error, 0)
  end
  self.steps = self.steps + 1
  self.loss = v
  if self.max_steps and self.steps >= self.max_steps then finish(self) end
  return "step", v
end

-- s:step() -> loss of one whole step (all its micro-batches), or nil when finished.
function Stepper:step()
  while true do
    local kind, loss = self:resume()
    if kind ~= "micro" then return loss end
  end
end

-- s:run_for([ms = budget_ms]) -> report { steps, units, ms, loss, total, done, over }.
-- Runs at least one unit, then more while the next one (by the moving average of
-- past units) should still end within ms. over: the slice took longer than ms.
function Stepper:run_for(ms)
  ms = ms or self.budget_ms
  if type(ms) ~= "number" or not (ms >= 0) then
    fail("stepper:run_for: ms must be a number >= 0, got " .. tostring(ms))
  end
  if self.error then error(self.error, 0) end
  local t0 = read_clock(self)
  local deadline = t0 + ms / 1000
  local steps, units, still, prev = 0, 0, 0, t0
  while not self.done do
    local kind = self:resume()
    if kind == nil then break end
    units = units + 1
    if kind == "step" then steps = steps + 1 end
    local t = read_clock(self)
    -- a clock that stands still cannot end the slice: give up after a few units
    still = t > prev and 0 or still + 1
    prev = t
    if t + (self.unit_ms or 0) / 1000 > deadline or still >= 16 then break end
  end
  local spent = (read_clock(self) - t0) * 1000
  return { steps = steps, units = units, ms = spent, loss = self.loss, total = self.steps,
           done = self.done, over = spent > ms }
end

-- s:mean_step_ms() -> average wall time of a step so far (nil before the first).
function Stepper:mean_step_ms()
  if self.steps == 0 then return nil end
  return self.time * 1000 / self.steps
end

function Stepper:__tostring()
  return ("remat.train.stepper: %d steps%s, %.1f ms in the loop%s"):format(
    self.steps, self.max_steps and (" of " .. self.max_steps) or "", self.time * 1000,
    self.error and ", failed" or (self.done and ", done" or ""))
end

return train
