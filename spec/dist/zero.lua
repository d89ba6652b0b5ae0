-- ZeRO stage 1: dist.ShardedAdamW gives the same parameters as optim.AdamW (both under
-- DataParallel, several steps, a learning-rate change midway), keeps 1/world of the
-- state (memory category optim), and its memory report says so.
local remat = require "remat"
local dist, nn, optim = remat.dist, remat.nn, remat.optim
local H = require "dist.common"

dist.run(function()
  dist.init { timeout = 20 }
  local W, r = dist.world_size(), dist.rank()
  local B, steps = 8, 4
  local per = B // W

  local function train(sharded)
    collectgarbage()
    collectgarbage()
    local base = remat.memory.stats().by_category.optim
    local dp = dist.DataParallel(H.model(3))
    local make = sharded and dist.ShardedAdamW or optim.AdamW
    local opt = make(dp:parameters(), { lr = 0.02, weight_decay = 0.05, betas = { 0.8, 0.99 } })
    for k = 1, steps do
      if k == 3 then opt.lr = 0.005 end
      local x, y = H.batch(k, B)
      x, y = H.rows(x, y, (r - 1) * per + 1, per)
      dp:backward(nn.cross_entropy(dp(x), y))
      opt:step()
      opt:zero_grad()
    end
    local optim_bytes = remat.memory.stats().by_category.optim - base
    local flat = H.flat(dp)
    dp:close()
    return flat, optim_bytes, opt
  end

  local ref, full_bytes = train(false)
  local got, shard_bytes, opt = train(true)
  local abs = H.maxdiff(got, ref)
  H.result("zero_abs", abs)
  H.result("optim_full", full_bytes)
  H.result("optim_shard", shard_bytes)
  H.result("optim_ratio", shard_bytes / full_bytes)
  local m = opt:memory()
  H.result("memory_full_matches", m.full == full_bytes)
  H.result("memory_bytes_matches", m.bytes == shard_bytes)
  local report = opt:memory_report()
  H.result("report_says_world", report:find(("sharded over %d ranks"):format(W), 1, true) ~= nil)
  if r == 1 then io.stdout:write(report, "\n") end
  -- every rank's shard sizes add up to the whole state
  local t = remat.tensor({ shard_bytes }, "float64")
  dist.allreduce(t, "sum")
  H.result("shards_sum_to_full", t:item() == full_bytes)
end)
