-- A collective that waits longer than the timeout fails with an error naming it:
-- rank 2 is busy for 4 s before its allreduce, rank 1 (timeout 1 s) gives up, and
-- dist.run ends the job.
local remat = require "remat"
local dist = remat.dist

dist.run(function()
  dist.init { timeout = 1 }
  dist.barrier()
  if dist.rank() == 2 then
    local t0 = remat.now()
    while remat.now() - t0 < 4 do end
  end
  dist.allreduce(remat.ones(5), "sum")
  print("UNREACHABLE: rank " .. dist.rank() .. " finished")
end)
