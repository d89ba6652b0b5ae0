-- The first run on a fresh machine and the two install paths: `make run` / `make test`
-- install their packages before make reads the pkg-config flags, busted runs under
-- Lua 5.4 whatever `lua` is, remat.so refuses another Lua with a message, `make
-- install` into a prefix (a host built against it with pkg-config), and the rock
-- (`luarocks make` into a tree, then `require "remat"` from lua5.4).
local files = require "support.files"
local need = require "support.need"

local build = os.getenv("REMAT_BUILD") or "build"
local cwd = os.getenv("PWD")

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Runs a shell command line; returns stdout, stderr, exit code.
local function run(cmdline)
  local err = os.tmpname()
  local p = assert(io.popen(cmdline .. " 2> " .. err, "r"))
  local out = p:read("a")
  local _, _, code = p:close()
  local errout = files.read(err)
  os.remove(err)
  return out, errout, code
end

local function has(cmd) return os.execute("command -v " .. cmd .. " > /dev/null 2>&1") == true end

local function script(path, body)
  files.write(path, "#!/bin/sh\n" .. body .. "\n")
  assert(os.execute("chmod +x " .. sh_quote(path)))
end

describe("a fresh machine #subprocess", function()
  -- A machine where nothing is installed until apt-get runs: fake dpkg, apt-get and
  -- pkg-config (which fails until apt-get has run), and a cc that records its
  -- arguments and fails, so the build stops at its first compile.
  local function fresh_machine()
    local d = files.tmpdir()
    local bin, marker = d .. "/bin", d .. "/installed"
    assert(os.execute("mkdir -p " .. bin))
    script(bin .. "/dpkg", ("[ -e %s ] && echo 'Status: install ok installed' && exit 0; exit 1"):format(marker))
    script(bin .. "/apt-get", ("touch %s"):format(marker))
    script(bin .. "/id", "echo 0")
    script(bin .. "/pkg-config", ("[ -e %s ] || exit 1; exec /usr/bin/pkg-config \"$@\""):format(marker))
    script(bin .. "/fakecc", ("echo \"$@\" >> %s/cc.log; exit 1"):format(d))
    return d, bin
  end

  it("make run builds with the flags of the packages deps has just installed", function()
    local d, bin = fresh_machine()
    local out, err = run(("PATH=%s:$PATH make -j1 run BUILD=%s/build CC=%s/fakecc CUDA=0 MPI=0"):format(bin, d, bin))
    local log = files.read(d .. "/cc.log")
    os.execute("rm -rf " .. sh_quote(d))
    assert.matches("deps: installing", out .. err)
    assert.truthy(log:find("-I/usr/include/lua5.4", 1, true), "the first compile lacks Lua's flags: " .. log)
  end)

  it("make test does too, and runs busted under lua5.4", function()
    local d, bin = fresh_machine()
    run(("PATH=%s:$PATH make -j1 test BUILD=%s/build CC=%s/fakecc CUDA=0 MPI=0"):format(bin, d, bin))
    local log = files.read(d .. "/cc.log")
    os.execute("rm -rf " .. sh_quote(d))
    assert.truthy(log:find("-I/usr/include/lua5.4", 1, true), "the first compile lacks Lua's flags: " .. log)
    local out = run("make -n test 2>&1")
    assert.matches('lua5%.4 "%$%(command %-v busted%)" %-%-exclude%-tags', out)
  end)

  it("make deps installs Open MPI (the distributed specs) and luarocks (the rock's spec)", function()
    local out, err, code = run("make -s print-deps")
    assert.are.equal(0, code, err)
    local set = {}
    for p in out:gmatch("%S+") do set[p] = true end
    for _, p in ipairs { "liblua5.4-dev", "lua-busted", "libopenmpi-dev", "openmpi-bin", "luarocks" } do
      assert.is_true(set[p], p .. " is not in DEPS_APT: " .. out)
    end
  end)
end)

describe("remat.so in another Lua #subprocess", function()
  local why = not has("lua5.1") and "lua5.1 not installed (apt-get install lua5.1)" or nil
  if not need.check("lua5.1", why) then return end

  it("fails to load with a message instead of crashing", function()
    local out, err, code = run(("LUA_CPATH=%s lua5.1 -e 'print(pcall(require, \"remat\"))'"):format(
      sh_quote(cwd .. "/" .. build .. "/?.so")))
    assert.are.equal(0, code, err)
    assert.matches("^false\tremat: this module was built for Lua 5%.4[.%d]* but was loaded by another Lua", out)
    assert.matches("run it with lua5%.4", out)
  end)
end)
