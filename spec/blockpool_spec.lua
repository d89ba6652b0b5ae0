-- The caching block pool (core/blockpool.c) that carves CUDA device memory, driven on
-- the CPU over a fake address space: best fit, split, merge, the out-of-memory path.
local remat = require "remat"
local C = remat._C

local KiB, MiB = 1024, 1024 * 1024

local function ok(pool)
  local why = pool:check()
  assert(why == nil, "pool invariant broken: " .. tostring(why))
end

describe("the block pool", function()
  it("splits a segment between small blocks and reuses a freed block in place", function()
    local pool <close> = C.pool_new(1 << 40)
    local a = pool:alloc(256 * KiB)
    local b = pool:alloc(256 * KiB)
    ok(pool)
    local s = pool:stats()
    assert.are.equal(1, s.segments)
    assert.are.equal(2 * MiB, s.reserved)
    assert.are.equal(512 * KiB, s.live_bytes)
    assert.are.equal(0, a % 512)
    assert.are.equal(256 * KiB, math.abs(b - a))
    assert.is_true(pool:free(a))
    assert.are.equal(a, pool:alloc(256 * KiB))
    assert.are.equal(2 * MiB, pool:stats().reserved)
    ok(pool)
  end)

  it("merges a freed block with both free neighbours", function()
    local pool <close> = C.pool_new(1 << 40)
    local a, b, c = pool:alloc(1000), pool:alloc(3000), pool:alloc(700)
    pool:free(a)
    pool:free(c)
    ok(pool)
    assert.are.equal(2, pool:stats().free_blocks) -- a alone; c merged with the tail
    pool:free(b)
    ok(pool)
    local s = pool:stats()
    assert.are.equal(1, s.free_blocks)
    assert.are.equal(2 * MiB, s.largest_free)
    assert.are.equal(0, s.live_bytes)
  end)

  it("takes the best-fitting free block, not the first", function()
    local pool <close> = C.pool_new(1 << 40)
    local big, sep1, small, sep2 = pool:alloc(64 * KiB), pool:alloc(512), pool:alloc(8 * KiB),
      pool:alloc(512)
    pool:free(big)
    pool:free(small)
    assert.are.equal(small, pool:alloc(8 * KiB))
    assert.are.equal(big, pool:alloc(40 * KiB))
    ok(pool)
    pool:free(sep1)
    pool:free(sep2)
    ok(pool)
  end)

  it("keeps small and large requests in separate segments", function()
    local pool <close> = C.pool_new(1 << 40)
    pool:alloc(4 * KiB)
    pool:alloc(3 * MiB)       -- a 20 MiB segment, split
    pool:alloc(5 * MiB)       -- from the same one
    pool:alloc(64 * MiB)      -- its own segment, 64 MiB
    local s = pool:stats()
    assert.are.equal(3, s.segments)
    assert.are.equal(2 * MiB + 20 * MiB + 64 * MiB, s.reserved)
    ok(pool)
  end)

  it("gives free segments back when the device runs out, then fails cleanly", function()
    local pool <close> = C.pool_new(21 * MiB)
    local a = pool:alloc(1000)             -- a 2 MiB small segment
    pool:free(a)
    local big = pool:alloc(20 * MiB)       -- needs 20 MiB: the free small segment goes back
    assert.is_not_nil(big)
    local s = pool:stats()
    assert.are.equal(1, s.segments)
    assert.are.equal(20 * MiB, s.backend_held)
    local c = pool:alloc(1000)
    assert.is_nil(c)                       -- 2 MiB more cannot be had, nothing to give back
    ok(pool)
    assert.are.equal(20 * MiB, pool:stats().live_bytes)
    pool:free(big)
    assert.are.equal(20 * MiB, pool:trim())
    assert.are.equal(0, pool:stats().backend_held)
    assert.is_not_nil(pool:alloc(1000))
    ok(pool)
  end)

  it("refuses a size no segment can hold, and stays intact", function()
    local pool <close> = C.pool_new(math.maxinteger)
    assert.is_nil(pool:alloc(math.maxinteger))
    assert.is_nil(pool:alloc(math.maxinteger - 1000))
    assert.are.equal(0, pool:stats().segments)
    assert.is_not_nil(pool:alloc(100))
    ok(pool)
  end)

  it("ignores an address it did not hand out, and a second free", function()
    local pool <close> = C.pool_new(1 << 40)
    local a = pool:alloc(4096)
    assert.is_false(pool:free(a + 512))
    assert.is_true(pool:free(a))
    assert.is_false(pool:free(a))
    ok(pool)
  end)

  it("holds its invariants through a long random workload, with no overlap", function()
    local pool <close> = C.pool_new(1 << 40)
    local seed = 12345
    local function rand(n) -- a small LCG: the same sequence everywhere
      seed = (seed * 1103515245 + 12345) % 2147483648
      return seed % n
    end
    local live, order = {}, {}
    for step = 1, 3000 do
      if #order > 0 and rand(100) < 45 then
        local i = rand(#order) + 1
        local addr = order[i]
        order[i] = order[#order]
        order[#order] = nil
        assert.is_true(pool:free(addr))
        live[addr] = nil
      else
        local kind = rand(10)
        local n = kind < 7 and rand(64 * KiB) + 1 or kind < 9 and rand(8 * MiB) + 1
          or rand(40 * MiB) + 1
        local addr = pool:alloc(n)
        assert.is_not_nil(addr)
        assert.are.equal(0, addr % 512)
        live[addr] = n
        order[#order + 1] = addr
      end
      if step % 250 == 0 then
        ok(pool)
        local spans = {}
        for addr, n in pairs(live) do spans[#spans + 1] = { addr, n } end
        table.sort(spans, function(x, y) return x[1] < y[1] end)
        for i = 2, #spans do
          assert(spans[i - 1][1] + spans[i - 1][2] <= spans[i][1], "two live blocks overlap")
        end
      end
    end
    for _, addr in ipairs(order) do pool:free(addr) end
    ok(pool)
    local s = pool:stats()
    assert.are.equal(0, s.live_bytes)
    assert.are.equal(s.segments, s.free_blocks) -- every segment merged back into one block
    assert.are.equal(s.reserved, pool:trim())
    assert.are.equal(0, pool:stats().backend_held)
  end)

  it("raises a clear error when used after close", function()
    local pool = C.pool_new(MiB)
    pool:close()
    assert.has_error(function() pool:alloc(1) end, "pool: used after it was closed")
  end)
end)
