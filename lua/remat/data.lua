-- Datasets: Fashion-MNIST (from Debian's dataset-fashion-mnist) and character-level
-- text. Minibatches are gathered in C (C.take_rows: one memcpy per row) and shuffled
-- with remat's own generator, so remat.manual_seed(s) replays the same epochs.
local remat = package.loaded.remat
local C = remat._C
local data = {}
remat.data = data

data.fashion_mnist_dir = "/usr/share/datasets/fashion-mnist"
data.fashion_mnist_classes = {
  "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
  "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
}

-- Raises msg located at the first caller outside remat's own Lua code (remat.tensor's).
local fail = remat._fail

local function check_int(fn, v, what, min)
  local i = math.type(v) == "integer" and v or (type(v) == "number" and math.tointeger(v))
  if not i then fail(("%s: %s must be an integer, got %s"):format(fn, what, tostring(v))) end
  if min and i < min then fail(("%s: %s must be at least %d, got %d"):format(fn, what, min, i)) end
  return i
end

local function check_opts(fn, opts)
  if opts == nil then return {} end
  if type(opts) ~= "table" then fail(("%s: options must be a table, got %s"):format(fn, type(opts))) end
  return opts
end

-- rank (1-based) and world_size from opts, checked.
local function shard_of(fn, opts)
  local ws = check_int(fn, opts.world_size or 1, "world_size", 1)
  local rank = check_int(fn, opts.rank or 1, "rank", 1)
  if rank > ws then fail(("%s: rank %d is larger than world_size %d"):format(fn, rank, ws)) end
  return rank, ws
end

local function numel(t) local n = 1 for _, d in ipairs((C.info(t))) do n = n * d end return n end

---------------------------------------------------------------- tensor datasets ----

local Dataset = {}
Dataset.__index = Dataset
data.Dataset = Dataset

-- data.tensor_dataset(x, y[, name]): examples are the rows of x (N, ...) and y (N, ...).
function data.tensor_dataset(x, y, name)
  local n = (C.info(x))[1]
  if not n then fail("remat.data.tensor_dataset: x needs a first dimension") end
  if y ~= nil and (C.info(y))[1] ~= n then
    fail(("remat.data.tensor_dataset: x has %d rows but y has %s"):format(n, tostring((C.info(y))[1])))
  end
  return setmetatable({ x = x, y = y, n = n, name = name or "dataset" }, Dataset)
end

function Dataset:__len() return self.n end
function Dataset:__tostring()
  local s = ("%s: %d examples, x %s"):format(self.name, self.n, table.concat(C.info(self.x), "x"))
  if self.y then s = s .. ", y " .. table.concat(C.info(self.y), "x") end
  return s
end

-- Number of batches of batch_size in one epoch.
function Dataset:num_batches(batch_size, drop_last)
  batch_size = check_int("num_batches", batch_size, "batch_size", 1)
  if drop_last then return self.n // batch_size end
  return (self.n + batch_size - 1) // batch_size
end

-- ds:batches(batch_size[, {shuffle = true, drop_last = false}]) -> iterator of (shuffled
-- by default; unknown options are errors)
-- (xb, yb, i): each example once per epoch, in an order drawn from remat's generator
-- when shuffle is on (drawn when the iterator is made). The last batch is smaller
-- unless drop_last. Each batch is a new contiguous tensor.
function Dataset:batches(batch_size, opts)
  local fn = "batches"
  local bs = check_int(fn, batch_size, "batch_size", 1)
  opts = check_opts(fn, opts)
  for k in pairs(opts) do
    if k ~= "shuffle" and k ~= "drop_last" then
      fail(("%s: unknown option '%s' (shuffle, drop_last)"):format(fn, tostring(k)))
    end
  end
  for _, k in ipairs { "shuffle", "drop_last" } do
    if opts[k] ~= nil and type(opts[k]) ~= "boolean" then
      fail(("%s: %s must be true or false, got %s"):format(fn, k, type(opts[k])))
    end
  end
  local shuffle = opts.shuffle ~= false
  local perm = shuffle and C.randperm(self.n, "batches") or nil
  local nb = self:num_batches(bs, opts.drop_last)
  local x, y, n, i = self.x, self.y, self.n, 0
  return function()
    i = i + 1
    if i > nb then return nil end
    local start = (i - 1) * bs + 1
    local count = math.min(bs, n - start + 1)
    local xb = C.take_rows(x, perm, start, count, "data")
    local yb = y and C.take_rows(y, perm, start, count, "data") or nil
    return xb, yb, i
  end
end

-- The examples at 1-based positions idx (a table or tensor) as a new dataset's x, y.
function Dataset:take(idx)
  local xb = C.take_rows(self.x, idx, nil, nil, "data")
  return xb, self.y and C.take_rows(self.y, idx, nil, nil, "data") or nil
end

---------------------------------------------------------------- Fashion-MNIST ----

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

-- data.fashion_mnist(split = "train" | "test"[, opts]) -> dataset with x (N, 784) in
-- [0, 1], y (N) class indices 1..10 (data.fashion_mnist_classes), n.
-- opts: dir (default data.fashion_mnist_dir), limit (first n examples), rank and
-- world_size (examples rank, rank + world_size, ... : disjoint shards, 1-based rank).
function data.fashion_mnist(split, opts)
  local fn = "fashion_mnist"
  split = split or "train"
  if split ~= "train" and split ~= "test" then
    fail(("%s: split must be \"train\" or \"test\", got %s"):format(fn, tostring(split)))
  end
  opts = check_opts(fn, opts)
  local dir = opts.dir or data.fashion_mnist_dir
  if type(dir) ~= "string" then fail(fn .. ": dir must be a string, got " .. type(dir)) end
  if dir:find("\0", 1, true) then fail(fn .. ": the path contains a NUL byte (\\0)") end
  local prefix = split == "train" and "train" or "t10k"
  local paths = { dir .. "/" .. prefix .. "-images-idx3-ubyte.gz", dir .. "/" .. prefix .. "-labels-idx1-ubyte.gz" }
  for _, p in ipairs(paths) do
    if not exists(p) then
      fail(("%s: %s not found (install the Debian package dataset-fashion-mnist)"):format(fn, p))
    end
  end
  local limit = opts.limit and check_int(fn, opts.limit, "limit", 1) or 0
  local rank, ws = shard_of(fn, opts)
  local x = C.read_idx(paths[1], limit)
  local y = C.read_idx(paths[2], limit)
  if #C.info(x) ~= 2 or #C.info(y) ~= 1 then
    local xd, yd = #C.info(x), #C.info(y)
    C.free(x); C.free(y)
    fail(("%s: %s must hold images (an IDX file of 3 dimensions) and %s labels (1 dimension); they have %d and %d")
      :format(fn, paths[1], paths[2], xd == 2 and 3 or 1, yd == 2 and 3 or 1))
  end
  if (C.info(x))[1] ~= (C.info(y))[1] then
    fail(("%s: %s has %d images but %s has %d labels"):format(fn, paths[1], (C.info(x))[1], paths[2], (C.info(y))[1]))
  end
  if ws > 1 then
    local rows = {}
    for r = rank, (C.info(x))[1], ws do rows[#rows + 1] = r end
    local xs, ys = C.take_rows(x, rows, 1, #rows, "data"), C.take_rows(y, rows, 1, #rows, "data")
    C.free(x); C.free(y)
    x, y = xs, ys
  end
  local name = ("fashion_mnist(%s%s)"):format(split, ws > 1 and (", shard %d/%d"):format(rank, ws) or "")
  local ds = data.tensor_dataset(x, y, name)
  ds.classes = data.fashion_mnist_classes
  return ds
end

---------------------------------------------------------------- text ----

local Text = {}
Text.__index = Text
data.Text = Text

-- data.text(path, opts) -> character-level dataset over the bytes of a file.
-- opts: block (context length T, default 64), val_fraction (the last part of the text
-- held out, default 0.1), rank and world_size (each rank trains on its own contiguous
-- part of the training text). Fields: vocab (sorted unique characters), vocab_size,
-- block, train and val (1-D int64 tensors of 1-based indices).
function data.text(path, opts)
  local fn = "remat.data.text"
  if type(path) ~= "string" then fail(fn .. ": the path must be a string, got " .. type(path)) end
  if path:find("\0", 1, true) then fail(fn .. ": the path contains a NUL byte (\\0)") end
  opts = check_opts(fn, opts)
  local block = check_int(fn, opts.block or 64, "block", 1)
  local vf = opts.val_fraction or 0.1
  if type(vf) ~= "number" or vf < 0 or vf >= 1 then
    fail(fn .. ": val_fraction must be a number in [0, 1), got " .. tostring(vf))
  end
  local rank, ws = shard_of(fn, opts)
  local f, err = io.open(path, "rb")
  if not f then fail(fn .. ": cannot open " .. tostring(err)) end
  local s, rerr = f:read("a")
  f:close()
  -- io.open succeeds on a directory; reading it is what fails
  if not s then fail(("%s: cannot read %s: %s"):format(fn, path, tostring(rerr))) end
  if #s < 2 then fail(("%s: %s has %d bytes; a text dataset needs at least 2"):format(fn, path, #s)) end
  local vocab, stoi = {}, {}
  for b = 0, 255 do
    local ch = string.char(b)
    if s:find(ch, 1, true) then
      vocab[#vocab + 1] = ch
      stoi[b] = #vocab
    end
  end
  local all = C.encode_bytes(s, stoi, "data")
  local n_val = math.floor(#s * vf)
  local n_train = #s - n_val
  local per = n_train // ws
  local train = C.take_rows(all, nil, (rank - 1) * per + 1, per, "data")
  local val = C.take_rows(all, nil, n_train + 1, n_val, "data")
  C.free(all)
  return setmetatable({
    path = path, block = block, vocab = vocab, vocab_size = #vocab, stoi = stoi,
    train = train, val = val, n_train = per, n_val = n_val, windows = {},
  }, Text)
end

function Text:__tostring()
  return ("text(%s): %d characters (%d train, %d val), vocabulary %d, block %d"):format(
    self.path, self.n_train + self.n_val, self.n_train, self.n_val, self.vocab_size, self.block)
end

-- ds:encode(str) -> 1-D int64 tensor of 1-based vocabulary indices.
function Text:encode(str)
  if type(str) ~= "string" then fail("encode: expected a string, got " .. type(str)) end
  return C.encode_bytes(str, self.stoi)
end

-- ds:decode(tensor or table of indices) -> string.
function Text:decode(idx)
  local vals = type(idx) == "table" and idx or C.flat(idx)
  local out = {}
  for i, v in ipairs(vals) do
    local ch = self.vocab[math.tointeger(v) or -1]
    if not ch then fail(("decode: entry %d (%s) is not an index in 1..%d"):format(i, tostring(v), self.vocab_size)) end
    out[i] = ch
  end
  return table.concat(out)
end

-- ds:batch(B[, split = "train" | "val"]) -> x, y, both (B, block): B blocks at random
-- positions (remat's generator); y is x shifted by one character (next-char targets).
function Text:batch(B, split)
  B = check_int("batch", B, "batch size", 1)
  split = split or "train"
  local src = (split == "train" or split == "val") and self[split] or nil
  if not src then fail("batch: split must be \"train\" or \"val\", got " .. tostring(split)) end
  local L, T = numel(src), self.block
  if L < T + 1 then
    fail(("batch: the %s split has %d characters, fewer than block + 1 = %d"):format(split, L, T + 1))
  end
  local w = self.windows[split]
  if not w then
    w = C.windows(src, T)
    self.windows[split] = w
  end
  -- x and y (int64), the starts table and its scratch, checked before any is taken
  C.memory_room(2.0 * B * T * 8 + 24.0 * B, "batch")
  local starts = C.randint(L - T, B, "batch")
  local x = C.take_rows(w, starts, 1, B, "data")
  for k = 1, B do starts[k] = starts[k] + 1 end
  local y = C.take_rows(w, starts, 1, B, "data")
  return x, y
end

return data
