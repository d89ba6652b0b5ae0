-- The REPL driven through a pipe: no prompt decoration, prints values, survives errors,
-- reads multi-line chunks, times lines on request, and exits on EOF or os.exit.
local build = os.getenv("REMAT_BUILD") or "build"
local exe = build .. "/remat"

-- Runs the REPL on `input`; returns stdout+stderr and the exit code.
local function repl(input)
  local f = assert(io.open(exe, "r"), "no " .. exe .. " (build first, or set REMAT_BUILD)")
  f:close()
  local tmp = os.tmpname()
  local w = assert(io.open(tmp, "w"))
  w:write(input)
  w:close()
  local p = assert(io.popen(exe .. " < " .. tmp .. " 2>&1", "r"))
  local out = p:read("a")
  local _, _, code = p:close()
  os.remove(tmp)
  return out, code
end

local function has(out, s) assert(out:find(s, 1, true), ("output lacks %q:\n%s"):format(s, out)) end

describe("the REPL through a pipe", function()
  it("prints a tensor and exits on EOF", function()
    local out, code = repl("remat.ones(2, 2)\n")
    assert.are.equal(0, code)
    assert.are.equal(" 1  1\n 1  1\n[remat.FloatTensor of size 2x2]\n", out)
  end)

  it("survives an error and carries on", function()
    local out, code = repl("error('boom')\nremat.zeros(-1)\n1 + 1\n")
    assert.are.equal(0, code)
    has(out, "boom")
    has(out, "size 1 is negative")
    assert.matches("\n2\n$", out)
  end)

  it("reports syntax errors and carries on", function()
    local out = repl("x = = 1\nprint('after')\n")
    has(out, "unexpected symbol")
    has(out, "after")
  end)

  it("prints expressions, =expr, several values and shallow tables; statements print nothing", function()
    local out = repl("x = 3\nx\n=x * 2\n1, 'a', nil\n{1, 2, a = 'b', t = {4}}\n")
    assert.are.equal("3\n6\n1\ta\tnil\n{1, 2, a = \"b\", t = {...}}\n", out)
  end)

  it("reads multi-line chunks", function()
    local out = repl("for i = 1, 3 do\n  io.write(i, ' ')\nend\nfunction f(a,\n b)\n return a + b\nend\nf(2, 3)\n")
    assert.are.equal("1 2 3 5\n", out)
  end)

  it("has remat, nn, optim and policy as globals", function()
    local out = repl("type(remat), remat.version, rawequal(nn, remat.nn), rawequal(optim, remat.optim), rawequal(policy, remat.policy)\n")
    has(out, "table\t0.1.0\ttrue\ttrue\ttrue")
  end)

  it(":time toggles the time of each line", function()
    local out = repl(":time\n1\n:time\n2\n")
    assert.matches("^timing on\n1\n%-%- %d+%.%d+ s\ntiming off\n2\n$", out)
  end)

  it(":time CODE runs and times CODE once; :time on / :time off set timing", function()
    local out = repl(":time 6 * 7\n1\n:time on\n2\n:time off\n3\n:time off\n4\n")
    assert.matches("^42\n%-%- [%d.]+ s\n1\ntiming on\n2\n%-%- [%d.]+ s\ntiming off\n3\ntiming off\n4\n$", out)
  end)

  it(":help lists the commands, :quit leaves, an unknown command says so", function()
    local out, code = repl(":help\n:nope\n:quit\nprint('not reached')\n")
    assert.are.equal(0, code)
    has(out, ":time CODE")
    has(out, ":quit")
    has(out, "unknown command :nope")
    assert.is_nil(out:find("not reached", 1, true))
  end)

  it("completes method names after ':' (what Tab completes, through :complete)", function()
    local out = repl("m = nn.Sequential{ nn.Linear(2, 2) }\nx = remat.ones(2)\n:complete m:chec\n:complete x:resh\n:complete nn.Lin\n")
    assert.are.equal("m:checkpoint\nm:checkpoint_policy\nx:reshape\nnn.Linear\n", out)
  end)

  it("exits with os.exit's code", function()
    local out, code = repl("print('bye')\nos.exit(3)\nprint('not reached')\n")
    assert.are.equal(3, code)
    assert.are.equal("bye\n", out)
  end)

  it("reports a chunk left incomplete at EOF", function()
    local out, code = repl("for i = 1, 2 do\n")
    assert.are.equal(0, code)
    has(out, "expected")
  end)
end)
