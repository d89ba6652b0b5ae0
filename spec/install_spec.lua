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

local shell = require "support.shell"
local run, exists = shell.run, shell.exists

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

-- The README line for linking a host against the static archive, with host.c and the
-- output replaced.
local function readme_static_line()
  for line in files.read("README.md"):gmatch("[^\n]+") do
    local cmd = line:match("^%s+(cc host%.c %-Icore build/libremat%.a .*)$")
    if cmd then return cmd end
  end
end

describe("make install into a prefix #subprocess", function()
  local ENV = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "

  -- Installs the build (as it was built: with the plugins it has) into a new prefix.
  local function install()
    local root = files.tmpdir()
    local _, err, code = run(("make -s install BUILD=%s PREFIX=%s CUDA=%d MPI=%d"):format(build, root,
      exists(build .. "/libremat_cuda.so") and 1 or 0, exists(build .. "/libremat_mpi.so") and 1 or 0))
    os.execute(("make -s pkgconfig BUILD=%s > /dev/null 2>&1"):format(build)) -- back to the default prefix
    assert.are.equal(0, code, err)
    return root
  end

  it("installs the module, the command, the C library, remat.pc and the plugins; a host builds with pkg-config", function()
    local root = install()
    for _, f in ipairs { "bin/remat", "lib/lua/5.4/remat.so", "include/remat.h", "lib/libremat.a",
                         "lib/libremat.so", "lib/pkgconfig/remat.pc" } do
      assert.is_true(exists(root .. "/" .. f), f .. " not installed")
    end
    for _, plugin in ipairs { "libremat_mpi.so", "libremat_cuda.so" } do
      assert.are.equal(exists(build .. "/" .. plugin), exists(root .. "/lib/" .. plugin), plugin)
    end
    local sh = table.concat({
      ("export PKG_CONFIG_PATH=%s/lib/pkgconfig"):format(root),
      ("test \"$(pkg-config --variable=libdir remat)\" = %s/lib"):format(root),
      ("cc -std=c11 -o %s/minimal examples/host/minimal.c $(pkg-config --cflags --libs remat) -Wl,-rpath,%s/lib"):format(root, root),
      ("%s%s/minimal"):format(ENV, root),
      ("LUA_CPATH='%s/lib/lua/5.4/?.so' lua5.4 -e 'print(require(\"remat\").ones(2):sum():item())'"):format(root),
      ("%s/bin/remat -e 'print(require(\"remat\").version)'"):format(root),
    }, " && ")
    local out, err, code = run("sh -c " .. sh_quote(sh))
    os.execute("rm -rf " .. sh_quote(root))
    assert.are.equal(0, code, out .. err)
    assert.matches("^200 steps, loss [%d.]+\n2%.0?\n0%.1%.0\n$", out)
  end)

  it("remat.dist finds the installed libremat_mpi.so from the command and the module", function()
    local why = not has("mpirun") and "mpirun not found"
      or not exists(build .. "/libremat_mpi.so") and "libremat_mpi.so was not built" or nil
    if not need.required("mpi") and why then return pending(why) end
    assert.is_nil(why)
    local root = install()
    local mpirun = "timeout 60 mpirun --allow-run-as-root --oversubscribe -np 1 "
    local code_ = "local r = require(\"remat\"); print(r.dist.init().backend())"
    local out, err, code = run(("%s %s/bin/remat -e '%s' && %s env LUA_CPATH='%s/lib/lua/5.4/?.so' lua5.4 -e '%s'"):format(
      mpirun, root, code_, mpirun, root, code_))
    os.execute("rm -rf " .. sh_quote(root))
    assert.are.equal(0, code, out .. err)
    assert.are.equal("mpi\nmpi\n", out)
  end)

  it("the README's static-link line builds a host", function()
    local cmd = readme_static_line()
    assert.is_not_nil(cmd, "README.md has no `cc host.c -Icore build/libremat.a ...` line")
    local d = files.tmpdir()
    cmd = cmd:gsub("^cc host%.c", "cc -std=c11 -o " .. d .. "/minimal examples/host/minimal.c"):gsub("build/libremat%.a", build .. "/libremat.a")
    local out, err, code = run(cmd .. " && " .. ENV .. d .. "/minimal")
    os.execute("rm -rf " .. sh_quote(d))
    assert.are.equal(0, code, cmd .. "\n" .. out .. err)
    assert.matches("^200 steps, loss", out)
  end)
end)

describe("the rock #subprocess", function()
  local why = not has("luarocks") and "luarocks not installed (apt-get install luarocks)" or nil
  if not need.check("luarocks", why) then return end

  it("luarocks make (CUDA=0) into a tree: require \"remat\" from lua5.4, the command, and remat.pc for hosts", function()
    local tree = files.tmpdir()
    local jobs = "MAKEFLAGS=-j" .. (io.popen("nproc"):read("n") or 2)
    local out, err, code = run(("%s luarocks --lua-version=5.4 --tree=%s make remat-scm-1.rockspec CUDA=0"):format(jobs, tree))
    assert.are.equal(0, code, out .. err)
    local lib = tree .. "/lib/lua/5.4/"
    assert.is_true(exists(lib .. "remat.so"))
    assert.is_false(exists(lib .. "libremat_cuda.so"), "CUDA=0 was ignored")
    for _, f in ipairs { "libremat.a", "libremat.so", "pkgconfig/remat.pc" } do
      assert.is_false(exists(lib .. f), f .. " is in the Lua module directory")
    end
    local sh = table.concat({
      ("LUA_CPATH='%s?.so' lua5.4 -e 'local r = require(\"remat\"); print(r.version, r.ones(3):sum():item())'"):format(lib),
      ("%s/bin/remat -v"):format(tree),
      ("export PKG_CONFIG_PATH=\"$(luarocks --lua-version=5.4 --tree=%s show --rock-dir remat)/host/lib/pkgconfig\""):format(tree),
      "test -f \"$(pkg-config --variable=libdir remat)/libremat.so\"",
      "test -f \"$(pkg-config --variable=includedir remat)/remat.h\"",
      "echo host-ok",
    }, " && ")
    out, err, code = run("sh -c " .. sh_quote(sh))
    os.execute("rm -rf " .. sh_quote(tree))
    assert.are.equal(0, code, out .. err)
    assert.matches("^0%.1%.0\t3%.0?\nremat 0%.1%.0", out)
    assert.matches("host%-ok\n$", out)
  end)
end)
