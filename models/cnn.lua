-- A small CNN on Fashion-MNIST, trained under an activation-memory budget.
--
--   remat models/cnn.lua [--epochs 2] [--batch 128] [--width 32] [--lr 3e-3]
--                        [--budget 90%|BYTES|none] [--every 100] [--seed 1] [--no-batchnorm]
--                        [--log PATH] [--quick]
-- (--no-batchnorm: without the BatchNorm2d after each convolution; --log PATH: a metrics
-- log, .jsonl or .csv, one record per step, for `remat plot PATH`)
--
-- The model: Conv2d(1, W/2, 3, pad 1) -> BatchNorm2d -> ReLU -> MaxPool2d(2)
--            -> Conv2d(W/2, W, 3, pad 1) -> BatchNorm2d -> ReLU -> MaxPool2d(2)
--            -> Flatten -> Linear(W*49, 128) -> ReLU -> Linear(128, 10),
-- trained with AdamW and a warmup + cosine learning rate (remat.train.fit). It reached
-- 90.93% test accuracy after the default 2 epochs (25 s of training on a 2-core machine
-- with nothing else running; `make run`'s MLP trains its 2 epochs in about 16 s; 89.21%
-- without BatchNorm, in an earlier version). Before training it prints
-- what keeping every activation needs and the plan under remat.policy.budget at
-- --budget (by default 90% of that peak): the plan lists each layer's recompute cost,
-- where the convolutions are the expensive ones and ReLU / pooling the cheap ones the
-- budget policy recomputes first. At the end: test accuracy and the time it took.
--
-- `--quick`: a narrow model on a slice of the data, for specs (a few seconds).
-- `--plan` as the first argument (the convention of `remat plan SCRIPT`): returns
-- { model =, input = function() -> x, loss = function(y) -> scalar loss } and trains nothing.
local remat = require "remat"
local nn, optim, policy = remat.nn, remat.optim, remat.policy
local fmt = remat.memory.format
local cli = require "remat.cli"

local argv = { ... }

local function usage(msg)
  local text = "usage: remat models/cnn.lua [--epochs N] [--batch N] [--width N] [--lr X]\n"
    .. "       [--budget 90%|BYTES|none] [--every N] [--seed N] [--no-batchnorm] [--log PATH] [--quick]\n"
  if not msg then io.write(text) os.exit(0) end
  io.stderr:write("models/cnn.lua: ", msg, "\n", text)
  os.exit(2)
end

local o = { epochs = 2, batch = 128, width = 32, lr = 3e-3, budget = "90%", every = 100, seed = 1,
            log = nil, quick = false, plan = false, ["no-batchnorm"] = false, train_limit = nil, test_limit = nil }
do
  cli.parse(argv, o, {
    numbers = { epochs = true, batch = true, width = true, lr = true, every = true, seed = true },
    strings = { budget = true, log = true }, switches = { quick = true, plan = true, ["no-batchnorm"] = true }, usage = usage })
  if o.quick then
    o.epochs, o.width, o.train_limit, o.test_limit, o.every, o.batch = 1, 8, 1024, 500, 4, 64
  end
  for _, k in ipairs { "epochs", "batch", "width", "every" } do
    if math.tointeger(o[k]) == nil or o[k] < 1 then usage(("--%s must be an integer >= 1"):format(k)) end
    o[k] = math.tointeger(o[k])
  end
  if o.width % 2 ~= 0 then usage("--width must be even") end
end

local function build()
  remat.manual_seed(o.seed)
  local w = o.width
  local layers = {}
  local function add(m) layers[#layers + 1] = m end
  add(nn.Conv2d(1, w // 2, 3, { padding = 1 }))
  local bn = not o["no-batchnorm"]
  if bn then add(nn.BatchNorm2d(w // 2)) end
  add(nn.ReLU()); add(nn.MaxPool2d(2))
  add(nn.Conv2d(w // 2, w, 3, { padding = 1 }))
  if bn then add(nn.BatchNorm2d(w)) end
  add(nn.ReLU()); add(nn.MaxPool2d(2))
  add(nn.Flatten()); add(nn.Linear(w * 49, 128)); add(nn.ReLU()); add(nn.Linear(128, 10))
  return nn.Sequential(layers)
end

local function example_input()
  remat.manual_seed(o.seed + 1)
  return remat.rand(o.batch, 1, 28, 28)
end

local example_loss = cli.example_loss(o.batch, 10)

if o.plan then
  return { model = build(), input = example_input, loss = example_loss }
end

-- Images (N, 784) in [0, 1] -> (N, 1, 28, 28).
local function images(xb) return xb:view(xb:size(1), 1, 28, 28) end

local train = remat.data.fashion_mnist("train", { limit = o.train_limit })
local test = remat.data.fashion_mnist("test", { limit = o.test_limit })
print(("%s\n%s"):format(tostring(train), tostring(test)))

local model = build()
print(model)

local xplan = example_input()
local keep = model:plan(xplan, { loss = example_loss })
local ok, budget = pcall(cli.budget, o.budget, keep.keep_peak)
if not ok then usage(budget) end
if budget then
  model:checkpoint(policy.budget(budget))
  print(("keeping every activation needs %s; training under policy.budget(%s) (%s of it)"):format(
    fmt(keep.keep_peak), fmt(budget), o.budget))
else
  print(("keeping every activation: %s"):format(fmt(keep.keep_peak)))
end
local plan = model:plan(xplan, { loss = example_loss })
print(plan)
xplan:free()

local steps_per_epoch = train:num_batches(o.batch, true)
local total = steps_per_epoch * o.epochs
local opt = optim.AdamW(model:parameters(), { lr = o.lr, weight_decay = 1e-4 })
local sched = optim.scheduler(opt, optim.schedule.warmup_cosine {
  warmup = math.max(1, total // 20), total = total, base = o.lr, min = o.lr * 0.02 })

print(("training: %d epochs of %d steps, batch %d, AdamW lr %g (warmup + cosine)"):format(
  o.epochs, steps_per_epoch, o.batch, o.lr))
local run = remat.train.fit {
  model = model, optimizer = opt, scheduler = sched, data = train, batch_size = o.batch, epochs = o.epochs,
  input = images, progress = print, every = o.every, log = o.log,
}

local acc = remat.train.accuracy(model, test, { batch_size = 500, input = images })
print(("test accuracy %.2f%% after %d epochs (%.1f s of training, %.0f examples/s)"):format(100 * acc, o.epochs,
  run.seconds, run.examples_per_s))
