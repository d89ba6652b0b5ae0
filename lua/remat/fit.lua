-- remat.train.fit and remat.train.accuracy: the epoch loop of a classifier script
-- (models/mlp.lua, models/cnn.lua), with a progress line and a metrics log.
--
--   local r = remat.train.fit{ model = model, optimizer = opt, scheduler = sched,
--     data = train_set, batch_size = 128, epochs = 2, progress = print, every = 100,
--     log = "run.jsonl" }
--   print(remat.train.accuracy(model, test_set))
--
-- The library prints nothing itself: progress is a function the caller gives (print).
local remat = package.loaded.remat
local train = remat.train
local fail = remat._fail
local fmt = remat.memory.format

local function describe(v)
  if remat.is_tensor(v) then return "a tensor" end
  if v == nil then return "nothing" end
  return type(v) .. " " .. tostring(v)
end

local KNOWN = { model = true, optimizer = true, scheduler = true, data = true, batch_size = true, epochs = true,
                input = true, loss = true, progress = true, every = true, log = true, shuffle = true,
                drop_last = true, before_step = true, after_backward = true }

local function check_fn(fn, o, key)
  if o[key] ~= nil and type(o[key]) ~= "function" then
    fail(("%s: %s must be a function, got %s"):format(fn, key, describe(o[key])))
  end
end

local function check_count(fn, o, key, default)
  local v = o[key]
  if v == nil then return default end
  if math.type(v) == "float" then v = math.tointeger(v) or v end
  if math.type(v) ~= "integer" or v < 1 then fail(("%s: %s must be an integer >= 1, got %s"):format(fn, key, describe(o[key]))) end
  return v
end

-- remat.train.fit(opts) -> { steps =, examples =, seconds =, examples_per_s =, loss = }:
-- `epochs` passes over the dataset `data` in batches of `batch_size`; per step:
-- scheduler:step() (when given), x = input(xb) (default xb), loss(model(x), yb)
-- (default nn.cross_entropy), backward, optimizer:step(), optimizer:zero_grad(); the
-- batch and what the step made are freed at once. Every `every` steps (and at the last)
-- progress(line) gets "epoch E step S/N  loss L  R ex/s  memory live .. peak ..  lr ..
-- ETA .. s" (loss: the mean since the last line). log: a path or a remat.train.metrics
-- log; one record per step (step, epoch, loss, lr, examples_per_s and memory); a path's
-- log is closed at the end. before_step(step) and after_backward(step, loss) are called
-- around each step. shuffle (default true) and drop_last (default true) go to
-- ds:batches. loss is the mean loss of the last progress interval.
function train.fit(o)
  local fn = "remat.train.fit"
  if type(o) ~= "table" then fail(fn .. ": expected a table of options, got " .. describe(o)) end
  for k in pairs(o) do
    if not KNOWN[k] then
      local names = {}
      for n in pairs(KNOWN) do names[#names + 1] = n end
      table.sort(names)
      fail(("%s: unknown option '%s' (known: %s)"):format(fn, tostring(k), table.concat(names, ", ")))
    end
  end
  local model, opt, ds = o.model, o.optimizer, o.data
  if not remat.nn.is_module(model) then fail(fn .. ": model must be a module, got " .. describe(model)) end
  if getmetatable(opt) ~= remat.optim.Optimizer then fail(fn .. ": optimizer must be an optimizer, got " .. describe(opt)) end
  if getmetatable(ds) ~= remat.data.Dataset then fail(fn .. ": data must be a dataset, got " .. describe(ds)) end
  if o.scheduler ~= nil and (type(o.scheduler) ~= "table" or type(o.scheduler.step) ~= "function") then
    fail(fn .. ": scheduler must be what optim.scheduler returns, got " .. describe(o.scheduler))
  end
  for _, k in ipairs { "input", "loss", "progress", "before_step", "after_backward" } do check_fn(fn, o, k) end
  local batch = check_count(fn, o, "batch_size", 64)
  local epochs = check_count(fn, o, "epochs", 1)
  local every = check_count(fn, o, "every", 100)
  local shuffle, drop_last = o.shuffle ~= false, o.drop_last ~= false
  local log, own_log = o.log, false
  if type(log) == "string" then
    log, own_log = train.metrics(log), true
  elseif log ~= nil and getmetatable(log) ~= train.Metrics then
    fail(fn .. ": log must be a path or a remat.train.metrics log, got " .. describe(log))
  end
  local input, loss_fn, progress = o.input, o.loss or remat.nn.cross_entropy, o.progress

  local per_epoch = ds:num_batches(batch, drop_last)
  local total = per_epoch * epochs
  local step, seen, t0 = 0, 0, remat.now()
  local t_line, step_line, sum, n, last = t0, 0, 0, 0, nil
  local ok, err = pcall(function()
    for epoch = 1, epochs do
      for xb, yb in ds:batches(batch, { shuffle = shuffle, drop_last = drop_last }) do
        step = step + 1
        local t_step = remat.now()
        if o.before_step then o.before_step(step) end
        if o.scheduler then o.scheduler:step() end
        local x = input and input(xb) or xb
        local y_hat <close> = model(x)
        local loss <close> = loss_fn(y_hat, yb)
        loss:backward()
        if o.after_backward then o.after_backward(step, loss) end
        opt:step()
        opt:zero_grad()
        local l = loss:item()
        local rows = xb:size(1)
        if not rawequal(x, xb) then x:free() end
        xb:free()
        yb:free()
        seen = seen + rows
        sum, n = sum + l, n + 1
        local t = remat.now()
        if log then
          log:write { step = step, epoch = epoch, loss = l, lr = opt.lr, examples_per_s = rows / (t - t_step) }
        end
        if step % every == 0 or step == total then
          last = sum / n
          if progress then
            local m = remat.memory.stats()
            progress(("epoch %d step %4d/%d  loss %.4f  %6.0f ex/s  memory live %s peak %s  lr %.2e  ETA %.0f s"):format(
              epoch, step, total, last, (step - step_line) * batch / (t - t_line), fmt(m.live), fmt(m.peak), opt.lr,
              (total - step) * (t - t0) / step))
          end
          sum, n, t_line, step_line = 0, 0, t, step
        end
      end
    end
  end)
  if own_log then log:close() end
  if not ok then error(err, 0) end
  local seconds = remat.now() - t0
  return { steps = step, examples = seen, seconds = seconds, examples_per_s = seen / seconds,
           loss = last or (n > 0 and sum / n or nil) }
end

-- remat.train.accuracy(model, ds, [{ batch_size = 1000, input = fn }]) -> the fraction of
-- ds's examples whose argmax of model(input(x)) over dim 2 is the label; in eval mode
-- without the tape (the model's mode is restored).
function train.accuracy(model, ds, o)
  local fn = "remat.train.accuracy"
  if not remat.nn.is_module(model) then fail(fn .. ": model must be a module, got " .. describe(model)) end
  if getmetatable(ds) ~= remat.data.Dataset then fail(fn .. ": expected a dataset, got " .. describe(ds)) end
  o = o or {}
  if type(o) ~= "table" then fail(fn .. ": opts must be a table, got " .. describe(o)) end
  for k in pairs(o) do
    if k ~= "batch_size" and k ~= "input" then fail(("%s: unknown option '%s' (batch_size, input)"):format(fn, tostring(k))) end
  end
  local batch = check_count(fn, o, "batch_size", 1000)
  check_fn(fn, o, "input")
  local was_training = model:is_training()
  model:eval()
  local correct = 0
  local ok, err = pcall(remat.no_grad, function()
    for xb, yb in ds:batches(batch, { shuffle = false }) do
      local x = o.input and o.input(xb) or xb
      local logits <close> = model(x)
      local pred <close> = logits:argmax(2)
      local hit <close> = pred:eq(yb)
      local s <close> = hit:sum()
      correct = correct + s:item()
      if not rawequal(x, xb) then x:free() end
      xb:free()
      yb:free()
    end
  end)
  model:train(was_training)
  if not ok then error(err, 0) end
  return correct / ds.n
end

return true
