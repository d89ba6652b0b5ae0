-- Datasets: Fashion-MNIST from Debian's files, IDX reading, minibatches and shuffling
-- with remat's generator, sharding, and the character-level text dataset.
local remat = require "remat"
local C = remat._C
local data = remat.data

local FMNIST = data.fashion_mnist_dir
local have_fmnist = io.open(FMNIST .. "/train-images-idx3-ubyte.gz", "rb") ~= nil

local function shape(t) return (C.info(t)) end

local files = require "support.files"
local tmpdir, write = files.tmpdir, files.write

local function expect_error(fn, ...)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error")
  err = tostring(err)
  for _, pat in ipairs({ ... }) do
    assert(err:find(pat, 1, true), ("error %q does not mention %q"):format(err, pat))
  end
  return err
end

-- A dataset whose row i is {i, -i} with label i: batches say which rows they hold.
local function numbered(n)
  local xv, yv = {}, {}
  for i = 1, n do xv[2 * i - 1], xv[2 * i], yv[i] = i, -i, i end
  return data.tensor_dataset(C.from_table(xv, { n, 2 }, "float32"), C.from_table(yv, { n }, "float32"))
end

-- Row ids of one epoch, checking x and y agree.
local function epoch(ds, bs, opts)
  local ids, sizes = {}, {}
  for xb, yb, i in ds:batches(bs, opts) do
    local x, y = C.flat(xb), C.flat(yb)
    sizes[i] = #y
    for k = 1, #y do
      assert.equal(y[k], x[2 * k - 1])
      assert.equal(-y[k], x[2 * k])
      ids[#ids + 1] = y[k]
    end
  end
  return ids, sizes
end

describe("fashion_mnist", function()
  local function needs_data() if not have_fmnist then pending("dataset-fashion-mnist is not installed") end end

  it("train: 60000 images of 784 pixels, labels 1..10 (6000 of each)", function()
    if not have_fmnist then return needs_data() end
    local ds = data.fashion_mnist("train")
    assert.equal(60000, ds.n)
    assert.equal(60000, #ds)
    assert.same({ 60000, 784 }, shape(ds.x))
    assert.same({ 60000 }, shape(ds.y))
    assert.equal("int64", ds.y:dtype())
    local count = {}
    for _, v in ipairs(C.flat(ds.y)) do
      assert(math.tointeger(v) and v >= 1 and v <= 10, "bad label " .. v)
      count[v] = (count[v] or 0) + 1
    end
    for c = 1, 10 do assert.equal(6000, count[c]) end
    assert.equal("Ankle boot", ds.classes[10])
  end)

  it("test: 10000 images, pixels k/255 in [0, 1] reaching both ends", function()
    if not have_fmnist then return needs_data() end
    local ds = data.fashion_mnist("test")
    assert.same({ 10000, 784 }, shape(ds.x))
    assert.same({ 10000 }, shape(ds.y))
    local small = data.fashion_mnist("test", { limit = 200 })
    assert.equal(200, small.n)
    local lo, hi = math.huge, -math.huge
    for _, v in ipairs(C.flat(small.x)) do
      lo, hi = math.min(lo, v), math.max(hi, v)
      local k = v * 255
      assert(math.abs(k - math.floor(k + 0.5)) < 1e-3, "pixel is not k/255: " .. v)
    end
    assert.equal(0, lo)
    assert.equal(1, hi)
    -- the first rows are the same whatever the limit
    local a, b = C.take_rows(ds.x, nil, 1, 3), C.take_rows(small.x, nil, 1, 3)
    assert.same(C.flat(a), C.flat(b))
  end)

  it("batches cover the epoch once, in a reproducible shuffled order", function()
    if not have_fmnist then return needs_data() end
    local ds = data.fashion_mnist("train", { limit = 1000 })
    local n, total = 0, 0
    remat.manual_seed(5)
    for xb, yb, i in ds:batches(64) do
      n = n + 1
      assert.equal(n, i)
      assert.equal(shape(xb)[1], shape(yb)[1])
      assert.equal(784, shape(xb)[2])
      total = total + shape(xb)[1]
    end
    assert.equal(16, n)
    assert.equal(1000, total)
    remat.manual_seed(5)
    local y1 = C.flat((select(2, ds:batches(64)())))
    remat.manual_seed(5)
    local y2 = C.flat((select(2, ds:batches(64)())))
    assert.same(y1, y2)
  end)

  it("shards by rank and world_size: disjoint, strided, covering everything", function()
    if not have_fmnist then return needs_data() end
    local full = data.fashion_mnist("test", { limit = 30 })
    local fx = C.flat(full.x)
    local seen = 0
    for rank = 1, 3 do
      local sh = data.fashion_mnist("test", { limit = 30, rank = rank, world_size = 3 })
      assert.equal(10, sh.n)
      local sx = C.flat(sh.x)
      for k = 1, 10 do
        local row = rank + (k - 1) * 3
        for p = 1, 784, 97 do assert.equal(fx[(row - 1) * 784 + p], sx[(k - 1) * 784 + p]) end
        seen = seen + 1
      end
    end
    assert.equal(30, seen)
    expect_error(function() data.fashion_mnist("test", { rank = 3, world_size = 2 }) end, "rank 3", "world_size 2")
  end)

  it("names the file and the Debian package when the data is missing", function()
    local err = expect_error(function() data.fashion_mnist("train", { dir = "/nonexistent/fmnist" }) end)
    assert.truthy(err:find(
      "fashion_mnist: /nonexistent/fmnist/train-images-idx3-ubyte.gz not found (install the Debian package dataset-fashion-mnist)",
      1, true), err)
    assert.truthy(err:find("data_spec.lua", 1, true), "error is not located at the caller: " .. err)
    expect_error(function() data.fashion_mnist("test", { dir = "/nonexistent" }) end,
      "/nonexistent/t10k-images-idx3-ubyte.gz not found", "dataset-fashion-mnist")
    expect_error(function() data.fashion_mnist("validation") end, 'split must be "train" or "test"')
  end)
end)

describe("IDX files", function()
  local dir
  before_each(function() dir = tmpdir() end)
  after_each(function() os.execute("rm -rf '" .. dir .. "'") end)

  local function idx3(n, r, c, bytes) return string.pack(">I4I4I4I4", 0x803, n, r, c) .. bytes end

  it("reads plain and gzip IDX images and labels", function()
    local p = dir .. "/img"
    write(p, idx3(2, 1, 3, "\0\255\51\102\153\204"))
    local x = C.read_idx(p)
    assert.same({ 2, 3 }, shape(x))
    local v = C.flat(x)
    local want = { 0, 1, 0.2, 0.4, 0.6, 0.8 }
    for i = 1, 6 do assert.near(want[i], v[i], 1e-6) end
    write(dir .. "/lab", string.pack(">I4I4", 0x801, 3) .. "\0\9\4")
    assert.same({ 1, 10, 5 }, C.flat(C.read_idx(dir .. "/lab")))
    -- labels are int64 class indices (Lua integers when read); images float32
    assert.equal("int64", select(2, C.info(C.read_idx(dir .. "/lab"))))
    assert.equal("integer", math.type(C.flat(C.read_idx(dir .. "/lab"))[2]))
    assert.equal("float32", select(2, C.info(x)))
    if os.execute("command -v gzip >/dev/null") then
      assert(os.execute("gzip -k '" .. dir .. "/lab'"))
      assert.same({ 1, 10, 5 }, C.flat(C.read_idx(dir .. "/lab.gz")))
      assert.same({ 1, 10 }, C.flat(C.read_idx(dir .. "/lab.gz", 2)))
    end
  end)

  it("rejects bad magic, truncated data and missing files with the file's name", function()
    local p = dir .. "/bad"
    write(p, string.pack(">I4I4", 0x802, 3) .. "\0\1\2")
    expect_error(function() C.read_idx(p) end, p, "magic is 0x00000802")
    write(p, idx3(3, 2, 2, "\1\2\3\4\5"))
    expect_error(function() C.read_idx(p) end, p, "truncated", "item 2")
    write(p, string.pack(">I4I4", 0x803, 3))
    expect_error(function() C.read_idx(p) end, p, "inside the IDX header")
    write(p, "")
    expect_error(function() C.read_idx(p) end, p, "too short")
    write(p, idx3(0xffffffff, 0xffff, 0xffff, ""))
    expect_error(function() C.read_idx(p) end, p, "implausible")
    expect_error(function() C.read_idx(dir .. "/none.gz") end, dir .. "/none.gz not found")
    if os.execute("command -v gzip >/dev/null") then
      write(p, idx3(50, 10, 10, ("\7"):rep(5000)) .. "extra")
      expect_error(function() C.read_idx(p) end, p, "data continues after the 50 items")
      assert.same({ 2, 100 }, shape(C.read_idx(p, 2)))
      write(p, idx3(50, 10, 10, ("\7"):rep(5000)))
      local gz, cut = "'" .. p .. ".gz'", "'" .. p .. "2.gz'"
      assert(os.execute("gzip -f '" .. p .. "' && head -c $(( $(stat -c %s " .. gz .. ") - 4 )) " .. gz .. " > " .. cut))
      expect_error(function() C.read_idx(p .. "2.gz") end, p .. "2.gz: corrupted or truncated file (unexpected end of file)")
    end
  end)
end)

describe("batches and shuffling", function()
  it("cover every example exactly once per epoch, shuffled or not", function()
    local ds = numbered(103)
    remat.manual_seed(1)
    local ids, sizes = epoch(ds, 10)
    assert.equal(103, #ids)
    assert.equal(11, #sizes)
    assert.equal(3, sizes[11])
    local seen = {}
    for _, v in ipairs(ids) do
      assert.is_nil(seen[v])
      seen[v] = true
    end
    local sorted = { table.unpack(ids) }
    table.sort(sorted)
    for i = 1, 103 do assert.equal(i, sorted[i]) end
    local in_order = true
    for i = 1, 103 do in_order = in_order and ids[i] == i end
    assert.is_false(in_order)
    local plain = epoch(ds, 10, { shuffle = false })
    for i = 1, 103 do assert.equal(i, plain[i]) end
  end)

  it("drop_last drops the short batch", function()
    local ids, sizes = epoch(numbered(10), 3, { drop_last = true })
    assert.same({ 3, 3, 3 }, sizes)
    assert.equal(9, #ids)
    assert.equal(3, numbered(10):num_batches(3, true))
    assert.equal(4, numbered(10):num_batches(3))
  end)

  it("are reproducible under remat.manual_seed, and differ across seeds and epochs", function()
    local ds = numbered(50)
    remat.manual_seed(42)
    local a1, a2 = epoch(ds, 7), epoch(ds, 7)
    remat.manual_seed(42)
    local b1, b2 = epoch(ds, 7), epoch(ds, 7)
    remat.manual_seed(43)
    local c1 = epoch(ds, 7)
    assert.same(a1, b1)
    assert.same(a2, b2)
    assert.are_not.same(a1, a2)
    assert.are_not.same(a1, c1)
  end)

  it("randperm is a permutation with every position reachable", function()
    remat.manual_seed(9)
    local first = {}
    for _ = 1, 400 do
      local p = C.randperm(4)
      local s = { table.unpack(p) }
      table.sort(s)
      assert.same({ 1, 2, 3, 4 }, s)
      first[p[1]] = (first[p[1]] or 0) + 1
    end
    for v = 1, 4 do assert(first[v] > 60 and first[v] < 140, "skewed: " .. tostring(first[v])) end
    assert.same({}, C.randperm(0))
    assert.same({ 1 }, C.randperm(1))
    expect_error(function() C.randperm(-1) end, "out of range")
  end)

  it("take_rows gathers rows by table, tensor or range, from strided sources too", function()
    local x = C.from_table({ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 }, { 4, 3 }, "float64")
    assert.same({ 10, 11, 12, 1, 2, 3 }, C.flat(C.take_rows(x, { 4, 1 })))
    assert.same({ 4, 5, 6, 4, 5, 6 }, C.flat(C.take_rows(x, C.from_table({ 2, 2 }, { 2 }), 1, 2)))
    assert.same({ 4, 5, 6, 7, 8, 9 }, C.flat(C.take_rows(x, nil, 2, 2)))
    assert.same({ 7, 8, 9 }, C.flat(C.take_rows(x, { 9, 3, 9 }, 2, 1)))
    local _, dt = C.info(C.take_rows(x, { 1 }))
    assert.equal("float64", dt)
    local xt = C.op(C.ops.transpose, { dim0 = 0, dim1 = 1 }, x) -- 3x4
    assert.same({ 3, 6, 9, 12, 1, 4, 7, 10 }, C.flat(C.take_rows(xt, { 3, 1 })))
    assert.same({ 0, 3 }, shape(C.take_rows(x, {}, 1, 0)))
    expect_error(function() C.take_rows(x, { 5 }) end, "row 5 is out of range", "4x3")
    expect_error(function() C.take_rows(x, { 0 }) end, "row 0 is out of range")
    expect_error(function() C.take_rows(x, { 1.5 }) end, "not an integer")
    expect_error(function() C.take_rows(x, { 1 }, 1, 2) end, "run past")
    expect_error(function() C.take_rows(C.from_table({ 1 }, {}), nil) end, "scalar")
  end)

  it("checks its arguments", function()
    local ds = numbered(5)
    expect_error(function() ds:batches(0) end, "batch_size must be at least 1")
    expect_error(function() ds:batches(2.5) end, "batch_size must be an integer")
    expect_error(function() ds:batches(2, "yes") end, "options must be a table")
    expect_error(function() ds:batches(2, { shufle = false }) end, "batches: unknown option 'shufle' (shuffle, drop_last)")
    expect_error(function() ds:batches(2, { shuffle = "no" }) end, "batches: shuffle must be true or false, got string")
    expect_error(function() data.tensor_dataset(C.full({ 3, 2 }, 0), C.full({ 4 }, 0)) end, "3 rows", "4")
  end)
end)

describe("text dataset", function()
  local dir, path
  local text = ("the quick brown fox jumps over the lazy dog. "):rep(20) .. "THE END\n"
  before_each(function()
    dir = tmpdir()
    path = dir .. "/t.txt"
    write(path, text)
  end)
  after_each(function() os.execute("rm -rf '" .. dir .. "'") end)

  it("has a sorted byte vocabulary and encodes/decodes losslessly", function()
    local ds = data.text(path, { block = 8 })
    local uniq = {}
    for ch in text:gmatch(".") do uniq[ch] = true end
    local want = {}
    for ch in pairs(uniq) do want[#want + 1] = ch end
    table.sort(want)
    assert.same(want, ds.vocab)
    assert.equal(#want, ds.vocab_size)
    local e = ds:encode("lazy dog\n")
    assert.same({ 9 }, shape(e))
    assert.equal("int64", e:dtype())
    assert.equal("int64", ds.train:dtype())
    assert.equal("lazy dog\n", ds:decode(e))
    assert.equal("lazy dog\n", ds:decode(C.flat(e)))
    assert.equal(text, ds:decode(ds:encode(text)))
    assert.same({ 1, 2 }, C.flat(ds:encode("\n "))) -- bytes 10 and 32 come first
    expect_error(function() ds:encode("quiz!") end, "character '!' (byte value 33) at position 5", "not in the vocabulary")
    expect_error(function() ds:decode({ 1, 99 }) end, "entry 2", "1.." .. ds.vocab_size)
  end)

  it("draws (B, T) blocks whose targets are the next characters", function()
    local ds = data.text(path, { block = 12 })
    remat.manual_seed(3)
    local x, y = ds:batch(5)
    assert.same({ 5, 12 }, shape(x))
    assert.same({ 5, 12 }, shape(y))
    assert.equal("int64", x:dtype())
    assert.equal("int64", y:dtype())
    local xv, yv = C.flat(x), C.flat(y)
    local train = ds:decode(ds.train)
    assert.equal(ds.n_train, #train)
    assert.equal(text:sub(1, ds.n_train), train)
    for b = 0, 4 do
      local xs = ds:decode({ table.unpack(xv, b * 12 + 1, b * 12 + 12) })
      local ys = ds:decode({ table.unpack(yv, b * 12 + 1, b * 12 + 12) })
      assert.equal(xs:sub(2), ys:sub(1, 11))
      assert.truthy(train:find(xs .. ys:sub(12), 1, true), "block not in the training text: " .. xs)
    end
    remat.manual_seed(3)
    local x2, y2 = ds:batch(5)
    assert.same(xv, C.flat(x2))
    assert.same(yv, C.flat(y2))
  end)

  it("holds out the end of the text for validation", function()
    local ds = data.text(path, { block = 4, val_fraction = 0.25 })
    assert.equal(math.floor(#text * 0.25), ds.n_val)
    assert.equal(#text, ds.n_train + ds.n_val)
    assert.equal(text:sub(ds.n_train + 1), ds:decode(ds.val))
    local x, y = ds:batch(3, "val")
    assert.same({ 3, 4 }, shape(x))
    local vtext = text:sub(ds.n_train + 1)
    local xv, yv = C.flat(x), C.flat(y)
    assert.truthy(vtext:find(ds:decode({ table.unpack(xv, 1, 4) }) .. ds:decode({ yv[4] }), 1, true))
    local none = data.text(path, { block = 4, val_fraction = 0 })
    expect_error(function() none:batch(2, "val") end, "val split has 0 characters")
    expect_error(function() ds:batch(2, "test") end, 'split must be "train" or "val"')
  end)

  it("gives each rank its own part of the training text", function()
    local a = data.text(path, { block = 4, rank = 1, world_size = 2 })
    local b = data.text(path, { block = 4, rank = 2, world_size = 2 })
    local full = data.text(path, { block = 4 })
    assert.equal(a.n_train, b.n_train)
    assert.equal(full:decode(full.train):sub(1, 2 * a.n_train), a:decode(a.train) .. b:decode(b.train))
  end)

  it("reports bad arguments and files clearly", function()
    expect_error(function() data.text(dir .. "/none.txt") end, "remat.data.text: cannot open", "none.txt")
    expect_error(function() data.text(path, { block = 0 }) end, "block must be at least 1")
    expect_error(function() data.text(path, { val_fraction = 1 }) end, "val_fraction")
    local ds = data.text(path, { block = #text })
    expect_error(function() ds:batch(1) end, "fewer than block + 1")
    write(dir .. "/one.txt", "x")
    expect_error(function() data.text(dir .. "/one.txt") end, "at least 2")
  end)
end)
