-- How many elements of a product change between 1 and 2 threads (the BLAS splits a
-- product between threads, which changes the order of its sums), and whether a fixed
-- thread count gives the same bits twice.
-- Run: build/remat bench/threads_repro.lua
local remat = require "remat"
if arg[1] == "--dump" then
  remat.manual_seed(1)
  local a, b = remat.randn(256, 128), remat.randn(256, 10)
  local c = a:transpose(1, 2):matmul(b) -- (128 x 256) x (256 x 10)
  local f = assert(io.open(arg[2], "wb"))
  for _, v in ipairs(c:view(-1):totable()) do f:write(string.pack("<f", v)) end
  f:close()
  return
end
local exe = arg[-1] or "build/remat"
local function run(threads)
  local path = os.tmpname()
  assert(os.execute(("OMP_NUM_THREADS=%d %s %s --dump %s"):format(threads, exe, arg[0], path)))
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  os.remove(path)
  return s
end
local function differ(x, y)
  local n = 0
  for i = 1, #x, 4 do if x:sub(i, i + 3) ~= y:sub(i, i + 3) then n = n + 1 end end
  return n
end
local one, two, two_again = run(1), run(2), run(2)
print(("256x128 (transposed) x 256x10, %s: %d of %d elements differ between 1 and 2 threads; "
  .. "2 threads twice: %d differ"):format(remat.info().blas, differ(one, two), #one // 4, differ(two, two_again)))
