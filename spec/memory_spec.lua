-- Memory accounting seen from Lua: categories, baselines after free/collect, the limit
-- and its error, collect-and-retry before an allocation fails, and fault injection
-- (fail the k-th allocation) across a composite forward+backward without leaks.
local remat = require "remat"
local memory = remat.memory

local function settle()
  collectgarbage()
  collectgarbage()
end

local function snapshot()
  settle()
  local s = memory.stats()
  return { live = s.live, tensors = s.tensors, nodes = s.nodes }
end

local function assert_baseline(base, what)
  local now = snapshot()
  assert(now.live == base.live, ("%s: live %d bytes, baseline %d"):format(what, now.live, base.live))
  assert(now.tensors == base.tensors, ("%s: %d tensors, baseline %d"):format(what, now.tensors, base.tensors))
  assert(now.nodes == base.nodes, ("%s: %d nodes, baseline %d"):format(what, now.nodes, base.nodes))
end

describe("memory.stats", function()
  after_each(function() memory.limit(nil); memory.fail_at(0) end)

  it("reports live, peak and the categories", function()
    local s = memory.stats()
    for _, k in ipairs({ "live", "peak", "tensors", "nodes", "allocs" }) do
      assert.is_number(s[k], k)
    end
    for _, c in ipairs({ "param", "grad", "optim", "activation", "workspace", "temp", "data" }) do
      assert.is_number(s.by_category[c], c)
      assert.is_number(s.peak_by_category[c], c)
    end
    assert.is_nil(s.limit)
  end)

  it("counts a tensor's bytes and returns to the baseline after free", function()
    local base = snapshot()
    local x = remat.zeros(256, "float64")
    local s = memory.stats()
    assert.are.equal(base.live + 2048, s.live)
    assert.are.equal(base.tensors + 1, s.tensors)
    local sum = 0
    for _, v in pairs(s.by_category) do sum = sum + v end
    assert.are.equal(s.live, sum)
    x:free()
    assert_baseline(base, "after free")
  end)

  it("returns to the baseline after tensors are collected", function()
    local base = snapshot()
    do
      local a = remat.randn(32, 32)
      local b = a:t():contiguous() + a
      local c = b:view(-1):narrow(1, 3, 10)
      assert(c:numel() == 10)
    end
    assert_baseline(base, "after collect")
  end)

  it("returns to the baseline after a backward pass and collection", function()
    local base = snapshot()
    do
      local w = remat.randn(8, 4, "float64"):requires_grad(true)
      local x = remat.randn(3, 8, "float64")
      local loss = x:matmul(w):gelu():sum()
      loss:backward()
      assert(w.grad)
    end
    assert_baseline(base, "after backward")
  end)

  it("keeps the peak until reset_peak", function()
    settle()
    memory.reset_peak()
    local p0 = memory.stats().peak
    local x = remat.zeros(1000)
    x:free()
    assert.are.equal(p0 + 4000, memory.stats().peak)
    memory.reset_peak()
    assert.are.equal(memory.stats().live, memory.stats().peak)
  end)
end)

describe("memory.limit", function()
  after_each(function() memory.limit(nil) end)

  it("raises the documented error naming the request, the live bytes and the limit", function()
    settle()
    local live = memory.stats().live
    memory.limit(live + 1024)
    assert.are.equal(live + 1024, memory.stats().limit)
    local ok, err = pcall(remat.zeros, 1000)
    assert.is_false(ok)
    assert.matches("remat.full: out of memory on cpu: allocation past the limit", err)
    assert.matches("%(3%.91 KiB%)", err)        -- the request
    assert.matches("; live ", err)               -- live bytes by category
    assert.matches("; limit " .. memory.format(live + 1024):gsub("%.", "%%."), err)
    assert.matches("memory_spec.lua:%d+:", err)  -- located at the caller's line
  end)

  it("accepts strings and nil", function()
    memory.limit("1GiB")
    assert.are.equal(1024 ^ 3, memory.stats().limit)
    memory.limit(nil)
    assert.is_nil(memory.stats().limit)
    assert.error_matches(function() memory.limit("lots") end, "cannot read 'lots' as a size")
    assert.error_matches(function() memory.limit(-1) end, "negative")
  end)

  it("collects and retries before failing: a loop that never frees does not run out", function()
    settle()
    memory.limit(memory.stats().live + 1024 * 1024)
    for _ = 1, 200 do
      local t = remat.zeros(64 * 1024)  -- 256 KiB, never freed by hand
      assert(t:numel() == 64 * 1024)
    end
    memory.limit(nil)
  end)

  it("still fails when the memory is really held", function()
    settle()
    memory.limit(memory.stats().live + 1024 * 1024)
    local keep = {}
    local ok, err = pcall(function()
      for i = 1, 10 do keep[i] = remat.zeros(64 * 1024) end
    end)
    assert.is_false(ok)
    assert.matches("out of memory", err)
    keep = nil
    memory.limit(nil)
  end)
end)

describe("memory.fail_at", function()
  after_each(function() memory.fail_at(0) end)

  -- A small model step: forward through matmul, gelu, softmax and a reduction, then backward.
  local function step()
    local w = remat.randn(6, 5, "float64"):requires_grad(true)
    local b = remat.zeros(5, "float64"):requires_grad(true)
    local x = remat.randn(4, 6, "float64")
    local h = (x:matmul(w) + b):gelu()
    local p = h:softmax(2)
    local loss = (p:log() * h):mean() + (h * h):sum() / 4
    loss:backward()
    return w.grad:sum():item() + b.grad:sum():item()
  end

  it("fails cleanly at every allocation of a forward+backward and leaks nothing", function()
    step()
    local base = snapshot()
    local failures, k = 0, 1
    while true do
      memory.fail_at(k)
      local ok, err = pcall(step)
      memory.fail_at(0)
      if ok then break end
      failures = failures + 1
      assert.matches("injected failure", err)
      assert_baseline(base, "fail_at(" .. k .. ")")
      k = k + 1
      assert(k < 1000, "the step never completed")
    end
    assert(failures > 10, "only " .. failures .. " allocations were tried")
    assert_baseline(base, "after the successful step")
  end)
end)

describe("memory helpers", function()
  it("format and parse sizes", function()
    assert.are.equal("1.50 MiB", memory.format(1.5 * 1024 * 1024))
    assert.are.equal("12 B", memory.format(12))
    assert.are.equal(2 * 1024 ^ 3, memory.parse("2GiB"))
    assert.is_nil(memory.parse("two"))
  end)
end)

describe("the CPU block cache", function()
  local remat = require "remat"

  it("reuses freed blocks, reports them as reserved, and gives them back on empty_cache", function()
    collectgarbage()
    collectgarbage()
    remat.memory.empty_cache()
    local base = remat.memory.stats()
    assert.equal(base.live, base.reserved)
    local t = remat.zeros(1 << 20)          -- 4 MiB: cached when freed
    t:free()
    local s = remat.memory.stats()
    assert.equal(base.live, s.live)
    assert.equal(base.reserved + 4 * (1 << 20), s.reserved)
    local u = remat.zeros(1 << 20)          -- the same block again: nothing new reserved
    assert.equal(s.reserved, remat.memory.stats().reserved)
    u:free()
    local small = remat.zeros(100)          -- small blocks are never cached
    small:free()
    assert.equal(s.reserved, remat.memory.stats().reserved)
    assert.equal(4 * (1 << 20), remat.memory.empty_cache())
    assert.equal(base.reserved, remat.memory.stats().reserved)
  end)

  it("serves sizes within 12.5% of a cached block from it", function()
    remat.memory.empty_cache()
    local r0 = remat.memory.stats().reserved
    local a = remat.zeros(1000000)          -- 4,000,000 bytes: class of 4,194,304
    a:free()
    local r1 = remat.memory.stats().reserved
    assert.equal(r0 + 4194304, r1)
    local b = remat.zeros(1040000)          -- 4,160,000 bytes: the same class
    assert.equal(r1, remat.memory.stats().reserved)
    b:free()
    remat.memory.empty_cache()
  end)
end)
