-- Defects an adversarial sweep found (issue 15), one spec each: every one of them
-- crashed, hung, leaked or answered wrongly before its fix.
local remat = require "remat"
local C = remat._C

-- Asserts that fn raises an error mentioning every pattern (plain text).
local function raises(fn, ...)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error")
  err = tostring(err)
  for _, p in ipairs({ ... }) do
    assert(err:find(p, 1, true), ("error %q does not mention %q"):format(err, p))
  end
  return err
end

describe("D1: in-place writes to tensors saved for backward", function()
  local function setup()
    local w = remat.tensor({ { 1 }, { 2 } }):requires_grad(true)
    local x = remat.tensor { { 3, 4 } }
    return w, x, x:matmul(w):sum()
  end

  it("fill_, zero_, copy_ and x[i] = v on a saved input make backward fail, naming it", function()
    local writes = {
      function(x) x:fill_(0) end,
      function(x) x:zero_() end,
      function(x) x:copy_(remat.tensor { { 5, 6 } }) end,
      function(x) x[1] = remat.tensor { 7, 8 } end,
      function(x) x:view(2):narrow(1, 2, 1):fill_(1) end,
    }
    for _, write in ipairs(writes) do
      local _, x, loss = setup()
      write(x)
      raises(function() loss:backward() end, "backward", "input 1 of matmul", "1x2", "modified in place")
    end
  end)

  it("a write through a detached alias of a saved output is caught too", function()
    local x = remat.tensor({ 0.5, -1, 2 }):requires_grad(true)
    local e = x:exp()
    local loss = e:sum()
    local y = (e * 1):sum() -- mul does not save its output; exp does
    e:detach():fill_(0)
    raises(function() (loss + y):backward() end, "output 1 of exp", "modified in place")
  end)

  it("an optimizer step between forward and backward is caught", function()
    local lin = remat.nn.Linear(2, 1)
    local opt = remat.optim.SGD(lin:parameters(), { lr = 0.1 })
    local loss = lin(remat.tensor { { 1, 2 } }):sum()
    for _, p in ipairs(lin:parameters()) do p.grad = remat.ones(table.unpack(p:shape())) end
    opt:step()
    raises(function() loss:backward() end, "modified in place")
  end)

  it("writes before the op, or to tensors the op does not save, are fine", function()
    local w = remat.tensor({ { 1 }, { 2 } }):requires_grad(true)
    local x = remat.tensor { { 0, 0 } }
    x:copy_(remat.tensor { { 3, 4 } })
    local loss = x:matmul(w):sum()
    local unrelated = x:clone()
    unrelated:fill_(9)
    loss:backward()
    assert.same({ { 3 }, { 4 } }, w.grad:totable())
  end)

  it("a checkpointed replay that would rebuild an overwritten tensor fails", function()
    local nn = remat.nn
    local Scale = nn.module { forward = function(_, h)
      local y = h * 2
      remat.no_grad(function() y:detach():fill_(1) end) -- y is recomputable: a replay would undo this
      return y * h
    end }
    local model = nn.Sequential { nn.Linear(2, 2), Scale, nn.Linear(2, 1) }
    model:checkpoint(remat.policy.every(1))
    local loss = model(remat.tensor { { 1, 2 } }):sum()
    raises(function() loss:backward() end, "modified in place")
  end)
end)

-- The C host of examples/host/faults.c, from this build (build-asan under check-mem).
local function build_dir()
  for templ in package.cpath:gmatch("[^;]+") do
    local p = templ:gsub("%?", "remat")
    local f = io.open(p, "rb")
    if f then f:close() return p:match("^(.*)/[^/]*$") or "." end
  end
end

local function faults(args)
  local exe = build_dir() .. "/examples/faults"
  local f = assert(io.popen(exe .. " " .. args .. " 2>&1"))
  local out = f:read("a")
  local ok, _, code = f:close()
  return out, ok and 0 or code
end

describe("D2: a host allocator that fails twice in a row while modules grow", function()
  it("every failure point of opening remat, building and training a model ends cleanly, every byte back", function()
    local out, code = faults("alloc 1")
    assert.equals(0, code, out)
    assert.matches("every byte given back", out)
  end)
end)

describe("D3: running out of memory inside opt:step()", function()
  local nn, optim = remat.nn, remat.optim
  after_each(function() remat.memory.fail_at(0) end)

  local function values(params)
    local v = {}
    for i, p in ipairs(params) do v[i] = C.flat(p) end
    return v
  end

  for _, kind in ipairs { "SGD", "AdamW" } do
    it(kind .. ": a failure at any allocation of a step leaves nothing applied; the retry equals one clean step", function()
      local function setup()
        remat.manual_seed(5)
        local model = nn.Sequential { nn.Linear(3, 4), nn.Linear(4, 2) }
        local opt = optim[kind](model:parameters(), kind == "SGD" and { lr = 0.1, momentum = 0.9 } or { lr = 0.1 })
        nn.cross_entropy(model(remat.randn(5, 3)), remat.tensor { 1, 2, 1, 2, 1 }):backward()
        for _, p in ipairs(model:parameters()) do p.grad = p.grad:transpose(1, -1):contiguous():transpose(1, -1) end
        return model, opt
      end
      local model, opt = setup()
      opt:step()
      local want = values(model:parameters())
      for k = 1, 40 do
        model, opt = setup()
        local before = values(model:parameters())
        remat.memory.fail_at(k)
        local ok, err = pcall(opt.step, opt)
        remat.memory.fail_at(0)
        if ok then break end
        assert.matches("out of memory", err)
        assert.same(before, values(model:parameters()))
        assert.equals(0, opt.steps)
        assert.is_nil(next(opt.state))
        opt:step()
        assert.same(want, values(model:parameters()))
      end
    end)
  end
end)

describe("D4: _C.op_into checks what it writes into", function()
  it("shape, dtype, device, count and contiguity", function()
    raises(function() C.op_into(C.ops.exp, nil, { remat.zeros(2) }, { remat.zeros(1000) }) end,
      "remat.exp", "output 1 is float32 1000", "expected float32 2")
    raises(function() C.op_into(C.ops.exp, nil, { remat.zeros(1000) }, { remat.zeros(2) }) end, "expected float32 1000")
    raises(function() C.op_into(C.ops.add, nil, { remat.zeros(3), remat.zeros(3) }, { remat.zeros(3, { dtype = "float64" }) }) end,
      "output 1 is float64")
    raises(function() C.op_into(C.ops.exp, nil, {}, { remat.zeros(2) }) end, "takes 1 inputs (got 0)")
    raises(function() C.op_into(C.ops.sgd_step, { lr = 0.1 }, { remat.zeros(2), remat.zeros(2), remat.zeros(2) }, { remat.zeros(2) }) end,
      "writes 2 outputs (got 1)")
    raises(function() C.op_into(C.ops.exp, nil, { remat.zeros(2, 2) }, { remat.zeros(2, 2):transpose(1, 2) }) end,
      "not contiguous")
    local out = remat.zeros(2)
    C.op_into(C.ops.exp, nil, { remat.zeros(2) }, { out })
    assert.same({ 1, 1 }, out:totable())
  end)
end)

describe("D5: grad mode and coroutines", function()
  it("a stepper that yields inside no_grad leaves the host's grad mode on", function()
    local s = remat.train.stepper(function(yield)
      remat.no_grad(function()
        yield()
        assert.is_false(remat.grad_enabled()) -- the loop keeps its own mode across yields
        yield()
      end)
      yield(1)
    end)
    assert.is_true(remat.grad_enabled())
    s:resume()
    assert.is_true(remat.grad_enabled())
    remat.no_grad(function() s:resume() end)
    assert.is_true(remat.grad_enabled())
    s:resume()
    assert.is_true(remat.grad_enabled())
  end)
end)

describe("D6: a stepper's clock", function()
  local function stepper(clock)
    return remat.train.stepper { loop = function(yield) while true do yield(1) end end, clock = clock }
  end
  it("NaN, nil, inf or a clock running backwards raise a clear error instead of hanging", function()
    local t = 0
    raises(function() stepper(function() return 0 / 0 end):run_for(5) end, "clock returned", "nan")
    raises(function() stepper(function() return nil end):run_for(5) end, "clock returned nil")
    raises(function() stepper(function() return math.huge end):run_for(5) end, "clock returned inf")
    raises(function() stepper(function() t = t - 1; return t end):run_for(5) end, "clock ran backwards")
  end)
  it("a clock that stands still ends the slice after a few units", function()
    local r = stepper(function() return 7 end):run_for(5)
    assert.is_true(r.units >= 1 and r.units <= 16)
  end)
end)

describe("D7 and D13: host entry points", function()
  it("NULL arguments are refused; a second rm_lua_open on a state is an error", function()
    local out, code = faults("nulls")
    assert.equals(0, code, out)
    assert.matches("all refused cleanly", out)
  end)
end)

describe("D9: Optimizer:load_state_dict rejects incomplete state", function()
  local optim = remat.optim
  local function trained(kind)
    local p = remat.ones(2):requires_grad(true)
    local opt = optim[kind]({ p }, kind == "SGD" and { momentum = 0.9 } or nil)
    p.grad = remat.ones(2)
    opt:step()
    return p, opt
  end
  it("a missing exp_avg_sq, step or momentum_buffer is named at load time", function()
    local p, opt = trained("AdamW")
    local t, m = opt:state_dict()
    t["1.exp_avg_sq"] = nil
    raises(function() optim.AdamW({ p }):load_state_dict(t, m) end, "load_state_dict", "'1.exp_avg_sq'")
    t, m = opt:state_dict()
    m["1.step"] = nil
    raises(function() optim.AdamW({ p }):load_state_dict(t, m) end, "'1.step'")
    p, opt = trained("SGD")
    t, m = opt:state_dict()
    t["1.momentum_buffer"] = nil
    m["1.x"] = "1"
    raises(function() optim.SGD({ p }, { momentum = 0.9 }):load_state_dict(t, m) end, "'1.momentum_buffer'")
  end)
  it("a freed tensor is named by its key", function()
    local p, opt = trained("AdamW")
    local t, m = opt:state_dict()
    local copy = {}
    for k, v in pairs(t) do copy[k] = v:clone() end
    copy["1.exp_avg"]:free()
    raises(function() optim.AdamW({ p }):load_state_dict(copy, m) end, "1.exp_avg", "freed")
  end)
end)

describe("D10: paths with a NUL byte", function()
  local files = require "support.files"
  it("save, load, read_idx and data.text refuse them instead of cutting the path", function()
    local dir = files.tmpdir()
    raises(function() remat.save(dir .. "/a\0b", { x = remat.zeros(1) }) end, "remat.save", "NUL")
    assert.is_nil(io.open(dir .. "/a", "rb"))
    remat.save(dir .. "/a", { x = remat.zeros(1) })
    raises(function() remat.load(dir .. "/a\0b") end, "remat.load", "NUL")
    raises(function() C.read_idx(dir .. "/a\0b") end, "NUL")
    raises(function() remat.data.text(dir .. "/a\0b") end, "remat.data.text", "NUL")
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)

describe("data.text on a path it cannot read", function()
  local files = require "support.files"
  it("a directory is a clear error naming data.text, not an internal Lua error", function()
    local dir = files.tmpdir()
    raises(function() remat.data.text(dir) end, "remat.data.text", "cannot read")
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)

describe("module sizes whose derived sizes overflow", function()
  it("MLP's default hidden size and TransformerBlock's MLP are clear errors (found by fuzz seed 31337)", function()
    raises(function() remat.nn.MLP(math.maxinteger) end, "MLP", "too large")
    raises(function() remat.nn.TransformerBlock(math.maxinteger, 1) end, "TransformerBlock", "too large")
  end)
end)

describe("D11: temporary files of killed saves", function()
  local files = require "support.files"
  it("a later save removes those of processes that are gone, not those of live ones", function()
    local dir = files.tmpdir()
    local f = assert(io.popen("sh -c 'echo $$'"))
    local dead = f:read("l")
    f:close()
    local stale = ("%s/m.safetensors.tmp-%s-0"):format(dir, dead)
    local live = ("%s/m.safetensors.tmp-1-0"):format(dir) -- pid 1 is alive
    files.write(stale, "half a file")
    files.write(live, "another writer")
    remat.save(dir .. "/m.safetensors", { x = remat.ones(3) })
    assert.is_nil(io.open(stale, "rb"))
    assert.equals("another writer", files.read(live))
    assert.same({ 1, 1, 1 }, remat.load(dir .. "/m.safetensors").x:totable())
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)

describe("D12: host memory sized by the caller stays within the limit", function()
  local files = require "support.files"
  after_each(function() remat.memory.limit(nil) end)
  it("batch, randint and randperm check the limit before taking scratch", function()
    local dir = files.tmpdir()
    files.write(dir .. "/t.txt", ("hello world "):rep(20))
    local ds = remat.data.text(dir .. "/t.txt", { block = 4 })
    remat.memory.limit(remat.memory.stats().live + (1 << 20))
    raises(function() ds:batch(1 << 28) end, "batch", "out of memory")
    raises(function() C.randperm(1 << 31) end, "randperm", "out of memory")
    raises(function() C.randint(5, 1 << 30) end, "randint", "out of memory")
    remat.memory.limit(nil)
    raises(function() ds:batch((1 << 31) + 1) end, "batch: count 2147483649 is out of range")
    local x = ds:batch(3)
    assert.same({ 3, 4 }, x:shape())
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)

describe("D14: leaks", function()
  it("tensors made by finalizers while the state closes are given back", function()
    local out, code = faults("close")
    assert.equals(0, code, out)
    assert.matches("every byte given back", out)
  end)
  it("_C.at with a bad index holds nothing", function()
    collectgarbage()
    local live = remat.memory.stats().live
    local t = remat.zeros(4, 4)
    assert.equals(0, C.at(t, 2, 3))
    for _ = 1, 3 do
      raises(function() C.at(t, "x", 1) end, "number expected")
      raises(function() C.at(t, 1, 9) end, "index 9 is out of range")
    end
    t:free()
    assert.equals(live, remat.memory.stats().live)
  end)
end)

describe("D15: errors name what the user called", function()
  local files = require "support.files"
  it("memory, policy and optimizer misuse", function()
    -- (policy.budget() with no argument is the whole-step budget: spec/step_memory_spec.lua)
    raises(function() remat.policy.budget("lots") end, "policy.budget", "cannot read 'lots'")
    raises(function() remat.memory.format() end, "memory.format", "expected a number of bytes")
    local err = raises(function() remat.memory.limit(1, {}) end, "memory.limit", "device")
    assert.is_nil(err:find("memory_limit", 1, true))
    local opt = remat.optim.SGD({ remat.zeros(1):requires_grad(true) })
    raises(function() opt.step() end, "step: expected an optimizer", "colon")
  end)
  it("an empty attention input gives an empty output", function()
    local a = remat.nn.CausalSelfAttention(8, 2)
    assert.same({ 2, 0, 8 }, a(remat.zeros(2, 0, 8)):shape())
  end)
  it("IDX headers with huge counts, and a 1-D images file for fashion_mnist", function()
    local dir = files.tmpdir()
    files.write(dir .. "/huge", string.pack(">I4I4I4I4", 0x803, 0xffffffff, 0xffffffff, 0xffffffff))
    raises(function() C.read_idx(dir .. "/huge") end, "implausible IDX dimensions")
    local labels = string.pack(">I4I4", 0x801, 3) .. "\1\2\3"
    files.write(dir .. "/train-images-idx3-ubyte.gz", labels)
    files.write(dir .. "/train-labels-idx1-ubyte.gz", labels)
    raises(function() remat.data.fashion_mnist("train", { dir = dir }) end, "fashion_mnist", "must hold images")
    os.execute("rm -rf '" .. dir .. "'")
  end)
  it("a dimension of INT64_MAX is reported without overflow", function()
    raises(function() C.op(C.ops.sum, { dim = math.maxinteger, keepdim = false }, remat.zeros(2)) end, "9223372036854775808 is out of range")
  end)
end)
