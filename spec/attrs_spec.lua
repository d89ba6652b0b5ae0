-- Named, typed op attributes (core/ops.def): ops are called by id, their attributes by
-- the names and types ops.def declares; anything else is an error naming the op.
local remat = require("remat")
local C = remat._C

local function raises(fn, pattern)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.is_truthy(tostring(err):find(pattern, 1, true), "got: " .. tostring(err))
end

describe("op attributes", function()
  it("C.ops maps every op name to its id, and C.op_list gives its declared attributes", function()
    local seen = 0
    for i, o in ipairs(C.op_list()) do
      assert.equal(i - 1, o.id)
      assert.equal(o.id, C.ops[o.name])
      local names = {}
      for _, a in ipairs(o.attrs) do
        assert.is_nil(names[a.name], o.name .. ": attribute " .. a.name .. " declared twice")
        names[a.name] = true
        assert.is_truthy(({ int = 1, bool = 1, real = 1, shape = 1 })[a.type], a.type)
      end
      seen = seen + 1
    end
    assert.is_true(seen > 50)
    local function attrs_of(name)
      for _, o in ipairs(C.op_list()) do
        if o.name == name then
          local t = {}
          for _, a in ipairs(o.attrs) do t[#t + 1] = a.name .. ":" .. a.type end
          return table.concat(t, " ")
        end
      end
    end
    assert.equal("dim:int keepdim:bool", attrs_of("sum"))
    assert.equal("eps:real", attrs_of("layernorm"))
    assert.equal("shape:shape", attrs_of("view"))
    assert.equal("tri:int upper:bool neg_inf:bool", attrs_of("matmul"))
  end)

  it("reads attributes by name", function()
    local x = remat.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    local s = C.op(C.ops.sum, { dim = 1, keepdim = true }, x)
    assert.same({ 2, 1 }, C.info(s))
    assert.same({ 6, 15 }, C.flat(s))
    local t = C.op(C.ops.transpose, { dim0 = 0, dim1 = 1 }, x)
    assert.same({ 3, 2 }, C.info(t))
    local v = C.op(C.ops.view, { shape = { 3, 2 } }, x)
    assert.same({ 3, 2 }, C.info(v))
    assert.same({ 2, 3, 4, 5, 6, 7 }, C.flat(C.op(C.ops.add_scalar, { value = 1 }, x)))
  end)

  it("rejects an unknown attribute, naming the op and what it takes", function()
    local x = remat.zeros(2, 3)
    raises(function() C.op(C.ops.sum, { dims = 1 }, x) end, "remat.sum: unknown attribute 'dims' (sum takes dim, keepdim)")
    raises(function() C.op(C.ops.exp, { dim = 1 }, x) end, "remat.exp: unknown attribute 'dim' (exp takes no attributes)")
    raises(function() C.op(C.ops.sum, { 1 }, x) end, "remat.sum: attribute names are strings, got number")
    raises(function() C.op_into(C.ops.mul_scalar, { scale = 2 }, { x }, { x }) end,
           "remat.mul_scalar: unknown attribute 'scale' (mul_scalar takes value)")
  end)

  it("rejects a value of the wrong type, naming the attribute", function()
    local x = remat.zeros(2, 3)
    raises(function() C.op(C.ops.sum, { dim = 1.5 }, x) end, "remat.sum: attribute 'dim' must be an integer, got a non-integer number")
    raises(function() C.op(C.ops.sum, { dim = "1" }, x) end, "remat.sum: attribute 'dim' must be an integer, got string")
    raises(function() C.op(C.ops.sum, { dim = 1, keepdim = 1 }, x) end, "remat.sum: attribute 'keepdim' must be a boolean, got number")
    raises(function() C.op(C.ops.add_scalar, { value = true }, x) end, "remat.add_scalar: attribute 'value' must be a number, got boolean")
    raises(function() C.op(C.ops.view, { shape = 6 }, x) end, "remat.view: attribute 'shape' must be a list of integers, got number")
    raises(function() C.op(C.ops.view, { shape = { 6.5 } }, x) end, "remat.view: size 1 must be an integer, got number")
    raises(function() C.op(C.ops.sum, 3, x) end, "remat.sum: attributes must be a table, got number")
  end)

  it("takes ops by id, not by name", function()
    local x = remat.zeros(2)
    raises(function() C.op("exp", nil, x) end, "expected an op id (C.ops.exp), got a name")
    raises(function() C.op(nil, nil, x) end, "expected an op id (from C.ops), got nil")
    raises(function() C.op(100000, nil, x) end, "unknown op id 100000")
    raises(function() C.op_into("exp", nil, { x }, { x }) end, "op_into: expected an op id (C.ops.exp), got a name")
  end)

  it("an attribute left out is zero (false, 0.0, an empty shape)", function()
    local x = remat.tensor({ { 1, 2 }, { 3, 4 } })
    assert.same({}, C.info(C.op(C.ops.sum, { dim = math.mininteger }, x)))   -- keepdim false
    assert.same({ 2 }, C.info(C.op(C.ops.sum, nil, x)))                      -- dim 0
  end)

  it("remat.ops has every op of the registry as a function, attributes last", function()
    for _, o in ipairs(C.op_list()) do assert.is_function(remat.ops[o.name], o.name) end
    local x = remat.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    assert.same({ { 2, 3 }, { 5, 6 } }, remat.ops.narrow(x, { dim = 1, start = 1, length = 2 }):totable())
    assert.same({ 5, 7, 9 }, remat.ops.sum(x, { dim = 0 }):totable())
    assert.same({ { 2, 4, 6 }, { 8, 10, 12 } }, remat.ops.add(x, x):totable())
    local v, i = remat.ops.max(x, { dim = 1 })
    assert.same({ 3, 6 }, v:totable())
    assert.same({ 3, 3 }, i:totable())
    raises(function() remat.ops.sum(x, { dims = 0 }) end, "remat.sum: unknown attribute 'dims' (sum takes dim, keepdim)")
  end)
end)
