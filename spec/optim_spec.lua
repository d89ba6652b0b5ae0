-- remat.optim: each optimizer against PyTorch's update formulas written out in Lua
-- (float64, a few steps with changing gradients), state accounting in the category
-- optim, gradient clipping, learning-rate schedules, state dicts, bad options, and a
-- deterministic tiny training run.
local remat = require "remat"
local nn, optim = remat.nn, remat.optim
local C = remat._C

local function param(vals, dtype) return remat.tensor(vals, dtype or "float64"):requires_grad(true) end

-- Gradients for step k of a parameter with n elements: changing signs and sizes.
local function grad_values(k, n)
  local g = {}
  for i = 1, n do g[i] = math.sin(1.3 * i + 0.7 * k) * (1 + 0.25 * k) end
  return g
end

local function set_grad(p, vals) p.grad = remat.tensor(vals, p:dtype()) end

local function assert_close(got, expected, tol, what)
  assert.are.equal(#expected, #got)
  for i = 1, #expected do
    local err = math.abs(got[i] - expected[i]) / math.max(1, math.abs(expected[i]))
    assert(err <= tol, ("%s[%d]: got %.17g, expected %.17g"):format(what or "values", i, got[i], expected[i]))
  end
end

local P0 = { 0.5, -1.25, 2.0, 0.0, -0.3 }

-- Runs `steps` steps of opt on a copy of P0 and returns the parameter values per step.
local function run(make, steps, dtype)
  local p = param(P0, dtype)
  local opt = make({ p })
  local out = {}
  for k = 1, steps do
    set_grad(p, grad_values(k, #P0))
    opt:step()
    out[k] = C.flat(p)
  end
  return out, opt, p
end

-- PyTorch's SGD (torch.optim.SGD, single-tensor path) in plain Lua.
local function ref_sgd(o, steps)
  local lr, mom, damp, wd, nest = o.lr or 1e-3, o.momentum or 0, o.dampening or 0, o.weight_decay or 0, o.nesterov
  local p, buf, out = table.move(P0, 1, #P0, 1, {}), nil, {}
  for k = 1, steps do
    local g = grad_values(k, #p)
    local d = {}
    for i = 1, #p do d[i] = g[i] + wd * p[i] end
    if mom ~= 0 then
      if not buf then
        buf = table.move(d, 1, #d, 1, {})
      else
        for i = 1, #p do buf[i] = mom * buf[i] + (1 - damp) * d[i] end
      end
      for i = 1, #p do d[i] = nest and d[i] + mom * buf[i] or buf[i] end
    end
    for i = 1, #p do p[i] = p[i] - lr * d[i] end
    out[k] = table.move(p, 1, #p, 1, {})
  end
  return out
end

-- PyTorch's Adam / AdamW in plain Lua.
local function ref_adam(o, steps, decoupled)
  local lr, b1, b2, eps = o.lr or 1e-3, (o.betas or {})[1] or 0.9, (o.betas or {})[2] or 0.999, o.eps or 1e-8
  local wd = o.weight_decay or (decoupled and 0.01 or 0)
  local p, m, v, out = table.move(P0, 1, #P0, 1, {}), {}, {}, {}
  for i = 1, #p do m[i], v[i] = 0, 0 end
  for t = 1, steps do
    local g = grad_values(t, #p)
    for i = 1, #p do
      if decoupled then p[i] = p[i] * (1 - lr * wd) elseif wd ~= 0 then g[i] = g[i] + wd * p[i] end
      m[i] = b1 * m[i] + (1 - b1) * g[i]
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i]
      local bc1, bc2 = 1 - b1 ^ t, 1 - b2 ^ t
      p[i] = p[i] - lr / bc1 * m[i] / (math.sqrt(v[i]) / math.sqrt(bc2) + eps)
    end
    out[t] = table.move(p, 1, #p, 1, {})
  end
  return out
end

-- PyTorch's RMSprop in plain Lua.
local function ref_rmsprop(o, steps)
  local lr, alpha, eps = o.lr or 1e-2, o.alpha or 0.99, o.eps or 1e-8
  local wd, mom, centered = o.weight_decay or 0, o.momentum or 0, o.centered
  local p, sq, buf, ga, out = table.move(P0, 1, #P0, 1, {}), {}, {}, {}, {}
  for i = 1, #p do sq[i], buf[i], ga[i] = 0, 0, 0 end
  for t = 1, steps do
    local g = grad_values(t, #p)
    for i = 1, #p do
      g[i] = g[i] + wd * p[i]
      sq[i] = alpha * sq[i] + (1 - alpha) * g[i] * g[i]
      local avg
      if centered then
        ga[i] = ga[i] + (1 - alpha) * (g[i] - ga[i])
        avg = math.sqrt(sq[i] - ga[i] * ga[i]) + eps
      else
        avg = math.sqrt(sq[i]) + eps
      end
      if mom > 0 then
        buf[i] = mom * buf[i] + g[i] / avg
        p[i] = p[i] - lr * buf[i]
      else
        p[i] = p[i] - lr * g[i] / avg
      end
    end
    out[t] = table.move(p, 1, #p, 1, {})
  end
  return out
end

local function check_against(got, ref, tol, what)
  for k = 1, #ref do assert_close(got[k], ref[k], tol, ("%s step %d"):format(what, k)) end
end

describe("optim.SGD", function()
  local cases = {
    { lr = 0.1 },
    { lr = 0.1, weight_decay = 0.05 },
    { lr = 0.05, momentum = 0.9 },
    { lr = 0.05, momentum = 0.9, dampening = 0.3, weight_decay = 0.01 },
    { lr = 0.05, momentum = 0.8, nesterov = true },
    { lr = 0.05, momentum = 0.8, nesterov = true, weight_decay = 0.1 },
    {},
  }
  for _, o in ipairs(cases) do
    local name = {}
    for k, v in pairs(o) do name[#name + 1] = k .. "=" .. tostring(v) end
    table.sort(name)
    it("matches PyTorch's update {" .. table.concat(name, ", ") .. "}", function()
      local got = run(function(ps) return optim.SGD(ps, o) end, 4)
      check_against(got, ref_sgd(o, 4), 1e-14, "SGD")
      local got32 = run(function(ps) return optim.SGD(ps, o) end, 4, "float32")
      check_against(got32, ref_sgd(o, 4), 1e-6, "SGD float32")
    end)
  end

  it("keeps a momentum buffer in the category optim, and none without momentum", function()
    collectgarbage()
    collectgarbage()
    local before = remat.memory.stats().by_category.optim
    local _, opt = run(function(ps) return optim.SGD(ps, { lr = 0.1 }) end, 2)
    assert.are.equal(before, remat.memory.stats().by_category.optim)
    assert.is_nil(opt.state[1])
    local _, opt2 = run(function(ps) return optim.SGD(ps, { lr = 0.1, momentum = 0.5 }) end, 2, "float32")
    assert.are.equal(before + 4 * #P0, remat.memory.stats().by_category.optim)
    assert.truthy(opt2.state[1].momentum_buffer)
  end)
end)

describe("optim.Adam and optim.AdamW", function()
  local cases = {
    { kind = "Adam", o = {} },
    { kind = "Adam", o = { lr = 0.01, weight_decay = 0.1 } },
    { kind = "Adam", o = { lr = 0.02, betas = { 0.8, 0.95 }, eps = 1e-6 } },
    { kind = "AdamW", o = {} },
    { kind = "AdamW", o = { lr = 0.01, weight_decay = 0.1 } },
    { kind = "AdamW", o = { lr = 0.05, betas = { 0.5, 0.9 }, eps = 1e-4, weight_decay = 0 } },
  }
  for _, c in ipairs(cases) do
    local name = {}
    for k, v in pairs(c.o) do name[#name + 1] = k .. "=" .. (type(v) == "table" and "{" .. table.concat(v, ",") .. "}" or tostring(v)) end
    table.sort(name)
    it(("%s matches PyTorch's update {%s}"):format(c.kind, table.concat(name, ", ")), function()
      local got = run(function(ps) return optim[c.kind](ps, c.o) end, 5)
      check_against(got, ref_adam(c.o, 5, c.kind == "AdamW"), 1e-13, c.kind)
      local got32 = run(function(ps) return optim[c.kind](ps, c.o) end, 5, "float32")
      check_against(got32, ref_adam(c.o, 5, c.kind == "AdamW"), 2e-6, c.kind .. " float32")
    end)
  end

  it("uses PyTorch's defaults", function()
    local a = optim.Adam({ param(P0) })
    assert.are.same({ 1e-3, { 0.9, 0.999 }, 1e-8, 0 }, { a.lr, a.betas, a.eps, a.weight_decay })
    local w = optim.AdamW({ param(P0) })
    assert.are.same({ 1e-3, { 0.9, 0.999 }, 1e-8, 0.01 }, { w.lr, w.betas, w.eps, w.weight_decay })
    local s = optim.SGD({ param(P0) })
    assert.are.same({ 1e-3, 0, 0, 0, false }, { s.lr, s.momentum, s.dampening, s.weight_decay, s.nesterov })
  end)

  it("allocates m and v lazily, in the category optim, with a step count per parameter", function()
    collectgarbage()
    collectgarbage()
    local before = remat.memory.stats().by_category.optim
    local a, b = param({ 1, 2, 3 }, "float32"), param({ 1, 2 }, "float32")
    local opt = optim.AdamW({ a, b })
    assert.are.equal(before, remat.memory.stats().by_category.optim)
    set_grad(a, { 1, 1, 1 })
    opt:step()
    assert.are.equal(before + 2 * 3 * 4, remat.memory.stats().by_category.optim)
    assert.are.same({ 1, 2 }, C.flat(b)) -- no gradient: skipped, no state
    assert.is_nil(opt.state[2])
    set_grad(b, { 1, 1 })
    opt:step()
    assert.are.equal(before + 2 * 5 * 4, remat.memory.stats().by_category.optim)
    assert.are.equal(2, opt.state[1].step)
    assert.are.equal(1, opt.state[2].step)
  end)
end)

describe("optim.Adam and optim.AdamW: multi-tensor steps", function()
  -- opt:step() runs adamw_multi_step over groups of parameters; it must give what one
  -- adamw_step per parameter gives, bit for bit, including parameters whose step counts
  -- differ (one had no gradient at a step) and more parameters than one call takes.
  local function manual(ps, grads, o, decoupled)
    local st = {}
    for i, p in ipairs(ps) do st[i] = { p = p:clone(), m = remat.zeros(table.unpack(p:shape())), v = remat.zeros(table.unpack(p:shape())), t = 0 } end
    for k, gs in ipairs(grads) do
      for i, s in ipairs(st) do
        if gs[i] then
          s.t = s.t + 1
          C.op_into(C.ops.adamw_step, { lr = o.lr, beta1 = o.betas[1], beta2 = o.betas[2], eps = o.eps, step = s.t,
            decoupled = decoupled, weight_decay = o.weight_decay }, { s.p, gs[i], s.m, s.v }, { s.p, s.m, s.v })
        end
      end
    end
    return st
  end

  for _, kind in ipairs({ "AdamW", "Adam" }) do
    it(kind .. ": 70 parameters of odd sizes, uneven step counts: the same bits as per-parameter steps", function()
      remat.manual_seed(31)
      local ps, grads = {}, {}
      for i = 1, 70 do ps[i] = remat.randn(i % 7 + 1, i % 3 + 2):requires_grad(true) end
      for k = 1, 3 do
        grads[k] = {}
        for i = 1, 70 do
          if not (k == 2 and i % 5 == 0) then grads[k][i] = remat.randn(table.unpack(ps[i]:shape())) end
        end
      end
      local o = { lr = 0.01, betas = { 0.8, 0.99 }, eps = 1e-6, weight_decay = 0.05 }
      local want = manual(ps, grads, o, kind == "AdamW")
      local opt = optim[kind](ps, o)
      for k = 1, 3 do
        for i, p in ipairs(ps) do p.grad = grads[k][i] end
        opt:step()
        opt:zero_grad()
      end
      for i, p in ipairs(ps) do
        local a, b = C.flat(p), C.flat(want[i].p)
        for j = 1, #a do assert(a[j] == b[j], ("parameter %d [%d]: %.9g vs %.9g"):format(i, j, a[j], b[j])) end
      end
    end)
  end
end)

describe("optim.RMSprop", function()
  local cases = {
    {},
    { lr = 0.01, alpha = 0.9, eps = 1e-6 },
    { lr = 0.01, weight_decay = 0.1 },
    { lr = 0.005, momentum = 0.9 },
    { lr = 0.005, centered = true },
    { lr = 0.005, alpha = 0.8, momentum = 0.5, centered = true, weight_decay = 0.01 },
  }
  for _, o in ipairs(cases) do
    local name = {}
    for k, v in pairs(o) do name[#name + 1] = k .. "=" .. tostring(v) end
    table.sort(name)
    it("matches PyTorch's update {" .. table.concat(name, ", ") .. "}", function()
      local got = run(function(ps) return optim.RMSprop(ps, o) end, 5)
      check_against(got, ref_rmsprop(o, 5), 1e-13, "RMSprop")
      local got32 = run(function(ps) return optim.RMSprop(ps, o) end, 5, "float32")
      check_against(got32, ref_rmsprop(o, 5), 2e-5, "RMSprop float32")
    end)
  end

  it("matches numbers computed by torch.optim.RMSprop", function()
    -- python: p = torch.tensor(P0, dtype=float64, requires_grad=True);
    -- opt = RMSprop([p], lr=0.01, alpha=0.9, momentum=0.5, centered=True, weight_decay=0.1);
    -- 3 steps with p.grad = grad_values(k); print(p)
    local got = run(function(ps)
      return optim.RMSprop(ps, { lr = 0.01, alpha = 0.9, momentum = 0.5, centered = true, weight_decay = 0.1 })
    end, 3)
    check_against({ got[3] }, { { 0.42453414375124376, -1.1120962376159547, 2.1038509508467618, -0.006873279001768078, -0.42519329699847386 } }, 1e-12, "torch")
  end)

  it("keeps only the state it uses, in the category optim", function()
    collectgarbage()
    collectgarbage()
    local before = remat.memory.stats().by_category.optim
    local _, opt = run(function(ps) return optim.RMSprop(ps, { lr = 0.01 }) end, 2, "float32")
    assert.are.equal(before + 4 * #P0, remat.memory.stats().by_category.optim)
    assert.are.equal(2, opt.state[1].step)
    assert.is_nil(opt.state[1].momentum_buffer)
    assert.is_nil(opt.state[1].grad_avg)
    local _, opt2 = run(function(ps) return optim.RMSprop(ps, { momentum = 0.9, centered = true }) end, 1, "float32")
    assert.are.equal(before + 4 * 4 * #P0, remat.memory.stats().by_category.optim)
    assert.truthy(opt2.state[1].momentum_buffer and opt2.state[1].grad_avg)
    assert.are.equal(0, opt:step_bytes())
  end)

  it("rejects bad options", function()
    local p = param(P0)
    assert.has_error(function() optim.RMSprop({ p }, { alpha = 1.5 }) end, "optim.RMSprop: invalid alpha 1.5 (must be in [0, 1])")
    assert.has_error(function() optim.RMSprop({ p }, { momentum = -1 }) end, "optim.RMSprop: invalid momentum -1 (must be >= 0)")
    assert.has_error(function() optim.RMSprop({ p }, { centered = 1 }) end, "optim.RMSprop: centered must be a boolean, got number 1")
    assert.has_error(function() optim.RMSprop({ p }, { betas = { 0.9, 0.9 } }) end)
  end)
end)

describe("optimizer API", function()
  it("zero_grad clears gradients; parameters without one are left alone", function()
    local p, q = param(P0), param({ 1, 2 })
    local opt = optim.SGD({ p, q }, { lr = 1 })
    set_grad(p, grad_values(1, #P0))
    opt:zero_grad()
    assert.is_nil(p.grad)
    opt:step()
    assert.are.same(P0, C.flat(p))
  end)

  it("reads opt.lr at every step", function()
    local p = param(P0)
    local opt = optim.SGD({ p }, { lr = 0.5 })
    opt.lr = 0
    set_grad(p, grad_values(1, #P0))
    opt:step()
    assert.are.same(P0, C.flat(p))
    opt.lr = -1
    assert.has_error(function() opt:step() end)
  end)

  it("trains through model:parameters() and the tape", function()
    remat.manual_seed(5)
    local model = nn.Sequential { nn.Linear(3, 8), nn.GELU(), nn.Linear(8, 1) }
    local x, y = remat.randn(16, 3), remat.randn(16, 1)
    local opt = optim.Adam(model:parameters(), { lr = 0.05 })
    local first, last
    for _ = 1, 30 do
      local loss = nn.mse(model(x), y)
      loss:backward()
      opt:step()
      opt:zero_grad()
      first = first or loss:item()
      last = loss:item()
    end
    assert.is_true(last < 0.5 * first, ("loss %g -> %g"):format(first, last))
  end)

  it("state_dict / load_state_dict resume training exactly, through remat.save and remat.load", function()
    local function fresh() return param(P0) end
    -- uninterrupted: 4 steps
    local p = fresh()
    local opt = optim.AdamW({ p }, { lr = 0.01 })
    for k = 1, 4 do set_grad(p, grad_values(k, #P0)); opt:step() end
    -- interrupted after 2 steps, saved, reloaded into a new optimizer
    local q = fresh()
    local o1 = optim.AdamW({ q }, { lr = 0.01 })
    for k = 1, 2 do set_grad(q, grad_values(k, #P0)); o1:step() end
    local path = os.tmpname()
    remat.save(path, o1:state_dict())
    local o2 = optim.AdamW({ q }, { lr = 0.5 })
    o2:load_state_dict(remat.load(path))
    os.remove(path)
    assert.are.equal(0.01, o2.lr)
    for k = 3, 4 do set_grad(q, grad_values(k, #P0)); o2:step() end
    assert.are.same(C.flat(p), C.flat(q))
    assert.has_error(function() optim.SGD({ q }):load_state_dict(o2:state_dict()) end,
      nil) -- a state of another kind of optimizer
  end)

  it("prints its hyperparameters", function()
    local s = tostring(optim.AdamW({ param(P0) }, { lr = 0.01 }))
    assert.truthy(s:find("AdamW(1 parameters", 1, true), s)
    assert.truthy(s:find("lr = 0.01", 1, true), s)
  end)
end)

describe("optim.clip_grad_norm", function()
  it("returns the total 2-norm and scales gradients above max_norm in place", function()
    local a, b, c = param({ 3, 0 }), param({ 0, 4 }), param({ 1 })
    set_grad(a, { 3, 0 })
    set_grad(b, { 0, 4 })
    local total = optim.clip_grad_norm({ a, b, c }, 1.0)
    assert.are.equal(5, total)
    local coef = 1.0 / (5 + 1e-6)
    assert_close(C.flat(a.grad), { 3 * coef, 0 }, 1e-15, "a.grad")
    assert_close(C.flat(b.grad), { 0, 4 * coef }, 1e-15, "b.grad")
    assert.is_nil(c.grad)
  end)

  it("leaves gradients below max_norm unchanged, takes a single tensor, and works in float32", function()
    local a = param({ 0.3, -0.4 }, "float32")
    set_grad(a, { 0.3, -0.4 })
    local before = C.flat(a.grad)
    local total = optim.clip_grad_norm(a, 10)
    assert.is_true(math.abs(total - 0.5) < 1e-7)
    assert.are.same(before, C.flat(a.grad))
    assert.are.equal(0, optim.clip_grad_norm({ param({ 1 }) }, 1))
  end)

  it("scales a strided gradient too", function()
    local p = param({ { 1, 2 }, { 3, 4 } })
    p.grad = remat.tensor({ { 3, 0 }, { 4, 0 } }, "float64"):transpose(1, 2)
    assert.are.equal(5, optim.clip_grad_norm({ p }, 1))
    local g = p.grad:totable()
    assert.is_true(math.abs(g[1][1] - 0.6) < 1e-6 and math.abs(g[1][2] - 0.8) < 1e-6, p.grad:totable()[1][2])
    assert.are.same({ 0, 0 }, g[2])
  end)

  it("accounts its temporaries outside the categories of training", function()
    local a = param({ 3, 4 }, "float32")
    set_grad(a, { 3, 4 })
    collectgarbage()
    collectgarbage()
    local s0 = remat.memory.stats()
    optim.clip_grad_norm({ a }, 1)
    local s1 = remat.memory.stats()
    assert.are.equal(s0.by_category.activation, s1.by_category.activation)
    assert.are.equal(s0.live, s1.live)
  end)

  it("rejects bad arguments", function()
    assert.has_error(function() optim.clip_grad_norm({ param({ 1 }) }, -1) end,
      nil)
    local ok, err = pcall(optim.clip_grad_norm, { 1, 2 }, 1)
    assert.is_false(ok)
    assert.truthy(err:find("optim.clip_grad_norm: params[1] is number 1, not a tensor", 1, true), err)
  end)
end)

describe("optim.schedule", function()
  it("warmup_cosine rises linearly, then follows a half cosine down to min", function()
    local lr = optim.schedule.warmup_cosine { warmup = 10, total = 110, base = 1.0, min = 0.1 }
    assert.are.equal(0.1, lr(1))
    assert.are.equal(0.5, lr(5))
    assert.are.equal(1.0, lr(10))
    assert.is_true(math.abs(lr(60) - 0.55) < 1e-12)
    assert.is_true(math.abs(lr(35) - (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))) < 1e-12)
    assert.are.equal(0.1, lr(110))
    assert.are.equal(0.1, lr(500))
    for s = 11, 109 do assert.is_true(lr(s + 1) <= lr(s)) end
    local nowarm = optim.schedule.warmup_cosine { total = 4, base = 2 }
    assert.are.equal(2, nowarm(0))
    assert.are.equal(0, nowarm(4))
  end)

  it("a scheduler sets opt.lr before each step", function()
    local p = param(P0)
    local opt = optim.SGD({ p }, { lr = 99 })
    local s = optim.scheduler(opt, optim.schedule.warmup_cosine { warmup = 2, total = 4, base = 0.2 })
    local seen = {}
    for k = 1, 4 do seen[k] = s:step() end
    assert.are.same({ 0.1, 0.2, 0.1, 0 }, { seen[1], seen[2], math.floor(seen[3] * 1e12 + 0.5) / 1e12, seen[4] })
    assert.are.equal(0, opt.lr)
  end)

  it("rejects bad settings", function()
    local function err_of(t)
      local ok, e = pcall(optim.schedule.warmup_cosine, t)
      assert.is_false(ok)
      return e
    end
    assert.truthy(err_of({ warmup = 5, total = 3, base = 1 }):find("warmup (5) is longer than total (3)", 1, true))
    assert.truthy(err_of({ total = 0, base = 1 }):find("total must be an integer >= 1", 1, true))
    assert.truthy(err_of({ total = 3, base = -1 }):find("base must be a learning rate", 1, true))
    assert.truthy(err_of({ total = 3, base = 1, min = 2 }):find("min must be a number in [0, base]", 1, true))
    assert.truthy(err_of({ total = 3, base = 1, cycles = 2 }):find("unknown option 'cycles'", 1, true))
  end)
end)

describe("optim.schedule: step, cosine, linear, warmup", function()
  local schedule = optim.schedule
  local function near(a, b) return math.abs(a - b) < 1e-12 end

  it("step multiplies by gamma every step_size steps", function()
    local lr = schedule.step { base = 1, step_size = 3, gamma = 0.5 }
    local got = {}
    for k = 1, 7 do got[k] = lr(k) end
    assert.are.same({ 1, 1, 1, 0.5, 0.5, 0.5, 0.25 }, got)
    assert.are.equal(0.1, schedule.step { base = 1, step_size = 2 }(3)) -- gamma 0.1 by default
  end)

  it("cosine goes from base at step 1 to min at step total, and stays there", function()
    local lr = schedule.cosine { base = 1, total = 5, min = 0.2 }
    assert.are.equal(1, lr(1))
    assert.is_true(near(lr(3), 0.6))
    assert.is_true(near(lr(2), 0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi / 4))))
    assert.is_true(near(lr(5), 0.2))
    assert.is_true(near(lr(50), 0.2))
    for k = 1, 4 do assert.is_true(lr(k + 1) < lr(k)) end
    assert.are.equal(0, schedule.cosine { base = 3, total = 2 }(2))
  end)

  it("linear goes in a straight line from base to min", function()
    local lr = schedule.linear { base = 1, total = 5, min = 0.2 }
    assert.are.equal(1, lr(1))
    assert.is_true(near(lr(2), 0.8))
    assert.is_true(near(lr(4), 0.4))
    assert.is_true(near(lr(5), 0.2))
    assert.is_true(near(lr(9), 0.2))
    assert.is_true(near(schedule.linear { base = 2, total = 3 }(2), 1))
  end)

  it("warmup rises linearly to the schedule's first value, then follows the schedule from its step 1", function()
    local inner = schedule.cosine { base = 1, total = 5, min = 0.2 }
    local lr = schedule.warmup(4, inner)
    assert.are.same({ 0.25, 0.5, 0.75, 1 }, { lr(1), lr(2), lr(3), lr(4) })
    for k = 1, 6 do assert.are.equal(inner(k), lr(4 + k)) end
    assert.are.equal(inner, schedule.warmup(0, inner))
    -- warmup + cosine equals warmup_cosine (cosine from phase 1/N after warmup there)
    local a = schedule.warmup(10, schedule.step { base = 0.3, step_size = 100 })
    assert.are.equal(0.03, a(1))
  end)

  it("a scheduler drives any of them", function()
    local p = param(P0)
    local opt = optim.SGD({ p }, { lr = 99 })
    local s = optim.scheduler(opt, schedule.warmup(2, schedule.linear { base = 0.4, total = 3, min = 0.2 }))
    local seen = {}
    for k = 1, 5 do seen[k] = s:step() end
    for k, v in ipairs { 0.2, 0.4, 0.4, 0.3, 0.2 } do assert.is_true(math.abs(seen[k] - v) < 1e-15, k) end
    assert.are.equal(5, s.k)
  end)

  it("reject bad options, naming them", function()
    local function err_of(f, t)
      local ok, e = pcall(f, t)
      assert.is_false(ok)
      return e
    end
    assert.truthy(err_of(schedule.step, { base = 1 }):find("optim.schedule.step: option step_size is required", 1, true))
    assert.truthy(err_of(schedule.step, { base = 1, step_size = 0 }):find("step_size must be an integer >= 1", 1, true))
    assert.truthy(err_of(schedule.step, { base = 1, step_size = 2.5 }):find("step_size must be an integer >= 1", 1, true))
    assert.truthy(err_of(schedule.cosine, { base = -1, total = 3 }):find("optim.schedule.cosine: base must be a learning rate >= 0", 1, true))
    assert.truthy(err_of(schedule.cosine, { base = 1, total = 3, min = 2 }):find("min (2) is above base (1)", 1, true))
    assert.truthy(err_of(schedule.linear, { base = 1, totl = 3 }):find("unknown option 'totl' (base, min, total)", 1, true))
    assert.truthy(err_of(schedule.linear, 3):find("expected a table of options", 1, true))
    assert.truthy(err_of(function(x) return schedule.warmup(-1, x) end, schedule.constant(1)):find("warmup length must be an integer >= 0", 1, true))
    assert.truthy(err_of(function(x) return schedule.warmup(2, x) end, 0.1):find("expected a schedule function", 1, true))
    assert.truthy(err_of(schedule.cosine { base = 1, total = 3 }, "x"):find("step must be a number", 1, true))
  end)
end)

describe("optim.clip_grad_value", function()
  it("clamps every gradient element in place to [-v, v], skipping parameters without one", function()
    local a, b, c = param({ 1, 2, 3 }), param({ 1, 2 }, "float32"), param({ 5 })
    a.grad = remat.tensor({ -3, 0.5, 2 }, "float64")
    b.grad = remat.tensor({ 0 / 0, -0.25 }, "float32")
    optim.clip_grad_value({ a, b, c }, 1)
    assert.are.same({ -1, 0.5, 1 }, a.grad:totable())
    local bg = b.grad:totable()
    assert.is_true(bg[1] ~= bg[1]) -- NaN stays NaN
    assert.are.equal(-0.25, bg[2])
    assert.is_nil(c.grad)
    optim.clip_grad_value(a, 0.5)
    assert.are.same({ -0.5, 0.5, 0.5 }, a.grad:totable())
  end)

  it("clamps a strided gradient too", function()
    local p = param({ { 1, 2 }, { 3, 4 } })
    p.grad = remat.tensor({ { -5, 1 }, { 0.5, 7 } }, "float64"):transpose(1, 2)
    optim.clip_grad_value({ p }, 2)
    assert.are.same({ { -2, 0.5 }, { 1, 2 } }, p.grad:totable())
  end)

  it("rejects bad arguments", function()
    local p = param(P0)
    assert.has_error(function() optim.clip_grad_value({ p }, -1) end, "optim.clip_grad_value: clip_value must be a number >= 0, got number -1")
    assert.has_error(function() optim.clip_grad_value({ 1 }, 1) end, "optim.clip_grad_value: params[1] is number 1, not a tensor")
    local q = param(P0)
    optim.SGD({ q }, { in_backward = true })
    local ok, e = pcall(optim.clip_grad_value, { q }, 1)
    assert.is_false(ok)
    assert.truthy(e:find("in_backward", 1, true), e)
  end)
end)

describe("bad options", function()
  local function err_of(f, ...)
    local ok, e = pcall(f, ...)
    assert.is_false(ok, "expected an error")
    return e
  end
  local p = param(P0)

  it("name the optimizer and the problem", function()
    local cases = {
      { optim.SGD, { { p }, { lr = -0.1 } }, "optim.SGD: invalid lr -0.1 (must be >= 0)" },
      { optim.SGD, { { p }, { momentum = -1 } }, "optim.SGD: invalid momentum -1" },
      { optim.SGD, { { p }, { lr = 0.1, nesterov = true } }, "nesterov momentum requires a momentum and zero dampening" },
      { optim.SGD, { { p }, { lr = 0.1, momentum = 0.9, dampening = 0.1, nesterov = true } }, "requires a momentum and zero dampening" },
      { optim.SGD, { { p }, { lr = "fast" } }, "optim.SGD: lr must be a number, got string fast" },
      { optim.SGD, { { p }, { learning_rate = 0.1 } }, "optim.SGD: unknown option 'learning_rate' (known: dampening, lr, momentum, nesterov, weight_decay)" },
      { optim.Adam, { { p }, { betas = { 1.0, 0.999 } } }, "optim.Adam: invalid beta 1: number 1.0 (must be in [0, 1))" },
      { optim.Adam, { { p }, { betas = { 0.9, -0.1 } } }, "optim.Adam: invalid beta 2" },
      { optim.AdamW, { { p }, { betas = 0.9 } }, "optim.AdamW: betas must be a table of two numbers" },
      { optim.AdamW, { { p }, { eps = -1 } }, "optim.AdamW: invalid eps -1" },
      { optim.AdamW, { { p }, { weight_decay = -0.1 } }, "optim.AdamW: invalid weight_decay -0.1" },
      { optim.Adam, { { p }, { lr = -1 } }, "optim.Adam: invalid lr -1" },
      { optim.Adam, { { p }, { amsgrad = true } }, "optim.Adam: amsgrad is not supported" },
      { optim.Adam, { p }, "optim.Adam: params must be a list of tensors (model:parameters()), got a tensor" },
      { optim.Adam, { {} }, "optim.Adam: params is an empty list" },
      { optim.Adam, { { p, 3 } }, "optim.Adam: params[2] is number 3, not a tensor" },
      { optim.Adam, { { p, p } }, "optim.Adam: params[2] appears twice in the list" },
      { optim.Adam, { { x = p } }, "optim.Adam: params must be a list of tensors; key x is not a position" },
      { optim.SGD, { { p }, 0.1 }, "optim.SGD: options must be a table, got number 0.1" },
    }
    for _, c in ipairs(cases) do
      local e = err_of(c[1], table.unpack(c[2]))
      assert.truthy(e:find(c[3], 1, true), ("expected %q in %q"):format(c[3], e))
      assert.truthy(e:find("optim_spec.lua", 1, true), "error located at the caller: " .. e)
    end
  end)

  it("a freed parameter is an error, not a crash", function()
    local q = param({ 1, 2 })
    local opt = optim.SGD({ q }, { lr = 0.1 })
    q:free()
    assert.truthy(err_of(function() opt:step() end):find("freed", 1, true))
  end)
end)

describe("deterministic training", function()
  local function curve()
    remat.manual_seed(42)
    local model = nn.Sequential { nn.Embedding(7, 8), nn.TransformerBlock(8, 2, 0.1), nn.LayerNorm(8), nn.Linear(8, 7) }
    local x = remat.tensor({ { 1, 2, 3, 4 }, { 5, 6, 7, 1 } })
    local y = remat.tensor({ { 2, 3, 4, 5 }, { 6, 7, 1, 2 } })
    local opt = optim.AdamW(model:parameters(), { lr = 0.02 })
    local losses = {}
    for step = 1, 8 do
      local loss = nn.cross_entropy(model(x), y)
      loss:backward()
      optim.clip_grad_norm(model:parameters(), 1.0)
      opt:step()
      opt:zero_grad()
      losses[step] = loss:item()
    end
    return losses
  end

  it("gives the same loss curve twice on a fixed seed, and the loss falls", function()
    local a, b = curve(), curve()
    assert.are.same(a, b)
    assert.is_true(a[8] < a[1], ("loss %g -> %g"):format(a[1], a[8]))
  end)
end)
