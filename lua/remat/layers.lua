-- Image and normalisation layers written with the op registry's ops, so they run on
-- every backend, record on the tape like any layer and replay under checkpointing:
--   nn.Conv2d(in, out, kernel [, opts])   unfold (im2col) + a batched GEMM (+ bias)
--   nn.MaxPool2d(kernel [, opts])         the maxpool2d op (padding reads -inf)
--   nn.AvgPool2d(kernel [, opts])         unfold with zero padding + mean (padding counts)
--   nn.BatchNorm1d(n [, opts]), nn.BatchNorm2d(n [, opts])   the batchnorm op (training)
--   nn.PositionalEmbedding(block, dim)    x (B, T, dim) + a learned (T, dim) table
--   nn.Flatten()                          (B, ...) -> (B, n)
-- Sizes (kernel, stride, padding, dilation) are a number or { h, w }.
local remat = package.loaded.remat
local C = remat._C
local nn = remat.nn
local fail = remat._fail
local is_tensor = remat.is_tensor
local op = C.op

-- unfold's attributes from a geometry list { kh, kw, sh, sw, ph, pw, dh, dw }.
local function window(g, pad_value)
  return { kh = g[1], kw = g[2], stride_h = g[3], stride_w = g[4], pad_h = g[5], pad_w = g[6],
           dilation_h = g[7], dilation_w = g[8], pad_value = pad_value }
end

local function pair(fn, what, v, default)
  if v == nil then v = default end
  if type(v) == "number" then v = { v, v } end
  if type(v) ~= "table" or #v ~= 2 then fail(("%s: %s must be a number or {h, w}, got %s"):format(fn, what, tostring(v))) end
  for k = 1, 2 do
    if math.type(v[k]) ~= "integer" and not (type(v[k]) == "number" and math.tointeger(v[k])) then
      fail(("%s: %s must be whole numbers, got %s"):format(fn, what, tostring(v[k])))
    end
  end
  return { math.tointeger(v[1]), math.tointeger(v[2]) }
end

local function check_opts(fn, opts, known)
  if opts == nil then return {} end
  if type(opts) ~= "table" then fail(fn .. ": options must be a table, got " .. type(opts)) end
  for k in pairs(opts) do
    if not known[k] then fail(("%s: unknown option '%s'"):format(fn, tostring(k))) end
  end
  return opts
end

local function positive(fn, what, v)
  if math.type(v) ~= "integer" or v < 1 then fail(("%s: %s must be a positive integer, got %s"):format(fn, what, tostring(v))) end
  return v
end

local function geometry(k, s, p, d) return { k[1], k[2], s[1], s[2], p[1], p[2], d[1], d[2] } end

local function check_geometry(fn, g)
  for i = 1, 8 do
    local padding = i == 5 or i == 6
    if g[i] < (padding and 0 or 1) then
      fail(fn .. ": kernel, stride and dilation must be >= 1 and padding >= 0")
    end
  end
end

local function out_hw(x, g)
  local s = C.info(x)
  local function o(n, k, st, pd, dl) return (n + 2 * pd - dl * (k - 1) - 1) // st + 1 end
  return o(s[3], g[1], g[3], g[5], g[7]), o(s[4], g[2], g[4], g[6], g[8])
end

local function check_image(fn, x, channels)
  if not is_tensor(x) then fail(fn .. ": expected a tensor, got " .. type(x)) end
  local s = C.info(x)
  if #s ~= 4 then fail(("%s: expected a 4-d input (batch, channels, height, width), got %d-d"):format(fn, #s)) end
  if channels and s[2] ~= channels then
    fail(("%s: the input has %d channels, expected %d"):format(fn, s[2], channels))
  end
  return s
end

-- Uniform in [-bound, bound), PyTorch's default for convolutions (bound 1/sqrt(fan_in)).
local function uniform(shape, bound)
  local r = remat.rand(shape)
  local t = r * (2 * bound) - bound
  r:free()
  return t
end

-- nn.Conv2d(in, out, kernel, { stride = 1, padding = 0, dilation = 1, groups = 1, bias = true })
-- x (B, in, H, W) -> (B, out, Ho, Wo); weight (out, in/groups, kh, kw), bias (out).
function nn.Conv2d(cin, cout, kernel, opts)
  local fn = "nn.Conv2d"
  positive(fn, "in_channels", cin)
  positive(fn, "out_channels", cout)
  opts = check_opts(fn, opts, { stride = true, padding = true, dilation = true, groups = true, bias = true })
  local k = pair(fn, "kernel", kernel)
  local g = geometry(k, pair(fn, "stride", opts.stride, 1), pair(fn, "padding", opts.padding, 0),
                     pair(fn, "dilation", opts.dilation, 1))
  check_geometry(fn, g)
  local groups = positive(fn, "groups", opts.groups or 1)
  if cin % groups ~= 0 or cout % groups ~= 0 then
    fail(("%s: groups (%d) must divide in_channels (%d) and out_channels (%d)"):format(fn, groups, cin, cout))
  end
  local fan_in = cin // groups * k[1] * k[2]
  local bound = 1 / math.sqrt(fan_in)
  local def = {
    name = ("Conv2d(%d, %d, %dx%d%s)"):format(cin, cout, k[1], k[2], groups > 1 and (", groups " .. groups) or ""),
    in_channels = cin, out_channels = cout, groups = groups, geometry = g,
    weight = uniform({ cout, cin // groups, k[1], k[2] }, bound):requires_grad(true),
  }
  if opts.bias ~= false then def.bias = uniform({ cout }, bound):requires_grad(true) end
  function def.forward(self, x)
    local s = check_image("Conv2d", x, self.in_channels)
    local geo = self.geometry
    local ho, wo = out_hw(x, geo)
    local G, co = self.groups, self.out_channels
    -- intermediates are freed as soon as they are used (the tape keeps what backward
    -- needs): Lua's collector does not see their memory
    local cols <close> = op(C.ops.unfold, window(geo, 0), x)                           -- (B, in*kh*kw, L)
    local kk = self.in_channels // G * geo[1] * geo[2]
    local L = ho * wo
    local weight <close> = self.weight
    local bias <close> = self.bias
    -- per image and group, (out/G, kk) x (kk, L): the result is already (B, out, L),
    -- where one (B*L, kk) GEMM needed the columns and its result transposed (two copies
    -- forward, two back), which cost more than the GEMMs' size saves
    local cg <close> = cols:view(s[1], G, kk, L)
    local w <close> = weight:view(G, co // G, kk)
    local y <close> = w:matmul(cg)                                                 -- (B, G, out/G, L)
    if not bias then return y:view(s[1], co, ho, wo) end
    local y2 <close> = y:view(s[1], co, L)
    local b2 <close> = bias:view(co, 1)
    local yb <close> = y2 + b2
    return yb:view(s[1], co, ho, wo)
  end
  return nn.module(def)
end

local function pool(kind, kernel, opts)
  local fn = "nn." .. kind
  opts = check_opts(fn, opts, { stride = true, padding = true, dilation = kind == "MaxPool2d" or nil })
  local k = pair(fn, "kernel", kernel)
  local g = geometry(k, pair(fn, "stride", opts.stride, k), pair(fn, "padding", opts.padding, 0),
                     pair(fn, "dilation", opts.dilation, 1))
  check_geometry(fn, g)
  if g[5] * 2 > k[1] or g[6] * 2 > k[2] then
    fail(("%s: padding %dx%d must be at most half the kernel %dx%d"):format(fn, g[5], g[6], k[1], k[2]))
  end
  local is_max = kind == "MaxPool2d"
  return nn.module {
    name = ("%s(%dx%d, stride %dx%d)"):format(kind, k[1], k[2], g[3], g[4]),
    geometry = g,
    forward = function(self, x)
      local s = check_image(kind, x)
      local geo = self.geometry
      local ho, wo = out_hw(x, geo)
      if is_max then return op(C.ops.maxpool2d, window(geo, 0), x) end
      local cols <close> = op(C.ops.unfold, window(geo, 0), x)
      local w <close> = cols:view(s[1], s[2], geo[1] * geo[2], ho * wo)
      local r <close> = w:mean(3)
      return r:view(s[1], s[2], ho, wo)
    end,
  }
end

-- nn.MaxPool2d(kernel, { stride = kernel, padding = 0, dilation = 1 }): padding reads -inf.
function nn.MaxPool2d(kernel, opts) return pool("MaxPool2d", kernel, opts) end
-- nn.AvgPool2d(kernel, { stride = kernel, padding = 0 }): padding counts as zeros.
function nn.AvgPool2d(kernel, opts) return pool("AvgPool2d", kernel, opts) end

-- Batch normalisation over every dim but 2 (channels). Training: batch statistics
-- (biased variance) normalise; the running mean and variance (unbiased) move by
-- momentum, outside the tape: a checkpointed layer replays its forward from the tape,
-- so recomputation never updates them a second time, and neither do planning dry runs
-- (their values do not exist). Eval: the running statistics normalise.
local function batchnorm(kind, rank, n, opts)
  local fn = "nn." .. kind
  positive(fn, "num_features", n)
  opts = check_opts(fn, opts, { eps = true, momentum = true, affine = true })
  local eps, momentum = opts.eps or 1e-5, opts.momentum or 0.1
  if type(eps) ~= "number" or eps <= 0 then fail(fn .. ": eps must be a positive number") end
  if type(momentum) ~= "number" or momentum < 0 or momentum > 1 then fail(fn .. ": momentum must be in [0, 1]") end
  local def = {
    name = ("%s(%d)"):format(kind, n), num_features = n, eps = eps, momentum = momentum,
    running_mean = remat.zeros(n), running_var = remat.ones(n),
    buffers = { "running_mean", "running_var" },
  }
  if opts.affine ~= false then
    def.weight = remat.ones(n):requires_grad(true)
    def.bias = remat.zeros(n):requires_grad(true)
  end
  function def.forward(self, x)
    if not is_tensor(x) then fail(kind .. ": expected a tensor, got " .. type(x)) end
    local s = C.info(x)
    local ok = (rank == 1 and (#s == 2 or #s == 3)) or (rank == 2 and #s == 4)
    if not ok then
      fail(("%s: expected a %s input, got %d-d"):format(kind, rank == 1 and "(N, C) or (N, C, L)" or "(N, C, H, W)", #s))
    end
    if s[2] ~= self.num_features then fail(("%s: the input has %d channels, expected %d"):format(kind, s[2], self.num_features)) end
    local bshape, count = { 1, s[2] }, s[1]
    for d = 3, #s do bshape[d] = 1; count = count * s[d] end
    local dev, dt = x:device(), x:dtype()
    if self.running_mean:device() ~= dev or self.running_mean:dtype() ~= dt then
      self.running_mean = self.running_mean:to { device = dev, dtype = dt }
      self.running_var = self.running_var:to { device = dev, dtype = dt }
    end
    if self:is_training() then
      if count < 2 then fail(("%s: training needs more than one value per channel (got %d)"):format(kind, count)) end
      -- one fused op (batch statistics, normalise, scale, shift); its mean and biased
      -- variance move the running statistics here, outside the tape
      local y, mean, var
      if self.weight then
        y, mean, var = op(C.ops.batchnorm, { eps = self.eps }, x, self.weight, self.bias)
      else
        y, mean, var = op(C.ops.batchnorm, { eps = self.eps }, x)
      end
      local m, unbias = self.momentum, count / (count - 1)
      remat.no_grad(function()
        -- the statistics are float32 for a bfloat16 input
        local mt = mean:dtype() == dt and mean or mean:to { dtype = dt }
        local vt = var:dtype() == dt and var or var:to { dtype = dt }
        self.running_mean:copy_(self.running_mean * (1 - m) + mt * m)
        self.running_var:copy_(self.running_var * (1 - m) + vt * (m * unbias))
        if mt ~= mean then mt:free() end
        if vt ~= var then vt:free() end
      end)
      mean:free()
      var:free()
      return y
    end
    local mean, var = self.running_mean:view(bshape), self.running_var:view(bshape)
    local y = (x - mean) * (var + self.eps):pow(-0.5)
    return self.weight and (y * self.weight:view(bshape) + self.bias:view(bshape)) or y
  end
  return nn.module(def)
end

-- nn.BatchNorm1d(n, { eps = 1e-5, momentum = 0.1, affine = true }): (N, n) or (N, n, L).
function nn.BatchNorm1d(n, opts) return batchnorm("BatchNorm1d", 1, n, opts) end
-- nn.BatchNorm2d(n, { eps = 1e-5, momentum = 0.1, affine = true }): (N, n, H, W).
function nn.BatchNorm2d(n, opts) return batchnorm("BatchNorm2d", 2, n, opts) end

-- nn.Flatten(): (B, ...) -> (B, the rest multiplied), a view when x is contiguous.
function nn.Flatten()
  return nn.module {
    name = "Flatten()",
    forward = function(self, x)
      if not is_tensor(x) then fail("Flatten: expected a tensor, got " .. type(x)) end
      local s = C.info(x)
      if #s < 1 then fail("Flatten: expected at least a 1-d input") end
      return x:reshape(s[1], -1)
    end,
  }
end

-- nn.PositionalEmbedding(block, dim): adds a learned position vector to each of the
-- T <= block positions of x (B, T, dim) (GPT-2's wpe; N(0, 0.02) initial values).
function nn.PositionalEmbedding(block, dim)
  local fn = "nn.PositionalEmbedding"
  positive(fn, "block", block)
  positive(fn, "dim", dim)
  local w = remat.randn(block, dim)
  local init = w * 0.02
  w:free()
  return nn.module {
    name = ("PositionalEmbedding(%d, %d)"):format(block, dim), block = block, dim = dim,
    weight = init:requires_grad(true),
    forward = function(self, x)
      if not is_tensor(x) then fail("PositionalEmbedding: expected a tensor, got " .. type(x)) end
      local s = C.info(x)
      if #s ~= 3 or s[3] ~= self.dim then
        fail(("PositionalEmbedding: expected an input (B, T, %d), got %s"):format(self.dim, table.concat(s, "x")))
      end
      if s[2] > self.block then
        fail(("PositionalEmbedding: %d positions, more than the block of %d"):format(s[2], self.block))
      end
      return x + self.weight:narrow(1, 1, s[2])
    end,
  }
end

return nn
