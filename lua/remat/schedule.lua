-- remat.optim.schedule: learning-rate schedules, and optim.scheduler, which applies one
-- to an optimizer.
--
--   local lr = optim.schedule.warmup(100, optim.schedule.cosine { base = 3e-3, total = 900 })
--   local sched = optim.scheduler(opt, lr)
--   for step = 1, 1000 do sched:step(); ...; opt:step() end
--
-- A schedule is a plain function lr(step) -> learning rate, steps counting from 1 (the
-- first update uses lr(1)). Each constructor checks its options and rejects unknown ones.
local remat = package.loaded.remat
local optim = remat.optim
local fail = remat._fail

local schedule = {}
optim.schedule = schedule

local function describe(v)
  if remat.is_tensor(v) then return "a tensor" end
  if v == nil then return "nothing" end
  return type(v) .. " " .. tostring(v)
end

-- Reads the options table o of schedule `name`: spec maps each option to
-- "rate" (a number >= 0), "count" (an integer >= 1), "factor" (a number > 0) or, with a
-- trailing "?", the same but optional. Returns o.
local function options(name, o, spec)
  local fn = "optim.schedule." .. name
  local keys = {}
  for k in pairs(spec) do keys[#keys + 1] = k end
  table.sort(keys)
  local known = table.concat(keys, ", ")
  if type(o) ~= "table" then fail(("%s: expected a table of options (%s), got %s"):format(fn, known, describe(o))) end
  for k in pairs(o) do
    if not spec[k] then fail(("%s: unknown option '%s' (%s)"):format(fn, tostring(k), known)) end
  end
  for _, k in ipairs(keys) do
    local kind, optional = spec[k]:match("^(%a+)(%??)$")
    local v = o[k]
    if v == nil then
      if optional == "" then fail(("%s: option %s is required"):format(fn, k)) end
    elseif kind == "rate" then
      if type(v) ~= "number" or not (v >= 0 and v < math.huge) then
        fail(("%s: %s must be a learning rate >= 0, got %s"):format(fn, k, describe(v)))
      end
    elseif kind == "count" then
      if math.type(v) == "float" then v = math.tointeger(v) or v end
      if math.type(v) ~= "integer" or v < 1 then
        fail(("%s: %s must be an integer >= 1, got %s"):format(fn, k, describe(o[k])))
      end
    elseif kind == "factor" then
      if type(v) ~= "number" or not (v > 0 and v < math.huge) then
        fail(("%s: %s must be a number > 0, got %s"):format(fn, k, describe(v)))
      end
    end
  end
  return o
end

local function check_step(step)
  if type(step) ~= "number" or step ~= step then fail("schedule: step must be a number, got " .. describe(step)) end
end

-- schedule.constant(lr) -> lr(step) = lr.
function schedule.constant(lr)
  if type(lr) ~= "number" or not (lr >= 0) then
    fail("optim.schedule.constant: lr must be a number >= 0, got " .. describe(lr))
  end
  return function() return lr end
end

-- schedule.step{base = lr, step_size = S, gamma = 0.1} -> lr(step) = base * gamma^k,
-- k = floor((step - 1) / S): base for steps 1..S, base * gamma for S+1..2S, and so on
-- (PyTorch's StepLR, stepped once per step).
function schedule.step(o)
  options("step", o, { base = "rate", step_size = "count", gamma = "rate?" })
  local base, size, gamma = o.base, math.tointeger(o.step_size), o.gamma or 0.1
  return function(step)
    check_step(step)
    return base * gamma ^ (math.max(step - 1, 0) // size)
  end
end

-- Where step lies between 1 (0) and total (1), clamped.
local function progress(step, total)
  if total <= 1 then return step >= 1 and 1 or 0 end
  return math.min(math.max((step - 1) / (total - 1), 0), 1)
end

-- schedule.cosine{base = lr, total = N, min = 0} -> lr(step): a half cosine from base at
-- step 1 down to min at step N; steps past N stay at min.
function schedule.cosine(o)
  options("cosine", o, { base = "rate", total = "count", min = "rate?" })
  local base, total, min = o.base, math.tointeger(o.total), o.min or 0
  if min > base then fail(("optim.schedule.cosine: min (%s) is above base (%s)"):format(min, base)) end
  return function(step)
    check_step(step)
    return min + (base - min) * 0.5 * (1 + math.cos(math.pi * progress(step, total)))
  end
end

-- schedule.linear{base = lr, total = N, min = 0} -> lr(step): a straight line from base at
-- step 1 down to min at step N; steps past N stay at min.
function schedule.linear(o)
  options("linear", o, { base = "rate", total = "count", min = "rate?" })
  local base, total, min = o.base, math.tointeger(o.total), o.min or 0
  if min > base then fail(("optim.schedule.linear: min (%s) is above base (%s)"):format(min, base)) end
  return function(step)
    check_step(step)
    return base + (min - base) * progress(step, total)
  end
end

-- schedule.warmup(W, lr) -> a schedule that rises linearly from lr(1) / W at step 1 to
-- lr(1) at step W, then follows lr from its own step 1: warmup(W, lr)(W + k) = lr(k).
-- W = 0 gives lr itself.
function schedule.warmup(steps, lr)
  local fn = "optim.schedule.warmup"
  if math.type(steps) == "float" then steps = math.tointeger(steps) or steps end
  if math.type(steps) ~= "integer" or steps < 0 then
    fail(fn .. ": the warmup length must be an integer >= 0, got " .. describe(steps))
  end
  if type(lr) ~= "function" then fail(fn .. ": expected a schedule function as the second argument, got " .. describe(lr)) end
  if steps == 0 then return lr end
  local peak
  return function(step)
    check_step(step)
    if step <= steps then
      peak = peak or lr(1)
      return peak * math.max(step, 1) / steps
    end
    return lr(step - steps)
  end
end

-- schedule.warmup_cosine{warmup = W, total = N, base = lr, min = 0} -> lr(step): rises
-- linearly from base/W at step 1 to base at step W, then follows a half cosine from
-- base at step W (phase 0) down to min at step N; steps past N stay at min.
function schedule.warmup_cosine(o)
  local fn = "optim.schedule.warmup_cosine"
  if type(o) ~= "table" then fail(fn .. ": expected {warmup =, total =, base =, min =}, got " .. describe(o)) end
  for k in pairs(o) do
    if k ~= "warmup" and k ~= "total" and k ~= "base" and k ~= "min" then
      fail(("%s: unknown option '%s' (warmup, total, base, min)"):format(fn, tostring(k)))
    end
  end
  local warmup, total = o.warmup or 0, o.total
  local base, min = o.base, o.min or 0
  if type(warmup) ~= "number" or not math.tointeger(warmup) or warmup < 0 then
    fail(fn .. ": warmup must be an integer >= 0, got " .. describe(o.warmup))
  end
  if type(total) ~= "number" or not math.tointeger(total) or total < 1 then
    fail(fn .. ": total must be an integer >= 1, got " .. describe(total))
  end
  if warmup > total then fail(("%s: warmup (%d) is longer than total (%d)"):format(fn, warmup, total)) end
  if type(base) ~= "number" or not (base >= 0) then fail(fn .. ": base must be a learning rate >= 0, got " .. describe(base)) end
  if type(min) ~= "number" or not (min >= 0 and min <= base) then
    fail(fn .. ": min must be a number in [0, base], got " .. describe(o.min))
  end
  return function(step)
    check_step(step)
    if warmup > 0 and step <= warmup then return base * math.max(step, 1) / warmup end
    if step >= total then return min end
    local t = (step - warmup) / (total - warmup)
    return min + (base - min) * 0.5 * (1 + math.cos(math.pi * t))
  end
end

-- optim.scheduler(opt, lr) -> a scheduler s: s:step() sets opt.lr = lr(k) for its k-th
-- call (call it before each opt:step(): the first update uses lr(1)) and returns it;
-- s:lr() is opt.lr; s.k counts the calls so far (a checkpoint saves and restores it).
function optim.scheduler(opt, fn)
  if getmetatable(opt) ~= optim.Optimizer then fail("optim.scheduler: expected an optimizer, got " .. describe(opt)) end
  if type(fn) ~= "function" then fail("optim.scheduler: expected a schedule function, got " .. describe(fn)) end
  local s = { k = 0 }
  function s.step()
    s.k = s.k + 1
    opt.lr = fn(s.k)
    return opt.lr
  end
  function s.lr() return opt.lr end
  return s
end

return schedule
