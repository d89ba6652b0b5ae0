-- int32 and int64 tensors: creation, conversion, element access, views, printing,
-- memory accounting, autograd's refusal, index-taking ops with integer indices, the
-- int64 indices of argmax/max/min/sort/topk, arithmetic and promotion. Every backend
-- where it matters (CUDA cases carry #gpu).
local remat = require "remat"
local C = remat._C
local nn = remat.nn

local function raises(f, ...)
  local ok, err = pcall(f)
  assert(not ok, "expected an error")
  for _, s in ipairs({ ... }) do
    assert(tostring(err):find(s, 1, true), ("error %q does not mention %q"):format(tostring(err), s))
  end
end

local devices = { "cpu" }
if C.device_available("cuda") then devices[#devices + 1] = "cuda" end

describe("integer tensors: creation and conversion", function()
  it("come from remat.tensor, zeros, ones, full, arange with a dtype or its alias", function()
    local x = remat.tensor({ { 1, 2, 3 }, { -4, 5, 6 } }, "int64")
    assert.equal("int64", x:dtype())
    assert.same({ { 1, 2, 3 }, { -4, 5, 6 } }, x:totable())
    assert.equal("int32", remat.tensor({ 1 }, "int"):dtype())
    assert.equal("int64", remat.tensor({ 1 }, "long"):dtype())
    assert.equal("int64", remat.zeros(2, 3, { dtype = "int64" }):dtype())
    assert.same({ 0, 0, 0 }, remat.zeros(3, "int32"):totable())
    assert.same({ { 1 }, { 1 } }, remat.ones(2, 1, "int64"):totable())
    assert.same({ -5, -5, -5, -5, -5, -5, -5 }, remat.full({ 7 }, -5, "int32"):totable())
    assert.same({ 1, 2, 3, 4, 5 }, remat.arange(5, "int64"):totable())
    assert.same({ 10, 7, 4, 1 }, remat.arange(10, 0, -3, "int32"):totable())
    -- exact beyond 2^53, where a double is not
    local big = remat.tensor({ (1 << 53) + 1, math.maxinteger, math.mininteger }, "int64")
    assert.same({ (1 << 53) + 1, math.maxinteger, math.mininteger }, big:totable())
    assert.equal((1 << 62) + 3, remat.arange((1 << 62) + 1, (1 << 62) + 3, "int64")[3])
    assert.equal("remat.LongTensor", x:type())
    assert.equal("remat.IntTensor", remat.zeros(1, "int32"):type())
  end)

  it("refuse values with no integer form, and an int32 value out of range", function()
    raises(function() remat.tensor({ 0 / 0 }, "int64") end, "remat.tensor", "nan", "int64")
    raises(function() remat.tensor({ 1 / 0 }, "int32") end, "int32")
    raises(function() remat.tensor({ 2147483648 }, "int32") end, "does not fit in int32")
    raises(function() remat.full({ 2 }, 0 / 0, "int64") end, "fill", "no int64 value")
    raises(function() remat.full({ 2 }, 1e300, "int64") end, "fill", "no int64 value")
    raises(function() remat.arange(1, 2, 0.5, "int64") end, "whole-number start and step")
  end)

  it("convert to and from floats: float -> int truncates toward zero, NaN/inf is an error", function()
    local f = remat.tensor({ 1.7, -2.7, 3, -0.5, 0.5, 2147483647.9 }, "float64")
    local i = f:to("int64")
    assert.equal("int64", i:dtype())
    assert.same({ 1, -2, 3, 0, 0, 2147483647 }, i:totable())
    assert.same({ 1, -2, 3, 0, 0, 2147483647 }, f:to("int32"):totable())
    local back = i:to("float32")
    assert.equal("float32", back:dtype())
    assert.same({ 1, -2, 3, 0, 0, 2147483648 }, back:totable()) -- float32 rounds 2^31 - 1
    assert.same({ 1, -2, 3, 0, 0, 2147483647 }, i:double():totable())
    assert.equal("int32", i:int():dtype())
    assert.equal("int64", i:int():long():dtype())
    -- int64 -> int32 wraps around (two's complement), as PyTorch's does
    assert.same({ -2147483648, 1 }, remat.tensor({ 2147483648, 1 }, "int64"):to("int32"):totable())
    raises(function() remat.tensor({ 1, 0 / 0 }):to("int64") end, "cast", "element 2", "nan", "int64")
    raises(function() remat.tensor({ -1 / 0 }, "float64"):to("int32") end, "cast", "-inf")
    raises(function() remat.tensor({ 3e9 }, "float64"):to("int32") end, "cast", "3000000000", "int32")
    raises(function() remat.tensor({ 1e19 }, "float64"):to("int64") end, "cast", "int64")
    -- a strided source converts through its strides
    local m = remat.tensor({ { 1.5, 2.5 }, { -3.5, 4.5 } })
    assert.same({ { 1, -3 }, { 2, 4 } }, m:t():to("int64"):totable())
  end)

  for _, dev in ipairs(devices) do
    it(("move to %s and back, and convert there%s"):format(dev, dev == "cuda" and " #gpu" or ""), function()
      local x = remat.tensor({ { 1, -2, math.maxinteger }, { 4, 5, 6 } }, "int64")
      local d = x:to(dev)
      assert.equal("int64", d:dtype())
      assert.same(x:totable(), d:to("cpu"):totable())
      assert.same({ { 1, 4 }, { -2, 5 }, { math.maxinteger, 6 } }, d:t():contiguous():totable())
      assert.same({ 1, -2 }, remat.tensor({ 1.5, -2.5 }, { device = dev }):to("int32"):totable())
      raises(function() remat.tensor({ 1, 0 / 0 }, { device = dev }):to("int64") end, "cast", "element 2", "nan")
      assert.same({ 3, 3 }, remat.full({ 2 }, 3, "int32", dev):totable())
    end)
  end
end)

describe("integer tensors: elements, views, printing", function()
  it("read elements as Lua integers and write them (whole numbers; floats truncate)", function()
    local x = remat.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }, "int64")
    assert.equal(2, x[1][2])
    assert.equal("integer", math.type(x[1][2]))
    assert.equal(6, x[{ 2, 3 }])
    assert.equal("integer", math.type(x[{ 2, 3 }]))
    assert.equal(5, x:sum(2)[2] - 10)
    assert.equal(21, x:sum():item())
    assert.equal("integer", math.type(x:sum():item()))
    x[1][1] = 42
    x[{ 2, 2 }] = -7.9
    assert.same({ { 42, 2, 3 }, { 4, -7, 6 } }, x:totable())
    x[2] = 9
    assert.same({ 9, 9, 9 }, x[2]:totable())
    x[1] = remat.tensor({ 1, 2, 3 }, "int32") -- integers of another width
    assert.same({ 1, 2, 3 }, x[1]:totable())
    x:fill_(math.maxinteger)
    assert.equal(math.maxinteger, x[2][3])
    raises(function() x[1][1] = 0 / 0 end, "no int64 value")
    raises(function() x[1] = remat.tensor({ 1.5, 2, 3 }) end, "cannot write float32 values into a int64 tensor")
    local y = remat.zeros(2, "int32")
    raises(function() y[1] = 2 ^ 40 end, "int32")
  end)

  it("views, copies and size-1 / odd shapes work byte for byte", function()
    local vals = {}
    for i = 1, 3 * 1 * 5 do vals[i] = (i * 7919) % 97 - 48 end
    local x = remat.tensor(vals, "int64"):view(3, 1, 5)
    assert.same({ 3, 1, 5 }, x:shape())
    local t = x:transpose(1, 3) -- (5, 1, 3), not contiguous
    assert.is_false(t:is_contiguous())
    local c = t:contiguous()
    assert.equal("int64", c:dtype())
    for i = 1, 5 do for k = 1, 3 do assert.equal(x[{ k, 1, i }], c[{ i, 1, k }]) end end
    assert.same(t:totable(), t:clone():totable())
    assert.same({ vals[2], vals[3] }, x:narrow(3, 2, 2):select(1, 1):view(-1):totable())
    assert.same({ 5, 3 }, x:squeeze():t():shape())
    assert.same(x:permute(3, 1, 2):contiguous():view(-1):totable(), t:contiguous():view(-1):totable())
    assert.same({ { 4, 4 }, { 4, 4 } }, remat.tensor({ 4 }, "int32"):expand(2, 2):totable())
    local dst = remat.zeros(5, 1, 3, "int64")
    dst:copy_(t)
    assert.same(t:totable(), dst:totable())
    assert.same({ 0, 1 }, remat.cat({ remat.zeros(1, "int64"), remat.ones(1, "int64") }):totable())
  end)

  it("print exactly, with Torch7's type names", function()
    local s = tostring(remat.tensor({ { 1, -20 }, { 300, math.maxinteger } }, "int64"))
    assert.truthy(s:find("9223372036854775807", 1, true), s)
    assert.truthy(s:find("-20", 1, true), s)
    assert.truthy(s:find("[remat.LongTensor of size 2x2]", 1, true), s)
    assert.falsy(s:find(".", 1, true) and s:find("%d%.%d"), s)
    assert.truthy(tostring(remat.tensor({ 7 }, "int32")):find("[remat.IntTensor of size 1]", 1, true))
  end)

  it("count their bytes by category, 4 or 8 per element", function()
    local before = remat.memory.stats()
    local a = C.scoped("data", nil, C.full, { 1001 }, 1, "int64", "cpu")
    local b = C.scoped("data", nil, C.full, { 999 }, 1, "int32", "cpu")
    local s = remat.memory.stats()
    assert.equal(before.by_category.data + 8 * 1001 + 4 * 999, s.by_category.data)
    assert.equal(before.live + 8 * 1001 + 4 * 999, s.live)
    a:free(); b:free()
    assert.equal(before.by_category.data, remat.memory.stats().by_category.data)
  end)
end)

describe("integer tensors and autograd", function()
  it("cannot require grad; ops from float inputs to integers record nothing", function()
    raises(function() remat.zeros(2, "int64"):requires_grad(true) end, "an int64 tensor cannot require grad")
    raises(function() remat.zeros(2, { dtype = "int32", requires_grad = true }) end, "cannot require grad")
    local w = remat.randn(3, 4, "float64"):requires_grad(true)
    local idx = w:argmax(2)
    assert.equal("int64", idx:dtype())
    assert.is_false(idx:requires_grad())
    local i = w:to("int64")
    assert.is_false(i:requires_grad())
    local _, mi = w:max(2)
    assert.is_false(mi:requires_grad())
    -- a loss through max's values still gets float gradients (routed by int64 indices)
    local v = w:max(2)
    v:sum():backward()
    assert.equal("float64", w.grad:dtype())
    local g, n = w.grad:totable(), 0
    for r = 1, 3 do for c = 1, 4 do n = n + g[r][c] end end
    assert.equal(3, n)
  end)
end)

describe("index-taking ops take int32/int64 indices (and float ones, as before)", function()
  for _, dev in ipairs(devices) do
    local tag = dev == "cuda" and " #gpu" or ""
    it(("gather, index_select, embedding, cross_entropy agree across index dtypes on %s%s"):format(dev, tag), function()
      remat.manual_seed(3)
      local x = remat.randn(5, 7, "float64"):to(dev)
      local gi = { { 1, 7, 3 }, { 2, 2, 6 }, { 7, 1, 1 }, { 4, 5, 6 }, { 3, 3, 3 } }
      local si = { 5, 1, 3, 3 }
      local labels = { 7, 1, 4, 4, 2 }
      local out = {}
      for _, dt in ipairs({ "float64", "int64", "int32" }) do
        local r = {}
        r.gather = x:gather(2, remat.tensor(gi, dt, dev)):totable()
        r.select = x:index_select(1, remat.tensor(si, dt, dev)):totable()
        r.emb = C.op(C.ops.embedding, {}, x:narrow(2, 1, 3):contiguous(), remat.tensor({ { 5, 1 }, { 2, 2 } }, dt, dev)):totable()
        r.ce = nn.cross_entropy(x, remat.tensor(labels, dt, dev)):item()
        out[dt] = r
      end
      assert.same(out.float64, out.int64)
      assert.same(out.float64, out.int32)
      -- naive references for two of them
      local xv = x:totable()
      assert.equal(xv[1][7], out.int64.gather[1][2])
      assert.equal(xv[3][1], out.int64.gather[3][2])
      assert.equal(xv[5][2], out.int64.select[1][2])
    end)

    it(("gradients through int64 indices equal those through float ones on %s%s"):format(dev, tag), function()
      local grads = {}
      for _, dt in ipairs({ "float64", "int64" }) do
        remat.manual_seed(5)
        local x = remat.randn(4, 6, "float64"):to(dev):requires_grad(true)
        local idx = remat.tensor({ { 6, 1 }, { 2, 2 }, { 3, 4 }, { 1, 1 } }, dt, dev)
        local sel = remat.tensor({ 4, 4, 1 }, dt, dev)
        local lab = remat.tensor({ 6, 1, 2, 3 }, dt, dev)
        local l = x:gather(2, idx):sum() + x:index_select(1, sel):sum() * 2 + nn.cross_entropy(x, lab)
        l:backward()
        grads[dt] = x.grad:totable()
      end
      assert.same(grads.float64, grads.int64)
    end)

    it(("out-of-range, zero and negative integer indices are clear errors on %s%s"):format(dev, tag), function()
      local x = remat.randn(3, 4):to(dev)
      local function sync(t) return t:to("cpu"):totable() end -- CUDA reports at the next synchronisation
      for _, dt in ipairs({ "int64", "int32" }) do
        raises(function() sync(x:index_select(1, remat.tensor({ 1, 4 }, dt, dev))) end, "index_select", "4 is out of range 1..3")
        raises(function() sync(x:gather(2, remat.tensor({ { 0 }, { 1 }, { 1 } }, dt, dev))) end, "gather", "0 is out of range 1..4")
        raises(function() sync(x:index_select(1, remat.tensor({ -1 }, dt, dev))) end, "-1 is out of range 1..3")
        raises(function() sync(nn.cross_entropy(x, remat.tensor({ 1, 5, 2 }, dt, dev))) end, "label 5 is out of range 1..4")
      end
      raises(function() sync(x:index_select(1, remat.tensor({ 1 << 40 }, "int64", dev))) end, "1099511627776 is out of range")
    end)

    it(("argmax, max, min, sort, topk give int64 indices on %s%s"):format(dev, tag), function()
      local v = { { 3, 9, -1, 9, 0 }, { -5, -5, 2, 8, 7 }, { 1, 1, 1, 1, 1 } }
      local x = remat.tensor(v, "float64"):to(dev)
      local xt = remat.tensor(v, "float64"):t():contiguous():t():to(dev) -- same values, strided storage
      for _, t in ipairs({ x, xt }) do
        local a = t:argmax(2)
        assert.equal("int64", a:dtype())
        assert.same({ 2, 4, 1 }, a:totable())
        assert.equal("integer", math.type(a:totable()[1]))
        local mv, mi = t:max(2)
        assert.equal("int64", mi:dtype())
        assert.same({ 9, 8, 1 }, mv:totable())
        assert.same({ 2, 4, 1 }, mi:totable())
        local nv, ni = t:min(1)
        assert.equal("int64", ni:dtype())
        assert.same({ -5, -5, -1, 1, 0 }, nv:totable())
        assert.same({ 2, 2, 1, 3, 1 }, ni:totable())
        local sv, si = t:sort(2)
        assert.equal("int64", si:dtype())
        assert.same({ 3, 5, 1, 2, 4 }, si:totable()[1])
        local tv, ti = t:topk(2, 2)
        assert.equal("int64", ti:dtype())
        assert.same({ { 2, 4 }, { 4, 5 }, { 1, 2 } }, ti:totable())
        -- the indices index: gather with them gives the values back
        assert.same(tv:totable(), t:gather(2, ti):totable())
        assert.same(sv:totable(), t:gather(2, si):totable())
      end
      assert.equal(4, remat.tensor({ 1, 2, 3, 7, 5 }, "float32"):to(dev):argmax():item())
    end)

    it(("integer arithmetic broadcasts, wraps around and compares on %s%s"):format(dev, tag), function()
      local a = remat.tensor({ { 1, -2, 3 }, { math.maxinteger, 0, -7 } }, "int64", dev)
      local row = remat.tensor({ 10, 20, 30 }, "int64", dev)
      assert.same({ { 11, 18, 33 }, { math.mininteger + 9, 20, 23 } }, (a + row):totable())
      assert.same({ { -9, -22, -27 }, { math.maxinteger - 10, -20, -37 } }, (a - row):totable())
      assert.same({ { 10, -40, 90 }, { -10, 0, -210 } }, (a * row):totable())
      assert.same({ { -1, 2, -3 }, { -math.maxinteger, 0, 7 } }, (-a):totable())
      assert.same({ { 3, 0, 5 }, { math.mininteger + 1, 2, -5 } }, (a + 2):totable())
      assert.same({ { 1, 0, 1 }, { 0, 1, 0 } }, a:t():t():eq(remat.tensor({ { 1, 9, 3 }, { 0, 0, 5 } }, "int64", dev)):totable())
      assert.same({ 0, 1, 1 }, row:gt(15):totable())
      assert.same({ 1, 1, 0 }, row:lt(25):totable())
      assert.same({ { 1, 0, 1 }, { 1, 0, 0 } }, a:gt(0):totable())
      assert.equal(math.maxinteger - 5, a:sum():item()) -- int64, exact
      assert.same({ 2, math.maxinteger - 7 }, a:sum(2):totable())
      local i32 = remat.tensor({ 2147483647, -2147483648 }, "int32", dev)
      assert.same({ -2147483648, 2147483647 }, (i32 + remat.tensor({ 1, -1 }, "int32", dev)):totable())
      assert.equal("int64", i32:sum():dtype())
      assert.equal(-1, i32:sum():item())
      assert.same({ { 1, 5, 3 }, { math.maxinteger, 5, 5 } }, remat.where(a:le(0), 5, a):totable())
      raises(function() return a * 1.5 end, "mul_scalar", "1.5 is not a whole number", "int64")
      raises(function() return a:eq(2.5) end, "2.5 is not a whole number")
      raises(function() return a / 2 end, "int64")
      raises(function() return a:mean() end, "mean does not take int64 tensors")
    end)

    it(("an integer and a float tensor compute in the float dtype (PyTorch's promotion) on %s%s"):format(dev, tag), function()
      local i = remat.tensor({ 1, 2, 3 }, "int64", dev)
      local f = remat.tensor({ 0.5, 2, 4 }, "float32", dev)
      assert.equal("float32", (i + f):dtype())
      assert.same({ 1.5, 4, 7 }, (i + f):totable())
      assert.same({ 0, 1, 0 }, i:eq(f):totable())
      assert.equal("float32", f:lt(i):dtype())
      assert.equal("int64", (i + remat.tensor({ 1, 1, 1 }, "int32", dev)):dtype())
      -- an integer mask selects floats, a float mask selects integers
      assert.same({ 0.5, -1, 4 }, f:masked_fill(i:eq(2), -1):totable())
      assert.same({ 1, 0, 3 }, remat.where(f:ne(2), i, 0):totable())
      assert.equal("int64", remat.where(f:ne(2), i, 0):dtype())
    end)
  end
end)

describe("data loaders give int64 labels that train and score as before", function()
  it("a tensor dataset of int64 labels batches them, and accuracy compares int64 with int64", function()
    remat.manual_seed(1)
    local x = remat.randn(20, 4)
    local y = remat.tensor({ 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2 }, "int64")
    local ds = remat.data.tensor_dataset(x, y)
    local model = nn.Sequential { nn.Linear(4, 3) }
    for xb, yb in ds:batches(7, { shuffle = false }) do
      assert.equal("int64", yb:dtype())
      local loss = nn.cross_entropy(model(xb), yb)
      loss:backward()
      assert.equal("float32", model[1].weight.grad:dtype())
    end
    local acc = remat.train.accuracy(model, ds)
    local logits = remat.no_grad(function() return model(x) end)
    local right = 0
    local p, t = logits:argmax(2):totable(), y:totable()
    for k = 1, 20 do if p[k] == t[k] then right = right + 1 end end
    assert.equal(right / 20, acc)
    -- rows picked by an int64 index tensor, as by a table
    assert.same(C.flat(C.take_rows(y, { 3, 1 })), C.flat(C.take_rows(y, remat.tensor({ 3, 1 }, "int64"))))
    assert.same({ 3, 1 }, C.flat(C.take_rows(y, remat.tensor({ 3, 1 }, "int32"))))
    -- float labels still score (promoted to the float dtype)
    local dsf = remat.data.tensor_dataset(x, y:to("float32"))
    assert.equal(acc, remat.train.accuracy(model, dsf))
  end)
end)
