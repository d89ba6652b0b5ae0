-- File helpers shared by specs that write and read files.
local files = {}

-- A fresh empty directory under the system's temporary directory.
function files.tmpdir()
  local d = os.tmpname()
  os.remove(d)
  assert(os.execute("mkdir -p '" .. d .. "'"))
  return d
end

-- The whole content of a file.
function files.read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

-- Writes s to path. Removes first: on ext4, truncating a file that has data forces a
-- flush (slow).
function files.write(path, s)
  os.remove(path)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

return files
