-- remat.train.metrics (a JSON-lines or CSV metrics log), read_metrics, `remat plot`
-- (the picture itself: spec/models_spec.lua), and remat.train.fit / accuracy, the loop
-- the model scripts share.
local remat = require "remat"
local nn, optim, train = remat.nn, remat.optim, remat.train
local files = require "support.files"

local function err_of(f, ...)
  local ok, e = pcall(f, ...)
  assert.is_false(ok, "expected an error")
  return tostring(e)
end

describe("remat.train.metrics", function()
  local dir
  setup(function() dir = files.tmpdir() end)
  teardown(function() os.execute("rm -rf '" .. dir .. "'") end)

  for _, ext in ipairs { "jsonl", "csv" } do
    it("writes ." .. ext .. " records with time and memory by category, read back by read_metrics", function()
      local path = dir .. "/run." .. ext
      local log = train.metrics(path)
      local x = remat.zeros(1000) -- 4000 bytes of activation... or whatever category is current
      local live = remat.memory.stats().live
      log:write { step = 1, loss = 2.5, lr = 0.01, note = "warm" }
      log:write { step = 2, loss = 1.25, lr = 0.005, note = "on" }
      log:close()
      log:close()
      assert.truthy(err_of(log.write, log, { step = 3 }):find("the log was closed", 1, true))
      local m = train.read_metrics(path)
      assert.are.equal(2, #m.rows)
      local r = m.rows[2]
      assert.are.same({ 2, 1.25, 0.005, "on" }, { r.step, r.loss, r.lr, r.note })
      assert.is_true(r.time >= m.rows[1].time and r.time >= 0)
      assert.are.equal(live, m.rows[1].mem_live)
      local sum = 0
      for _, c in ipairs { "param", "grad", "optim", "activation", "workspace", "temp", "data" } do
        assert.truthy(r["mem_" .. c], c)
        sum = sum + r["mem_" .. c]
      end
      assert.are.equal(r.mem_live, sum)
      assert.are.equal("step", m.columns[1])
      x:free()
    end)
  end

  it("CSV keeps the first record's columns; bad records and options raise", function()
    local path = dir .. "/x.csv"
    local log = train.metrics(path)
    log:write { step = 1, loss = 1 }
    log:write { step = 2 } -- a missing value is an empty field
    assert.truthy(err_of(log.write, log, { step = 3, acc = 0.5 }):find("acc is not a column of", 1, true))
    assert.truthy(err_of(log.write, log, { loss = 1 }):find("step must be an integer", 1, true))
    assert.truthy(err_of(log.write, log, { step = 1, loss = {} }):find("loss must be a number or a string", 1, true))
    assert.truthy(err_of(log.write, log, { step = 1, note = "a,b" }):find("has a quote, comma", 1, true))
    log:close()
    assert.is_nil(train.read_metrics(path).rows[2].loss)
    assert.truthy(err_of(train.metrics, dir .. "/no/such/dir/x.jsonl"):find("remat.train.metrics: cannot write", 1, true))
    assert.truthy(err_of(train.metrics, path, { format = "xml" }):find('format must be "jsonl" or "csv"', 1, true))
    assert.truthy(err_of(train.metrics, path, { fmt = "csv" }):find("unknown option 'fmt'", 1, true))
    assert.truthy(err_of(train.read_metrics, dir .. "/none.jsonl"):find("cannot read", 1, true))
  end)
end)

describe("remat.train.fit and accuracy", function()
  -- a separable toy problem: the label is the larger of two coordinates
  local function toy(n, seed)
    remat.manual_seed(seed)
    local x = remat.randn(n, 2)
    local xs, ys = x:totable(), {}
    for i = 1, n do ys[i] = xs[i][1] > xs[i][2] and 1 or 2 end
    return remat.data.tensor_dataset(x, remat.tensor(ys))
  end

  it("trains a classifier over epochs, reports progress and logs every step", function()
    remat.manual_seed(3)
    local model = nn.Sequential { nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2) }
    local opt = optim.RMSprop(model:parameters(), { lr = 0.01 })
    local sched = optim.scheduler(opt, optim.schedule.warmup(5, optim.schedule.cosine { base = 0.01, total = 35 }))
    local lines, calls = {}, { before = 0, after = 0 }
    local path = os.tmpname() .. ".csv"
    local r = train.fit {
      model = model, optimizer = opt, scheduler = sched, data = toy(320, 1), batch_size = 32, epochs = 4,
      progress = function(l) lines[#lines + 1] = l end, every = 10, log = path,
      before_step = function() calls.before = calls.before + 1 end,
      after_backward = function(_, loss) calls.after = calls.after + 1 assert(remat.is_tensor(loss)) end,
    }
    assert.are.equal(40, r.steps)
    assert.are.equal(1280, r.examples)
    assert.are.same({ before = 40, after = 40 }, calls)
    assert.are.equal(40, sched.k)
    assert.are.equal(4, #lines)
    assert.truthy(lines[4]:find("^epoch 4 step   40/40  loss [%d.]+ +%d+ ex/s  memory live .* lr .* ETA 0 s$"), lines[4])
    assert.is_true(r.loss < 0.3, r.loss)
    local m = train.read_metrics(path)
    os.remove(path)
    assert.are.equal(40, #m.rows)
    assert.are.equal(4, m.rows[40].epoch)
    local acc = train.accuracy(model, toy(200, 2), { batch_size = 64 })
    assert.is_true(acc > 0.9, acc)
    assert.is_true(model:is_training())
  end)

  it("takes an input transform, and raises on bad options", function()
    local model = nn.Sequential { nn.Linear(2, 2) }
    local opt = optim.SGD(model:parameters(), { lr = 0.1 })
    local seen = 0
    local ds = toy(8, 1)
    train.fit { model = model, optimizer = opt, data = ds, batch_size = 4, input = function(x) seen = seen + 1 return x * 2 end }
    assert.are.equal(2, seen)
    assert.truthy(err_of(train.fit, { model = model, optimizer = opt, data = ds, batch = 4 }):find("unknown option 'batch'", 1, true))
    assert.truthy(err_of(train.fit, { model = model, optimizer = opt, data = ds, epochs = 0 }):find("epochs must be an integer >= 1", 1, true))
    assert.truthy(err_of(train.fit, { model = model, optimizer = model, data = ds }):find("optimizer must be an optimizer", 1, true))
    assert.truthy(err_of(train.fit, { model = model, optimizer = opt, data = {} }):find("data must be a dataset", 1, true))
    assert.truthy(err_of(train.fit, { model = model, optimizer = opt, data = ds, log = 3 }):find("log must be a path", 1, true))
    assert.truthy(err_of(train.accuracy, model, ds, { batch = 2 }):find("unknown option 'batch'", 1, true))
    -- an error inside the loop comes out, and the model still trains afterwards
    assert.truthy(err_of(train.fit, { model = model, optimizer = opt, data = ds, batch_size = 4,
      loss = function() error("boom") end }):find("boom", 1, true))
  end)
end)
