-- The adversarial sweep of issue 15, kept: random bad arguments to every public function
-- and every remat._C function, mutated safetensors files, and a failure at every
-- allocation of a whole training step (optimizer included) under four policies. Each
-- must end in a clear Lua error or a result: never a crash (check-mem runs this file
-- under ASan/UBSan), a leak, a hang, or a message naming an internal function.
--
-- Fixed seeds; `make test` runs a short sweep, `make check-mem` a long one
-- (REMAT_FUZZ=full). A fresh sweep: REMAT_FUZZ_SEED=<n> REMAT_FUZZ_CALLS=<n> busted spec/fuzz_spec.lua
local remat = require "remat"
local C = remat._C
local nn, optim, policy = remat.nn, remat.optim, remat.policy
local files = require "support.files"

local FULL = os.getenv("REMAT_FUZZ") == "full"
local SEED = math.tointeger(tonumber(os.getenv("REMAT_FUZZ_SEED") or "")) or 1
local CALLS = math.tointeger(tonumber(os.getenv("REMAT_FUZZ_CALLS") or "")) or (FULL and 30000 or 3000)
local MUTANTS = math.tointeger(tonumber(os.getenv("REMAT_FUZZ_MUTANTS") or "")) or (FULL and 3000 or 300)

-- xorshift32, independent of remat's generator
local state = 1
local function reseed(s)
  state = (s * 2654435761 + 1) & 0xffffffff
  if state == 0 then state = 1 end
end
local function rnd(n)
  state = state ~ (state << 13) & 0xffffffff
  state = state ~ (state >> 17)
  state = state ~ (state << 5) & 0xffffffff
  return state % n + 1
end
local function pick(list) return list[rnd(#list)] end

---------------------------------------------------------------- values ----

local numbers = { 0, 1, -1, 2, 3, 4, 7, -7, 0.5, -0.0, 1e-300, 1e308, -1e308, 1 / 0, -1 / 0, 0 / 0,
  2 ^ 31, 2 ^ 31 + 1, 2 ^ 53, 2 ^ 63, (1 << 31), (1 << 31) + 1, (1 << 40), math.maxinteger,
  math.mininteger, 1000, 1e9, 64 }
local strings = { "", "x", "cpu", "cuda", "float32", "float64", "bfloat16", "float16", "1GiB", "64k",
  "-1", "nan", "relu", "gelu", "matmul", "softmax", "keep", "boundary", "recompute", "\0", "a\0b",
  ("a"):rep(300), "sum", "%s%d%n%p", "activation", "param", "grad", "temp", "val", "1.x", "weight", "/" }

local function tensor()
  local k = rnd(16)
  if k == 1 then return remat.zeros(0) end
  if k == 2 then return remat.zeros(2, 0) end
  if k == 3 then return remat.randn(2, 3):transpose(1, 2) end
  if k == 4 then return remat.randn(2, 2, "float64") end
  if k == 5 then return remat.randn(4):requires_grad(true) end
  if k == 6 then
    local t = remat.randn(3)
    t:free()
    return t
  end
  if k == 7 then return remat.randn(2):requires_grad(true) * 2 end
  if k == 8 then return remat.tensor { 1, 2, 3 } end
  if k == 9 then return remat.randn(2, 3, 4) end
  if k == 10 then return remat.full({ 1 }, 7) end
  if k == 11 then return remat.randn(3, 3):narrow(2, 2, 2) end
  if k == 12 then return remat.randn(1, 4, 6) end
  if k == 13 then return C.full({}, 2, "float32", "cpu") end
  return remat.randn(pick { 1, 2, 3 }, pick { 1, 2, 3 })
end

local function object()
  local k = rnd(8)
  if k == 1 then return nn.Linear(3, 2) end
  if k == 2 then return nn.Sequential { nn.Linear(2, 2), nn.ReLU() } end
  if k == 3 then return optim.SGD({ remat.zeros(2):requires_grad(true) }) end
  if k == 4 then return policy.every(1) end
  if k == 5 then return nn.LayerNorm(3) end
  if k == 6 then return nn.module { forward = function(_, x) return x end } end
  if k == 7 then return remat.data.tensor_dataset(remat.randn(4, 2), remat.tensor { 1, 2, 1, 2 }) end
  return nn.CausalSelfAttention(4, 2)
end

local function value(depth)
  depth = depth or 0
  local k = rnd(20)
  if k <= 2 then return nil end
  if k == 3 then return rnd(2) == 1 end
  if k <= 7 then return pick(numbers) end
  if k <= 10 then return pick(strings) end
  if k <= 14 then return tensor() end
  if k == 15 then return object() end
  if k == 16 then return function() return 1 end end
  if k == 17 then return function() error("callback failed") end end
  if k == 18 then return coroutine.create(function() end) end
  if depth > 1 then return {} end
  local t, n = {}, rnd(4) - 1
  for i = 1, n do t[i] = value(depth + 1) end
  if rnd(4) == 1 then t[pick(strings)] = value(depth + 1) end
  return t
end

---------------------------------------------------------------- targets ----

-- Calls that would leave the process (MPI, os.exit), write files where the sweep runs,
-- log to the host, or load the whole of Fashion-MNIST: swept elsewhere or not at all.
-- set_methods replaces the tensor method table; metamethods are Lua's to call.
local skip = {
  dist = true, save = true, log = true, fashion_mnist = true, cli = true, set_methods = true,
  metrics = true, save_checkpoint = true, -- create their file at the path given ("cuda", "1.x")
  fused_hook = true, -- installs a callback for every later backward (optim.lua owns it)
}
local function skipped(name)
  for part in name:gmatch("[%w_]+") do if skip[part] or part:find("^dist") then return true end end
  return false
end

local targets = {}
local function add(name, f, self_kind)
  -- names starting with _ (outside _C) are the library's own plumbing
  if name:find("[%.:]_[%w_]+$") and not name:find("^remat%._C%.") then return end
  if name:find("[%.:]__[%w_]+$") then return end
  if type(f) == "function" and not skipped(name) then targets[#targets + 1] = { name = name, f = f, self = self_kind } end
end
local function add_table(prefix, t, self_kind, seen)
  seen = seen or {}
  if seen[t] then return end
  seen[t] = true
  local keys = {}
  for k in pairs(t) do if type(k) == "string" then keys[#keys + 1] = k end end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local v = t[k]
    if type(v) == "function" then add(prefix .. k, v, self_kind)
    elseif type(v) == "table" and prefix:sub(1, 6) == "remat." and not prefix:find("%.%w+%.%w+%.") and k ~= "_C" then
      add_table(prefix .. k .. ".", v, nil, seen)
    end
  end
end
add_table("remat._C.", C)
add_table("Tensor:", remat.Tensor, "tensor")
add_table("Module:", nn.Module, "module")
add_table("Optimizer:", optim.Optimizer, "optimizer")
add_table("Dataset:", remat.data.Dataset, "dataset")
add_table("remat.", remat)

local function self_for(kind)
  if kind == "tensor" then return tensor() end
  if kind == "module" then return pick { nn.Linear(3, 2), nn.Sequential { nn.Linear(3, 3), nn.GELU() }, nn.LayerNorm(3) } end
  if kind == "optimizer" then
    local p = remat.randn(3):requires_grad(true)
    p.grad = remat.randn(3)
    return pick { optim.SGD({ p }, { momentum = 0.9 }), optim.AdamW({ p }) }
  end
  if kind == "dataset" then return remat.data.tensor_dataset(remat.randn(5, 3), remat.tensor { 1, 2, 1, 2, 1 }) end
end

-- Internal names a message must not show for a public function: the C functions'.
local internal = {}
for k in pairs(C) do internal[k] = true end

local function check_message(t, err)
  if type(err) ~= "string" then return ("%s raised a %s, not a message"):format(t.name, type(err)) end
  if t.name:find("^remat%._C%.") then return nil end
  local named = err:match("bad argument #%d+ to '([%w_]+)'")
  local last = t.name:match("([%w_]+)$")
  if named and internal[named] and named ~= last then
    return ("%s: the message names the internal function '%s': %s"):format(t.name, named, err)
  end
  if err:find("%[remat%]/[%w_]+:%d+: attempt to") then
    return ("%s: an internal Lua error escaped: %s"):format(t.name, err)
  end
end

local function sweep(seed, calls)
  reseed(seed)
  remat.manual_seed(seed)
  local limit = 256 * 1024 * 1024
  local problems, raised = {}, 0
  for i = 1, calls do
    local t = targets[rnd(#targets)]
    local args, n = {}, rnd(5) - 1
    if t.self and rnd(5) > 1 then args[1] = self_for(t.self) else args[1] = value() end
    for k = 2, n + 1 do args[k] = value() end
    remat.memory.limit(limit)
    local ok, err = pcall(t.f, table.unpack(args, 1, n + 1))
    remat.memory.fail_at(0)
    remat.memory.limit(nil)
    C.grad_enabled(true)
    if not ok then
      raised = raised + 1
      local p = check_message(t, err)
      if p then problems[#problems + 1] = ("call %d: %s"):format(i, p) end
    end
    if i % 200 == 0 then collectgarbage() end
  end
  collectgarbage()
  return problems, raised
end

-- The process-wide switches a sweep may have flipped (a later spec file assumes their
-- defaults: without the collection at each step, garbage left by earlier steps moves
-- every dry run's baseline).
local function restore_defaults()
  C.step_collect(true)
  C.op_timers(false)
  C.opcost_learn(false)
  C.opcost_calibrate(true)
  C.grad_enabled(true)
  remat.memory.limit(nil)
  remat.memory.fail_at(0)
  collectgarbage()
end

describe("the random-argument API fuzzer", function()
  it(("covers every public function and every _C function (%d targets)"):format(#targets), function()
    local names = {}
    for _, t in ipairs(targets) do names[t.name] = true end
    for _, must in ipairs { "remat.zeros", "remat._C.op_into", "Tensor:matmul", "Module:checkpoint",
      "Optimizer:step", "remat.nn.Linear", "remat.optim.AdamW", "remat.policy.budget", "remat.memory.limit",
      "remat.train.stepper", "remat.data.text" } do
      assert(names[must], must .. " is not swept")
    end
  end)

  it(("%d calls with seed %d end in a result or a clear error"):format(CALLS, SEED), function()
    -- functions that write files (save, metrics logs) take any string as a path: the
    -- sweep removes the files its strings named that were not there before it
    local before = {}
    for _, name in ipairs(strings) do
      local f = io.open(name, "rb")
      before[name] = f ~= nil
      if f then f:close() end
    end
    local ok, problems, raised = pcall(sweep, SEED, CALLS)
    restore_defaults()
    for _, name in ipairs(strings) do
      if not before[name] and name ~= "" and name ~= "/" then os.remove(name) end
    end
    assert(ok, problems)
    assert(raised > CALLS // 4, "only " .. raised .. " calls raised: the arguments are not adversarial")
    assert(#problems == 0, #problems .. " problems:\n" .. table.concat(problems, "\n", 1, math.min(#problems, 30)))
  end)
end)

---------------------------------------------------------------- safetensors ----

describe("the safetensors mutation fuzzer", function()
  it(("%d mutants of a valid file load or fail with a clear error, and leak nothing"):format(MUTANTS), function()
    local dir = files.tmpdir()
    local good = dir .. "/good.safetensors"
    remat.save(good, { w = remat.randn(3, 4), b = remat.randn(4, "float64"), e = remat.zeros(0), s = C.full({}, 2, "float32", "cpu") },
      { step = 7, note = "x" })
    local bytes = files.read(good)
    local path = dir .. "/m.safetensors"
    reseed(SEED + 1000)
    collectgarbage()
    local live = remat.memory.stats().live
    local loaded = 0
    for _ = 1, MUTANTS do
      local b = { bytes:byte(1, -1) }
      local kind = rnd(6)
      local hlen = 8 + string.unpack("<I8", bytes)
      if kind == 1 then -- flip bytes anywhere
        for _ = 1, rnd(4) do local at = rnd(#b) b[at] = rnd(256) - 1 end
      elseif kind == 2 then -- flip bytes in the header
        for _ = 1, rnd(3) do local at = rnd(hlen) b[at] = pick { 0, 34, 44, 58, 91, 93, 123, 125, 48, 57, 255, rnd(256) - 1 } end
      elseif kind == 3 then -- truncate
        for k = #b, rnd(#b), -1 do b[k] = nil end
      elseif kind == 4 then -- a length prefix of any size
        local n = pick { 0, 1, 2, hlen - 9, hlen - 7, #b, 1 << 31, 1 << 40, -1 }
        local p = { string.pack("<i8", n):byte(1, 8) }
        for k = 1, 8 do b[k] = p[k] end
      elseif kind == 5 then -- digits in the offsets and shapes changed
        for k = 9, hlen do
          if b[k] >= 48 and b[k] <= 57 and rnd(8) == 1 then b[k] = 48 + rnd(10) - 1 end
        end
      else -- bytes appended
        for _ = 1, rnd(64) do b[#b + 1] = rnd(256) - 1 end
      end
      local chunks = {}
      for k = 1, #b, 4096 do chunks[#chunks + 1] = string.char(table.unpack(b, k, math.min(k + 4095, #b))) end
      files.write(path, table.concat(chunks))
      local ok, t = pcall(remat.load, path)
      if ok then
        loaded = loaded + 1
        for _, v in pairs(t) do v:free() end
      else
        assert.is_string(t)
        assert.matches("remat.load", t)
      end
    end
    collectgarbage()
    assert.equals(live, remat.memory.stats().live)
    assert(loaded < MUTANTS, "no mutant was rejected")
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)

---------------------------------------------------------------- failing allocations ----

describe("a failure at every allocation of a whole training step", function()
  after_each(function() remat.memory.fail_at(0) end)

  local policies = {
    none = function() return policy.none() end,
    every = function() return policy.every(1) end,
    selective = function() return policy.selective { "gelu", "softmax" } end,
    budget = function() return policy.budget("30KiB") end,
  }

  local function params_of(model)
    local v = {}
    for i, p in ipairs(model:parameters()) do v[i] = C.flat(p) end
    return v
  end

  for _, name in ipairs { "none", "every", "selective", "budget" } do
    it(name .. ": forward, loss, backward and AdamW fail cleanly, leak nothing and retrain bit-identically", function()
      local function setup()
        remat.manual_seed(11)
        local model = nn.Sequential { nn.Linear(6, 16), nn.GELU(), nn.TransformerBlock(16, 2), nn.Linear(16, 3) }
        model:checkpoint(policies[name]())
        local opt = optim.AdamW(model:parameters(), { lr = 1e-2 })
        return model, opt
      end
      local x = remat.randn(2, 4, 6)
      local y = remat.tensor { { 1, 2, 3, 1 }, { 2, 3, 1, 2 } }
      local function step(model, opt)
        local loss = nn.cross_entropy(model(x):view(8, 3), y:view(8))
        loss:backward()
        opt:step()
        opt:zero_grad()
        return loss:item()
      end
      local model, opt = setup()
      step(model, opt) -- the first step makes the optimizer state
      local want_loss = step(model, opt)
      local want = params_of(model)
      model, opt = setup()
      step(model, opt)
      collectgarbage()
      local base = remat.memory.stats().live
      local k, failures = 1, 0
      while true do
        remat.memory.fail_at(k)
        local ok, err = pcall(step, model, opt)
        remat.memory.fail_at(0)
        if ok then break end
        failures = failures + 1
        assert.matches("injected failure", err)
        opt:zero_grad()
        collectgarbage()
        assert.equals(base, remat.memory.stats().live, "bytes left after failing at allocation " .. k)
        k = k + 1
        assert(k < 5000, "the step never completed")
      end
      assert(failures > 20, "only " .. failures .. " allocations were tried")
      -- a failure before the optimizer step changed nothing, so the completed step is the second
      assert.same(want, params_of(model))
      local _ = want_loss
    end)
  end
end)
