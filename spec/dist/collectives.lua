-- allreduce (sum, mean, max), broadcast from every root, and all_gather on odd sizes,
-- empty and 0-d tensors, float32 and float64, checked on every rank against values
-- computed locally. Prints "RESULT <rank> collectives ok" or raises (dist.run ends the job).
local remat = require "remat"
local dist = remat.dist
local H = require "dist.common"

dist.run(function()
  dist.init { timeout = 20 }
  local W, r = dist.world_size(), dist.rank()
  -- rank q's value at flat position i: exact in float32 (small integers and halves)
  local function val(q, i) return ((i * 7 + q * 3) % 23) - 11 + 0.5 * q end
  local function make(q, shape, dtype)
    local n = 1
    for _, s in ipairs(shape) do n = n * s end
    local flat = {}
    for i = 1, n do flat[i] = val(q, i) end
    local t = remat.tensor(flat, dtype)
    if #shape == 0 then return t:view() end
    return t:view(table.unpack(shape))
  end
  local function check(what, got, want)
    local g = H.values(got)
    assert(#g == #want, ("%s: %d values, expected %d"):format(what, #g, #want))
    for i = 1, #want do
      if g[i] ~= want[i] then error(("%s: element %d is %s, expected %s"):format(what, i, g[i], want[i]), 0) end
    end
  end
  local n_checks = 0
  for _, dtype in ipairs { "float32", "float64" } do
    for _, shape in ipairs { { 1 }, { 7 }, { 3, 5 }, { 1001 }, { 2, 1, 3 }, { 0 }, {} } do
      local n = 1
      for _, s in ipairs(shape) do n = n * s end
      local label = ("%s %s"):format(dtype, #shape == 0 and "0-d" or table.concat(shape, "x"))
      for _, op in ipairs { "sum", "mean", "max" } do
        local t = make(r, shape, dtype)
        local same = dist.allreduce(t, op)
        assert(same == t, "allreduce returns its argument")
        local want = {}
        for i = 1, n do
          local acc = op == "max" and -math.huge or 0
          for q = 1, W do acc = op == "max" and math.max(acc, val(q, i)) or acc + val(q, i) end
          want[i] = op == "mean" and acc / W or acc
        end
        check("allreduce " .. op .. " " .. label, t, want)
        n_checks = n_checks + 1
      end
      for root = 1, W do
        local t = make(r, shape, dtype)
        dist.broadcast(t, root)
        local want = {}
        for i = 1, n do want[i] = val(root, i) end
        check(("broadcast from %d %s"):format(root, label), t, want)
        n_checks = n_checks + 1
      end
      local g = dist.all_gather(make(r, shape, dtype))
      local gshape = g:shape()
      assert(gshape[1] == (#shape == 0 and W or shape[1] * W), "all_gather: first dimension is world_size times")
      local want = {}
      for q = 1, W do for i = 1, n do want[#want + 1] = val(q, i) end end
      check("all_gather " .. label, g, want)
      local list = dist.all_gather(make(r, shape, dtype), { list = true })
      assert(#list == W, "all_gather list has world_size tensors")
      for q = 1, W do
        local wq = {}
        for i = 1, n do wq[i] = val(q, i) end
        check(("all_gather list[%d] %s"):format(q, label), list[q], wq)
      end
      n_checks = n_checks + 2
    end
  end
  -- bad input: clear errors, and the job goes on
  local ok, err = pcall(dist.allreduce, remat.ones(3), "prod")
  assert(not ok and err:find("unknown op 'prod'"), tostring(err))
  ok, err = pcall(dist.broadcast, remat.ones(3), W + 1)
  assert(not ok and err:find("root " .. (W + 1) .. " is not a rank"), tostring(err))
  ok, err = pcall(dist.allreduce, remat.ones(3, 4):transpose(1, 2), "sum")
  assert(not ok and err:find("contiguous"), tostring(err))
  dist.barrier()
  H.result("collectives", n_checks)
end)
