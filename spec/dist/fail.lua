-- An error on one rank, in the middle of data-parallel training, ends the job on every
-- rank: rank 2 raises during its third forward while rank 1 waits in backward's reduction;
-- dist.run prints the error on both and ends the job (exit code 1).
-- With `plain` as argument, no dist.run: the failing rank's process just ends with the
-- error, and rank 1 fails a few seconds later ("rank 2 ended ...").
local remat = require "remat"
local dist, nn, optim = remat.dist, remat.nn, remat.optim
local H = require "dist.common"
local plain = (arg and arg[1]) == "plain"

local function main()
  dist.init { timeout = 20 }
  local r = dist.rank()
  local dp = dist.DataParallel(H.model(5))
  local opt = optim.SGD(dp:parameters(), { lr = 0.1 })
  for k = 1, 5 do
    local x, y = H.batch(k, 4)
    if r == 2 and k == 3 then error("rank two broke in step " .. k) end
    dp:backward(nn.cross_entropy(dp(x), y))
    opt:step()
    opt:zero_grad()
  end
  print("UNREACHABLE: rank " .. r .. " finished")
end

if plain then main() else dist.run(main) end
