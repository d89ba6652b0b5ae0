-- remat.optim: SGD, Adam, AdamW and RMSprop with PyTorch's semantics and defaults (torch.optim,
-- single-tensor path), gradient clipping, and learning-rate schedules.
--
--   local opt = optim.AdamW(model:parameters(), { lr = 1e-3, weight_decay = 0.01 })
--   loss:backward(); optim.clip_grad_norm(model:parameters(), 1.0); opt:step(); opt:zero_grad()
--
-- Each step runs one fused kernel per parameter in place (sgd_step / rmsprop_step through
-- C.op_into, see core/op_optim.c); Adam and AdamW run one adamw_multi_step per group of up
-- to 64 parameters (one launch on CUDA), the same bits as adamw_step on each. State tensors (momentum buffers, Adam's m and v) are
-- made at a parameter's first step, in the memory category "optim".
local remat = package.loaded.remat
local C = remat._C
local optim = {}
remat.optim = optim

local DIM_ALL = math.mininteger

-- Raises msg located at the first caller outside remat's own Lua code.
local fail = remat._fail

local is_tensor = remat.is_tensor

local function describe(v)
  if is_tensor(v) then return "a tensor" end
  if v == nil then return "nothing" end
  return type(v) .. " " .. tostring(v)
end

-- The list of parameters, checked: a non-empty list of live tensors, no duplicates.
local function check_params(fn, params)
  if type(params) ~= "table" or is_tensor(params) then
    fail(("%s: params must be a list of tensors (model:parameters()), got %s"):format(fn, describe(params)))
  end
  local n = #params
  for k in pairs(params) do
    if math.type(k) ~= "integer" or k < 1 or k > n then
      fail(("%s: params must be a list of tensors; key %s is not a position"):format(fn, tostring(k)))
    end
  end
  if n == 0 then fail(fn .. ": params is an empty list") end
  local list, seen = {}, {}
  for i = 1, n do
    local p = params[i]
    if not is_tensor(p) then fail(("%s: params[%d] is %s, not a tensor"):format(fn, i, describe(p))) end
    if C.is_freed(p) then fail(("%s: params[%d] was freed"):format(fn, i)) end
    local id = C.tensor_id(p)
    if seen[id] then fail(("%s: params[%d] appears twice in the list"):format(fn, i)) end
    seen[id] = true
    list[i] = p
  end
  return list
end

-- Options: defaults filled, unknown keys and bad values rejected with clear messages.
local function check_number(fn, o, key, lo, lo_open, hi_open)
  local v = o[key]
  if type(v) ~= "number" or v ~= v then fail(("%s: %s must be a number, got %s"):format(fn, key, describe(v))) end
  if lo and (v < lo or (lo_open and v == lo)) then
    fail(("%s: invalid %s %s (must be %s %s)"):format(fn, key, tostring(v), lo_open and ">" or ">=", tostring(lo)))
  end
  if hi_open and v >= hi_open then
    fail(("%s: invalid %s %s (must be < %s)"):format(fn, key, tostring(v), tostring(hi_open)))
  end
  return v
end

local function read_opts(fn, opts, defaults, known)
  if opts == nil then opts = {} end
  if type(opts) ~= "table" then fail(("%s: options must be a table, got %s"):format(fn, describe(opts))) end
  local o = {}
  for k, v in pairs(opts) do
    if defaults[k] == nil and not (known and known[k]) then
      local names = {}
      for name in pairs(defaults) do names[#names + 1] = name end
      table.sort(names)
      fail(("%s: unknown option '%s' (known: %s)"):format(fn, tostring(k), table.concat(names, ", ")))
    end
    o[k] = v
  end
  for k, v in pairs(defaults) do if o[k] == nil then o[k] = v end end
  return o
end

local function check_betas(fn, betas)
  if type(betas) ~= "table" or #betas ~= 2 then
    fail(("%s: betas must be a table of two numbers such as {0.9, 0.999}, got %s"):format(fn, describe(betas)))
  end
  for i = 1, 2 do
    local b = betas[i]
    if type(b) ~= "number" or not (b >= 0 and b < 1) then
      fail(("%s: invalid beta %d: %s (must be in [0, 1))"):format(fn, i, describe(b)))
    end
  end
  return { betas[1], betas[2] }
end

---------------------------------------------------------------- the optimizer base ----

local Optimizer = {}
Optimizer.__index = Optimizer
optim.Optimizer = Optimizer

Optimizer.__tostring = function(o)
  local keys = {}
  for _, k in ipairs(o.hyper) do
    local v = o[k]
    if type(v) == "table" then v = "{" .. table.concat(v, ", ") .. "}" end
    keys[#keys + 1] = ("%s = %s"):format(k, tostring(v))
  end
  return ("%s(%d parameters; %s)"):format(o.kind, #o.params, table.concat(keys, ", "))
end

-- Which optimizer updates a parameter (keyed by C.tensor_id; the latest made wins):
-- the whole-step planner asks it what an optimizer step adds, and the fused hook finds
-- the optimizer to run. Weak values: a dropped optimizer stops counting.
local owner = setmetatable({}, { __mode = "v" })

local function new(kind, params, o, hyper)
  local in_backward = o.in_backward
  if in_backward ~= nil and type(in_backward) ~= "boolean" then
    fail(("optim.%s: in_backward must be a boolean, got %s"):format(kind, describe(in_backward)))
  end
  o.in_backward = in_backward or false
  o.kind, o.params, o.state, o.hyper, o.steps = kind, params, {}, hyper, 0
  o.index = {}
  for i, p in ipairs(params) do o.index[C.tensor_id(p)] = i end
  return setmetatable(o, Optimizer)
end

-- Registers opt as the owner of its parameters (once its update functions exist).
local function register(o)
  for _, p in ipairs(o.params) do owner[C.tensor_id(p)] = o end
  if o.in_backward then
    -- state made now, so that backward only updates and the planner sees it live
    if o._prepare then
      for i, p in ipairs(o.params) do o:_prepare(i, p) end
    end
    optim._install_fused()
  end
  return o
end

-- The optimizer that updates parameter p, or nil.
function optim.owner_of(p) return owner[C.tensor_id(p)] end

-- Bytes of p's elements at dtype (p's own when nil).
local function nbytes(p, dtype)
  local shape, pdtype = C.info(p)
  dtype = dtype or pdtype
  local n = dtype == "float64" and 8 or (dtype == "float32" and 4 or 2)
  for _, d in ipairs(shape) do n = n * d end
  return n
end

-- Bytes an opt:step() adds to what lives when backward ends: state not made yet (made
-- at a parameter's first update: buffers, and a bfloat16 parameter's float32 master)
-- and temporaries (none: updates run in place, and gradients are contiguous). 0 for an
-- optimizer fused into backward (its state is made with it).
function Optimizer:step_bytes()
  if self.in_backward then return 0 end
  local n = 0
  for i, p in ipairs(self.params) do n = n + self:_missing_bytes(i, p) end
  return n
end

-- Mixed precision: a bfloat16 parameter trains through a float32 master copy, with
-- float32 optimizer state (as mixed-precision training does everywhere): the fused step
-- updates the master from the bfloat16 gradient, and the master, rounded, is cast back
-- into the parameter. The switch is the model's dtype: model:to("bfloat16") computes in
-- bfloat16, and every optimizer keeps float32 masters for it. Stepping the bfloat16
-- weights themselves would drop every update below half an ulp (2^-9 of the weight).
local F32_ID, F64_ID, BF16_ID = 0, 1, 2
local function low_precision(p) return select(2, C.info(p)) == "bfloat16" end

-- Zeros like p (float32 for a bfloat16 p, or dtype), allocated in the category "optim".
local function state_tensor(p, dtype)
  local shape, pdtype, device = C.info(p)
  if not dtype then dtype = pdtype == "bfloat16" and "float32" or pdtype end
  return C.scoped("optim", nil, C.full, shape, 0, dtype, device)
end

-- The tensor an update steps: p itself, or its float32 master (made at the first step,
-- kept in st.master, category "optim").
local function master_of(st, p)
  if not low_precision(p) then return p end
  if not st.master then
    st.master = C.scoped("optim", false, C.op, C.ops.cast, { dtype = F32_ID }, p)
  end
  return st.master
end

-- After an update of a master: the rounded master back into the bfloat16 parameter.
local function store_master(p, w)
  if w ~= p then C.op_into(C.ops.cast, { dtype = BF16_ID }, { w }, { p }) end
end

-- The gradient of p as a contiguous tensor the caller frees, or nil when p has none.
local function grad_of(p)
  local g = C.grad(p)
  if g and not C.is_contiguous(g) then
    local c = C.op(C.ops.copy, nil, g)
    C.free(g)
    g = c
  end
  return g
end

-- Clears the gradients of the parameters (PyTorch's default: set to none).
function Optimizer:zero_grad()
  for _, p in ipairs(self.params) do C.set_grad(p, nil) end
end

-- Checks the hyperparameters that may have been changed since construction.
function Optimizer:check()
  local fn = "optim." .. self.kind
  check_number(fn, self, "lr", 0)
  return self
end

-- One update of every parameter that has a gradient (with in_backward: nothing, the
-- updates ran during backward; the hyperparameters are checked). Atomic: what the step allocates
-- (contiguous gradients, state made at a parameter's first step) comes first, so that
-- running out of memory leaves parameters, state and step counts as they were and a
-- retry applies each update once.
function Optimizer:step()
  if getmetatable(self) ~= Optimizer then fail("opt:step: call it with a colon (opt:step()), got " .. describe(self)) end
  self:check()
  if self.in_backward then return end -- the updates ran during backward
  local todo, fresh = {}, {}
  local ok, err = pcall(function()
    for i, p in ipairs(self.params) do
      local g = grad_of(p)
      if g then
        todo[#todo + 1] = { i, p, g }
        if self._prepare and self:_prepare(i, p) then fresh[#fresh + 1] = i end
      end
    end
  end)
  if not ok then
    for _, u in ipairs(todo) do C.free(u[3]) end
    for _, i in ipairs(fresh) do
      for _, v in pairs(self.state[i]) do if is_tensor(v) then C.free(v) end end
      self.state[i] = nil
    end
    error(err, 0)
  end
  self.steps = self.steps + 1
  if self._update_many then
    ok, err = pcall(self._update_many, self, todo)
    for _, u in ipairs(todo) do C.free(u[3]) end
    if not ok then error(err, 0) end
    return
  end
  for k, u in ipairs(todo) do
    ok, err = pcall(self._update, self, u[1], u[2], u[3])
    C.free(u[3])
    if not ok then
      for q = k + 1, #todo do C.free(todo[q][3]) end
      error(err, 0)
    end
  end
end

-- The state as a flat table of tensors ("<i>.<name>", i the parameter's position) and
-- metadata (hyperparameters and step counts, as strings), the shapes remat.save takes:
--   remat.save(path, opt:state_dict()); opt:load_state_dict(remat.load(path))
function Optimizer:state_dict()
  local tensors, meta = {}, { kind = self.kind, steps = tostring(self.steps) }
  for _, k in ipairs(self.hyper) do
    local v = self[k]
    meta[k] = type(v) == "table" and table.concat(v, ",") or tostring(v)
  end
  for i, st in pairs(self.state) do
    for name, v in pairs(st) do
      if is_tensor(v) then tensors[i .. "." .. name] = v
      else meta[i .. "." .. name] = tostring(v) end
    end
  end
  return tensors, meta
end

local function parse_value(s)
  if s == "true" then return true elseif s == "false" then return false end
  if s:find(",") then
    local t = {}
    for x in s:gmatch("[^,]+") do t[#t + 1] = tonumber(x) end
    return t
  end
  return tonumber(s) or s
end

-- Restores what state_dict gave (the tensors are copied into fresh "optim" tensors).
function Optimizer:load_state_dict(tensors, meta)
  local fn = "load_state_dict"
  if type(tensors) ~= "table" then fail(fn .. ": expected the tensors of a state_dict, got " .. describe(tensors)) end
  if type(meta) ~= "table" then fail(fn .. ": expected the metadata of a state_dict as the second argument") end
  if meta.kind ~= self.kind then
    fail(("%s: the state is of a %s, this optimizer is a %s"):format(fn, tostring(meta.kind), self.kind))
  end
  local state = {}
  local function slot(i)
    i = math.tointeger(tonumber(i))
    if not i or i < 1 or i > #self.params then fail(fn .. ": the state names a parameter that does not exist") end
    state[i] = state[i] or {}
    return i
  end
  for key, t in pairs(tensors) do
    local i, name = tostring(key):match("^(%d+)%.(.+)$")
    if not i then fail(("%s: unexpected key '%s'"):format(fn, tostring(key))) end
    if not is_tensor(t) then fail(("%s: %s is %s, not a tensor"):format(fn, key, describe(t))) end
    if C.is_freed(t) then fail(("%s: the tensor of %s was freed"):format(fn, key)) end
    i = slot(i)
    local p = self.params[i]
    local ps, ts = C.info(p), C.info(t)
    if table.concat(ps, "x") ~= table.concat(ts, "x") then
      fail(("%s: %s has size %s but parameter %d has size %s"):format(fn, key, table.concat(ts, "x"), i,
        table.concat(ps, "x")))
    end
    local s = state_tensor(p, select(2, C.info(t)))
    C.copy_values(s, t)
    state[i][name] = s
  end
  for key, v in pairs(meta) do
    local i, name = tostring(key):match("^(%d+)%.(.+)$")
    if i then state[slot(i)][name] = parse_value(v) end
  end
  -- a parameter's state is all there or absent (never stepped): a partial one would
  -- fail inside the next step
  for i, st in pairs(state) do
    for _, k in ipairs(self:_state_keys()) do
      local want = k == "step" and "number" or "tensor"
      local v = st[k]
      if v == nil then fail(("%s: the state of parameter %d lacks '%d.%s'"):format(fn, i, i, k)) end
      if (want == "number") ~= (type(v) == "number") or (want == "number" and (v < 0 or v ~= math.floor(v))) then
        fail(("%s: '%d.%s' must be %s, got %s"):format(fn, i, k, want == "number" and "a step count" or "a tensor", describe(v)))
      end
    end
  end
  for _, k in ipairs(self.hyper) do
    if meta[k] ~= nil then self[k] = parse_value(meta[k]) end
  end
  self.steps = tonumber(meta.steps) or self.steps
  self.state = state
  return self
end

---------------------------------------------------------------- SGD ----

-- optim.SGD(params, {lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false})
function optim.SGD(params, opts)
  local fn = "optim.SGD"
  params = check_params(fn, params)
  local o = read_opts(fn, opts, { lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false },
    { in_backward = true })
  check_number(fn, o, "lr", 0)
  check_number(fn, o, "momentum", 0)
  check_number(fn, o, "dampening")
  check_number(fn, o, "weight_decay", 0)
  if type(o.nesterov) ~= "boolean" then fail(fn .. ": nesterov must be a boolean, got " .. describe(o.nesterov)) end
  if o.nesterov and (o.momentum <= 0 or o.dampening ~= 0) then
    fail(fn .. ": nesterov momentum requires a momentum and zero dampening")
  end
  local self = new("SGD", params, o, { "lr", "momentum", "dampening", "weight_decay", "nesterov" })
  self._state_keys = function(s) return s.momentum == 0 and {} or { "momentum_buffer" } end
  -- makes the momentum buffer at a parameter's first step; true when it did
  self._prepare = function(s, i, p)
    local st = s.state[i]
    if s.momentum == 0 or (st and st.momentum_buffer) then return false end
    if st then -- master weights only: a buffer added to it stays harmless if the step fails
      st.momentum_buffer, st.first = state_tensor(p), true
      return false
    end
    s.state[i] = { momentum_buffer = state_tensor(p), first = true }
    return true
  end
  self._update = function(s, i, p, g)
    local st = s.state[i]
    local attrs = { lr = s.lr, momentum = s.momentum, weight_decay = s.weight_decay, dampening = s.dampening,
                    nesterov = s.nesterov and true or false, first = false }
    if not st and low_precision(p) then
      st = {}
      s.state[i] = st
    end
    local w = st and master_of(st, p) or p
    if s.momentum == 0 then
      C.op_into(C.ops.sgd_step, attrs, { w, g, w }, { w, w })
      store_master(p, w)
      return
    end
    if st.first then attrs.first, st.first = true, nil end
    local b = st.momentum_buffer
    C.op_into(C.ops.sgd_step, attrs, { w, g, b }, { w, b })
    store_master(p, w)
  end
  self._missing_bytes = function(s, i, p)
    local st = s.state[i] or {}
    local f32 = low_precision(p) and "float32" or nil
    local n = 0
    if s.momentum ~= 0 and not st.momentum_buffer then n = n + nbytes(p, f32) end
    if f32 and not st.master then n = n + nbytes(p, f32) end
    return n
  end
  return register(self)
end

---------------------------------------------------------------- Adam / AdamW ----

local MULTI_MAX = 64 -- tensors per adamw_multi_step (its inputs: 4 per tensor, 256 at most)

local function adam(kind, decoupled, default_wd)
  local fn = "optim." .. kind
  return function(params, opts)
    params = check_params(fn, params)
    local o = read_opts(fn, opts, { lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = default_wd },
      { amsgrad = true, in_backward = true })
    if o.amsgrad then fail(fn .. ": amsgrad is not supported") end
    o.amsgrad = nil
    check_number(fn, o, "lr", 0)
    check_number(fn, o, "eps", 0)
    check_number(fn, o, "weight_decay", 0)
    o.betas = check_betas(fn, o.betas)
    local self = new(kind, params, o, { "lr", "betas", "eps", "weight_decay" })
    self._state_keys = function() return { "step", "exp_avg", "exp_avg_sq" } end
    self._prepare = function(s, i, p)
      if s.state[i] then return false end
      local m = state_tensor(p)
      local ok, v = pcall(state_tensor, p)
      if not ok then C.free(m); error(v, 0) end
      s.state[i] = { step = 0, exp_avg = m, exp_avg_sq = v }
      return true
    end
    self._update = function(s, i, p, g)
      local st = s.state[i]
      st.step = st.step + 1
      local m, v = st.exp_avg, st.exp_avg_sq
      local w = master_of(st, p)
      C.op_into(C.ops.adamw_step, { lr = s.lr, beta1 = s.betas[1], beta2 = s.betas[2], eps = s.eps, step = st.step, decoupled = decoupled and true or false, weight_decay = s.weight_decay }, { w, g, m, v }, { w, m, v })
      store_master(p, w)
    end
    -- A whole step: the parameters in order, cut into groups that share the step count,
    -- the device and the dtypes (at most MULTI_MAX each), one adamw_multi_step per
    -- group: one launch for many parameters on CUDA, the same bits as _update's
    -- adamw_step per parameter (spec/cases/optim.lua).
    self._update_many = function(s, todo)
      local group, key = {}, nil
      local function flush()
        if #group == 0 then return end
        local ins = {}
        for _, u in ipairs(group) do
          ins[#ins + 1], ins[#ins + 2], ins[#ins + 3], ins[#ins + 4] = u.w, u.g, u.st.exp_avg, u.st.exp_avg_sq
        end
        C.op_into(C.ops.adamw_multi_step, { lr = s.lr, beta1 = s.betas[1], beta2 = s.betas[2], eps = s.eps, step = group[1].st.step, decoupled = decoupled and true or false, weight_decay = s.weight_decay }, ins, {})
        for _, u in ipairs(group) do store_master(u.p, u.w) end
        group = {}
      end
      for _, u in ipairs(todo) do
        local st = s.state[u[1]]
        st.step = st.step + 1
        local w = master_of(st, u[2])
        local _, wdt, dev = C.info(w)
        local _, gdt = C.info(u[3])
        local k = ("%d %s %s %s"):format(st.step, wdt, gdt, dev)
        if k ~= key or #group == MULTI_MAX then flush(); key = k end
        group[#group + 1] = { p = u[2], w = w, g = u[3], st = st }
      end
      flush()
    end
    self._missing_bytes = function(s, i, p)
      local st = s.state[i]
      local f32 = low_precision(p) and "float32" or nil
      local n = st and 0 or 2 * nbytes(p, f32)
      if f32 and not (st and st.master) then n = n + nbytes(p, f32) end
      return n
    end
    self.check = function(s)
      Optimizer.check(s)
      check_number(fn, s, "eps", 0)
      check_number(fn, s, "weight_decay", 0)
      s.betas = check_betas(fn, s.betas)
      return s
    end
    return register(self)
  end
end

-- optim.Adam(params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0}):
-- weight decay as L2 (added to the gradient).
optim.Adam = adam("Adam", false, 0)
-- optim.AdamW(params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0.01}):
-- decoupled weight decay (the parameter shrinks by lr * weight_decay).
optim.AdamW = adam("AdamW", true, 0.01)

---------------------------------------------------------------- RMSprop ----

-- optim.RMSprop(params, {lr = 1e-2, alpha = 0.99, eps = 1e-8, weight_decay = 0,
-- momentum = 0, centered = false}): torch.optim.RMSprop. Weight decay as L2 (added to
-- the gradient); state per parameter: step, square_avg, and momentum_buffer (momentum >
-- 0) and grad_avg (centered) when used.
function optim.RMSprop(params, opts)
  local fn = "optim.RMSprop"
  params = check_params(fn, params)
  local o = read_opts(fn, opts, { lr = 1e-2, alpha = 0.99, eps = 1e-8, weight_decay = 0, momentum = 0,
                                  centered = false }, { in_backward = true })
  local function check(s)
    check_number(fn, s, "lr", 0)
    check_number(fn, s, "alpha", 0)
    if s.alpha > 1 then fail(("%s: invalid alpha %s (must be in [0, 1])"):format(fn, tostring(s.alpha))) end
    check_number(fn, s, "eps", 0)
    check_number(fn, s, "weight_decay", 0)
    check_number(fn, s, "momentum", 0)
    if type(s.centered) ~= "boolean" then fail(fn .. ": centered must be a boolean, got " .. describe(s.centered)) end
    return s
  end
  check(o)
  local self = new("RMSprop", params, o, { "lr", "alpha", "eps", "weight_decay", "momentum", "centered" })
  self.check = check
  local function wanted(s)
    local keys = { "square_avg" }
    if s.momentum > 0 then keys[#keys + 1] = "momentum_buffer" end
    if s.centered then keys[#keys + 1] = "grad_avg" end
    return keys
  end
  self._state_keys = function(s)
    local keys = wanted(s)
    table.insert(keys, 1, "step")
    return keys
  end
  -- makes the state at a parameter's first step (true when it did); a buffer that a
  -- later change of momentum or centered needs is added to an existing state
  self._prepare = function(s, i, p)
    local st, fresh = s.state[i], false
    if not st then st, fresh = { step = 0 }, true end
    local made = {}
    for _, k in ipairs(wanted(s)) do
      if not st[k] then
        local ok, t = pcall(state_tensor, p)
        if not ok then
          for _, m in ipairs(made) do C.free(st[m]); st[m] = nil end
          error(t, 0)
        end
        st[k] = t
        made[#made + 1] = k
      end
    end
    s.state[i] = st
    return fresh
  end
  self._update = function(s, i, p, g)
    local st = s.state[i]
    st.step = st.step + 1
    local w = master_of(st, p)
    -- unused states: the parameter stands in (the kernel leaves an aliased one alone)
    local b = s.momentum > 0 and st.momentum_buffer or w
    local ga = s.centered and st.grad_avg or w
    C.op_into(C.ops.rmsprop_step, {
      lr = s.lr, alpha = s.alpha, eps = s.eps, momentum = s.momentum, weight_decay = s.weight_decay,
      centered = s.centered and true or false,
    }, { w, g, st.square_avg, b, ga }, { w, st.square_avg, b, ga })
    store_master(p, w)
  end
  self._missing_bytes = function(s, i, p)
    local st = s.state[i] or {}
    local f32 = low_precision(p) and "float32" or nil
    local n = 0
    for _, k in ipairs(wanted(s)) do
      if not st[k] then n = n + nbytes(p, f32) end
    end
    if f32 and not st.master then n = n + nbytes(p, f32) end
    return n
  end
  return register(self)
end

---------------------------------------------------------------- fused into backward ----

-- Called by the context's grad_ready hook (lua/loptim.c) as soon as a leaf's gradient
-- is final during backward: when a fused optimizer owns the leaf, the parameter is
-- updated and its gradient freed at once, so gradients of the whole model never
-- coexist. In a planning dry run the gradient is only freed (nothing is computed).
local function fused_dispatch(id, dry)
  local o = owner[id]
  if not o or not o.in_backward then return end
  local i = o.index[id]
  local p = o.params[i]
  if not dry then
    o:check()
    local g = grad_of(p)
    if g then
      local ok, err = pcall(function()
        if o._prepare then o:_prepare(i, p) end
        o._update(o, i, p, g)
      end)
      C.free(g)
      if not ok then C.set_grad(p, nil); error(err, 0) end
      o._updates = o._updates or {}
      o._updates[i] = (o._updates[i] or 0) + 1
      if o._updates[i] > o.steps then o.steps = o._updates[i] end
    end
  end
  C.set_grad(p, nil)
end

function optim._install_fused() C.fused_hook(fused_dispatch) end

---------------------------------------------------------------- gradient clipping ----

-- optim.clip_grad_norm(params, max_norm) -> total norm: the 2-norm of all gradients
-- together (parameters without one are skipped). When it exceeds max_norm every
-- gradient is scaled in place by max_norm / (total + 1e-6), as PyTorch's
-- clip_grad_norm_ does. A single tensor counts as a list of one.
function optim.clip_grad_norm(params, max_norm)
  local fn = "optim.clip_grad_norm"
  if is_tensor(params) then params = { params } end
  params = check_params(fn, params)
  for _, p in ipairs(params) do
    local o = owner[C.tensor_id(p)]
    if o and o.in_backward then
      fail(fn .. ": a parameter belongs to an optimizer with in_backward = true, which applies and frees each "
        .. "gradient during backward, before the norm over all of them is known; clip without in_backward")
    end
  end
  if type(max_norm) ~= "number" or not (max_norm >= 0) then
    fail(("%s: max_norm must be a number >= 0, got %s"):format(fn, describe(max_norm)))
  end
  -- One float64 running sum per device, read once at the end: one synchronisation per
  -- call, not one per parameter.
  local grads, owners, total, acc = {}, {}, 0, {}
  local ok, err = pcall(C.scoped, "temp", nil, function()
    for _, p in ipairs(params) do
      local g = grad_of(p)
      if g then
        grads[#grads + 1] = g
        owners[#grads] = p
        local _, gdt, dev = C.info(g)
        local x = gdt == "bfloat16" and C.op(C.ops.cast, { dtype = F32_ID }, g) or g
        local sq = C.op(C.ops.mul, nil, x, x)
        if x ~= g then C.free(x) end
        local s = C.op(C.ops.sum, { dim = DIM_ALL, keepdim = false }, sq)
        C.free(sq)
        local s64 = C.op(C.ops.cast, { dtype = F64_ID }, s)
        C.free(s)
        if acc[dev] then
          local t = C.op(C.ops.add, nil, acc[dev], s64)
          C.free(acc[dev])
          C.free(s64)
          acc[dev] = t
        else
          acc[dev] = s64
        end
      end
    end
    local devs = {}
    for dev in pairs(acc) do devs[#devs + 1] = dev end
    table.sort(devs)
    for _, dev in ipairs(devs) do
      local s = acc[dev]
      local h = dev ~= "cpu" and C.to_device(s, "cpu") or s
      total = total + C.item(h)
      if h ~= s then C.free(h) end
    end
  end)
  for _, s in pairs(acc) do C.free(s) end
  if ok then
    total = math.sqrt(total)
    local coef = max_norm / (total + 1e-6)
    if coef < 1 then
      ok, err = pcall(function()
        for k, g in ipairs(grads) do
          local p, pg = owners[k], C.grad(owners[k])
          if C.is_contiguous(pg) then
            C.op_into(C.ops.mul_scalar, { value = coef }, { g }, { g })
          else -- g is a contiguous copy of a strided gradient: the scaled copy becomes it
            local scaled = C.scoped("grad", false, C.op, C.ops.mul_scalar, { value = coef }, pg)
            C.set_grad(p, scaled)
            C.free(scaled)
          end
          C.free(pg)
        end
      end)
    end
  end
  for _, g in ipairs(grads) do C.free(g) end
  if not ok then error(err, 0) end
  return total
end

-- Fails when a parameter belongs to an optimizer fused into backward: its gradients
-- are applied and freed before a clipping call could see them.
local function check_not_fused(fn, params)
  for _, p in ipairs(params) do
    local o = owner[C.tensor_id(p)]
    if o and o.in_backward then
      fail(fn .. ": a parameter belongs to an optimizer with in_backward = true, which applies and frees each "
        .. "gradient during backward, before clipping could see it; clip without in_backward")
    end
  end
end

-- optim.clip_grad_value(params, clip_value): every gradient element clamped in place to
-- [-clip_value, clip_value] (PyTorch's clip_grad_value_; NaN stays NaN). Parameters
-- without a gradient are skipped; a single tensor counts as a list of one.
function optim.clip_grad_value(params, clip_value)
  local fn = "optim.clip_grad_value"
  if is_tensor(params) then params = { params } end
  params = check_params(fn, params)
  check_not_fused(fn, params)
  if type(clip_value) ~= "number" or not (clip_value >= 0) then
    fail(("%s: clip_value must be a number >= 0, got %s"):format(fn, describe(clip_value)))
  end
  local attrs = { lo = -clip_value, hi = clip_value }
  for _, p in ipairs(params) do
    local g = C.grad(p)
    if g then
      local ok, err
      if C.is_contiguous(g) then
        ok, err = pcall(C.op_into, C.ops.clamp, attrs, { g }, { g })
      else -- a strided gradient: the clamped copy becomes the gradient
        ok, err = pcall(function()
          local c = C.scoped("grad", false, C.op, C.ops.clamp, attrs, g)
          C.set_grad(p, c)
          C.free(c)
        end)
      end
      C.free(g)
      if not ok then error(err, 0) end
    end
  end
end

-- Learning-rate schedules (optim.schedule, optim.scheduler): lua/remat/schedule.lua.

return optim
