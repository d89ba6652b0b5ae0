-- Shell helpers for specs that run commands and build programs (hosts, examples, installs).
local files = require "support.files"
local shell = {}

-- Runs a shell command line; returns its stdout, its stderr and its exit code.
function shell.run(cmdline)
  local err = os.tmpname()
  local p = assert(io.popen(cmdline .. " 2> " .. err, "r"))
  local out = p:read("a")
  local _, _, code = p:close()
  local errout = files.read(err)
  os.remove(err)
  return out, errout, code
end

-- Whether a file exists (can be opened for reading).
function shell.exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

-- A function that runs `make -s TARGETS BUILD=build` the first time it is called and
-- raises "make TARGETS failed" with make's output then and on every later call if it
-- failed (a no-op when the targets are up to date).
function shell.maker(targets, build)
  local built, log
  return function()
    if built == nil then
      local path = os.tmpname()
      built = os.execute(("make -s %s BUILD=%s > %s 2>&1"):format(targets, build, path)) == true
      log = files.read(path)
      os.remove(path)
    end
    assert(built, ("make %s failed:\n%s"):format(targets, log or ""))
  end
end

return shell
