-- Data-parallel training of the default model (models/mlp.lua's residual MLP) on
-- Fashion-MNIST: `make run-dist` runs it on 2 processes.
--
--   mpirun -np 2 remat dist/train.lua [--epochs 1] [--batch 128] [--lr 2e-3]
--                 [--zero] [--policy none|sqrt|every:K] [--limit N] [--quick] [--save PATH]
--
-- --batch is the global batch: each rank takes batch / world_size examples of its own
-- shard per step; gradients are averaged in buckets that start reducing during
-- backward. --zero shards AdamW's state over the ranks (ZeRO stage 1). --policy sets a
-- checkpoint policy (each rank plans its own memory). Rank 1 prints and saves; an
-- error on any rank ends the job (dist.run). Run with one process it trains alone.
local remat = require "remat"
local dist, nn, optim, policy = remat.dist, remat.nn, remat.optim, remat.policy
local fmt = remat.memory.format
local argv = arg or {}

local function usage(msg)
  error("dist/train.lua: " .. msg .. "\nusage: remat dist/train.lua [--epochs N] [--batch N] [--lr X] [--zero] " ..
    "[--policy none|sqrt|every:K] [--limit N] [--quick] [--save PATH]", 0)
end

dist.run(function()
  dist.init()
  local W, r = dist.world_size(), dist.rank()
  local o = { epochs = 1, batch = 128, lr = 2e-3, zero = false, policy = "none", limit = nil, quick = false,
              every = 50, seed = 1 }
  local i = 1
  while i <= #argv do
    local a, v = argv[i], argv[i + 1]
    if a == "--zero" then o.zero = true
    elseif a == "--quick" then o.quick = true
    elseif a == "--policy" or a == "--save" then o[a:sub(3)] = v or usage(a .. " needs a value"); i = i + 1
    elseif a == "--epochs" or a == "--batch" or a == "--lr" or a == "--limit" or a == "--every" then
      o[a:sub(3)] = tonumber(v) or usage(a .. " needs a number")
      i = i + 1
    else usage("unknown argument " .. tostring(a)) end
    i = i + 1
  end
  if o.quick then o.limit, o.every = o.limit or 4096, 8 end
  if o.batch % W ~= 0 then usage(("--batch %d does not split over %d ranks"):format(o.batch, W)) end
  local per = o.batch // W

  -- the default model, as models/mlp.lua defines it (its --plan convention)
  local margs = { "--plan", "--seed", tostring(o.seed) }
  if o.quick then margs[#margs + 1] = "--quick" end
  local def = assert(loadfile("models/mlp.lua"))(table.unpack(margs))
  local model = dist.DataParallel(def.model)   -- rank 1's weights on every rank
  if o.policy == "sqrt" then model:checkpoint(policy.sqrt())
  elseif o.policy:match("^every:%d+$") then model:checkpoint(policy.every(tonumber(o.policy:match("%d+"))))
  elseif o.policy ~= "none" then usage("--policy: none, sqrt or every:K, got " .. o.policy) end

  local train = remat.data.fashion_mnist("train", { rank = r, world_size = W, limit = o.limit })
  dist.print(("%d ranks, global batch %d (%d per rank), %s; rank 1 trains on %s"):format(W, o.batch, per,
    o.zero and "sharded AdamW (ZeRO-1)" or "AdamW", tostring(train)))
  dist.print(model)

  -- every rank takes the same number of steps (shards may differ by one example)
  local steps_t = remat.tensor { -train:num_batches(per, true) }
  dist.allreduce(steps_t, "max")
  local steps = -math.floor(steps_t:item())
  local total = steps * o.epochs
  local make = o.zero and dist.ShardedAdamW or optim.AdamW
  local opt = make(model:parameters(), { lr = o.lr, weight_decay = 0.01 })
  local sched = optim.scheduler(opt, optim.schedule.warmup_cosine {
    warmup = math.max(1, total // 20), total = total, base = o.lr, min = o.lr * 0.05 })

  dist.reset_stats()
  local step, t0 = 0, remat.now()
  local t_last, step_last = t0, 0
  for epoch = 1, o.epochs do
    local loss_sum = remat.zeros(1)
    local k = 0
    for xb, yb in train:batches(per, { drop_last = true }) do
      k = k + 1
      if k > steps then xb:free(); yb:free(); break end
      step = step + 1
      sched:step()
      local logits <close> = model(xb)
      local loss <close> = nn.cross_entropy(logits, yb)
      model:backward(loss)
      opt:step()
      opt:zero_grad()
      loss_sum = loss_sum + loss:detach()
      xb:free()
      yb:free()
      if step % o.every == 0 or step == total then
        local mean = dist.allreduce(loss_sum / (step - step_last), "mean"):item()
        local now = remat.now()
        dist.print(("epoch %d step %4d/%d  loss %.4f  %7.0f ex/s (all ranks)  lr %.2e"):format(epoch, step, total, mean,
          (step - step_last) * o.batch / (now - t_last), opt.lr))
        loss_sum, t_last, step_last = remat.zeros(1), now, step
      end
    end
  end
  local elapsed = remat.now() - t0
  local sent = dist.stats().bytes
  local info = model:info()
  dist.print(("%d steps in %.1f s (%.1f ms/step, %.0f examples/s); this rank sent %s per step through collectives " ..
    "for %s of gradients in %d buckets"):format(step, elapsed, 1000 * elapsed / step, step * o.batch / elapsed,
    fmt(sent / step), fmt(info.grad_bytes), #info.buckets))
  local m = remat.memory.stats()
  dist.print(("peak memory by category on rank 1: param %s, grad %s, optim %s, activation %s, workspace %s"):format(
    fmt(m.peak_by_category.param), fmt(m.peak_by_category.grad), fmt(m.peak_by_category.optim),
    fmt(m.peak_by_category.activation), fmt(m.peak_by_category.workspace)))
  if o.zero then dist.print(opt:memory_report()) end

  if dist.is_main() then
    local test = remat.data.fashion_mnist("test", { limit = o.quick and 1000 or nil })
    model:eval()
    local correct = 0
    remat.no_grad(function()
      for xb, yb in test:batches(1000, { shuffle = false }) do
        local pred <close> = model(xb):argmax(2)
        local hit <close> = pred:eq(yb):sum()
        correct = correct + hit:item()
        xb:free()
        yb:free()
      end
    end)
    print(("test accuracy %.2f%%"):format(100 * correct / test.n))
    if o.save then
      remat.save(o.save, model:state_dict())
      print("saved the weights to " .. o.save)
    end
  end
  model:close()
  dist.finalize()
end)
