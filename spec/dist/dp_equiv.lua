-- Two ranks with half the batch each vs one process with the whole batch: after
-- several SGD and AdamW steps the parameters agree within float32 reduction
-- tolerance. Also: a checkpoint policy on the wrapped model changes nothing (bitwise),
-- gradients are averaged even for a parameter only one rank used, and no_sync
-- accumulation equals one backward over the concatenated micro-batches.
local remat = require "remat"
local dist, nn, optim, policy = remat.dist, remat.nn, remat.optim, remat.policy
local H = require "dist.common"

dist.run(function()
  dist.init { timeout = 20 }
  local W, r = dist.world_size(), dist.rank()
  local B, steps = 16, 5
  local per = B // W

  local function train(kind, opts)
    local model = H.model(7)
    local dp = opts.dp and dist.DataParallel(model, { bucket = opts.bucket }) or model
    if opts.policy then dp:checkpoint(opts.policy) end
    local opt = kind == "sgd" and optim.SGD(dp:parameters(), { lr = 0.1, momentum = 0.9 })
      or optim.AdamW(dp:parameters(), { lr = 0.01, weight_decay = 0.01 })
    for k = 1, steps do
      local x, y = H.batch(k, B)
      if opts.dp then x, y = H.rows(x, y, (r - 1) * per + 1, per) end
      local loss = nn.cross_entropy(dp(x), y)
      loss:backward()   -- DataParallel: averaged when backward returns (no dp:sync())
      if opts.dp then
        local info = dp:info()
        H.result(("%s_started_early_%d"):format(kind, #info.buckets), info.started_during_backward)
      end
      opt:step()
      opt:zero_grad()
    end
    local flat = H.flat(model)
    if opts.dp then dp:close() end
    return flat
  end

  for _, kind in ipairs { "sgd", "adamw" } do
    local ref = train(kind, { dp = false })
    local got = train(kind, { dp = true, bucket = 600 })   -- several buckets
    local abs, rel = H.maxdiff(got, ref)
    H.result(kind .. "_abs", abs)
    H.result(kind .. "_rel", rel)
    local one = train(kind, { dp = true, bucket = 1 << 30 })  -- one bucket
    local a1 = H.maxdiff(one, got)
    H.result(kind .. "_bucket_abs", a1)
    local ck = train(kind, { dp = true, bucket = 600, policy = policy.every(2) })
    local a2 = H.maxdiff(ck, got)
    H.result(kind .. "_ckpt_abs", a2)
  end

  -- every rank ends with the same parameters (all_gather them and compare)
  local model = H.model(r)          -- different weights per rank before the broadcast
  local dp = dist.DataParallel(model)
  local mine = H.flat(model)
  local t = remat.tensor(mine)
  local all = dist.all_gather(t, { list = true })
  local same = true
  for q = 1, W do
    local a, b = all[q]:totable(), mine
    for i = 1, #a do same = same and a[i] == b[i] end
  end
  H.result("broadcast_same", same)

  -- a parameter used on one rank only: its gradient is the average with zeros
  local x, y = H.batch(1, 4)
  local loss = r == 1 and nn.cross_entropy(dp(x), y) or (dp[1](x)):sum()
  loss:backward()
  local g = dp:parameters()[#dp:parameters()].grad
  local has = g ~= nil
  local gsum = remat.tensor(has and { 1 } or { 0 })
  dist.allreduce(gsum, "sum")
  H.result("unused_grad_everywhere", gsum:item() == W)
  dp:zero_grad()

  -- no_sync: two micro-batches accumulated then one reduction == one bigger batch
  dp:no_sync(function()
    local x1, y1 = H.batch(2, 4)
    local l1 = nn.cross_entropy(dp(x1), y1) * 0.5
    l1:backward()
  end)
  local x2, y2 = H.batch(3, 4)
  local l2 = nn.cross_entropy(dp(x2), y2) * 0.5
  l2:backward()
  local acc = {}
  for _, p in ipairs(dp:parameters()) do acc[#acc + 1] = p.grad:clone() end
  dp:zero_grad()
  dp:close()
  local ref = H.model(1)
  local x1, y1 = H.batch(2, 4)
  local la = nn.cross_entropy(ref(x1), y1) * 0.5
  la:backward()
  local lb = nn.cross_entropy(ref(x2), y2) * 0.5
  lb:backward()
  local worst = 0
  for i, p in ipairs(ref:parameters()) do
    worst = math.max(worst, (H.maxdiff(H.values(p.grad), H.values(acc[i]))))
  end
  H.result("no_sync_abs", worst)
  H.result("done", true)
  dist.finalize()
end)
