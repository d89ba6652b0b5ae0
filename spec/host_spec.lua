-- Embedding remat in a C host: remat.train.stepper (time-sliced training), remat.log,
-- and the C programs in examples/host (a frame-loop trainer; two contexts in one
-- process), run as a host would: exit status, report, saved weights, every byte of the
-- host allocators back, errors as statuses, valgrind clean.
local remat = require "remat"
local nn, optim, train = remat.nn, remat.optim, remat.train

local build = os.getenv("REMAT_BUILD") or "build"
local FMNIST = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"

local shell = require "support.shell"
local run, exists = shell.run, shell.exists
local read_file = require("support.files").read

-- Builds the examples once (a no-op when they are up to date).
local ensure_built = shell.maker(("examples %s/libremat.so"):format(build), build)

-- One thread each for OpenMP and OpenBLAS, as a game would leave cores to itself.
local ENV = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "

local function has_valgrind() return os.execute("command -v valgrind > /dev/null 2>&1") == true end

describe("remat.train.stepper", function()
  local function linear_task(n, d, k)
    remat.manual_seed(3)
    local x = remat.randn(n, d)
    local w = remat.randn(d, k)
    local y = remat.no_grad(function() return x:matmul(w):argmax(2) end)
    return x, y
  end

  it("trains a model step by step and stops after its steps", function()
    local x, y = linear_task(64, 8, 3)
    local m = nn.Sequential{ nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3) }
    local s = train.stepper{ model = m, optimizer = optim.SGD(m:parameters(), { lr = 0.2, momentum = 0.9 }),
                             data = function() return x, y end, steps = 40 }
    local first = s:step()
    assert.is_number(first)
    local last
    for _ = 2, 40 do last = s:step() end
    assert.is_true(last < first * 0.5, ("loss %g -> %g"):format(first, last))
    assert.is_true(s.done)
    assert.are.equal(40, s.steps)
    assert.is_nil(s:step())
    assert.is_nil(s:resume())
    assert.matches("40 steps of 40", tostring(s))
    assert.is_true(s:mean_step_ms() > 0)
  end)

  it("resume() yields between micro-batches and reports each step", function()
    local x, y = linear_task(8, 4, 2)
    local m = nn.Linear(4, 2)
    local s = train.stepper{ model = m, optimizer = optim.SGD(m:parameters(), { lr = 0.1 }),
                             data = function() return x, y end, micro_batches = 3, steps = 2 }
    local kinds = {}
    while true do
      local kind, loss = s:resume()
      if not kind then break end
      kinds[#kinds + 1] = kind
      if kind == "step" then assert.is_number(loss) end
    end
    assert.are.same({ "micro", "micro", "step", "micro", "micro", "step" }, kinds)
    assert.are.equal(6, s.units)
  end)

  it("accumulates micro-batches exactly like one step on the whole batch", function()
    remat.manual_seed(5)
    local x = remat.randn(8, 4):to("float64")
    local y = remat.tensor{ 1, 2, 1, 2, 2, 1, 1, 2 }
    local function fresh()
      remat.manual_seed(9)
      return nn.Linear(4, 2):to("float64")
    end
    local whole = fresh()
    train.stepper{ model = whole, optimizer = optim.SGD(whole:parameters(), { lr = 0.5 }),
                   data = function() return x, y end, steps = 1 }:step()
    local parts = fresh()
    local halves = { { x:narrow(1, 1, 4):contiguous(), y:narrow(1, 1, 4):contiguous() },
                     { x:narrow(1, 5, 4):contiguous(), y:narrow(1, 5, 4):contiguous() } }
    local i = 0
    local s = train.stepper{ model = parts, optimizer = optim.SGD(parts:parameters(), { lr = 0.5 }),
                             data = function() i = i + 1 return table.unpack(halves[i]) end,
                             micro_batches = 2, steps = 1 }
    s:step()
    local pw, pp = whole:parameters(), parts:parameters()
    for k = 1, #pw do
      local a, b = pw[k]:totable(), pp[k]:totable()
      for r = 1, #a do
        if type(a[r]) == "table" then
          for c = 1, #a[r] do assert.is_true(math.abs(a[r][c] - b[r][c]) < 1e-12) end
        else
          assert.is_true(math.abs(a[r] - b[r]) < 1e-12)
        end
      end
    end
  end)

  it("run_for runs at least one unit, then only units that fit the budget", function()
    local t = 0 -- a host clock: each unit of this loop takes 2 ms, then 5 ms
    local cost = 0.002
    local s = train.stepper{ clock = function() return t end, loop = function(yield)
      for i = 1, 1000 do t = t + cost yield(i) end
    end }
    local r = s:run_for(0)
    assert.are.same({ 1, 1, 1, 2 }, { r.units, r.steps, r.loss, math.floor(r.ms + 0.5) })
    r = s:run_for(11) -- 2, 4, 6, 8: a fifth would end at 10 < 11, a sixth past it
    assert.are.equal(5, r.units)
    assert.are.equal(6, r.total)
    assert.is_false(r.over)
    cost = 0.005
    r = s:run_for() -- the default 8 ms: the average moves towards 5 ms per unit
    assert.is_true(r.units >= 1 and r.units <= 2, "units " .. r.units)
    cost = 0.02
    r = s:run_for(8) -- one unit longer than the budget: run, reported as over
    assert.are.equal(1, r.units)
    assert.is_true(r.over)
    assert.is_false(r.done)
    assert.are.equal(0.02 * 1000, math.floor(s.max_ms + 0.5))
  end)

  it("with remat.now, a slice's time is what the loop took", function()
    local s = train.stepper(function(yield)
      for i = 1, 100 do
        local t = remat.now() + 0.001
        while remat.now() < t do end
        yield(i)
      end
    end)
    local r = s:run_for(5)
    assert.is_true(r.units >= 1 and r.ms >= r.units * 1)
    assert.is_true(s.time * 1000 >= r.units)
  end)

  it("a loop that ends by itself finishes the stepper", function()
    local s = train.stepper(function(yield) yield(1.5) yield() yield(2.5) end)
    local r = s:run_for(math.huge)
    assert.is_true(r.done)
    assert.are.equal(2, r.total)
    assert.are.equal(2.5, r.loss)
    assert.are.equal(3, r.units)
  end)

  it("takes a dataset: batches are cycled per epoch and freed after use", function()
    remat.manual_seed(1)
    local ds = remat.data.tensor_dataset(remat.randn(10, 4), remat.tensor{ 1, 2, 1, 2, 1, 2, 1, 2, 1, 2 })
    local m = nn.Linear(4, 2)
    local s = train.stepper{ model = m, optimizer = optim.SGD(m:parameters(), { lr = 0.1 }),
                             data = ds, batch_size = 4, epochs = 2 }
    local r = s:run_for(math.huge)
    assert.are.equal(4, r.total) -- 2 full batches per epoch (the last partial one dropped)
    assert.is_true(r.done)
    local s2 = train.stepper{ model = m, optimizer = optim.SGD(m:parameters(), { lr = 0.1 }),
                              data = ds, batch_size = 4 }
    for _ = 1, 5 do s2:step() end
    collectgarbage() collectgarbage()
    local live = remat.memory.stats().live
    for _ = 1, 50 do s2:step() end
    collectgarbage() collectgarbage()
    assert.are.equal(live, remat.memory.stats().live)
  end)

  it("takes an optimizer written as a function of the model", function()
    local x, y = linear_task(16, 4, 2)
    local m = nn.Linear(4, 2)
    local calls = 0
    local s = train.stepper{ model = m, data = function() return x, y end, steps = 3,
      optimizer = function(model)
        calls = calls + 1
        remat.no_grad(function()
          for _, p in ipairs(model:parameters()) do p:copy_(p - p.grad * 0.1) end
        end)
      end }
    s:run_for(math.huge)
    assert.are.equal(3, calls)
    assert.is_nil(m:parameters()[1].grad) -- zeroed after each step
  end)

  it("an error in the loop ends the stepper with the loop's traceback, raised every time", function()
    local n = 0
    local m = nn.Linear(4, 3)
    local s = train.stepper{ model = m, optimizer = optim.SGD(m:parameters(), { lr = 0.1 }),
      data = function() n = n + 1 return remat.randn(2, 4), remat.tensor{ 1, n == 2 and 7 or 1 } end }
    assert.is_number(s:step())
    local ok, err = pcall(s.step, s)
    assert.is_false(ok)
    assert.matches("out of range", err)
    assert.matches("stack traceback", err)
    assert.is_true(s.done)
    assert.are.equal(err, s.error)
    for _, again in ipairs { function() s:run_for(5) end, function() s:resume() end, function() s:step() end } do
      local ok2, err2 = pcall(again)
      assert.is_false(ok2)
      assert.are.equal(err, err2)
    end
    assert.matches("failed", tostring(s))
  end)

  it("a loop that yields something other than a loss is an error", function()
    local s = train.stepper(function(yield) yield("oops") end)
    assert.has_error(function() s:step() end,
      "remat.train: the loop yielded string (yield(loss) takes the loss as a number)")
  end)

  it("runs inside a host's own coroutine scheduler", function()
    local x, y = linear_task(16, 4, 2)
    local m = nn.Linear(4, 2)
    local s = train.stepper{ model = m, optimizer = optim.SGD(m:parameters(), { lr = 0.1 }),
                             data = function() return x, y end, steps = 6 }
    local task = coroutine.wrap(function()
      while not s.done do s:run_for(0) coroutine.yield(s.steps) end
      return "finished"
    end)
    local seen = {}
    for _ = 1, 10 do
      local v = task()
      seen[#seen + 1] = v
      if v == "finished" then break end
    end
    assert.are.same({ 1, 2, 3, 4, 5, 6, "finished" }, seen)
  end)

  it("rejects bad options with messages naming the function", function()
    local m = nn.Linear(2, 2)
    local o = optim.SGD(m:parameters(), { lr = 0.1 })
    local data = function() return remat.randn(1, 2), remat.tensor{ 1 } end
    local cases = {
      { 42, "remat.train.stepper: expected a table of options or a loop function%(yield%), got number" },
      { { model = m, optimizer = o }, "remat.train.stepper: data must be a function returning x, y or a remat.data dataset, got nil" },
      { { model = 3, optimizer = o, data = data }, "remat.train.stepper: model must be a module" },
      { { model = m, optimizer = {}, data = data }, "remat.train.stepper: optimizer must be an optimizer" },
      { { model = m, optimizer = o, data = data, loss = 1 }, "remat.train.stepper: loss must be a function" },
      { { model = m, optimizer = o, data = data, steps = -1 }, "remat.train.stepper: steps must be a non%-negative integer, got %-1" },
      { { model = m, optimizer = o, data = data, steps = 1.5 }, "steps must be a non%-negative integer" },
      { { model = m, optimizer = o, data = data, budget_ms = -2 }, "budget_ms must be a number >= 0, got %-2" },
      { { model = m, optimizer = o, data = data, micro_batches = 0 }, "micro_batches must be a positive integer, got 0" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(train.stepper, c[1])
      assert.is_false(ok)
      assert.matches(c[2], err)
      assert.matches("host_spec.lua:%d+:", err) -- located at the caller's line
    end
    local s = train.stepper{ model = m, optimizer = o, data = data }
    assert.has_error(function() s:run_for(-1) end)
    local s0 = train.stepper{ model = m, optimizer = o, data = data, steps = 0 }
    assert.is_true(s0.done)
    assert.are.equal(0, s0:run_for(5).units)
  end)

  it("a loss that is not a tensor is an error naming the stepper", function()
    local m = nn.Linear(2, 2)
    local s = train.stepper{ model = m, optimizer = optim.SGD(m:parameters(), { lr = 0.1 }),
      data = function() return remat.randn(1, 2), remat.tensor{ 1 } end, loss = function() return 3 end }
    local ok, err = pcall(s.step, s)
    assert.is_false(ok)
    assert.matches("remat.train.stepper: loss returned number, not a tensor", err)
  end)
end)

describe("remat.log", function()
  local code = [[local r = require "remat"; r.log("hello", 1, true); r.log.warn("careful"); r.log.error("bad"); ]] ..
    [[io.write(tostring(r.log.enabled()))]]
  local want = "[remat info] hello\t1\ttrue\n[remat warn] careful\n[remat error] bad\n"

  it("writes to stderr without a host (stock lua5.4)", function()
    local out, err, rc = run(("LUA_CPATH=%s/?.so lua5.4 -e '%s'"):format(build, code))
    assert.are.equal(0, rc, err)
    assert.are.equal("true", out)
    assert.are.equal(want, err)
  end)

  it("writes to stderr in the remat command", function()
    local out, err, rc = run(("%s/remat -e '%s'"):format(build, code))
    assert.are.equal(0, rc, err)
    assert.are.equal("true", out)
    assert.are.equal(want, err)
  end)
end)

describe("examples/host #subprocess", function()
  it("the frame-loop host trains a slice per frame, saves the weights and gets every byte back", function()
    ensure_built()
    local out_path = os.tmpname() .. ".safetensors"
    local out, err, code = run(ENV .. build .. "/examples/host --frames 30 --out " .. out_path)
    assert.are.equal(0, code, out .. err)
    local frames = 0
    for ms, budget in out:gmatch("frame +%d+: train +([%d.]+) ms / ([%d.]+) ms budget") do
      frames = frames + 1
      assert.is_true(tonumber(ms) > 0)
      assert.are.equal(8, tonumber(budget))
    end
    assert.are.equal(30, frames)
    assert.matches("summary: 30 frames", out)
    assert.matches("remat host allocator: %d+ allocs, %d+ reallocs, %d+ frees, peak %d+ bytes; live now 0 bytes in 0 blocks\n", out)
    assert.matches("lua_State allocator: .- live now 0 bytes in 0 blocks\n", out)
    assert.matches("host: ok\n$", out)
    local mlp = exists(FMNIST)
    assert.matches(mlp and "%[remat info%] training the Fashion%-MNIST MLP" or "%[remat info%] training a policy network", err)
    local t, meta = remat.load(out_path)
    local w = t["1.weight"]
    assert.is_not_nil(w, "saved weights have 1.weight")
    assert.are.same(mlp and { 256, 784 } or { 64, 16 }, w:shape())
    assert.is_true(tonumber(meta.steps) >= 30)
    os.remove(out_path)
  end)

  it("the host trains the synthetic policy network, stops at --steps and reports accuracy", function()
    ensure_built()
    local out_path = os.tmpname() .. ".safetensors"
    local out, err, code = run(ENV .. build .. "/examples/host --synthetic --frames 1000 --budget-ms 4 --steps 120 --quiet --out " .. out_path)
    assert.are.equal(0, code, out .. err)
    assert.matches("%[remat info%] training a policy network on synthetic observations", err)
    assert.is_nil(out:find("frame +%d+:"))
    local acc = tonumber(out:match("accuracy ([%d.]+)"))
    assert.is_true(acc > 0.6, "accuracy " .. tostring(acc))
    assert.matches("; 120 steps,", out)
    assert.matches("host: ok\n$", out)
    os.remove(out_path)
  end)

  it("the minimal host of the README trains to the end of its stepper", function()
    ensure_built()
    local out, err, code = run(ENV .. build .. "/examples/minimal")
    assert.are.equal(0, code, out .. err)
    assert.are.equal("", err)
    local loss = tonumber(out:match("^200 steps, loss ([%d.]+)\n$"))
    assert.is_true(loss and loss < 0.3, out)
  end)

  it("remat.pc gives a host the flags to build and link against libremat.so", function()
    ensure_built()
    local root = os.tmpname()
    os.remove(root)
    local cwd = os.getenv("PWD")
    local sh = table.concat({
      ("mkdir -p %s/include %s/lib/pkgconfig"):format(root, root),
      ("ln -s %s/core/remat.h %s/include/remat.h"):format(cwd, root),
      ("ln -s %s/%s/libremat.so %s/lib/libremat.so"):format(cwd, build, root),
      ("make -s pkgconfig BUILD=%s PREFIX=%s INST_INCDIR=%s/include INST_CLIBDIR=%s/lib"):format(build, root, root, root),
      ("cp %s/remat.pc %s/lib/pkgconfig/remat.pc"):format(build, root),
      ("export PKG_CONFIG_PATH=%s/lib/pkgconfig"):format(root),
      "pkg-config --modversion remat",
      ("cc -std=c11 -o %s/minimal examples/host/minimal.c $(pkg-config --cflags --libs remat) -Wl,-rpath,%s/lib"):format(root, root),
      ("%s%s/minimal"):format(ENV, root),
    }, " && ")
    local out, err, code = run("sh -c '" .. sh .. "'")
    os.execute("rm -rf " .. root)
    os.execute(("make -s pkgconfig BUILD=%s > /dev/null 2>&1"):format(build)) -- back to the default prefix
    assert.are.equal(0, code, out .. err)
    assert.matches("^0%.1%.0\n200 steps, loss", out)
  end)

  it("the rockspec builds with the Makefile and installs through its install target", function()
    local env = {}
    assert(loadfile("remat-scm-1.rockspec", "t", env))()
    assert.are.equal("remat", env.package)
    assert.are.equal("scm-1", env.version)
    assert.are.equal("make", env.build.type)
    assert.are.equal("install", env.build.install_target)
    assert.are.equal("$(LIBDIR)", env.build.install_variables.INST_LIBDIR)
    assert.are.equal("$(BINDIR)", env.build.install_variables.INST_BINDIR)
    assert.are.same({ "lua >= 5.4, < 5.5" }, env.dependencies)
    local mk = read_file("Makefile")
    assert.matches("\ninstall: all pkgconfig\n", mk)
    assert.matches("INST_LIBDIR%)/remat%.so", mk)
  end)

  it("the host refuses an unknown option with its usage", function()
    ensure_built()
    local out, err, code = run(build .. "/examples/host --bogus")
    assert.are.equal(1, code)
    assert.are.equal("", out)
    assert.matches("unknown option %-%-bogus", err)
    assert.matches("usage: host", err)
  end)

  it("two contexts in one process: limits, statistics, RNG, errors and logs do not mix", function()
    ensure_built()
    local out, err, code = run(ENV .. build .. "/examples/two_contexts")
    assert.are.equal(0, code, out .. err)
    assert.are.equal("", err) -- the library wrote nothing of its own
    assert.is_nil(out:find("FAIL"))
    local checks = select(2, out:gsub("\nok   ", "")) + 1
    assert.is_true(checks >= 35, "checks " .. checks)
    for _, line in ipairs {
      "different limits", "an allocation past A's limit fails", "a script error returns a status and a message",
      "A runs another script fine afterwards", "an error in the stepper's loop comes back from rm_lua_slice",
      "collect%-and%-retry works inside a stepper's coroutine", "same seed, same first draw",
      "rm_log reaches A's callback only", "it has a context of its own",
      "A's host allocator got every byte back", "B's host allocator got every byte back",
    } do
      assert.matches("ok   " .. line, out)
    end
    assert.matches("two_contexts: ok\n$", out)
  end)

  local function valgrind(args)
    ensure_built()
    local out, err, code = run("valgrind --error-exitcode=99 --leak-check=full -q --suppressions=examples/host/valgrind.supp "
                               .. build .. "/" .. args)
    assert.are.equal(0, code, err)
    return out, err
  end

  it("two_contexts is valgrind clean (no errors, no leaks) #valgrind", function()
    if not has_valgrind() then pending("valgrind is not installed") return end
    local out = valgrind("examples/two_contexts")
    assert.matches("two_contexts: ok\n$", out)
  end)

  it("the frame-loop host is valgrind clean #valgrind #slow", function()
    if not has_valgrind() then pending("valgrind is not installed") return end
    local out_path = os.tmpname() .. ".safetensors"
    local out = valgrind("examples/host --synthetic --frames 4 --quiet --out " .. out_path)
    assert.matches("host: ok\n$", out)
    os.remove(out_path)
  end)
end)
