-- Walks every op in the registry with int32 and int64 inputs, on every available
-- backend: an op whose kernels take integers gives the naive reference's values (and
-- dtype); every other op raises the one clear error naming the op and the dtype. A new
-- op is covered the day it is added: it either raises that error or needs a reference
-- here. View ops have no kernel (they only make a new geometry): spec/int_dtype_spec.lua
-- checks them on integer tensors.
local remat = require "remat"
local C = remat._C

local devices = { "cpu" }
if C.device_available("cuda") then devices[#devices + 1] = "cuda" end

local MAX = { int64 = math.maxinteger, int32 = 2147483647 }
local MIN = { int64 = math.mininteger, int32 = -2147483648 }

-- Wraps a Lua integer to the dtype's range (Lua's integers wrap at 64 bits already).
local function wrap(v, dt)
  if dt == "int64" then return v end
  v = v & 0xffffffff
  return v >= 0x80000000 and v - 0x100000000 or v
end

local function dtype(t) return select(2, C.info(t)) end
local function shape(t) return (C.info(t)) end

-- (2, 3) integer tensors as non-contiguous views (transposes of (3, 2) ones), values
-- near the edges of the range too, so that wrapping around shows.
local function ints(rows, dt, dev)
  local flat = {}
  for j = 1, 3 do for i = 1, 2 do flat[#flat + 1] = rows[i][j] end end
  local t = C.from_table(flat, { 3, 2 }, dt)
  if dev ~= "cpu" then t = C.to_device(t, dev) end
  return C.op(C.ops.transpose, { dim0 = 0, dim1 = 1 }, t)
end

local function values(dt)
  return {
    a = { { 5, -3, MAX[dt] }, { 0, 7, MIN[dt] } },
    b = { { 2, -3, 1 }, { 9, 7, -1 } },
    c = { { 1, 0, 0 }, { 0, 3, -2 } },
  }
end

local function flat(rows) local f = {} for _, r in ipairs(rows) do for _, v in ipairs(r) do f[#f + 1] = v end end return f end

local function map2(a, b, f)
  local fa, fb, out = flat(a), flat(b), {}
  for i = 1, #fa do out[i] = f(fa[i], fb[i]) end
  return out
end

local function bool(x) return x and 1 or 0 end

-- Naive references: name -> function(values, dt) -> attrs, inputs (names of values),
-- expected flat values, expected shape, expected dtype (nil: the input's).
local REF = {
  add = function(v, dt) return {}, { "a", "b" }, map2(v.a, v.b, function(x, y) return wrap(x + y, dt) end) end,
  sub = function(v, dt) return {}, { "a", "b" }, map2(v.a, v.b, function(x, y) return wrap(x - y, dt) end) end,
  mul = function(v, dt) return {}, { "a", "b" }, map2(v.a, v.b, function(x, y) return wrap(x * y, dt) end) end,
  neg = function(v, dt) return {}, { "a" }, map2(v.a, v.a, function(x) return wrap(-x, dt) end) end,
  abs = function(v, dt) return {}, { "a" }, map2(v.a, v.a, function(x) return wrap(x < 0 and -x or x, dt) end) end,
  add_scalar = function(v, dt)
    return { value = 3 }, { "a" }, map2(v.a, v.a, function(x) return wrap(x + 3, dt) end)
  end,
  mul_scalar = function(v, dt)
    return { value = -2 }, { "a" }, map2(v.a, v.a, function(x) return wrap(x * -2, dt) end)
  end,
  eq = function(v) return {}, { "a", "b" }, map2(v.a, v.b, function(x, y) return bool(x == y) end) end,
  ne = function(v) return {}, { "a", "b" }, map2(v.a, v.b, function(x, y) return bool(x ~= y) end) end,
  lt = function(v) return {}, { "a", "b" }, map2(v.a, v.b, function(x, y) return bool(x < y) end) end,
  le = function(v) return {}, { "a", "b" }, map2(v.a, v.b, function(x, y) return bool(x <= y) end) end,
  gt = function(v) return {}, { "a", "b" }, map2(v.a, v.b, function(x, y) return bool(x > y) end) end,
  ge = function(v) return {}, { "a", "b" }, map2(v.a, v.b, function(x, y) return bool(x >= y) end) end,
  where = function(v)
    local fc, fa, fb, out = flat(v.c), flat(v.a), flat(v.b), {}
    for i = 1, #fc do out[i] = fc[i] ~= 0 and fa[i] or fb[i] end
    return {}, { "c", "a", "b" }, out
  end,
  copy = function(v) return {}, { "a" }, flat(v.a) end,
  cast = function(v)
    local out = {}
    for i, x in ipairs(flat(v.b)) do out[i] = x + 0.0 end
    return { dtype = C.dtypes.float64 }, { "b" }, out, { 2, 3 }, "float64"
  end,
  -- integer sums are int64 (as in PyTorch), exact, wrapping at 64 bits
  sum = function(v)
    local out = {}
    for i, r in ipairs(v.a) do out[i] = r[1] + r[2] + r[3] end
    return { dim = 1 }, { "a" }, out, { 2 }, "int64"
  end,
  concat = function(v)
    local out = flat(v.a)
    for _, x in ipairs(flat(v.b)) do out[#out + 1] = x end
    return { dim = 0 }, { "a", "b" }, out, { 4, 3 }
  end,
}

local function refuses(fn, name, dt)
  local ok, err = pcall(fn)
  assert(not ok, name .. " accepted " .. dt .. " inputs but has no reference in spec/int_ops_spec.lua")
  err = tostring(err)
  assert(err:find(name .. " does not take " .. dt .. " tensors", 1, true), name .. ": unclear error: " .. err)
  assert(err:find("x:to('float32')", 1, true), name .. ": the error does not say how to convert: " .. err)
end

for _, dev in ipairs(devices) do
  for _, dt in ipairs({ "int64", "int32" }) do
    describe(("every op on %s %s%s"):format(dev, dt, dev == "cuda" and " #gpu" or ""), function()
      for _, op in ipairs(C.op_list()) do
        if op.view then goto continue end
        it(op.name, function()
          local v = values(dt)
          if op.nin == 0 then -- factories: the output dtype is the attribute
            local attrs = { dtype = C.dtypes[dt], device = C.devices[dev], shape = { 2, 3 } }
            for _, at in ipairs(op.attrs) do if at.name == "value" then attrs.value = -7 end end
            if op.name == "fill" then
              local t = C.op(op.id, attrs)
              assert.equal(dt, dtype(t))
              assert.same({ -7, -7, -7, -7, -7, -7 }, C.flat(t))
              assert.equal("integer", math.type(C.flat(t)[1]))
            else
              refuses(function() return C.op(op.id, attrs) end, op.name, dt)
            end
            return
          end
          local ref = REF[op.name]
          if not ref then
            local n = op.nin < 0 and 2 or op.nin
            local inputs = {}
            for i = 1, n do inputs[i] = ints(i % 2 == 1 and v.a or v.b, dt, dev) end
            -- an index input takes integers: the op's data input is what it refuses
            if op.index_inputs[1] == 1 then inputs[1], inputs[2] = inputs[2], inputs[1] end
            refuses(function() return C.op(op.id, {}, table.unpack(inputs)) end, op.name, dt)
            return
          end
          local attrs, names, want, wshape, wdtype = ref(v, dt)
          local inputs = {}
          for i, nm in ipairs(names) do inputs[i] = ints(v[nm], dt, dev) end
          local out = C.op(op.id, attrs, table.unpack(inputs))
          assert.equal(wdtype or dt, dtype(out))
          assert.same(wshape or { 2, 3 }, shape(out))
          local got = C.flat(out)
          assert.same(want, got)
          if (wdtype or dt):find("int") then
            for _, x in ipairs(got) do assert.equal("integer", math.type(x)) end
          end
        end)
        ::continue::
      end
    end)
  end
end

describe("the dtype check", function()
  it("names what integer tensors are for and what to do, on the first input it meets", function()
    local x = remat.tensor({ 1, 2 }, "int64")
    local ok, err = pcall(function() return x:exp() end)
    assert.is_false(ok)
    assert.matches("exp does not take int64 tensors", err, 1, true)
    assert.matches("add, sub, mul", err, 1, true)
    -- a float op with an integer second input: the same error, before any shape check
    ok, err = pcall(function() return C.op(C.ops.matmul, {}, remat.zeros(2, 3), remat.zeros({ 5 }, "int32")) end)
    assert.is_false(ok)
    assert.matches("matmul does not take int32 tensors", err, 1, true)
  end)
end)
