-- Saving and loading tensors in the safetensors format (core/safetensors.c):
--   remat.save(path, model:state_dict()); model:load_state_dict(remat.load(path))
-- and one-file training checkpoints (model, optimizer, scheduler, step and generator):
--   remat.save_checkpoint(path, { model = model, optimizer = opt, scheduler = sched, step = step })
--   local step = remat.load_checkpoint(path, { model = model, optimizer = opt, scheduler = sched })
local remat = package.loaded.remat
local C = remat._C

-- Raises msg located at the first caller outside remat's own Lua code (remat.tensor's).
local fail = remat._fail

-- remat.save(path, tensors[, metadata]): writes a flat table name -> tensor (any
-- device, dtype and strides; each stored as its logical values) and optional metadata
-- (string keys; string, number or boolean values, stored as strings) atomically.
function remat.save(path, tensors, metadata)
  if type(path) ~= "string" then fail("remat.save: the path must be a string, got " .. type(path)) end
  if type(tensors) ~= "table" then
    fail("remat.save: expected a table of tensors (name -> tensor), got " .. type(tensors))
  end
  local meta
  if metadata ~= nil then
    if type(metadata) ~= "table" then fail("remat.save: metadata must be a table, got " .. type(metadata)) end
    meta = {}
    for k, v in pairs(metadata) do
      local tv = type(v)
      if type(k) ~= "string" then fail("remat.save: metadata keys must be strings, got " .. type(k)) end
      if tv ~= "string" and tv ~= "number" and tv ~= "boolean" then
        fail(("remat.save: metadata '%s' must be a string, number or boolean, got %s"):format(k, tv))
      end
      meta[k] = tostring(v)
    end
  end
  C.save(path, tensors, meta)
end

-- remat.load(path[, opts]) -> tensors (name -> CPU tensor), metadata (key -> string),
-- dtypes (name -> dtype as stored: "F32", "BF16", ...). F16 and BF16 load as float32.
-- opts.category: memory category of the loaded tensors (default "param").
function remat.load(path, opts)
  if type(path) ~= "string" then fail("remat.load: the path must be a string, got " .. type(path)) end
  if opts ~= nil and type(opts) ~= "table" then fail("remat.load: opts must be a table, got " .. type(opts)) end
  return C.load(path, opts and opts.category)
end

---------------------------------------------------------------- training checkpoints ----

local FORMAT = "remat.checkpoint/1"

local function describe(v)
  if remat.is_tensor(v) then return "a tensor" end
  if v == nil then return "nothing" end
  return type(v) .. " " .. tostring(v)
end

-- Checks the table of objects given to save_checkpoint / load_checkpoint.
local function check_objects(fn, o, known)
  if type(o) ~= "table" then fail(("%s: expected a table {model =, optimizer =, ...}, got %s"):format(fn, describe(o))) end
  for k in pairs(o) do
    if not known[k] then
      local names = {}
      for n in pairs(known) do names[#names + 1] = n end
      table.sort(names)
      fail(("%s: unknown field '%s' (known: %s)"):format(fn, tostring(k), table.concat(names, ", ")))
    end
  end
  if o.model ~= nil and not remat.nn.is_module(o.model) then fail(fn .. ": model must be a module, got " .. describe(o.model)) end
  if o.optimizer ~= nil and getmetatable(o.optimizer) ~= remat.optim.Optimizer then
    fail(fn .. ": optimizer must be an optimizer, got " .. describe(o.optimizer))
  end
  if o.scheduler ~= nil and (type(o.scheduler) ~= "table" or math.type(o.scheduler.k) ~= "integer") then
    fail(fn .. ": scheduler must be what optim.scheduler returns, got " .. describe(o.scheduler))
  end
  if o.model == nil and o.optimizer == nil then fail(fn .. ": give at least a model or an optimizer") end
end

-- remat.save_checkpoint(path, {model =, optimizer =, scheduler =, step =, meta =}): one
-- safetensors file with everything training needs to go on as if never stopped: the
-- model's parameters ("model.<name>"), the optimizer's state ("optim.<i>.<name>") and
-- hyperparameters, the scheduler's position, the step (an integer >= 0, default the
-- optimizer's step count), the random generator's state, and meta (string keys; string,
-- number or boolean values, read back as strings). Written atomically.
function remat.save_checkpoint(path, o)
  local fn = "remat.save_checkpoint"
  if type(path) ~= "string" then fail(fn .. ": the path must be a string, got " .. describe(path)) end
  check_objects(fn, o, { model = true, optimizer = true, scheduler = true, step = true, meta = true })
  local step = o.step
  if step == nil then step = o.optimizer and o.optimizer.steps or 0 end
  if math.type(step) ~= "integer" or step < 0 then fail(fn .. ": step must be an integer >= 0, got " .. describe(step)) end
  local tensors, meta = {}, { format = FORMAT, step = tostring(step) }
  if o.meta ~= nil then
    if type(o.meta) ~= "table" then fail(fn .. ": meta must be a table, got " .. describe(o.meta)) end
    for k, v in pairs(o.meta) do
      local tv = type(v)
      if type(k) ~= "string" then fail(fn .. ": meta keys must be strings, got " .. describe(k)) end
      if tv ~= "string" and tv ~= "number" and tv ~= "boolean" then
        fail(("%s: meta '%s' must be a string, number or boolean, got %s"):format(fn, k, tv))
      end
      meta["meta." .. k] = tostring(v)
    end
  end
  if o.model then
    for name, t in pairs(o.model:state_dict()) do tensors["model." .. name] = t end
  end
  if o.optimizer then
    local ot, om = o.optimizer:state_dict()
    for k, t in pairs(ot) do tensors["optim." .. k] = t end
    for k, v in pairs(om) do meta["optim." .. k] = v end
  end
  if o.scheduler then meta["scheduler.k"] = tostring(o.scheduler.k) end
  local seed, offset = C.rng_state()
  meta.rng_seed, meta.rng_offset = tostring(seed), tostring(offset)
  C.save(path, tensors, meta)
end

-- remat.load_checkpoint(path, {model =, optimizer =, scheduler =}) -> step, meta:
-- restores what save_checkpoint wrote into the objects given (each must have been in
-- the file) and the random generator; returns the step and the user's meta (strings).
-- The model and optimizer must be built as they were (same layers, same parameter
-- order); a mismatch is an error naming it. The data order is the caller's: step says
-- where training stopped.
function remat.load_checkpoint(path, o)
  local fn = "remat.load_checkpoint"
  if type(path) ~= "string" then fail(fn .. ": the path must be a string, got " .. describe(path)) end
  check_objects(fn, o, { model = true, optimizer = true, scheduler = true })
  local tensors, meta = C.load(path, "temp")
  local function release() for _, t in pairs(tensors) do C.free(t) end end
  local ok, step, user = pcall(function()
    if meta.format ~= FORMAT then
      fail(("%s: %s is not a training checkpoint (its metadata has no format = %s)"):format(fn, path, FORMAT))
    end
    local model_sd, opt_t, opt_m, user = {}, {}, {}, {}
    for k, t in pairs(tensors) do
      local name = k:match("^model%.(.+)$")
      if name then model_sd[name] = t
      else
        local key = k:match("^optim%.(.+)$")
        if not key then fail(("%s: unexpected tensor '%s' in %s"):format(fn, k, path)) end
        opt_t[key] = t
      end
    end
    for k, v in pairs(meta) do
      local key = k:match("^optim%.(.+)$")
      if key then opt_m[key] = v end
      key = k:match("^meta%.(.+)$")
      if key then user[key] = v end
    end
    if o.optimizer and not opt_m.kind then fail(("%s: %s holds no optimizer state"):format(fn, path)) end
    if o.scheduler and not meta["scheduler.k"] then fail(("%s: %s holds no scheduler position"):format(fn, path)) end
    if o.model and next(model_sd) == nil then fail(("%s: %s holds no model"):format(fn, path)) end
    local step = math.tointeger(tonumber(meta.step))
    local seed, offset = math.tointeger(tonumber(meta.rng_seed)), math.tointeger(tonumber(meta.rng_offset))
    if not step or not seed or not offset then fail(("%s: %s has a damaged step or generator state"):format(fn, path)) end
    -- the optimizer first: a mismatch there leaves the model as it was
    if o.optimizer then o.optimizer:load_state_dict(opt_t, opt_m) end
    if o.model then o.model:load_state_dict(model_sd) end
    if o.scheduler then o.scheduler.k = math.tointeger(tonumber(meta["scheduler.k"])) end
    C.set_rng_state(seed, offset)
    return step, user
  end)
  release()
  if not ok then error(step, 0) end
  return step, user
end

return true
