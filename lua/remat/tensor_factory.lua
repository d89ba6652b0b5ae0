-- Tensor factories: full, zeros, ones, rand, randn, zeros_like / ones_like / full_like,
-- arange and tensor (nested tables). Returns the installer: tensor.lua passes its
-- argument checks and option readers and the factories are set on `remat`.
return function(h)
  local remat = package.loaded.remat
  local C = remat._C
  local op, O = C.op, C.ops
  local DTYPE_ID, DEVICE_ID = C.dtypes, C.devices
  local MAX_DIM = C.MAX_DIM
  local fail, describe, check_tensor, is_tensor = h.fail, h.describe, h.check_tensor, h.is_tensor
  local check_sizes, read_opts, sizes_opts, finish = h.check_sizes, h.read_opts, h.sizes_opts, h.finish
  local CPU_DTYPE = h.CPU_DTYPE

  -- Converts a CPU tensor t to o.dtype / o.device (freeing t when replaced).
  local function place(t, o)
    if o.device ~= "cpu" then
      local m = C.to_device(t, o.device)
      C.free(t)
      t = m
    end
    if select(2, C.info(t)) ~= o.dtype then
      local c = op(O.cast, { dtype = DTYPE_ID[o.dtype] }, t)
      C.free(t)
      t = c
    end
    return t
  end

  function remat.full(size, value, ...)
    local fn = "remat.full"
    if type(size) == "number" then size = { size } end
    if type(size) ~= "table" then fail(fn .. ": expected a size table such as {2, 3}, got " .. describe(size)) end
    if type(value) ~= "number" then fail(fn .. ": the value must be a number, got " .. describe(value)) end
    local s = check_sizes(fn, size)
    local o = read_opts(fn, { ... }, 1, select("#", ...), {})
    return finish(C.full(s, value, o.dtype, o.device), o)
  end

  function remat.zeros(...)
    local s, o = sizes_opts("remat.zeros", ...)
    return finish(C.full(s, 0, o.dtype, o.device), o)
  end

  function remat.ones(...)
    local s, o = sizes_opts("remat.ones", ...)
    return finish(C.full(s, 1, o.dtype, o.device), o)
  end

  local function random(name)
    local id = O[name]
    return function(...)
      local s, o = sizes_opts("remat." .. name, ...)
      return finish(op(id, { dtype = DTYPE_ID[o.dtype], device = DEVICE_ID[o.device], shape = s }), o)
    end
  end
  remat.rand = random("rand")     -- uniform in [0, 1)
  remat.randn = random("randn")   -- standard normal

  function remat.zeros_like(x) check_tensor("remat.zeros_like", x) return remat.zeros(x:shape(), x:dtype(), x:device()) end
  function remat.ones_like(x) check_tensor("remat.ones_like", x) return remat.ones(x:shape(), x:dtype(), x:device()) end
  function remat.full_like(x, v) check_tensor("remat.full_like", x) return remat.full(x:shape(), v, x:dtype(), x:device()) end

  -- arange(stop), arange(start, stop[, step], opts...): start, start+step, ... up to and
  -- including stop (Torch7's range; 1-based like the rest of the API): arange(4) is 1..4,
  -- arange(0, 3) is 0..3, arange(1, 2, 0.25) is 1, 1.25, ..., 2. Float steps include stop
  -- when it is reached up to a relative 1e-9 of the step (rounding of (stop - start) / step).
  function remat.arange(...)
    local fn = "remat.arange"
    local args, n = { ... }, select("#", ...)
    local nums = 0
    while nums < n and type(args[nums + 1]) == "number" do nums = nums + 1 end
    if nums == 0 or nums > 3 then fail(fn .. ": expected (stop), (start, stop) or (start, stop, step)") end
    local start, stop, step = 1, args[1], 1
    if nums >= 2 then start, stop = args[1], args[2] end
    if nums == 3 then step = args[3] end
    if step == 0 then fail(fn .. ": the step is 0") end
    local q = (stop - start) / step
    if q ~= q or q == math.huge or q == -math.huge then fail(fn .. ": the range is not finite") end
    local count = math.max(0, math.floor(q + 1e-9) + 1)
    if count > 2 ^ 40 then fail(("%s: %.0f values is absurd"):format(fn, count)) end
    local o = read_opts(fn, args, nums + 1, n, {})
    local cpu_dtype = CPU_DTYPE[o.dtype] or "float32"
    local t = C.arange(start, step, math.tointeger(count), cpu_dtype)
    return finish(place(t, o), o)
  end

  -- Flat values and shape of nested tables; ragged or non-numeric input is an error.
  local function flatten(fn, data)
    local shape, v = {}, data
    while type(v) == "table" and not is_tensor(v) do
      shape[#shape + 1] = #v
      if #shape > MAX_DIM then fail(("%s: more than %d levels of nesting"):format(fn, MAX_DIM)) end
      v = v[1]
    end
    local flat = {}
    local function walk(t, depth, where)
      if depth > #shape then
        local x = t
        if type(x) == "boolean" then x = x and 1 or 0 end
        if type(x) ~= "number" then
          fail(("%s: element %s is %s, expected a number"):format(fn, where == "" and "[1]" or where, describe(t)))
        end
        flat[#flat + 1] = x
        return
      end
      if type(t) ~= "table" then
        fail(("%s: ragged input: element %s is %s, expected a table of %d values"):format(fn, where, describe(t), shape[depth]))
      end
      if #t ~= shape[depth] then
        fail(("%s: ragged input: element %s has %d values, expected %d"):format(fn, where == "" and "(top)" or where, #t, shape[depth]))
      end
      for i = 1, #t do walk(t[i], depth + 1, where .. "[" .. i .. "]") end
    end
    walk(data, 1, "")
    return flat, shape
  end

  -- remat.tensor(nested tables or a number [, dtype/device/options])
  function remat.tensor(data, ...)
    local fn = "remat.tensor"
    local o = read_opts(fn, { ... }, 1, select("#", ...), {})
    if is_tensor(data) then return finish(data:to(o.dtype):to(o.device), o) end
    if type(data) ~= "table" and type(data) ~= "number" then
      fail(fn .. ": expected nested tables of numbers, got " .. describe(data))
    end
    local flat, shape = flatten(fn, data)
    local cpu_dtype = CPU_DTYPE[o.dtype] or "float32"
    return finish(place(C.from_table(flat, shape, cpu_dtype), o), o)
  end
end
