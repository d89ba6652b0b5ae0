-- The CUDA backend against the CPU one: every op forward and backward on the same
-- inputs (odd sizes, size-1 dims, broadcasting, non-contiguous views, NaN/inf), with
-- per-dtype tolerances (float32 tight, float64 tighter, bfloat16 loose); dropout
-- masks bit for bit; the gradients of a small MLP; checkpoint policies on CUDA.
-- Every test is tagged #gpu; without a device they are registered as pending, never
-- counted as passed.
local remat = require "remat"
local kit = require "support.kit"
local C = remat._C

local DEV, DEV_ID = "cuda", 1
local has_cuda, why = C.device_available(DEV)

if not has_cuda then
  describe("cuda backend #gpu", function()
    pending("CUDA is not available here (" .. tostring(why) .. "): every CUDA spec is skipped")
  end)
  return
end

local F32, F64, BF16 = 0, 1, 2
local DTYPE_ID = { float32 = F32, float64 = F64, bfloat16 = BF16 }
local ALL = math.mininteger -- RM_DIM_ALL

-- Tolerances (relative, with an absolute floor of the same size near 0).
local TOL = { float32 = 2e-4, float64 = 1e-9, bfloat16 = 4e-2 }

local function op(name, attrs, ...) return C.op(C.ops[name], attrs, ...) end
local function cast(t, dt) return op("cast", { dtype = DTYPE_ID[dt] }, t) end

-- Flat values of any tensor (CUDA and bfloat16 ones are read through float32 on CPU).
local function values(t)
  local _, dt, dev = C.info(t)
  if dt == "bfloat16" then t = cast(t, "float32") end
  if dev ~= "cpu" then t = C.to_device(t, "cpu") end
  return C.flat(t)
end

local function shape_of(t) return (C.info(t)) end

local function same_shape(a, b)
  local sa, sb = shape_of(a), shape_of(b)
  if #sa ~= #sb then return false end
  for i = 1, #sa do if sa[i] ~= sb[i] then return false end end
  return true
end

-- Asserts that got (a CUDA tensor) matches want (a CPU tensor): shapes, NaN and inf
-- positions, values within tol.
local function close(got, want, tol, what)
  assert(same_shape(got, want), what .. ": shapes differ")
  local g, w = values(got), values(want)
  assert(#g == #w, what .. ": sizes differ")
  for i = 1, #g do
    local a, b = g[i], w[i]
    if b ~= b then
      assert(a ~= a, ("%s[%d]: got %s, expected nan"):format(what, i, a))
    elseif b == math.huge or b == -math.huge then
      assert(a == b, ("%s[%d]: got %s, expected %s"):format(what, i, a, b))
    else
      local err = math.abs(a - b) / math.max(1, math.abs(b))
      assert(err <= tol, ("%s[%d]: cuda %.9g, cpu %.9g (rel err %.3g > %.3g)"):format(what, i, a, b, err, tol))
    end
  end
end

local function bitwise(got, want, what)
  local g, w = values(got), values(want)
  assert(#g == #w, what .. ": sizes differ")
  for i = 1, #g do
    local a, b = g[i], w[i]
    assert(a == b or (a ~= a and b ~= b), ("%s[%d]: cuda %.17g, cpu %.17g"):format(what, i, a, b))
  end
end

-- An input spec: { shape, lo, hi } random values, or { shape, vals = {...} }, with
-- t = true for a transposed (non-contiguous) view of the last two dims, grad = false
-- for inputs that get no gradient (indices, labels, conditions).
local function make_inputs(specs)
  local cpu, gpu = {}, {}
  for i, s in ipairs(specs) do
    local shape = s.shape
    if s.t then
      local n = #shape
      local base_shape = {}
      for k = 1, n do base_shape[k] = shape[k] end
      base_shape[n - 1], base_shape[n] = shape[n], shape[n - 1]
      local v = s.vals or kit.values(base_shape, s.lo, s.hi)
      local b = C.from_table(v, base_shape, "float32")
      cpu[i] = op("transpose", { dim0 = n - 2, dim1 = n - 1 }, b)
      gpu[i] = op("transpose", { dim0 = n - 2, dim1 = n - 1 }, C.to_device(b, DEV))
    else
      local v = s.vals or kit.values(shape, s.lo, s.hi)
      cpu[i] = C.from_table(v, shape, "float32")
      gpu[i] = C.to_device(cpu[i], DEV)
    end
  end
  return cpu, gpu
end

-- Runs op on CPU (float32, or float64 / bfloat16-rounded inputs) and CUDA, compares
-- every visible output; with grad, also compares the input gradients after a backward
-- from the same random output weights.
local function compare(name, attrs, specs, opts)
  opts = opts or {}
  local dtype = opts.dtype or "float32"
  local cpu, gpu = make_inputs(specs)
  for i = 1, #specs do
    local keep = specs[i].index -- index/label inputs keep float32 values
    if dtype == "float64" and not keep then
      cpu[i], gpu[i] = cast(cpu[i], "float64"), cast(gpu[i], "float64")
    elseif dtype == "bfloat16" and not keep then
      -- the CPU sees the bfloat16-rounded values in float32
      gpu[i] = cast(gpu[i], "bfloat16")
      cpu[i] = C.to_device(cast(gpu[i], "float32"), "cpu")
    end
  end
  local tol = opts.tol or TOL[dtype]
  local want_grad = opts.grad and dtype ~= "bfloat16"
  if want_grad then
    for i, s in ipairs(specs) do
      if s.grad ~= false then
        -- leaves: copies that own their data
        cpu[i] = op("copy", nil, cpu[i])
        gpu[i] = op("copy", nil, gpu[i])
        C.requires_grad(cpu[i], true)
        C.requires_grad(gpu[i], true)
      end
    end
  end
  local oc = table.pack(op(name, attrs, table.unpack(cpu, 1, #specs)))
  local og = table.pack(op(name, attrs, table.unpack(gpu, 1, #specs)))
  assert(oc.n == og.n, name .. ": output counts differ")
  for j = 1, oc.n do close(og[j], oc[j], tol, ("%s output %d (%s)"):format(name, j, dtype)) end
  if want_grad then
    local shape = shape_of(oc[1])
    local w = kit.values(shape)
    local wc = C.from_table(w, shape, dtype)
    C.backward(oc[1], wc)
    C.backward(og[1], C.to_device(wc, DEV))
    for i, s in ipairs(specs) do
      if s.grad ~= false then
        local gc, gg = C.grad(cpu[i]), C.grad(gpu[i])
        assert(gc and gg, ("%s: input %d got no gradient"):format(name, i))
        close(gg, gc, opts.gtol or tol * 5, ("%s grad of input %d (%s)"):format(name, i, dtype))
      end
    end
  end
end

-- ---- the cases ----

local function labels(n, classes)
  local v = {}
  for i = 1, n do v[i] = (i * 7) % classes + 1 end
  return v
end

local BINARY = { "add", "sub", "mul", "div", "pow", "maximum", "eq", "ne", "lt", "le", "gt", "ge" }
local UNARY = { "neg", "exp", "log", "tanh", "sqrt", "abs", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "copy" }
local POSITIVE = { log = true, sqrt = true, pow = true }
local NODIFF = { eq = true, ne = true, lt = true, le = true, gt = true, ge = true }

local cases = {}
local function case(label, name, attrs, specs, opts)
  cases[#cases + 1] = { label = label, name = name, attrs = attrs, specs = specs, opts = opts or {} }
end

for _, nm in ipairs(BINARY) do
  local lo = POSITIVE[nm] and 0.5 or -2
  local g = not NODIFF[nm]
  case("7x5 and 5 (broadcast)", nm, nil, { { shape = { 7, 5 }, lo = lo, hi = 2 }, { shape = { 5 }, lo = 0.5, hi = 2 } }, { grad = g })
  case("1x9 and 4x1, odd sizes", nm, nil, { { shape = { 1, 9 }, lo = lo, hi = 2 }, { shape = { 4, 1 }, lo = 0.5, hi = 2 } }, { grad = g })
  case("transposed 6x3 and 3x6", nm, nil, { { shape = { 6, 3 }, lo = lo, hi = 2, t = true }, { shape = { 6, 3 }, lo = 0.5, hi = 2 } }, { grad = g })
end
case("NaN and inf propagate", "add", nil, { { shape = { 4 }, vals = { 0 / 0, math.huge, -math.huge, 1 } }, { shape = { 4 }, vals = { 1, 1, 2, 0 / 0 } } })
case("maximum keeps NaN", "maximum", nil, { { shape = { 4 }, vals = { 0 / 0, 1, 3, -1 } }, { shape = { 4 }, vals = { 1, 0 / 0, 2, -math.huge } } })

for _, nm in ipairs(UNARY) do
  local lo = POSITIVE[nm] and 0.1 or -3
  case("3x1x17", nm, nil, { { shape = { 3, 1, 17 }, lo = lo, hi = 3 } }, { grad = true })
  case("transposed 5x4", nm, nil, { { shape = { 5, 4 }, lo = lo, hi = 3, t = true } }, { grad = true })
  case("NaN, inf, -inf", nm, nil, { { shape = { 3 }, vals = { 0 / 0, math.huge, -math.huge } } })
end
case("add_scalar", "add_scalar", { value = 1.5 }, { { shape = { 4, 3 } } }, { grad = true })
case("mul_scalar", "mul_scalar", { value = -0.25 }, { { shape = { 4, 3 } } }, { grad = true })
case("pow_scalar 2", "pow_scalar", { value = 2 }, { { shape = { 5, 2 } } }, { grad = true })
case("pow_scalar 1.5", "pow_scalar", { value = 1.5 }, { { shape = { 5, 2 }, lo = 0.1, hi = 2 } }, { grad = true })
case("rdiv_scalar", "rdiv_scalar", { value = 3 }, { { shape = { 5, 2 }, lo = 0.5, hi = 2 } }, { grad = true })
case("where", "where", nil, { { shape = { 3, 4 }, vals = { 1, 0, 1, 0, 0, 0, 1, 1, 0, 1, 0, 1 }, grad = false },
  { shape = { 3, 4 } }, { shape = { 4 } } }, { grad = true })
case("gelu_backward", "gelu_backward", nil, { { shape = { 33 }, lo = -4, hi = 4 }, { shape = { 33 } } })
case("silu_backward", "silu_backward", nil, { { shape = { 33 }, lo = -4, hi = 4 }, { shape = { 33 } } })
-- linear_gelu: out a multiple of 8 (the cublasLt GELU_AUX epilogue), and 13 (the fallback)
case("linear_gelu 5x7 -> 16, bias", "linear_gelu", nil, { { shape = { 5, 7 } }, { shape = { 16, 7 } }, { shape = { 16 } } }, { grad = true })
case("linear_gelu 2x3x8 -> 24, no bias", "linear_gelu", nil, { { shape = { 2, 3, 8 } }, { shape = { 24, 8 } } }, { grad = true })
case("linear_gelu 4x6 -> 13 (fallback), transposed x", "linear_gelu", nil, { { shape = { 4, 6 }, t = true }, { shape = { 13, 6 } }, { shape = { 13 } } }, { grad = true })
case("gelu_tanh_backward", "gelu_tanh_backward", nil, { { shape = { 33 }, lo = -4, hi = 4 }, { shape = { 33 } } })
case("gelu_tanh huge |x|", "gelu_tanh", nil, { { shape = { 4 }, vals = { -1e30, -40, 40, 1e30 } } }, { grad = true })

-- reductions
for _, nm in ipairs({ "sum", "mean", "max", "argmax" }) do
  local g = nm ~= "argmax"
  case("dim 1 of 5x7", nm, { dim = 0, keepdim = false }, { { shape = { 5, 7 } } }, { grad = g })
  case("dim 2 of 3x1x9, keepdim", nm, { dim = 1, keepdim = true }, { { shape = { 3, 1, 9 } } }, { grad = g })
  case("last dim, transposed input", nm, { dim = -1, keepdim = false }, { { shape = { 6, 5 }, t = true } }, { grad = g })
  case("every dim", nm, { dim = ALL, keepdim = false }, { { shape = { 4, 3, 5 } } }, { grad = g })
end
case("max: NaN wins, first max", "max", { dim = 1, keepdim = false }, { { shape = { 2, 4 }, vals = { 1, 0 / 0, 5, 0 / 0, 2, 7, 7, 1 } } })
case("sum of 3e5 (split path)", "sum", { dim = ALL, keepdim = false }, { { shape = { 300001 } } }, { grad = true })
case("column sum of 4099x3 (split path)", "sum", { dim = 0, keepdim = false }, { { shape = { 4099, 3 } } }, { grad = true })
case("sum_to 4x3x5 -> 3x1", "sum_to", { shape = { 3, 1 } }, { { shape = { 4, 3, 5 } } }, { grad = true })
for _, nm in ipairs({ "softmax", "log_softmax" }) do
  case("last dim of 6x37", nm, { dim = -1 }, { { shape = { 6, 37 }, lo = -5, hi = 5 } }, { grad = true })
  case("dim 1 of 4x5x3", nm, { dim = 0 }, { { shape = { 4, 5, 3 } } }, { grad = true })
  case("row of 2000", nm, { dim = -1 }, { { shape = { 3, 2000 }, lo = -5, hi = 5 } }, { grad = true })
  case("-inf entries", nm, { dim = -1 }, { { shape = { 1, 3 }, vals = { -math.huge, 0, 1 } } })
  case("scale 0.35, causal 3x2x9x9", nm, { dim = -1, scale = 0.35, causal = true }, { { shape = { 3, 2, 9, 9 }, lo = -5, hi = 5 } }, { grad = true })
  case("causal rows of 300", nm, { dim = -1, scale = 0.125, causal = true }, { { shape = { 2, 300, 300 }, lo = -5, hi = 5 } }, { grad = true })
  case("scale -1.5 over dim 0", nm, { dim = 0, scale = -1.5 }, { { shape = { 4, 5, 3 } } }, { grad = true })
end

-- matrix products
case("17x33 by 33x9", "matmul", nil, { { shape = { 17, 33 } }, { shape = { 33, 9 } } }, { grad = true })
case("transposed operands", "matmul", nil, { { shape = { 8, 5 }, t = true }, { shape = { 5, 6 }, t = true } }, { grad = true })
case("batch broadcast 2x1x5x7 by 3x7x4", "matmul", nil, { { shape = { 2, 1, 5, 7 } }, { shape = { 3, 7, 4 } } }, { grad = true })
case("shared right operand 4x3x6 by 6x2", "matmul", nil, { { shape = { 4, 3, 6 } }, { shape = { 6, 2 } } }, { grad = true })
case("1-D promotion", "matmul", nil, { { shape = { 7 } }, { shape = { 3, 7, 2 } } }, { grad = true })
case("x 2x3x10, w 7x10, b 7", "linear", nil, { { shape = { 2, 3, 10 } }, { shape = { 7, 10 } }, { shape = { 7 } } }, { grad = true })
case("no bias, transposed x", "linear", nil, { { shape = { 5, 4 }, t = true }, { shape = { 3, 4 } } }, { grad = true })

-- normalisation
case("layernorm 3x2x33 affine", "layernorm", { eps = 1e-5 }, { { shape = { 3, 2, 33 } }, { shape = { 33 } }, { shape = { 33 } } }, { grad = true })
case("layernorm no affine", "layernorm", { eps = 1e-5 }, { { shape = { 4, 1000 } } }, { grad = true })
case("rmsnorm affine", "rmsnorm", { eps = 1e-6 }, { { shape = { 5, 19 } }, { shape = { 19 } } }, { grad = true })
case("rmsnorm 300 rows (split column sums)", "rmsnorm", { eps = 1e-6 }, { { shape = { 300, 8 } }, { shape = { 8 } } }, { grad = true })

-- indexing
case("index_select dim 1", "index_select", { dim = 1 }, { { shape = { 3, 5, 2 } }, { shape = { 4 }, vals = { 5, 1, 1, 3 }, grad = false, index = true } }, { grad = true })
case("gather dim 2", "gather", { dim = 1 }, { { shape = { 3, 4 } }, { shape = { 3, 2 }, vals = { 1, 4, 2, 2, 3, 1 }, grad = false, index = true } }, { grad = true })
case("concat dim 2", "concat", { dim = 1 }, { { shape = { 2, 3 } }, { shape = { 2, 1 } }, { shape = { 2, 4 }, t = true } }, { grad = true })
case("embedding", "embedding", nil, { { shape = { 6, 5 } }, { shape = { 2, 3 }, vals = { 6, 1, 2, 2, 5, 3 }, grad = false, index = true } }, { grad = true })
case("causal_mask", "causal_mask", { zeros = false }, { { shape = { 2, 5, 5 } } }, { grad = true })
case("narrow (narrow_backward)", "narrow", { dim = 1, start = 1, length = 3 }, { { shape = { 3, 6 } } }, { grad = true })
case("index_add", "index_add", { dim = 0, size = 4 }, { { shape = { 3, 2 } }, { shape = { 3 }, vals = { 4, 1, 4 }, grad = false, index = true } })
case("scatter_add", "scatter_add", { dim = 1, shape = { 2, 5 } }, { { shape = { 2, 3 } }, { shape = { 2, 3 }, vals = { 1, 5, 1, 2, 2, 3 }, grad = false, index = true } })

-- losses
case("cross_entropy 9x13", "cross_entropy", nil, { { shape = { 9, 13 }, lo = -4, hi = 4 }, { shape = { 9 }, vals = labels(9, 13), grad = false, index = true } }, { grad = true })
case("cross_entropy wide rows", "cross_entropy", nil, { { shape = { 3, 5000 }, lo = -4, hi = 4 }, { shape = { 3 }, vals = labels(3, 5000), grad = false, index = true } }, { grad = true })
case("mse", "mse", nil, { { shape = { 7, 3 } }, { shape = { 7, 3 } } }, { grad = true })

-- attention: several key/query blocks (T > 64), Tq != Tk, causal and not, odd head dims
case("causal, Tq 70 < Tk 100, hd 16", "attention", { causal = true, scale = 0 },
  { { shape = { 2, 3, 70, 16 } }, { shape = { 2, 3, 100, 16 } }, { shape = { 2, 3, 100, 16 } } }, { grad = true })
case("not causal, Tq 90 > Tk 65, hd 7, scale 0.3", "attention", { causal = false, scale = 0.3 },
  { { shape = { 3, 90, 7 } }, { shape = { 3, 65, 7 } }, { shape = { 3, 65, 7 } } }, { grad = true })
case("packed qkv 2x70x(3x3x16), causal (attention_qkv_backward)", "attention", { causal = true, scale = 0, heads = 3 },
  { { shape = { 2, 70, 144 } } }, { grad = true })
case("packed qkv 3x33x(3x2x7), not causal, transposed", "attention", { causal = false, scale = 0.4, heads = 2 },
  { { shape = { 3, 33, 42 }, t = true } }, { grad = true })
case("causal 129 x 129, transposed k", "attention", { causal = true, scale = 0 },
  { { shape = { 2, 129, 8 } }, { shape = { 2, 129, 8 }, t = true }, { shape = { 2, 129, 8 } } }, { grad = true })

-- optimizer steps (outputs are new tensors here: rm_op_run allocates them)
local function wd_bits(wd) return (string.unpack("<i8", string.pack("<d", wd))) end
case("sgd_step momentum nesterov", "sgd_step", { lr = 0.1, momentum = 0.9, weight_decay = 0.01, dampening = 0, nesterov = true, first = false }, { { shape = { 4, 5 } }, { shape = { 4, 5 } }, { shape = { 4, 5 } } })
case("sgd_step plain", "sgd_step", { lr = 0.1, momentum = 0, weight_decay = 0, dampening = 0, nesterov = false, first = true }, { { shape = { 7 } }, { shape = { 7 } }, { shape = { 7 } } })
case("sgd_step momentum, dampening", "sgd_step", { lr = 0.05, momentum = 0.8, weight_decay = 0, dampening = 0.1, nesterov = false, first = false }, { { shape = { 3, 3 } }, { shape = { 3, 3 } }, { shape = { 3, 3 } } })
case("adamw_step t=3", "adamw_step", { lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, step = 3, decoupled = true, weight_decay = wd_bits(0.01) },
  { { shape = { 6, 4 } }, { shape = { 6, 4 } }, { shape = { 6, 4 } }, { shape = { 6, 4 }, lo = 0, hi = 1 } })

-- clamp, sorting and scans
case("clamp 5x7", "clamp", { lo = -0.5, hi = 0.7 }, { { shape = { 5, 7 } } }, { grad = true })
case("clamp NaN, inf", "clamp", { lo = -1, hi = 1 }, { { shape = { 3 }, vals = { 0 / 0, math.huge, -math.huge } } })
case("min dim 1 of 5x7", "min", { dim = 0, keepdim = false }, { { shape = { 5, 7 } } }, { grad = true })
case("min last dim, transposed, keepdim", "min", { dim = -1, keepdim = true }, { { shape = { 6, 5 }, t = true } }, { grad = true })
case("sort rows of 4x9", "sort", { dim = -1, descending = false }, { { shape = { 4, 9 } } }, { grad = true })
case("sort dim 1 of 6x3, descending", "sort", { dim = 0, descending = true }, { { shape = { 6, 3 } } }, { grad = true })
case("topk 3 of 9, largest", "topk", { dim = -1, k = 3, largest = true }, { { shape = { 4, 9 } } }, { grad = true })
case("topk 2 of 5, smallest, transposed", "topk", { dim = -1, k = 2, largest = false }, { { shape = { 3, 5 }, t = true } }, { grad = true })
case("cumsum rows of 3x6", "cumsum", { dim = 1, reverse = false }, { { shape = { 3, 6 } } }, { grad = true })
case("cumsum dim 1 reversed, transposed", "cumsum", { dim = 0, reverse = true }, { { shape = { 5, 4 }, t = true } }, { grad = true })

-- sliding windows, pooling, batch normalisation
local function window(kh, kw, s, p, more)
  local a = { kh = kh, kw = kw, stride_h = s, stride_w = s, pad_h = p, pad_w = p, dilation_h = 1, dilation_w = 1 }
  for k, v in pairs(more or {}) do a[k] = v end
  return a
end
case("unfold 3x3 stride 2 pad 1 of 2x3x5x7", "unfold", window(3, 3, 2, 1), { { shape = { 2, 3, 5, 7 } } }, { grad = true })
case("fold (unfold's adjoint) to 2x3x5x7", "fold", window(3, 3, 2, 1, { height = 5, width = 7 }), { { shape = { 2, 27, 12 } } })
case("maxpool2d 2x2 of 2x3x6x5", "maxpool2d", window(2, 2, 2, 0), { { shape = { 2, 3, 6, 5 } } }, { grad = true })
case("maxpool2d 3x3 stride 1 pad 1 (overlapping)", "maxpool2d", window(3, 3, 1, 1), { { shape = { 1, 2, 5, 4 } } }, { grad = true })
case("batchnorm 4x3x5 affine", "batchnorm", { eps = 1e-5 }, { { shape = { 4, 3, 5 } }, { shape = { 3 }, lo = 0.5, hi = 1.5 }, { shape = { 3 } } }, { grad = true })
case("batchnorm 6x4 no affine", "batchnorm", { eps = 1e-5 }, { { shape = { 6, 4 } } }, { grad = true })
case("rmsprop_step centered, momentum", "rmsprop_step", { lr = 0.01, alpha = 0.9, eps = 1e-8, momentum = 0.9, weight_decay = 0.01, centered = true },
  { { shape = { 4, 5 } }, { shape = { 4, 5 } }, { shape = { 4, 5 }, lo = 0.5, hi = 1 }, { shape = { 4, 5 } }, { shape = { 4, 5 }, lo = -0.1, hi = 0.1 } })

-- ops that take bfloat16 on CUDA (elementwise, matmul, norms)
local BF16_OK = { add = true, mul = true, sub = true, gelu = true, gelu_tanh = true, relu = true, silu = true, exp = true, tanh = true,
  matmul = true, linear = true, linear_gelu = true, layernorm = true, rmsnorm = true, softmax = true, attention = true }

describe("cuda vs cpu: every op #gpu", function()
  for k, c in ipairs(cases) do
    for _, dt in ipairs({ "float32", "float64", "bfloat16" }) do
      if dt ~= "bfloat16" or (BF16_OK[c.name] and not c.label:find("NaN")) then
        it(("%s: %s (%s)"):format(c.name, c.label, dt), function()
          kit.seed(k * 31 + #dt)
          local opts = {}
          for kk, v in pairs(c.opts) do opts[kk] = v end
          opts.dtype = dt
          compare(c.name, c.attrs, c.specs, opts)
        end)
      end
    end
  end

  it("every op in the registry has a cuda kernel or is a view", function()
    local names = {}
    for _, c in ipairs(cases) do names[c.name] = true end
    for _, o in ipairs(C.op_list()) do
      if not o.view and o.name ~= "rand" and o.name ~= "randn" and o.name ~= "fill" and o.name ~= "cast"
        and o.name ~= "dropout" and o.name ~= "dropout_backward" and not o.name:find("_backward$") then
        assert(names[o.name], "no cuda spec case for op " .. o.name)
      end
    end
  end)

  it("a bad index or label is an error at the next synchronisation, and the context stays usable", function()
    local x = C.to_device(C.from_table({ 1, 2, 3 }, { 3 }, "float32"), DEV)
    local idx = C.to_device(C.from_table({ 1, 4 }, { 2 }, "float32"), DEV)
    local y = op("index_select", { dim = 0 }, x, idx) -- queued: nothing waits here
    local ok, err = pcall(values, y)
    assert(not ok and tostring(err):find("index_select: index 4 is out of range 1..3 (dimension 1, position 2",
      1, true), tostring(err))
    assert.same({ 1, 2, 3 }, values(x)) -- reported once; later work is fine
    local lab = C.to_device(C.from_table({ 2.5 }, { 1 }, "float32"), DEV)
    local l = op("cross_entropy", nil, C.to_device(C.from_table({ 1, 2, 3 }, { 1, 3 }, "float32"), DEV), lab)
    ok, err = pcall(values, l)
    assert(not ok and tostring(err):find("label 2.5 is not a whole number in 1..3 (row 1", 1, true), tostring(err))
    -- the first of several bad checks is the one reported
    local i2 = C.to_device(C.from_table({ 0 }, { 1 }, "float32"), DEV)
    op("embedding", nil, C.to_device(C.from_table({ 1, 2, 3, 4 }, { 2, 2 }, "float32"), DEV), i2)
    op("gather", { dim = 0 }, x, C.to_device(C.from_table({ 9 }, { 1 }, "float32"), DEV))
    ok, err = pcall(remat.cuda.synchronize)
    assert(not ok and tostring(err):find("embedding: index 0 is out of range 1..2 (position 1", 1, true), tostring(err))
    remat.cuda.synchronize()
  end)

  it("attention with B*H > 65535 leading rows (grid limits)", function()
    kit.seed(11)
    compare("attention", { causal = true, scale = 0 },
      { { shape = { 65600, 2, 2 } }, { shape = { 65600, 3, 2 } }, { shape = { 65600, 3, 2 } } }, { tol = 1e-4 })
  end)

  it("attention reads q, k, v as strided views of one packed projection (as the model does)", function()
    kit.seed(12)
    local B, T, H, D = 2, 80, 3, 8
    local base = C.from_table(kit.values({ B, T, 3, H, D }), { B, T, 3, H, D }, "float32")
    for _, dt in ipairs({ "float32", "float64", "bfloat16" }) do
      local g = cast(C.to_device(base, DEV), dt)
      local c = dt == "bfloat16" and C.to_device(cast(g, "float32"), "cpu") or C.to_device(g, "cpu")
      local function qkv(t, i) return op("transpose", { dim0 = 1, dim1 = 2 }, op("select", { dim = 2, index = i }, t)) end
      C.requires_grad(g, dt ~= "bfloat16")
      C.requires_grad(c, dt ~= "bfloat16")
      local yg = op("attention", { causal = true, scale = 0 }, qkv(g, 0), qkv(g, 1), qkv(g, 2))
      local yc = op("attention", { causal = true, scale = 0 }, qkv(c, 0), qkv(c, 1), qkv(c, 2))
      close(yg, yc, TOL[dt], "packed attention (" .. dt .. ")")
      if dt ~= "bfloat16" then
        local w = C.from_table(kit.values(shape_of(yc)), shape_of(yc), dt)
        C.backward(yc, w)
        C.backward(yg, C.to_device(w, DEV))
        close(C.grad(g), C.grad(c), TOL[dt] * 5, "packed attention grad (" .. dt .. ")")
      end
    end
  end)

  it("adamw_multi_step: one launch equals adamw_step per tensor bit for bit (float32 masters, bfloat16 grads)", function()
    kit.seed(15)
    local at = { lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, step = 3, decoupled = true, weight_decay = 0.01 }
    local ins, ref = {}, {}
    for k = 1, 40 do
      local n = k == 1 and 70001 or k * 13
      local function t(lo, hi) return C.to_device(C.from_table(kit.values({ n }, lo, hi), { n }, "float32"), DEV) end
      local p, g, m, v = t(), cast(t(), "bfloat16"), t(), t(0, 1)
      ref[k] = { op("adamw_step", at, p, g, m, v) }
      for _, x in ipairs({ p, g, m, v }) do ins[#ins + 1] = x end
    end
    C.op_into(C.ops.adamw_multi_step, at, ins, {})
    for k = 1, 40 do
      for j, i in ipairs({ 1, 3, 4 }) do bitwise(ins[4 * (k - 1) + i], ref[k][j], ("tensor %d input %d"):format(k, i)) end
    end
  end)

  it("packed attention with T 6000: row blocks accumulate into the three parts of one dqkv", function()
    kit.seed(14)
    compare("attention", { causal = true, scale = 0, heads = 1 }, { { shape = { 1, 6000, 6 } } }, { grad = true, tol = 1e-4 })
  end)

  it("accounts kernel workspace (attention scores) as workspace, under the memory limit", function()
    kit.seed(13)
    local B, H, T, D = 2, 2, 300, 16
    local q = C.to_device(C.from_table(kit.values({ B, H, T, D }), { B, H, T, D }, "float32"), DEV)
    remat.memory.reset_peak(DEV)
    local before = remat.memory.stats(DEV)
    local y = op("attention", { causal = true, scale = 0 }, q, q, q)
    remat.cuda.synchronize()
    local s = remat.memory.stats(DEV)
    assert.is_true(s.peak_by_category.workspace >= T * 4, "no workspace was accounted")
    assert.are.equal(before.by_category.workspace, s.by_category.workspace) -- all given back
    C.free(y)
    remat.memory.limit(s.live + B * H * T * D * 4 + 4096, DEV) -- room for y, not for the scores
    local ok, err = pcall(op, "attention", { causal = true, scale = 0 }, q, q, q)
    remat.memory.limit(nil, DEV)
    assert(not ok and tostring(err):find("workspace", 1, true), tostring(err))
  end)

  it("layernorm keeps float32 statistics for bfloat16 rows (a bf16 mean would shift the row)", function()
    -- bf16-exact values around 1000 (spacing 4): mean 1002 is not a bfloat16
    local v = { 996, 1000, 1004, 1008 }
    local x = cast(C.to_device(C.from_table(v, { 1, 4 }, "float32"), DEV), "bfloat16")
    local y = values(op("layernorm", { eps = 0 }, x))
    local sd = math.sqrt(20) -- population std of the row (deviations -6, -2, 2, 6)
    for i = 1, 4 do
      local want = (v[i] - 1002) / sd
      assert(math.abs(y[i] - want) <= 0.02 * math.max(1, math.abs(want)), ("y[%d] = %g, expected %g"):format(i, y[i], want))
    end
    -- and its gradient through the float32 statistics matches the float32 CPU one
    local xc = C.from_table(v, { 1, 4 }, "float32")
    C.requires_grad(x, true)
    C.requires_grad(xc, true)
    local w = { 0.5, -1, 2, 0.25 }
    C.backward(op("layernorm", { eps = 1e-5 }, x), cast(C.to_device(C.from_table(w, { 1, 4 }, "float32"), DEV), "bfloat16"))
    C.backward(op("layernorm", { eps = 1e-5 }, xc), C.from_table(w, { 1, 4 }, "float32"))
    close(C.grad(x), C.grad(xc), 4e-2, "bf16 layernorm grad")
  end)

  it("argmax of bfloat16 gives float32 indices, exact past 256 classes", function()
    local v = {}
    for i = 1, 600 do v[i] = 0 end
    v[301] = 5
    local x = cast(C.to_device(C.from_table(v, { 1, 600 }, "float32"), DEV), "bfloat16")
    local i = op("argmax", { dim = 1, keepdim = false }, x)
    local _, dt = C.info(i)
    assert.equal("float32", dt)
    assert.equal(301, values(i)[1])
    local _, mi = op("max", { dim = 1, keepdim = false }, x)
    assert.equal("float32", select(2, C.info(mi)))
    assert.equal(301, values(mi)[1])
  end)

  it("float64 -> bfloat16 casts round once", function()
    local v = 1 + 2 ^ -8 + 2 ^ -30 -- just above a bf16 tie: rounds up; through float32 it ties to even (1)
    local t = C.to_device(C.from_table({ v, -v }, { 2 }, "float64"), DEV)
    local r = values(cast(t, "bfloat16"))
    assert.equal(1 + 2 ^ -7, r[1])
    assert.equal(-(1 + 2 ^ -7), r[2])
  end)

  it("index_add, scatter_add and the embedding gradient accumulate bfloat16 in float32", function()
    local n = 512 -- 512 additions of 1: in bfloat16 the sum sticks at 256
    local ones, at1 = {}, {}
    for i = 1, n do ones[i] = 1; at1[i] = 1 end
    local src = cast(C.to_device(C.from_table(ones, { n, 1 }, "float32"), DEV), "bfloat16")
    local idx = C.to_device(C.from_table(at1, { n }, "float32"), DEV)
    assert.equal(n, values(op("index_add", { dim = 0, size = 3 }, src, idx))[1])
    local src2 = cast(C.to_device(C.from_table(ones, { 1, n }, "float32"), DEV), "bfloat16")
    local idx2 = C.to_device(C.from_table(at1, { 1, n }, "float32"), DEV)
    assert.equal(n, values(op("scatter_add", { dim = 1, shape = { 1, 2 } }, src2, idx2))[1])
    local w = cast(C.to_device(C.from_table({ 0, 0, 0, 0 }, { 2, 2 }, "float32"), DEV), "bfloat16")
    C.requires_grad(w, true)
    local e = op("embedding", nil, w, C.to_device(C.from_table(at1, { n }, "float32"), DEV))
    C.backward(op("sum", { dim = ALL, keepdim = false }, e))
    assert.same({ n, n, 0, 0 }, values(C.grad(w)))
  end)

  it("index_add sums every target's run in source order (many targets, repeats, two slices)", function()
    kit.seed(13)
    local idx = {}
    for i = 1, 300 do idx[i] = (i * 37) % 23 + 1 end
    compare("index_add", { dim = 1, size = 23 }, { { shape = { 2, 300, 5 } }, { shape = { 300 }, vals = idx, grad = false, index = true } })
  end)

  it("a bfloat16 parameter trains through a float32 master: updates below half an ulp accumulate", function()
    local optim = remat.optim
    local p = cast(C.to_device(C.from_table({ 1, 1, 1 }, { 3 }, "float32"), DEV), "bfloat16")
    C.requires_grad(p, true)
    local opt = optim.AdamW({ p }, { lr = 1e-3, weight_decay = 0 })
    for _ = 1, 20 do
      C.set_grad(p, cast(C.to_device(C.from_table({ 1, 1, 1 }, { 3 }, "float32"), DEV), "bfloat16"))
      opt:step()
    end
    -- each step moves the weight by ~1e-3, below bf16's half ulp at 1 (2^-8): 20 steps ~ 0.98
    local r = values(p)
    assert(r[1] < 0.99 and r[1] > 0.97, "weight " .. r[1])
    local st = opt.state[1]
    for _, k in ipairs({ "master", "exp_avg", "exp_avg_sq" }) do assert.equal("float32", select(2, C.info(st[k]))) end
    local sgd = optim.SGD({ p }, { lr = 1e-3 })
    C.set_grad(p, cast(C.to_device(C.from_table({ 1, 1, 1 }, { 3 }, "float32"), DEV), "bfloat16"))
    sgd:step()
    assert.equal("float32", select(2, C.info(sgd.state[1].master)))
  end)

  it("REMAT_CUDA_SYNC=1 reports a bad index at the op, and REMAT_CUDA_PROFILE=1 times every op", function()
    local function run(env, code)
      local path = os.tmpname()
      local fh = assert(io.open(path, "w"))
      fh:write(code)
      fh:close()
      local f = assert(io.popen(("%s lua5.4 %s 2>&1"):format(env, path)))
      local out = f:read("a")
      f:close()
      os.remove(path)
      return out
    end
    local out = run("REMAT_CUDA_SYNC=1", [[
      local C = require("remat")._C
      local x = C.to_device(C.from_table({1, 2, 3}, {3}, "float32"), "cuda")
      local i = C.to_device(C.from_table({7}, {1}, "float32"), "cuda")
      local ok, err = pcall(C.op, C.ops.index_select, { dim = 0 }, x, i)
      print(ok and "no error at the op" or err)]])
    assert(out:find("index_select: index 7 is out of range 1..3", 1, true), out)
    out = run("REMAT_CUDA_PROFILE=1", [[
      local remat = require("remat")
      local C = remat._C
      local a = C.to_device(C.from_table({1, 2, 3, 4}, {2, 2}, "float32"), "cuda")
      for _ = 1, 3 do C.op(C.ops.matmul, nil, a, a) end
      for _, r in ipairs(remat.cuda.profile()) do print("PROF", r.name, r.calls, r.ms) end]])
    assert(out:find("PROF%s+matmul%s+3%s"), out)
    assert.is_nil(remat.cuda.profile()) -- off in this process
  end)
  it("cast round trips float32 -> bfloat16 -> float32 with bf16 rounding", function()
    local v = { 1, 1.00390625, -3.5, 1e-3, 65504 }
    local t = C.to_device(C.from_table(v, { 5 }, "float32"), DEV)
    local r = values(cast(cast(t, "bfloat16"), "float32"))
    for i = 1, #v do assert(math.abs(r[i] - v[i]) <= math.abs(v[i]) * 2 ^ -8, ("%g -> %g"):format(v[i], r[i])) end
  end)

  it("fill on cuda", function()
    local t = op("fill", { value = 2.5, dtype = F32, device = DEV_ID, shape = { 3, 1, 4 } })
    local _, _, dev = C.info(t)
    assert.equal(DEV, dev)
    for _, x in ipairs(values(t)) do assert.equal(2.5, x) end
  end)
end)

describe("cuda random: same bits as the cpu #gpu", function()
  local function draw(name, dev, seed, shape)
    C.manual_seed(seed)
    return op(name, { dtype = F32, device = dev, shape = shape })
  end

  it("rand is bit-identical (odd size)", function()
    bitwise(draw("rand", DEV_ID, 42, { 3, 37 }), draw("rand", 0, 42, { 3, 37 }), "rand")
  end)

  it("randn matches (float32 values)", function()
    close(draw("randn", DEV_ID, 42, { 1001 }), draw("randn", 0, 42, { 1001 }), 1e-6, "randn")
  end)

  it("dropout masks are bit-identical, forward and backward", function()
    local x = C.from_table(kit.values({ 5, 129 }), { 5, 129 }, "float32")
    local xc = op("copy", nil, x)
    local xg = C.to_device(x, DEV)
    C.requires_grad(xc, true)
    C.requires_grad(xg, true)
    C.manual_seed(2024)
    local yc = op("dropout", { p = 0.3 }, xc)
    C.manual_seed(2024)
    local yg = op("dropout", { p = 0.3 }, xg)
    bitwise(yg, yc, "dropout")
    local w = C.from_table(kit.values({ 5, 129 }), { 5, 129 }, "float32")
    C.backward(yc, w)
    C.backward(yg, C.to_device(w, DEV))
    bitwise(C.grad(xg), C.grad(xc), "dropout grad")
  end)
end)

describe("cuda training pieces #gpu", function()
  it("gradients of a small MLP match the cpu", function()
    kit.seed(5)
    local N, D, H, K = 16, 12, 32, 5
    local host = {
      x = C.from_table(kit.values({ N, D }), { N, D }, "float32"),
      w1 = C.from_table(kit.values({ H, D }, -0.3, 0.3), { H, D }, "float32"),
      b1 = C.from_table(kit.values({ H }, -0.1, 0.1), { H }, "float32"),
      w2 = C.from_table(kit.values({ K, H }, -0.3, 0.3), { K, H }, "float32"),
      b2 = C.from_table(kit.values({ K }, -0.1, 0.1), { K }, "float32"),
      y = C.from_table(labels(N, K), { N }, "float32"),
    }
    local function run(dev)
      local p = {}
      for k, t in pairs(host) do
        p[k] = dev == "cpu" and op("copy", nil, t) or C.to_device(t, dev)
        if k:sub(1, 1) == "w" or k:sub(1, 1) == "b" then C.requires_grad(p[k], true) end
      end
      local h = op("gelu", nil, op("linear", nil, p.x, p.w1, p.b1))
      local h2 = op("layernorm", { eps = 1e-5 }, h)
      local loss = op("cross_entropy", nil, op("linear", nil, h2, p.w2, p.b2), p.y)
      C.backward(loss)
      return loss, p
    end
    local lc, pc = run("cpu")
    local lg, pg = run(DEV)
    close(lg, lc, 1e-5, "loss")
    for _, k in ipairs({ "w1", "b1", "w2", "b2" }) do close(C.grad(pg[k]), C.grad(pc[k]), 1e-4, "grad " .. k) end
  end)

  it("checkpoint policies give the same gradients as none() on cuda (bitwise: kernels are deterministic)", function()
    local nn, policy = remat.nn, remat.policy
    if not (nn and nn.Sequential and policy and policy.every) then
      pending("remat.nn / remat.policy are not available in this build")
      return
    end
    local function grads(pol)
      remat.manual_seed(3)
      local layers = {}
      for i = 1, 6 do layers[#layers + 1] = nn.Linear(16, 16); layers[#layers + 1] = nn.GELU() end
      local model = nn.Sequential(layers):to(DEV)
      if pol then model:checkpoint(pol) end
      remat.manual_seed(4)
      local x = remat.randn(8, 16):to(DEV)
      local out = model(x)
      out:sum():backward()
      local g = {}
      for _, p in ipairs(model:parameters()) do g[#g + 1] = p.grad end
      return g
    end
    local base = grads(nil)
    for _, pol in ipairs({ policy.every(2), policy.sqrt(), policy.selective { "gelu" } }) do
      local g = grads(pol)
      for i = 1, #base do bitwise(g[i], base[i], "grad " .. i) end
    end
  end)

  it("memory on cuda is accounted and the cache can be emptied", function()
    local before = C.memory_stats(DEV)
    local t = op("fill", { value = 1, dtype = F32, device = DEV_ID, shape = { 1024, 1024 } })
    local mid = C.memory_stats(DEV)
    assert(mid.live >= before.live + 4 * 1024 * 1024, "live bytes did not grow")
    C.free(t)
    local after = C.memory_stats(DEV)
    assert.equal(before.live, after.live)
    if remat.cuda.empty_cache then remat.cuda.empty_cache() end
  end)
end)
