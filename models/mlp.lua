-- A residual MLP on Fashion-MNIST, trained under an activation-memory budget.
--
--   remat models/mlp.lua [--epochs 2] [--batch 128] [--blocks 8] [--width 256]
--                        [--lr 2e-3] [--budget 60%|BYTES|none] [--every 100]
--                        [--seed 1] [--save PATH] [--log PATH] [--quick]
--
-- The model: Linear(784, W) -> GELU -> B residual blocks (LayerNorm, Linear(W, 2W), GELU,
-- Linear(2W, W)) -> LayerNorm -> Linear(W, 10), trained with AdamW and a warmup + cosine
-- learning rate. Before training it computes what keeping every activation needs
-- (model:plan(x)), then trains under remat.policy.budget at --budget (by default 60% of
-- that peak), prints the plan, and prints the measured activation peak of one step next
-- to the predicted one. At the end: test accuracy, peak memory by category, and a save /
-- reload check of the weights (the reloaded model must give the same outputs).
-- --log PATH: a metrics log (.jsonl or .csv, one record per step) for `remat plot PATH`.
--
-- `--quick`: a small model on a slice of the data, for specs (a few seconds).
-- `--plan` as the first argument (the convention of `remat plan SCRIPT`): returns
-- { model =, input = function() -> x, loss = function(y) -> scalar loss } and trains nothing.
local remat = require "remat"
local nn, optim, policy = remat.nn, remat.optim, remat.policy
local fmt = remat.memory.format
local cli = require "remat.cli"

local argv = { ... } -- as `remat SCRIPT args` and `remat plan` pass them

-- msg nil: --help (the usage on stdout, exit 0).
local function usage(msg)
  local text = "usage: remat models/mlp.lua [--epochs N] [--batch N] [--blocks N] [--width N] [--lr X]\n"
    .. "       [--budget 60%|BYTES|none] [--every N] [--seed N] [--save PATH] [--log PATH] [--quick]\n"
  if not msg then io.write(text) os.exit(0) end
  io.stderr:write("models/mlp.lua: ", msg, "\n", text)
  os.exit(2)
end

local o = { epochs = 2, batch = 128, blocks = 8, width = 256, lr = 2e-3, budget = "60%", every = 100, seed = 1,
            save = nil, log = nil, quick = false, plan = false, train_limit = nil, test_limit = nil }
do
  cli.parse(argv, o, {
    numbers = { epochs = true, batch = true, blocks = true, width = true, lr = true, every = true, seed = true },
    strings = { budget = true, save = true, log = true }, switches = { quick = true, plan = true }, usage = usage })
  if o.quick then
    o.epochs, o.blocks, o.width, o.train_limit, o.test_limit, o.every = 1, 4, 64, 2048, 1000, 4
  end
  for _, k in ipairs { "epochs", "batch", "blocks", "width", "every" } do
    if math.tointeger(o[k]) == nil or o[k] < 1 then usage(("--%s must be an integer >= 1"):format(k)) end
    o[k] = math.tointeger(o[k])
  end
end

local function build()
  remat.manual_seed(o.seed)
  local w = o.width
  local layers = { nn.Linear(784, w), nn.GELU() }
  for _ = 1, o.blocks do
    layers[#layers + 1] = nn.Residual(nn.Sequential { nn.LayerNorm(w), nn.Linear(w, 2 * w), nn.GELU(), nn.Linear(2 * w, w) })
  end
  layers[#layers + 1] = nn.LayerNorm(w)
  layers[#layers + 1] = nn.Linear(w, 10)
  return nn.Sequential(layers)
end

-- Example batch for planning: the shape training uses (random values; sizes are what matter).
local function example_input()
  remat.manual_seed(o.seed + 1)
  return remat.rand(o.batch, 784)
end

local example_loss = cli.example_loss(o.batch, 10)

if o.plan then
  return { model = build(), input = example_input, loss = example_loss }
end

local train = remat.data.fashion_mnist("train", { limit = o.train_limit })
local test = remat.data.fashion_mnist("test", { limit = o.test_limit })
print(("%s\n%s"):format(tostring(train), tostring(test)))

local model = build()
print(model)

-- The plan: keep-everything peak first, then a budget below it.
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
local opt = optim.AdamW(model:parameters(), { lr = o.lr, weight_decay = 0.01 })
local sched = optim.scheduler(opt, optim.schedule.warmup_cosine {
  warmup = math.max(1, total // 20), total = total, base = o.lr, min = o.lr * 0.05 })

print(("training: %d epochs of %d steps, batch %d, AdamW lr %g (warmup + cosine)"):format(
  o.epochs, steps_per_epoch, o.batch, o.lr))
local measured
local run = remat.train.fit {
  model = model, optimizer = opt, scheduler = sched, data = train, batch_size = o.batch, epochs = o.epochs,
  progress = print, every = o.every, log = o.log,
  -- measure one step's activation peak (step 1 resolved the plan and made the state)
  before_step = function(step)
    if step == 2 then
      collectgarbage()
      collectgarbage()
      remat.memory.reset_peak()
    end
  end,
  after_backward = function(step)
    if step == 2 then measured = remat.memory.stats().peak_by_category.activation end
  end,
}
if measured then
  print(("activation peak of one step: measured %s, predicted %s (%+.1f%%)%s"):format(fmt(measured),
    fmt(plan.predicted_peak), 100 * (measured - plan.predicted_peak) / plan.predicted_peak,
    budget and (", budget %s"):format(fmt(budget)) or ""))
end

local acc = remat.train.accuracy(model, test)
print(("test accuracy %.2f%% after %d epochs (%.1f s of training, %.0f examples/s)"):format(100 * acc, o.epochs,
  run.seconds, run.examples_per_s))

local m = remat.memory.stats()
local cats = {}
for _, c in ipairs { "param", "grad", "optim", "activation", "workspace", "temp", "data" } do
  cats[#cats + 1] = ("%s %s"):format(c, fmt(m.peak_by_category[c] or 0))
end
print("peak memory by category: " .. table.concat(cats, ", "))

-- Save, reload into a fresh model, and check the outputs agree.
local path = o.save or os.tmpname()
remat.save(path, model:state_dict())
local copy = build()
copy:load_state_dict(remat.load(path))
model:eval()
copy:eval()
local xb = test:take({ 1, 2, 3, 4, 5, 6, 7, 8 })
local same = remat.no_grad(function()
  local a, b = model(xb):totable(), copy(xb):totable()
  for i = 1, #a do
    for j = 1, #a[i] do if a[i][j] ~= b[i][j] then return false end end
  end
  return true
end)
if not o.save then os.remove(path) end
print(("saved weights to %s and reloaded them: outputs %s"):format(o.save or "a temporary file",
  same and "identical" or "DIFFER"))
if not same then os.exit(1) end
