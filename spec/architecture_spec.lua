-- The core's layering: what the tape, the allocator and the op runner may know of, and
-- how context state is changed for a while (one scope helper, restored on every path).
local remat = require "remat"
local files = require "support.files"
local C = remat._C

local function includes(path)
  local out = {}
  for h in files.read(path):gmatch('#include%s+"([^"]+)"') do out[#out + 1] = h end
  return out
end

local function ls(pattern)
  local p = io.popen("ls " .. pattern)
  local out = {}
  for f in p:lines() do out[#out + 1] = f end
  p:close()
  return out
end

describe("the core's layers", function()
  it("alloc.c, op.c and autograd.c include no measure, checkpoint or dist header", function()
    for _, f in ipairs { "core/alloc.c", "core/op.c", "core/autograd.c" } do
      for _, h in ipairs(includes(f)) do
        assert.is_nil(h:match("measure") or h:match("checkpoint") or h:match("dist"),
          f .. " includes " .. h)
      end
    end
  end)

  it("no code outside the scope helper sets category, grad mode or dry-run state", function()
    for _, f in ipairs(ls("core/*.c lua/*.c kernels/cpu/*.c kernels/cuda/*.cu")) do
      if f ~= "core/ctx.c" then
        local src = files.read(f)
        for _, field in ipairs { "category", "grad_enabled", "dry" } do
          assert.is_nil(src:match("ctx%->" .. field .. "%s*=[^=]"), f .. " assigns ctx->" .. field)
        end
      end
    end
  end)
end)

describe("smaller debts", function()
  it("an op records gradients for any number of inputs (per-input flags, not a 31-bit mask)", function()
    local xs = {}
    for i = 1, 40 do xs[i] = remat.tensor({ i, -i }):requires_grad(true) end
    local y = remat.cat(xs)
    assert.are.same({ 80 }, y:size())
    local w = {}
    for k = 1, 80 do w[k] = k end
    (y * remat.tensor(w)):sum():backward()
    for i = 1, 40 do assert.are.same({ 2 * i - 1, 2 * i }, xs[i].grad:totable()) end
  end)

  it("every one of 40 leaves of one op is reported final (an optimizer fused into backward updates each)", function()
    local xs = {}
    for i = 1, 40 do xs[i] = remat.tensor({ i, -i }):requires_grad(true) end
    local opt = remat.optim.SGD(xs, { lr = 1, in_backward = true })
    local w = {}
    for k = 1, 80 do w[k] = k end
    (remat.cat(xs) * remat.tensor(w)):sum():backward()
    for i = 1, 40 do assert.are.same({ i - (2 * i - 1), -i - 2 * i }, xs[i]:totable(), "leaf " .. i) end
    opt = nil
    collectgarbage()
  end)

  it("no (void) casts of parameters (the Makefile passes -Wno-unused-parameter)", function()
    for _, f in ipairs(ls("core/*.c core/*.h lua/*.c kernels/cpu/*.c kernels/cuda/*.cu kernels/cuda/*.cuh dist/*.c")) do
      local src = files.read(f)
      for _, name in ipairs { "ctx", "nin", "nout", "in", "out", "a", "n", "L", "ud", "ev" } do
        assert.is_nil(src:find("(void)" .. name .. ";", 1, true), f .. " casts " .. name .. " to void")
      end
    end
  end)

  it("the Lua library takes the most dimensions from C, not a literal 8", function()
    assert.is_true(C.MAX_DIM >= 4)
    local shape = {}
    for k = 1, C.MAX_DIM + 1 do shape[k] = 1 end
    assert.error_matches(function() remat.zeros(table.unpack(shape)) end,
                         "at most " .. C.MAX_DIM .. " dimensions")
    assert.is_nil(files.read("lua/remat/tensor.lua"):find("> 8 then", 1, true))
  end)
end)

describe("the checkpoint pipeline lives in the core", function()
  local nn, policy = remat.nn, remat.policy

  it("no Lua file replaces Module.add, Module.forward or __call", function()
    for _, f in ipairs(ls("lua/remat/*.lua")) do
      local src = files.read(f)
      assert.is_nil(src:match("Module_mt%.__call%s*="), f .. " replaces __call")
      if not f:match("/nn%.lua$") then
        for _, m in ipairs { "add", "forward" } do
          assert.is_nil(src:match("function%s+Module[:.]" .. m .. "%s*%(") or src:match("Module%." .. m .. "%s*="),
            f .. " replaces Module." .. m)
        end
      end
    end
    assert.are.equal("C", debug.getinfo(C.Module_mt.__call, "S").what)
  end)

  it("a forward from C plans a size-dependent policy (no Lua wrapper needed)", function()
    local layers = {}
    for i = 1, 8 do layers[i] = nn.MLP(16, 64, 0) end
    local m = nn.Sequential(layers)
    local x = remat.randn(64, 16)
    local keep = m:plan(x).keep_peak
    m:checkpoint(policy.budget(keep - 1))
    local y = C.module_forward(m, x)          -- the binding's forward, not Module:forward
    y:sum():backward()
    local plan = C.checkpoint_prepare(m, x)   -- what that forward planned and installed
    local recomputes = 0
    for _, l in ipairs(plan) do if l.action ~= "keep" then recomputes = recomputes + 1 end end
    assert.is_true(recomputes > 0)
  end)

  it("says \"policies apply to a Sequential\" in one place", function()
    local n = 0
    for _, f in ipairs(ls("core/*.c lua/*.c lua/remat/*.lua")) do
      for _ in files.read(f):gmatch("policies apply to a Sequential") do n = n + 1 end
    end
    assert.are.equal(1, n)
  end)
end)

describe("scoped state", function()
  it("no_grad restores grad mode when fn fails", function()
    assert.is_true(remat.grad_enabled())
    assert.has_error(function() remat.no_grad(function() error("boom") end) end)
    assert.is_true(remat.grad_enabled())
  end)

  it("no_grad returns every result and works across a coroutine yield", function()
    local co = coroutine.wrap(function()
      return remat.no_grad(function(a, b)
        local inside = remat.grad_enabled()
        coroutine.yield(inside)
        return a + b, remat.grad_enabled()
      end, 1, 2)
    end)
    assert.is_false(co())
    local s, g = co()
    assert.equal(3, s)
    assert.is_false(g)
    assert.is_true(remat.grad_enabled())
  end)

  it("C.scoped sets the category of new op outputs and restores it after an error", function()
    local z = remat.zeros(256)
    local before = remat.memory.stats().by_category.temp or 0
    local t = C.scoped("temp", nil, function() return z + 1 end)
    assert.equal(before + 1024, remat.memory.stats().by_category.temp)
    t:free()
    assert.has_error(function() C.scoped("temp", nil, function() error("boom") end) end, "boom")
    local a = z + 1
    assert.equal(before, remat.memory.stats().by_category.temp or 0)
    a:free()
    z:free()
    assert.has_error(function() C.scoped("nope", nil, print) end, "unknown memory category 'nope'")
  end)
end)
