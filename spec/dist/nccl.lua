-- NCCL on CUDA tensors (run by a #gpu spec, one GPU per rank): allreduce, broadcast and
-- all_gather of CUDA tensors agree with the same collectives on the CPU, and one
-- data-parallel step on a CUDA model averages the gradients.
local remat = require "remat"
local dist, nn = remat.dist, remat.nn
local H = require "dist.common"

dist.run(function()
  dist.init { timeout = 60 }
  local W, r = dist.world_size(), dist.rank()
  local function same(a, b, what)
    local d = H.maxdiff(H.values(a:cpu()), H.values(b:cpu()))
    if d > 1e-6 then error(("%s: CUDA and CPU differ by %g"):format(what, d), 0) end
  end
  for _, n in ipairs { 1, 7, 1001 } do
    remat.manual_seed(r * 100 + n)
    local host = remat.randn(n)
    local dev = host:cuda()
    dist.allreduce(host, "mean")
    dist.allreduce(dev, "mean")
    same(dev, host, "allreduce " .. n)
    dist.broadcast(host, W)
    dist.broadcast(dev, W)
    same(dev, host, "broadcast " .. n)
    same(dist.all_gather(dev), dist.all_gather(host), "all_gather " .. n)
  end
  local dp = dist.DataParallel(H.model(2):to("cuda"))
  local x, y = H.batch(r, 4)
  dp:backward(nn.cross_entropy(dp(x:cuda()), y:cuda()))
  H.result("nccl", "ok")
end)
