-- Saving and loading tensors in the safetensors format (core/safetensors.c):
--   remat.save(path, model:state_dict()); model:load_state_dict(remat.load(path))
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

return true
