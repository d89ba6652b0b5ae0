-- remat.nn: built-in layers (C), Sequential, Lua-defined modules, losses, and the
-- methods every module has. Methods live in nn.Module (other files add more, e.g.
-- :checkpoint and :plan), looked up after a module's own fields.
local remat = package.loaded.remat
local C = remat._C
local nn = {}
remat.nn = nn

local Module = C.Module
nn.Module = Module
local module_mt = C.Module_mt

local function is_module(v) return getmetatable(v) == module_mt end
local is_tensor = remat.is_tensor
nn.is_module = is_module

-- Built-in layers: nn.Linear(in, out [, bias]), nn.Embedding(n, d),
-- nn.LayerNorm(d [, eps = 1e-5 [, affine = true]]), nn.RMSNorm(d [, eps = 1e-6]),
-- nn.GELU(), nn.ReLU(), nn.SiLU(), nn.Dropout([p = 0.5]), nn.Softmax([dim = -1]),
-- nn.CausalSelfAttention(d, heads [, dropout]), nn.MLP(d [, hidden = 4d [, dropout]]),
-- nn.TransformerBlock(d, heads [, dropout]), nn.Residual(m).
-- CausalSelfAttention and TransformerBlock take a 5th argument {fused = true|false}:
-- true runs the fused "attention" op (no T x T matrix kept; needs dropout 0), false the
-- composed ops (matmul, softmax with its scale and causal mask, dropout, matmul); unset:
-- fused, or composed while training with dropout.
for _, kind in ipairs { "Linear", "Embedding", "LayerNorm", "RMSNorm", "GELU", "ReLU", "SiLU",
                        "Dropout", "Softmax", "CausalSelfAttention", "MLP", "TransformerBlock",
                        "Residual" } do
  nn[kind] = function(...) return C.nn_new(kind, ...) end
end

-- nn.Sequential{ m1, m2, ... } (or nn.Sequential() and :add).
function nn.Sequential(layers)
  local s = C.nn_new("Sequential")
  if layers == nil then return s end
  if type(layers) ~= "table" or is_module(layers) then
    error("nn.Sequential: expected a list of modules, got " .. (is_module(layers) and "a module" or type(layers)), 2)
  end
  local n = #layers
  for k in pairs(layers) do
    if math.type(k) ~= "integer" or k < 1 or k > n then
      error("nn.Sequential: expected a list of modules; key " .. tostring(k) .. " is not a position", 2)
    end
  end
  for i = 1, n do
    if not is_module(layers[i]) then
      error(("nn.Sequential: element %d is a %s, not a module"):format(i, type(layers[i])), 2)
    end
    C.module_add(s, layers[i])
  end
  return s
end

-- nn.module{ forward = function(self, x) ... end, ... }: a module written in Lua,
-- usable anywhere a built-in is (inside Sequential too; the C forward calls back).
-- Fields of the table become fields of the module, except: modules become children
-- (named by their key), and tensors that require grad become parameters (copied into
-- parameter memory; read them back as self.<key>). More parameters: self:param(name, t).
-- The input tensor handed to forward is freed when forward returns: do not keep it.
function nn.module(def)
  if type(def) ~= "table" or is_module(def) then
    error("nn.module: expected a table with a forward function, got " .. type(def), 2)
  end
  if type(def.forward) ~= "function" then
    error("nn.module: the table needs a forward function (forward = function(self, x) ... end)", 2)
  end
  local fields, mods, params = {}, {}, {}
  for k, v in pairs(def) do
    if is_module(v) then mods[#mods + 1] = k
    elseif is_tensor(v) and C.requires_grad(v) then params[#params + 1] = k
    else fields[k] = v end
  end
  for _, list in ipairs { mods, params } do
    for _, k in ipairs(list) do
      if type(k) ~= "string" then error("nn.module: module and parameter fields need string keys", 2) end
    end
    table.sort(list)
  end
  local m = C.nn_module(fields)
  for _, k in ipairs(params) do C.module_param(m, k, def[k]) end
  for _, k in ipairs(mods) do C.module_add(m, def[k], k) end
  return m
end

-- ---- methods ----

function Module:forward(x) return C.module_forward(self, x) end

-- Appends a layer to a Sequential; returns self.
function Module:add(m)
  local kind = C.module_info(self)
  if kind ~= "Sequential" then error("add: only a Sequential takes layers (this is a " .. kind .. ")", 2) end
  if not is_module(m) then error("add: expected a module, got " .. type(m), 2) end
  C.module_add(self, m)
  return self
end

-- Registers a named child module (for Lua-defined modules); returns the child.
function Module:add_module(name, m)
  if type(name) ~= "string" then error("add_module: the name must be a string", 2) end
  if not is_module(m) then error("add_module: expected a module, got " .. type(m), 2) end
  C.module_add(self, m, name)
  return m
end

-- Registers a parameter: a copy of t's values (category param, requires grad).
-- Returns the parameter tensor, also readable as self[name].
function Module:param(name, t)
  if type(name) ~= "string" then error("param: the name must be a string", 2) end
  return C.module_param(self, name, t)
end

function Module:named_parameters() return C.module_params(self) end

function Module:parameters()
  local out = {}
  for i, p in ipairs(C.module_params(self)) do out[i] = p[2] end
  return out
end

function Module:num_parameters() local _, _, _, _, n = C.module_info(self) return n end

function Module:children()
  local out = {}
  for i, c in ipairs(C.module_children(self)) do out[i] = c[2] end
  return out
end

function Module:train(flag)
  C.module_train(self, flag ~= false)
  return self
end

function Module:eval() return self:train(false) end

function Module:is_training() local _, _, _, _, _, t = C.module_info(self) return t end

function Module:zero_grad() C.module_zero_grad(self) end

-- model:to("cuda" | "cpu" | "float64" | "float32"): replaces every parameter by a
-- converted copy (gradients are dropped); returns self.
function Module:to(what)
  if type(what) ~= "string" then error("to: expected a device or dtype name, got " .. type(what), 2) end
  return C.module_to(self, what)
end

function Module:type_name() return (C.module_info(self)) end

-- { type =, description =, children =, params = (own elements), total_params = }
function Module:info()
  local kind, desc, nch, own, total, training = C.module_info(self)
  return { type = kind, description = desc, children = nch, params = own, total_params = total,
           training = training }
end

-- Buffers: tensors a Lua module keeps besides its parameters (BatchNorm's running
-- statistics), named by its `buffers` field (a list of field names); state_dict and
-- load_state_dict carry them with the parameters. -> { {name, tensor}, ... }, named as
-- parameters are ("2.running_mean").
function Module:named_buffers()
  local out = {}
  local function walk(m, prefix)
    if C.module_info(m) == "Lua" then
      local names = m.buffers
      if type(names) == "table" then
        for _, b in ipairs(names) do
          local t = m[b]
          if is_tensor(t) then out[#out + 1] = { prefix .. b, t } end
        end
      end
    end
    for i, c in ipairs(C.module_children(m)) do
      walk(c[2], prefix .. (c[1] ~= "" and c[1] or tostring(i)) .. ".")
    end
  end
  walk(self, "")
  return out
end

-- name -> tensor: the parameters and the buffers.
function Module:state_dict()
  local sd = {}
  for _, p in ipairs(C.module_params(self)) do sd[p[1]] = p[2] end
  for _, b in ipairs(self:named_buffers()) do sd[b[1]] = b[2] end
  return sd
end

local function shape_str(t)
  local s = C.info(t)
  return #s == 0 and "scalar" or table.concat(s, "x")
end

-- Copies the values of sd (name -> tensor) into the parameters and buffers. Every key
-- must match a parameter or buffer of the same size; otherwise nothing is copied and the error lists the
-- missing keys, unexpected keys and size mismatches.
function Module:load_state_dict(sd)
  if type(sd) ~= "table" then error("load_state_dict: expected a table of tensors, got " .. type(sd), 2) end
  local params, seen = C.module_params(self), {}
  for _, b in ipairs(self:named_buffers()) do params[#params + 1] = b end
  local missing, wrong, unexpected = {}, {}, {}
  for _, p in ipairs(params) do
    local name, t = p[1], p[2]
    seen[name] = true
    local v = sd[name]
    if v == nil then
      missing[#missing + 1] = name
    elseif not is_tensor(v) then
      wrong[#wrong + 1] = ("%s (a %s, not a tensor)"):format(name, type(v))
    elseif shape_str(v) ~= shape_str(t) then
      wrong[#wrong + 1] = ("%s (got %s, expected %s)"):format(name, shape_str(v), shape_str(t))
    end
  end
  for k in pairs(sd) do
    if not seen[k] then unexpected[#unexpected + 1] = tostring(k) end
  end
  table.sort(unexpected)
  if #missing + #wrong + #unexpected > 0 then
    local parts = {}
    if #missing > 0 then parts[#parts + 1] = "missing keys: " .. table.concat(missing, ", ") end
    if #unexpected > 0 then parts[#parts + 1] = "unexpected keys: " .. table.concat(unexpected, ", ") end
    if #wrong > 0 then parts[#parts + 1] = "wrong sizes: " .. table.concat(wrong, ", ") end
    error("load_state_dict: " .. table.concat(parts, "; "), 2)
  end
  for _, p in ipairs(params) do C.copy_values(p[2], sd[p[1]]) end
  return self
end

-- ---- printing ----

local function commas(n)
  local s = tostring(n)
  local out = s:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (out:gsub("^,", ""))
end

local function label(m)
  local kind, desc = C.module_info(m)
  if kind == "Lua" then
    local f = m.name
    if type(f) ~= "string" then return "Lua()" end
    return f:find("(", 1, true) and f or f .. "()"
  end
  return desc
end

local function is_container(m)
  local kind = C.module_info(m)
  return kind == "Sequential" or kind == "Lua"
end

-- Lists the layers (containers inside are expanded) with parameter counts and a total.
local function describe(m)
  local kind, _, _, _, total = C.module_info(m)
  local rows = {}
  local function walk(mod, indent)
    for i, c in ipairs(C.module_children(mod)) do
      local name, child = c[1], c[2]
      local _, _, _, _, n = C.module_info(child)
      rows[#rows + 1] = { ("%s(%s) %s"):format(indent, name ~= "" and name or tostring(i), label(child)), n }
      if is_container(child) then walk(child, indent .. "  ") end
    end
  end
  walk(m, "  ")
  local width = 0
  for _, r in ipairs(rows) do width = math.max(width, #r[1]) end
  local lines = { ("%s (%s parameters)"):format(kind == "Sequential" and "Sequential" or label(m), commas(total)) }
  for _, r in ipairs(rows) do
    lines[#lines + 1] = ("%-" .. width .. "s  %12s"):format(r[1], commas(r[2]))
  end
  if #rows > 0 then lines[#lines + 1] = ("%-" .. width .. "s  %12s"):format("  total", commas(total)) end
  return table.concat(lines, "\n")
end

module_mt.__tostring = describe

-- The name plans and policies show for layer i of a Sequential: a Lua module's own
-- `name` field (nn.Conv2d and the other layers of remat.layers set one), else desc.
function nn.layer_name(seq, i, desc)
  if desc == "Lua()" then
    local n = seq[i].name
    if type(n) == "string" then return n end
  end
  return desc
end
nn.describe = describe

-- ---- losses ----

-- Mean cross entropy of logits (N, C) against 1-based labels (N); (B, T, C) logits
-- with (B, T) labels are flattened.
function nn.cross_entropy(logits, labels) return C.nn_loss("cross_entropy", logits, labels) end

-- Mean squared error.
function nn.mse(pred, target) return C.nn_loss("mse", pred, target) end

return nn
