-- The tensor API: methods and operators over the C op call (factories are in
-- tensor_factory.lua, printing in tensor_print.lua).
--
-- Conventions (Torch7's, with PyTorch's where Torch7 had none):
--   * dimensions and indices are 1-based; negative ones count from the end (-1: last);
--   * x[i] selects along dimension 1: a view, except on a 1-d tensor where it is the
--     element as a number (Torch7's); x[{i, j, ...}] is the element (one index per
--     dimension) or the sub-tensor (fewer); == < <= on tensors raise (use eq/lt/... or equal);
--   * factories take sizes as numbers or one table, then optionally a dtype and/or a
--     device as strings, or an options table: remat.zeros(2, 3, "float64", "cuda"),
--     remat.zeros({2, 3}, { dtype = "float64", device = "cuda", requires_grad = true });
--   * remat.arange(start, stop[, step]) includes stop (Torch7's range): arange(n) is 1..n;
--   * reductions drop the reduced dimension unless keepdim is true: x:sum(2, true);
--   * x:to / x:contiguous / x:cpu / x:cuda return a new handle even when nothing changes
--     (a view of the same data), so freeing or closing the result never frees x.
local remat = package.loaded.remat
local C = remat._C
local mt = C.Tensor_mt
local Tensor = remat.Tensor or {}
remat.Tensor = Tensor

-- C.op takes an op id (C.ops: name -> id) and the op's attributes by name, as
-- core/ops.def declares them: op(O.sum, { dim = 0, keepdim = true }, x).
local op, O = C.op, C.ops
local DIM_ALL = math.mininteger
local MAX_DIM = C.MAX_DIM   -- RM_MAX_DIM
local DTYPE_ID, DEVICE_ID = C.dtypes, C.devices
local DTYPE_OF = C.dtype_of -- every accepted spelling ("float", "bf16", ...) -> the dtype's name

local function is_tensor(x) return getmetatable(x) == mt end
remat.is_tensor = is_tensor

-- Raises msg located at the first caller outside remat's own Lua code (as the C side does).
local function fail(msg)
  local getinfo = debug and debug.getinfo
  if getinfo then
    local level = 2
    while true do
      local info = getinfo(level, "Sl")
      if not info then break end
      if info.currentline > 0 and not info.source:find("^=%[remat%]") then
        error(info.short_src .. ":" .. info.currentline .. ": " .. msg, 0)
      end
      level = level + 1
    end
  end
  error(msg, 0)
end
remat._fail = fail

local function describe(v)
  if is_tensor(v) then return "a tensor" end
  if type(v) == "nil" then return "nothing" end
  return type(v) .. " " .. tostring(v)
end

local function check_tensor(fn, v, what)
  if not is_tensor(v) then fail(("%s: %s must be a tensor, got %s"):format(fn, what or "argument", describe(v))) end
  if C.is_freed(v) then fail(fn .. ": the tensor was freed") end
  return v
end

local function check_int(fn, v, what)
  local i = math.type(v) == "integer" and v or (type(v) == "number" and math.tointeger(v))
  if not i then fail(("%s: %s must be an integer, got %s"):format(fn, what, describe(v))) end
  return i
end

local function info(x) return C.info(x) end

-- 1-based (or negative) Lua dim -> 0-based (or negative) C dim, checked against ndim.
local function cdim(fn, d, ndim)
  d = check_int(fn, d, "the dimension")
  local n = math.max(ndim, 1)
  if d == 0 or d > n or d < -n then
    fail(("%s: dimension %d is out of range for a %d-d tensor (dimensions are 1-based: 1..%d, or -1..-%d)")
      :format(fn, d, ndim, n, n))
  end
  return d > 0 and d - 1 or d + ndim
end

-- ---- dtype / device / sizes ----

local function check_dtype(fn, s)
  s = DTYPE_OF[s] or s
  if DTYPE_ID[s] == nil then
    fail(("%s: unknown dtype '%s' (float32, float64, bfloat16, float16, int32, int64)"):format(fn, tostring(s)))
  end
  return s
end

local function check_device(fn, s)
  if DEVICE_ID[s] == nil then fail(("%s: unknown device '%s' (cpu, cuda)"):format(fn, tostring(s))) end
  return s
end

-- Reads trailing options (strings or one table) from args[first..n] into o.
local function read_opts(fn, args, first, n, o)
  for k = first, n do
    local a = args[k]
    if type(a) == "string" then
      local s = DTYPE_OF[a] or a
      if DTYPE_ID[s] then o.dtype = s
      elseif DEVICE_ID[s] then o.device = s
      else fail(("%s: '%s' is neither a dtype (float32, float64, bfloat16, float16, int32, int64) nor a device (cpu, cuda)"):format(fn, a)) end
    elseif type(a) == "table" then
      for key, v in pairs(a) do
        if key == "dtype" then o.dtype = check_dtype(fn, v)
        elseif key == "device" then o.device = check_device(fn, v)
        elseif key == "requires_grad" then o.requires_grad = v and true or false
        else fail(("%s: unknown option '%s' (dtype, device, requires_grad)"):format(fn, tostring(key))) end
      end
    elseif a ~= nil then
      fail(("%s: argument %d: expected a size, a dtype, a device or an options table, got %s"):format(fn, k, describe(a)))
    end
  end
  o.dtype = o.dtype or "float32"
  o.device = o.device or "cpu"
  return o
end

local function check_sizes(fn, s)
  local out = {}
  if #s > MAX_DIM then fail(("%s: at most %d dimensions (got %d)"):format(fn, MAX_DIM, #s)) end
  for i = 1, #s do
    local v = check_int(fn, s[i], "size " .. i)
    if v < 0 then fail(("%s: size %d is negative (%d)"):format(fn, i, v)) end
    out[i] = v
  end
  return out
end

-- Sizes (numbers, or one table first) then options: returns sizes, opts.
local function sizes_opts(fn, ...)
  local args, n = { ... }, select("#", ...)
  local sizes, k = {}, 1
  if type(args[1]) == "table" then
    sizes, k = args[1], 2
  else
    while k <= n and type(args[k]) == "number" do sizes[#sizes + 1] = args[k]; k = k + 1 end
  end
  return check_sizes(fn, sizes), read_opts(fn, args, k, n, {})
end

local function finish(t, o)
  if o.requires_grad then C.requires_grad(t, true) end
  return t
end

-- The dtypes the CPU fills directly (the others are filled as float32, then cast).
local CPU_DTYPE = { float32 = "float32", float64 = "float64", int32 = "int32", int64 = "int64" }

-- factories (full, zeros, ones, rand, randn, *_like, arange, tensor):
-- lua/remat/tensor_factory.lua
require("remat.tensor_factory")({ fail = fail, describe = describe, check_tensor = check_tensor,
  check_sizes = check_sizes, read_opts = read_opts, sizes_opts = sizes_opts, finish = finish,
  is_tensor = is_tensor, CPU_DTYPE = CPU_DTYPE })

-- ---- information ----

function Tensor:shape() return (info(self)) end
function Tensor:size(d)
  local s = info(self)
  if d == nil then return s end
  if #s == 0 then fail("size: a 0-d tensor has no dimensions") end
  return s[cdim("size", d, #s) + 1]
end
function Tensor:dim() return #(info(self)) end
function Tensor:numel() local n = 1 for _, d in ipairs(info(self)) do n = n * d end return n end
function Tensor:dtype() local _, dt = info(self) return dt end
function Tensor:device() local _, _, dev = info(self) return dev end
function Tensor:stride() return (C.strides(self)) end
function Tensor:is_contiguous() return C.is_contiguous(self) end
function Tensor:free() C.free(self) end
function Tensor:is_freed() return C.is_freed(self) end

local TYPE_NAMES = { float32 = "Float", float64 = "Double", bfloat16 = "BFloat16", float16 = "Half",
                     int32 = "Int", int64 = "Long" }
-- Torch7's type name: remat.FloatTensor, remat.DoubleTensor, remat.CudaTensor, ...
function Tensor:type()
  if not is_tensor(self) then fail("type: expected a tensor (x:type()), got " .. type(self)) end
  if C.is_freed(self) then return "remat.Tensor" end
  local _, dt, dev = info(self)
  if dev == "cuda" then
    return "remat.Cuda" .. (dt == "float32" and "" or TYPE_NAMES[dt]) .. "Tensor"
  end
  return "remat." .. TYPE_NAMES[dt] .. "Tensor"
end

-- A CPU tensor with self's values that Lua can read (float32, float64, int32, int64:
-- self when it already is one; else a copy).
local function readable(x)
  local _, dt, dev = info(x)
  local t, owned = x, false
  if not CPU_DTYPE[dt] then t, owned = op(O.cast, { dtype = DTYPE_ID.float32 }, t), true end
  if dev ~= "cpu" then
    local m = C.to_device(t, "cpu")
    if owned then C.free(t) end
    t, owned = m, true
  end
  return t, owned
end

function Tensor:item() return C.item(self) end

-- Nested tables of numbers (a number for a 0-d tensor).
function Tensor:totable()
  local t, owned = readable(self)
  local flat, shape = C.flat(t), info(t)
  if owned then C.free(t) end
  if #shape == 0 then return flat[1] end
  local pos = 0
  local function build(d)
    local r = {}
    for i = 1, shape[d] do
      if d == #shape then pos = pos + 1; r[i] = flat[pos] else r[i] = build(d + 1) end
    end
    return r
  end
  return build(1)
end

-- ---- views ----

-- Sizes from varargs or one table, with at most one -1 resolved against numel.
local function target_sizes(fn, x, ...)
  local s = ...
  if type(s) ~= "table" then s = { ... } end
  local out, infer, known = {}, nil, 1
  if #s > MAX_DIM then fail(("%s: at most %d dimensions (got %d)"):format(fn, MAX_DIM, #s)) end
  for i = 1, #s do
    local v = check_int(fn, s[i], "size " .. i)
    if v == -1 then
      if infer then fail(fn .. ": only one size may be -1") end
      infer = i
    elseif v < 0 then
      fail(("%s: size %d is negative (%d)"):format(fn, i, v))
    else
      known = known * v
    end
    out[i] = v
  end
  if infer then
    local n = x:numel()
    if known == 0 or n % known ~= 0 then
      fail(("%s: cannot infer the size -1: %d elements do not divide into %s"):format(fn, n, table.concat(s, "x")))
    end
    out[infer] = n // known
  end
  return out
end

function Tensor:view(...) return op(O.view, { shape = target_sizes("view", self, ...) }, self) end

function Tensor:reshape(...)
  local s = target_sizes("reshape", self, ...)
  if C.is_contiguous(self) then return op(O.view, { shape = s }, self) end
  local c = op(O.copy, nil, self)
  local v = op(O.view, { shape = s }, c)
  C.free(c)
  return v
end

-- A new handle on the same data (with autograd history): what no-op conversions return.
local function alias(x) return op(O.expand, { shape = info(x) }, x) end

function Tensor:contiguous()
  if C.is_contiguous(self) then return alias(self) end
  return op(O.copy, nil, self)
end

function Tensor:clone() return op(O.copy, nil, self) end

function Tensor:transpose(a, b)
  local nd = #info(self)
  return op(O.transpose, { dim0 = cdim("transpose", a, nd), dim1 = cdim("transpose", b, nd) }, self)
end

function Tensor:t()
  local nd = #info(self)
  if nd ~= 2 then fail(("t: expected a 2-d tensor, got a %d-d one (use transpose)"):format(nd)) end
  return op(O.transpose, { dim0 = 0, dim1 = 1 }, self)
end

-- 1-based position (negative counts from the end) -> 0-based, checked against size.
local function cindex(fn, i, size, what)
  i = check_int(fn, i, what)
  local j = i < 0 and size + i or i - 1
  if i == 0 or j < 0 or j >= size then
    fail(("%s: %s %d is out of range for a dimension of size %d (indices are 1-based)"):format(fn, what, i, size))
  end
  return j
end

function Tensor:narrow(dim, start, len)
  local s = info(self)
  local d = cdim("narrow", dim, #s)
  if #s == 0 then fail("narrow: cannot narrow a 0-d tensor") end
  len = check_int("narrow", len, "the length")
  if len < 0 then fail(("narrow: the length is negative (%d)"):format(len)) end
  local st = check_int("narrow", start, "the start")
  local j = st < 0 and s[d + 1] + st or st - 1
  if st == 0 or j < 0 or j + len > s[d + 1] then
    fail(("narrow: start %d and length %d are out of range for dimension %d of size %d"):format(st, len, dim, s[d + 1]))
  end
  return op(O.narrow, { dim = d, start = j, length = len }, self)
end

function Tensor:select(dim, i)
  local s = info(self)
  if #s == 0 then fail("select: cannot select from a 0-d tensor (use :item())") end
  local d = cdim("select", dim, #s)
  return op(O.select, { dim = d, index = cindex("select", i, s[d + 1], "index") }, self)
end

-- expand(sizes): sizes of 1 stretch, -1 keeps a size, new leading dimensions are allowed.
function Tensor:expand(...)
  local s = ...
  if type(s) ~= "table" then s = { ... } end
  local cur = info(self)
  local out, off = {}, #s - #cur
  if #s > MAX_DIM then fail(("expand: at most %d dimensions (got %d)"):format(MAX_DIM, #s)) end
  for i = 1, #s do
    local v = check_int("expand", s[i], "size " .. i)
    if v == -1 then
      if i <= off then fail(("expand: size %d is -1 for a new dimension"):format(i)) end
      v = cur[i - off]
    elseif v < 0 then
      fail(("expand: size %d is negative (%d)"):format(i, v))
    end
    out[i] = v
  end
  return op(O.expand, { shape = out }, self)
end

-- unsqueeze(dim): a new size-1 dimension at dim (1..dim()+1; -1 appends one).
function Tensor:unsqueeze(dim)
  local nd = #info(self)
  local d = check_int("unsqueeze", dim, "the dimension")
  if d == 0 or d > nd + 1 or d < -(nd + 1) then
    fail(("unsqueeze: dimension %d is out of range for a %d-d tensor (1..%d, or -1..-%d)"):format(d, nd, nd + 1, nd + 1))
  end
  return op(O.unsqueeze, { dim = d > 0 and d - 1 or d }, self)
end

-- squeeze([dim]): drops dim if its size is 1 (every size-1 dimension without dim).
function Tensor:squeeze(dim)
  if dim == nil then return op(O.squeeze, { dim = DIM_ALL }, self) end
  return op(O.squeeze, { dim = cdim("squeeze", dim, #info(self)) }, self)
end

-- permute(d1, d2, ...) or permute{...}: output dimension k is input dimension dk (a view).
function Tensor:permute(...)
  local p = ...
  if type(p) ~= "table" then p = { ... } end
  local nd = #info(self)
  if #p ~= nd then fail(("permute: %d dimensions given for a %d-d tensor"):format(#p, nd)) end
  local perm = {}
  for k = 1, nd do perm[k] = cdim("permute", p[k], nd) end
  return op(O.permute, { dims = perm }, self)
end

-- repeat_tensor(r1, r2, ...) or repeat_tensor{...}: self tiled r_k times along each
-- dimension (Torch7's repeatTensor; `repeat` is a Lua keyword). More counts than
-- dimensions add leading dimensions. A new contiguous tensor; differentiable.
function Tensor:repeat_tensor(...)
  local r = ...
  if type(r) ~= "table" then r = { ... } end
  local shape = info(self)
  if #r < #shape then
    fail(("repeat_tensor: %d counts for a %d-d tensor (at least one per dimension)"):format(#r, #shape))
  end
  if 2 * #r > MAX_DIM then fail(("repeat_tensor: at most %d counts (got %d)"):format(MAX_DIM // 2, #r)) end
  local lead = #r - #shape
  local src, expd, final = {}, {}, {}
  for k = 1, #r do
    local c = check_int("repeat_tensor", r[k], "count " .. k)
    if c < 0 then fail(("repeat_tensor: count %d is negative (%d)"):format(k, c)) end
    local s = k > lead and shape[k - lead] or 1
    src[#src + 1], src[#src + 2] = 1, s
    expd[#expd + 1], expd[#expd + 2] = c, s
    final[k] = c * s
  end
  local v = self:contiguous()
  local v2 = op(O.view, { shape = src }, v)
  local e = op(O.expand, { shape = expd }, v2)
  local c = op(O.copy, nil, e)
  local out = op(O.view, { shape = final }, c)
  C.free(v); C.free(v2); C.free(e); C.free(c)
  return out
end

function Tensor:expand_as(other) return self:expand(info(check_tensor("expand_as", other))) end

-- ---- arithmetic ----

local INT_DTYPE = { int32 = true, int64 = true }

-- A 0-d tensor holding number v, like x (dtype and device). An integer tensor takes a
-- whole number only (3.5 would silently become 3).
local function scalar_like(v, x, fn)
  local _, dt, dev = info(x)
  if INT_DTYPE[dt] and math.type(v) ~= "integer" and (v ~= v or v ~= math.floor(v) or math.abs(v) == math.huge) then
    fail(("%s: %s is not a whole number, and the tensor is %s (convert it with x:to('float32') first)")
      :format(fn or "remat", tostring(v), dt))
  end
  return C.full({}, v, dt, dev)
end

-- Binary ops on an integer and a float tensor compute in the float dtype, and on int32
-- and int64 in int64 (PyTorch's promotion): a, b with the narrower one converted, and
-- the converted copy (to free) or nil.
local function promote(a, b)
  if not (is_tensor(a) and is_tensor(b)) or C.is_freed(a) or C.is_freed(b) then return a, b end
  local _, da = info(a)
  local _, db = info(b)
  local ia, ib = INT_DTYPE[da], INT_DTYPE[db]
  if da == db or not (ia or ib) then return a, b end -- two floats: the op says what is wrong
  local to = not ia and da or not ib and db or "int64"
  if da ~= to then local c = op(O.cast, { dtype = DTYPE_ID[to] }, a) return c, b, c end
  local c = op(O.cast, { dtype = DTYPE_ID[to] }, b)
  return a, c, c
end

local function binary(name, scalar_right, scalar_left)
  local id = O[name]
  return function(a, b)
    if type(b) == "number" and is_tensor(a) then return scalar_right(a, b) end
    if type(a) == "number" and is_tensor(b) then return scalar_left(a, b) end
    local x, y, tmp = promote(a, b)
    if not tmp then return op(id, nil, a, b) end
    local ok, r = pcall(op, id, nil, x, y)
    C.free(tmp)
    if not ok then error(r, 0) end
    return r
  end
end

local function neg(x) return op(O.neg, nil, x) end

mt.__add = binary("add", function(x, s) return op(O.add_scalar, { value = s }, x) end,
                  function(s, x) return op(O.add_scalar, { value = s }, x) end)
mt.__sub = binary("sub", function(x, s) return op(O.add_scalar, { value = -s }, x) end,
                  function(s, x)
                    local n = neg(x)
                    local r = op(O.add_scalar, { value = s }, n)
                    C.free(n)
                    return r
                  end)
mt.__mul = binary("mul", function(x, s) return op(O.mul_scalar, { value = s }, x) end,
                  function(s, x) return op(O.mul_scalar, { value = s }, x) end)
-- x / s multiplies by 1/s (one rounding more than a true division, much faster than broadcasting)
mt.__div = binary("div", function(x, s) return op(O.mul_scalar, { value = 1 / s }, x) end,
                  function(s, x) return op(O.rdiv_scalar, { value = s }, x) end)
mt.__pow = binary("pow", function(x, s) return op(O.pow_scalar, { value = s }, x) end,
                  function(s, x)
                    if s <= 0 then fail(("pow: %s ^ tensor needs a positive base"):format(s)) end
                    local m = op(O.mul_scalar, { value = math.log(s) }, x)
                    local r = op(O.exp, nil, m)
                    C.free(m)
                    return r
                  end)
mt.__unm = neg
mt.__name = "remat.Tensor"

Tensor.add = mt.__add
Tensor.sub = mt.__sub
Tensor.mul = mt.__mul
Tensor.div = mt.__div
Tensor.neg = neg
function Tensor:pow(e)
  if type(e) == "number" then return op(O.pow_scalar, { value = e }, self) end
  return op(O.pow, nil, self, e)
end

-- matmul(other [, attrs]): attrs as core/ops.def names them, { tri = 1, neg_inf = true }
-- for causal attention's scores (only the lower triangle computed, -inf above it)
function Tensor:matmul(other, attrs) return op(O.matmul, attrs, self, other) end
Tensor.mm = Tensor.matmul

for _, name in ipairs({ "exp", "log", "tanh", "sqrt", "abs", "sigmoid", "relu", "gelu", "silu" }) do
  local id = O[name]
  Tensor[name] = function(self) return op(id, nil, self) end
end

-- Reductions: dim nil reduces everything (to a 0-d tensor).
local function reduce_attrs(fn, x, dim, keepdim)
  if dim == nil then return { dim = DIM_ALL, keepdim = keepdim and true or false } end
  return { dim = cdim(fn, dim, #info(x)), keepdim = keepdim and true or false }
end

function Tensor:sum(dim, keepdim) return op(O.sum, reduce_attrs("sum", self, dim, keepdim), self) end
function Tensor:mean(dim, keepdim) return op(O.mean, reduce_attrs("mean", self, dim, keepdim), self) end
-- max(dim) -> values, indices (1-based); max() -> the largest value as a 0-d tensor.
function Tensor:max(dim, keepdim)
  local v, i = op(O.max, reduce_attrs("max", self, dim, keepdim), self)
  if dim == nil then
    C.free(i)
    return v
  end
  return v, i
end
-- min(dim) -> values, indices (1-based, the first minimum); min() -> the smallest value.
function Tensor:min(dim, keepdim)
  local v, i = op(O.min, reduce_attrs("min", self, dim, keepdim), self)
  if dim == nil then
    C.free(i)
    return v
  end
  return v, i
end

-- clamp(lo, hi): values limited to [lo, hi]; either bound may be nil (no bound).
function Tensor:clamp(lo, hi)
  if lo ~= nil and type(lo) ~= "number" then fail("clamp: the lower bound must be a number or nil, got " .. describe(lo)) end
  if hi ~= nil and type(hi) ~= "number" then fail("clamp: the upper bound must be a number or nil, got " .. describe(hi)) end
  return op(O.clamp, { lo = lo or -math.huge, hi = hi or math.huge }, self)
end

-- sort([dim [, descending]]) -> values, indices (1-based): a stable sort along dim
-- (default the last); NaN sorts above every number.
function Tensor:sort(dim, descending)
  local nd = #info(self)
  if nd == 0 then fail("sort: expected at least a 1-d tensor, got a 0-d one") end
  return op(O.sort, { dim = dim == nil and nd - 1 or cdim("sort", dim, nd), descending = descending and true or false }, self)
end

-- topk(k [, dim [, largest]]) -> values, indices (1-based) of the k largest (largest
-- = false: smallest) along dim (default the last), in order; ties keep their order.
function Tensor:topk(k, dim, largest)
  local nd = #info(self)
  if nd == 0 then fail("topk: expected at least a 1-d tensor, got a 0-d one") end
  k = check_int("topk", k, "k")
  return op(O.topk, { dim = dim == nil and nd - 1 or cdim("topk", dim, nd), k = k, largest = not (largest == false) }, self)
end

-- cumsum(dim): running sums along dim (accumulated in float64).
function Tensor:cumsum(dim)
  local nd = #info(self)
  if dim == nil then fail("cumsum: the dimension is required") end
  return op(O.cumsum, { dim = cdim("cumsum", dim, nd), reverse = false }, self)
end

function Tensor:argmax(dim, keepdim) return op(O.argmax, reduce_attrs("argmax", self, dim, keepdim), self) end

-- softmax([dim [, {scale = s, causal = true}]]) / log_softmax(...): over dim (default
-- the last) of s * x. causal: x holds (..., T, T) scores and row i sees columns j <= i
-- (the others give 0, or -inf in log_softmax), as if they held -inf; one pass over x.
local function softmax_attrs(fn, self, dim, opts)
  local a = { dim = dim == nil and -1 or cdim(fn, dim, #info(self)) }
  if opts == nil then return a end
  if type(opts) ~= "table" then fail(("%s: options must be a table {scale =, causal =}, got %s"):format(fn, type(opts))) end
  for k in pairs(opts) do
    if k ~= "scale" and k ~= "causal" then fail(("%s: unknown option '%s' (it takes scale and causal)"):format(fn, tostring(k))) end
  end
  local s = opts.scale
  if s ~= nil then
    if type(s) ~= "number" or s ~= s or s == 0 or s == math.huge or s == -math.huge then
      fail(("%s: scale must be a finite nonzero number, got %s"):format(fn, tostring(s)))
    end
    a.scale = s
  end
  if opts.causal ~= nil then
    if type(opts.causal) ~= "boolean" then fail(("%s: causal must be a boolean, got %s"):format(fn, type(opts.causal))) end
    a.causal = opts.causal
  end
  return a
end
function Tensor:softmax(dim, opts) return op(O.softmax, softmax_attrs("softmax", self, dim, opts), self) end
function Tensor:log_softmax(dim, opts) return op(O.log_softmax, softmax_attrs("log_softmax", self, dim, opts), self) end

-- Comparisons give 1 (true) or 0 (false) in the tensors' dtype (an integer tensor
-- against a float one: in the float dtype, see promote).
for _, name in ipairs({ "eq", "ne", "lt", "le", "gt", "ge" }) do
  local id = O[name]
  local compare = binary(name)
  Tensor[name] = function(self, other)
    if type(other) == "number" then
      local s = scalar_like(other, self, name)
      local r = op(id, nil, self, s)
      C.free(s)
      return r
    end
    return compare(self, other)
  end
end

-- equal(other): true when both have the same shape and every element is equal (NaN never is).
function Tensor:equal(other)
  check_tensor("equal", other, "the other tensor")
  local a, b = info(self), info(other)
  if #a ~= #b then return false end
  for d = 1, #a do if a[d] ~= b[d] then return false end end
  if self:numel() == 0 then return true end
  local m = self:ne(other)
  local s = m:sum()
  local v = s:item()
  C.free(m); C.free(s)
  return v == 0
end

-- where(cond, a, b): a where cond is nonzero, else b; a or b may be numbers.
function remat.where(cond, a, b)
  local fn = "remat.where"
  check_tensor(fn, cond, "the condition")
  local like = is_tensor(a) and a or is_tensor(b) and b or cond
  local tmp = {}
  if type(a) == "number" then a = scalar_like(a, like, "where"); tmp[#tmp + 1] = a end
  if type(b) == "number" then b = scalar_like(b, like, "where"); tmp[#tmp + 1] = b end
  local ok, r = pcall(function()
    local x, y, t = promote(a, b)
    if t then tmp[#tmp + 1] = t end
    -- the condition is read as nonzero or not: any dtype does, converted to the values'
    local _, dc = info(cond)
    local _, dx = info(x)
    if dc ~= dx then
      local zero = scalar_like(0, cond)
      local nz = op(O.ne, nil, cond, zero) -- 1/0 (NaN counts as nonzero), then in x's dtype
      C.free(zero)
      cond = op(O.cast, { dtype = DTYPE_ID[dx] }, nz)
      C.free(nz)
      tmp[#tmp + 1] = cond
    end
    return op(O.where, nil, cond, x, y)
  end)
  for _, t in ipairs(tmp) do C.free(t) end
  if not ok then error(r, 0) end
  return r
end

-- masked_fill(mask, value): value where mask is nonzero, self elsewhere (a new tensor;
-- mask broadcasts against self, as a comparison's result does).
function Tensor:masked_fill(mask, value)
  check_tensor("masked_fill", mask, "the mask")
  if type(value) ~= "number" and not is_tensor(value) then
    fail("masked_fill: the value must be a number or a tensor, got " .. describe(value))
  end
  return remat.where(mask, value, self)
end

-- cat({t1, t2, ...}, dim): concatenation along dim (default 1).
function remat.cat(list, dim)
  local fn = "remat.cat"
  if type(list) ~= "table" or is_tensor(list) then fail(fn .. ": expected a list of tensors, got " .. describe(list)) end
  if #list == 0 then fail(fn .. ": the list is empty") end
  for i = 1, #list do check_tensor(fn, list[i], "element " .. i) end
  return op(O.concat, { dim = cdim(fn, dim or 1, #info(list[1])) }, table.unpack(list))
end

-- Index tensors: tensors, or Lua tables of 1-based indices (converted to x's dtype and device).
local function index_arg(fn, x, idx)
  if is_tensor(idx) then return idx, false end
  if type(idx) ~= "table" then fail(fn .. ": the indices must be a tensor or a table, got " .. describe(idx)) end
  return remat.tensor(idx, x:dtype(), x:device()), true
end

function Tensor:gather(dim, idx)
  local i, owned = index_arg("gather", self, idx)
  local r = op(O.gather, { dim = cdim("gather", dim, #info(self)) }, self, i)
  if owned then C.free(i) end
  return r
end

function Tensor:index_select(dim, idx)
  local i, owned = index_arg("index_select", self, idx)
  local r = op(O.index_select, { dim = cdim("index_select", dim, #info(self)) }, self, i)
  if owned then C.free(i) end
  return r
end

-- fill_(v): writes v (a number or a broadcastable tensor) into every element; returns self.
function Tensor:fill_(v) return C.assign(self, v, "fill_") end
function Tensor:zero_() return C.assign(self, 0, "zero_") end
-- copy_(src): copies src's values into self (Torch7's x:copy(y)); returns self.
function Tensor:copy_(src) return C.copy_into(self, src) end

-- ---- devices and dtypes ----

-- to(dtype or device, or {dtype=, device=}): a converted copy, or a new handle when nothing changes.
function Tensor:to(what)
  local o = {}
  if type(what) == "string" then
    local s = DTYPE_OF[what] or what
    if DTYPE_ID[s] then o.dtype = s
    elseif DEVICE_ID[s] then o.device = s
    else fail(("to: '%s' is neither a dtype (float32, float64, bfloat16, float16, int32, int64) nor a device (cpu, cuda)"):format(what)) end
  elseif type(what) == "table" then
    o.dtype = what.dtype and check_dtype("to", what.dtype)
    o.device = what.device and check_device("to", what.device)
  else
    fail("to: expected a dtype or a device name, got " .. describe(what))
  end
  local _, dt, dev = info(self)
  local x, owned = self, false
  if o.device and o.device ~= dev then
    -- a cast to bfloat16/float16 happens on the device that supports it
    if o.dtype and o.dtype ~= dt and o.device ~= "cpu" then
      x = C.to_device(x, o.device)
      local c = op(O.cast, { dtype = DTYPE_ID[o.dtype] }, x)
      C.free(x)
      return c
    end
    x, owned = C.to_device(x, o.device), true
  end
  if o.dtype and o.dtype ~= dt then
    local c = op(O.cast, { dtype = DTYPE_ID[o.dtype] }, x)
    if owned then C.free(x) end
    return c
  end
  if owned then return x end
  return alias(self)
end

function Tensor:cuda() return self:to("cuda") end
function Tensor:cpu() return self:to("cpu") end
function Tensor:float() return self:to("float32") end
function Tensor:double() return self:to("float64") end
function Tensor:int() return self:to("int32") end
function Tensor:long() return self:to("int64") end

remat.cuda = remat.cuda or {}
-- true when the CUDA backend loads and finds a device; never prints.
function remat.cuda.available()
  local ok = C.device_available("cuda")
  return ok and true or false
end

-- printing (Torch7 style): lua/remat/tensor_print.lua
mt.__tostring = require("remat.tensor_print")({ info = info, readable = readable })

-- remat.ops: every op of core/ops.def as a plain function, built from the registry:
-- remat.ops.<name>(inputs..., [attrs]), attrs by the names ops.def declares (C.op_list()
-- lists them), e.g. remat.ops.narrow(x, { dim = 0, start = 1, length = 2 }); dims and
-- indices are 0-based here, as in C. Outputs as the op gives them (extras included).
remat.ops = {}
for _, o in ipairs(C.op_list()) do
  local id = o.id
  remat.ops[o.name] = function(...)
    local n = select("#", ...)
    if n > 0 and type((select(n, ...))) == "table" then
      local args = { ... }
      return op(id, args[n], table.unpack(args, 1, n - 1))
    end
    return op(id, nil, ...)
  end
end

C.set_methods(Tensor)

return Tensor
