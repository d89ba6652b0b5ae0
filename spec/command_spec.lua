-- The `remat` command: -v, -h, -e, scripts with arguments, stdin scripts, exit codes,
-- and a library that prints nothing of its own.
local build = os.getenv("REMAT_BUILD") or "build"
local exe = build .. "/remat"

-- Runs the command with a shell argument string; returns stdout, stderr, exit code.
local function run(args, input)
  local f = assert(io.open(exe, "r"), "no " .. exe .. " (build first, or set REMAT_BUILD)")
  f:close()
  local err, inp = os.tmpname(), os.tmpname()
  local w = assert(io.open(inp, "w"))
  w:write(input or "")
  w:close()
  local p = assert(io.popen(("%s %s < %s 2> %s"):format(exe, args, inp, err), "r"))
  local out = p:read("a")
  local _, _, code = p:close()
  local e = assert(io.open(err, "r"))
  local errout = e:read("a")
  e:close()
  os.remove(err)
  os.remove(inp)
  return out, errout, code
end

local function script(src)
  local path = os.tmpname() .. ".lua"
  local f = assert(io.open(path, "w"))
  f:write(src)
  f:close()
  return path
end

describe("the remat command", function()
  it("-v prints the version", function()
    local out, _, code = run("-v")
    assert.are.equal(0, code)
    assert.matches("^remat 0%.1%.0 %(Lua 5%.4", out)
  end)

  it("-h prints the usage", function()
    local out, _, code = run("-h")
    assert.are.equal(0, code)
    assert.matches("usage: remat", out)
    assert.matches("%-e code", out)
  end)

  it("an unknown option is an error with the usage on stderr", function()
    local out, err, code = run("-Z")
    assert.are.equal(1, code)
    assert.are.equal("", out)
    assert.matches("unknown option %-Z", err)
  end)

  it("-e runs code; the README's example prints a 2x2 tensor", function()
    local out, err, code = run([[-e 'local r = require "remat"; print(r.randn(2,3):matmul(r.randn(3,2)))']])
    assert.are.equal(0, code, err)
    assert.matches("%[remat%.FloatTensor of size 2x2%]\n$", out)
  end)

  it("-e with an error exits 1 with the message on stderr", function()
    local out, err, code = run([[-e 'error("bad thing")']])
    assert.are.equal(1, code)
    assert.are.equal("", out)
    assert.matches("bad thing", err)
  end)

  it("runs a script with arguments in arg and ...", function()
    local path = script("print(arg[0] == ..., select('#', ...), arg[1], arg[2], #arg)\n")
    local out, err, code = run(path .. " one two")
    os.remove(path)
    assert.are.equal(0, code, err)
    assert.are.equal("false\t2\tone\ttwo\t2\n", out)
  end)

  it("a failing script exits 1 with the message and a traceback", function()
    local path = script("local x = 1\nerror('script failed')\n")
    local _, err, code = run(path)
    os.remove(path)
    assert.are.equal(1, code)
    assert.matches(":2: script failed", err)
    assert.matches("traceback", err)
  end)

  it("a missing script is an error", function()
    local _, err, code = run("/nonexistent/script.lua")
    assert.are.equal(1, code)
    assert.matches("cannot open", err)
  end)

  it("- runs the script on standard input", function()
    local out, _, code = run("- x y", "print(...)\n")
    assert.are.equal(0, code)
    assert.are.equal("x\ty\n", out)
  end)

  it("-e has the REPL's globals: remat, nn, optim, policy", function()
    local out, err, code = run([[-e 'print(remat.version, rawequal(nn, remat.nn), rawequal(optim, remat.optim), rawequal(policy, remat.policy))']])
    assert.are.equal(0, code, err)
    assert.are.equal("0.1.0\ttrue\ttrue\ttrue\n", out)
  end)

  it("the library prints nothing of its own", function()
    local out, err, code = run([[-e 'local r = require "remat"; r.cuda.available(); local x = r.ones(3); x:free(); pcall(function() return x:sum() end)']])
    assert.are.equal(0, code)
    assert.are.equal("", out)
    assert.are.equal("", err)
  end)
end)
