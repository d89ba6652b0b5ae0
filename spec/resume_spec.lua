-- One-file training checkpoints (remat.save_checkpoint / remat.load_checkpoint): a run
-- saved after N steps and resumed in a fresh model, optimizer and scheduler ends bit
-- for bit where the uninterrupted run does, dropout's random draws included.
local remat = require "remat"
local nn, optim = remat.nn, remat.optim
local C = remat._C

local function batch(k)
  remat.manual_seed(1000 + k) -- the data depend on the step only
  local x = remat.randn(8, 6)
  local y = remat.tensor { 1, 2, 3, 1, 2, 3, 1, 2 }
  return x, y
end

-- A fresh model, optimizer and scheduler; init_seed decides the initial weights.
local function build(kind, init_seed)
  remat.manual_seed(init_seed)
  local model = nn.Sequential { nn.Linear(6, 16), nn.GELU(), nn.Dropout(0.3), nn.Linear(16, 3) }
  local opt
  if kind == "AdamW" then opt = optim.AdamW(model:parameters(), { lr = 0.01 })
  elseif kind == "SGD" then opt = optim.SGD(model:parameters(), { lr = 0.05, momentum = 0.9, weight_decay = 0.01 })
  else opt = optim.RMSprop(model:parameters(), { lr = 0.01, momentum = 0.5, centered = true }) end
  local sched = optim.scheduler(opt, optim.schedule.warmup(2, optim.schedule.cosine { base = 0.01, total = 8 }))
  return model, opt, sched
end

-- Steps from..to; the generator state carries on from whatever it was (dropout).
local function train(model, opt, sched, from, to)
  for k = from, to do
    local seed, offset = C.rng_state()
    local x, y = batch(k)
    C.set_rng_state(seed, offset)
    sched:step()
    local loss = nn.cross_entropy(model(x), y)
    loss:backward()
    opt:step()
    opt:zero_grad()
  end
end

local function weights(model)
  local out = {}
  for name, t in pairs(model:state_dict()) do out[name] = C.flat(t) end
  return out
end

describe("remat.save_checkpoint / load_checkpoint", function()
  for _, kind in ipairs { "AdamW", "SGD", "RMSprop" } do
    it(kind .. ": 4 steps, save, resume in fresh objects, 4 more steps = 8 uninterrupted steps, bit for bit", function()
      local m1, o1, s1 = build(kind, 7)
      train(m1, o1, s1, 1, 8)

      local m2, o2, s2 = build(kind, 7)
      train(m2, o2, s2, 1, 4)
      local path = os.tmpname()
      remat.save_checkpoint(path, { model = m2, optimizer = o2, scheduler = s2, step = 4, meta = { note = "hi" } })
      train(m2, o2, s2, 5, 6) -- the interrupted run goes on a little: none of it may leak

      local m3, o3, s3 = build(kind, 99) -- other initial weights, no state
      o3.lr = 123
      local step, meta = remat.load_checkpoint(path, { model = m3, optimizer = o3, scheduler = s3 })
      assert.are.equal(4, step)
      assert.are.equal("hi", meta.note)
      assert.are.equal(4, s3.k)
      assert.are.equal(4, o3.steps)
      assert.are.equal(o1.kind, o3.kind)
      train(m3, o3, s3, 5, 8)
      local _, file_meta = remat.load(path)
      os.remove(path)
      assert.are.same(weights(m1), weights(m3))
      assert.are.equal(o1.lr, o3.lr)
      assert.are.equal("remat.checkpoint/1", file_meta.format)
      assert.truthy(file_meta["optim.kind"] == kind and file_meta.rng_seed and file_meta["scheduler.k"] == "4")
    end)
  end

  it("without a scheduler or step: the optimizer's step count is the step", function()
    local m, o = build("SGD", 3)
    train(m, o, optim.scheduler(o, optim.schedule.constant(0.01)), 1, 3)
    local path = os.tmpname()
    remat.save_checkpoint(path, { model = m, optimizer = o })
    local m2, o2 = build("SGD", 4)
    assert.are.equal(3, (remat.load_checkpoint(path, { model = m2, optimizer = o2 })))
    assert.are.same(weights(m), weights(m2))
    local m3 = build("SGD", 5)
    remat.load_checkpoint(path, { model = m3 }) -- the model alone
    assert.are.same(weights(m), weights(m3))
    os.remove(path)
  end)

  it("carries BatchNorm's running statistics (buffers) with the weights", function()
    local function bn_model(seed)
      remat.manual_seed(seed)
      return nn.Sequential { nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3) }
    end
    local m = bn_model(1)
    local o = optim.SGD(m:parameters(), { lr = 0.1, momentum = 0.9 })
    train(m, o, optim.scheduler(o, optim.schedule.constant(0.1)), 1, 3)
    local names = {}
    for _, b in ipairs(m:named_buffers()) do names[#names + 1] = b[1] end
    assert.are.same({ "2.running_mean", "2.running_var" }, names)
    local path = os.tmpname()
    remat.save_checkpoint(path, { model = m, optimizer = o })
    local m2 = bn_model(2)
    local o2 = optim.SGD(m2:parameters(), { lr = 0.1, momentum = 0.9 })
    remat.load_checkpoint(path, { model = m2, optimizer = o2 })
    os.remove(path)
    assert.are.same(C.flat(m[2].running_mean), C.flat(m2[2].running_mean))
    assert.are.same(C.flat(m[2].running_var), C.flat(m2[2].running_var))
    m:eval()
    m2:eval()
    local x = batch(9)
    assert.are.same(C.flat(m(x)), C.flat(m2(x)))
  end)

  it("refuses what does not fit, naming the problem", function()
    local m, o, s = build("AdamW", 1)
    train(m, o, s, 1, 1)
    local path = os.tmpname()
    remat.save_checkpoint(path, { model = m, optimizer = o })
    local function err_of(f, ...)
      local ok, e = pcall(f, ...)
      assert.is_false(ok)
      return e
    end
    local m2, o2, s2 = build("AdamW", 1)
    assert.truthy(err_of(remat.load_checkpoint, path, { model = m2, optimizer = o2, scheduler = s2 })
      :find("holds no scheduler position", 1, true))
    local _, sgd = build("SGD", 1)
    assert.truthy(err_of(remat.load_checkpoint, path, { optimizer = sgd }):find("the state is of a AdamW", 1, true))
    local other = nn.Sequential { nn.Linear(6, 4), nn.Linear(4, 3) }
    assert.truthy(err_of(remat.load_checkpoint, path, { model = other }):find("load_state_dict", 1, true))
    assert.truthy(err_of(remat.load_checkpoint, path, { model = m2, opt = o2 }):find("unknown field 'opt'", 1, true))
    assert.truthy(err_of(remat.save_checkpoint, path, { model = m2, step = -1 }):find("step must be an integer >= 0", 1, true))
    assert.truthy(err_of(remat.save_checkpoint, path, {}):find("give at least a model or an optimizer", 1, true))
    assert.truthy(err_of(remat.save_checkpoint, path, { model = o2 }):find("model must be a module", 1, true))
    local plain = os.tmpname()
    remat.save(plain, m:state_dict())
    assert.truthy(err_of(remat.load_checkpoint, plain, { model = m2 }):find("is not a training checkpoint", 1, true))
    os.remove(plain)
    os.remove(path)
  end)
end)
