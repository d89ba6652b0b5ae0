-- cross_entropy's backward writes dlogits over the logits when nothing reads them
-- afterwards (core/op_loss.c, logits_reusable): the caller freed its handle and no op
-- kept them for its own backward. Then the step's peak is one logits-sized buffer lower
-- and the gradients are the same bits. Wherever anything still reads the logits (a
-- handle, an op that saved its output, a checkpoint plan's replay) it falls back to a
-- new tensor, and the gradients stay those of none() with the logits kept.
local remat = require "remat"
local nn, policy = remat.nn, remat.policy
local C = remat._C

local devices = { { "cpu", "" } }
if C.device_available("cuda") then devices[#devices + 1] = { "cuda", " #gpu" } end

local function settle()
  collectgarbage()
  collectgarbage()
end

local function same_bits(a, b, what)
  local av, bv = C.flat(a:cpu()), C.flat(b:cpu())
  assert(#av == #bv, what .. ": sizes differ")
  for i = 1, #av do
    assert(av[i] == bv[i], ("%s[%d]: %.17g vs %.17g"):format(what, i, av[i], bv[i]))
  end
end

local V, D, B, T = 300, 16, 2, 7

-- A small LM-like chain: its last layer is the wide head (B, T, V).
local function model_on(dev)
  remat.manual_seed(21)
  local m = nn.Sequential { nn.Linear(D, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, V) }
  return m:to(dev)
end

local function batch(dev)
  remat.manual_seed(22)
  local x = remat.randn(B, T, D):to(dev)
  local y = {}
  for i = 1, B * T do y[i] = (i * 37) % V + 1 end
  return x, remat.tensor(y):view(B, T):to(dev)
end

-- One forward and backward; free_logits: the logits' handle is freed once the loss
-- holds them. after(logits) may wrap the model output (an op before the loss).
-- Returns the parameter gradients and the peak activation bytes of the backward
-- above what was live when it started.
local function step(m, x, y, dev, free_logits, after)
  m:zero_grad()
  settle()
  local logits = m(x)
  local z = after and after(logits) or logits
  local loss = nn.cross_entropy(z, y)
  if free_logits then
    if not rawequal(z, logits) then z:free() end
    logits:free()
  end
  settle()
  remat.memory.reset_peak(dev)
  local before = remat.memory.stats(dev).by_category.activation
  loss:backward()
  local peak = remat.memory.stats(dev).peak_by_category.activation - before
  local grads = {}
  for i, p in ipairs(m:parameters()) do grads[i] = p.grad:cpu() end
  loss:free()
  return grads, peak
end

for _, dv in ipairs(devices) do
  local dev, tag = dv[1], dv[2]
  describe(("cross_entropy's backward in place of the logits (%s)%s"):format(dev, tag), function()
    it("freed logits: the backward's peak is a logits buffer lower, the gradients the same bits", function()
      local m = model_on(dev)
      local x, y = batch(dev)
      local gk, pk = step(m, x, y, dev, false)
      local gf, pf = step(m, x, y, dev, true)
      for i = 1, #gk do same_bits(gf[i], gk[i], "parameter " .. i) end
      local logits_bytes = B * T * V * 4
      assert(pk - pf >= logits_bytes, ("peak with the logits kept %d, freed %d: less than %d bytes apart"):format(
        pk, pf, logits_bytes))
    end)

    it("falls back when the op before the loss saved its output (tanh): same gradients, no error", function()
      local m = model_on(dev)
      local x, y = batch(dev)
      local tanh = function(l) return l:tanh() end
      local gk, pk = step(m, x, y, dev, false, tanh)
      local gf, pf = step(m, x, y, dev, true, tanh)
      for i = 1, #gk do same_bits(gf[i], gk[i], "parameter " .. i) end
      assert(pk - pf < B * T * V * 4, "tanh's saved output was not written over")
    end)

    it("2-D logits freed: in place; kept: a new tensor", function()
      local m = model_on(dev)
      local x, y = batch(dev)
      local flat = function(l) return l:view(B * T, V) end
      local y2 = y:view(B * T)
      local gk, pk = step(m, x, y2, dev, false, flat)
      local gf, pf = step(m, x, y2, dev, true, flat)
      for i = 1, #gk do same_bits(gf[i], gk[i], "parameter " .. i) end
      assert(pk - pf >= B * T * V * 4)
    end)

    it("under checkpoint plans (replayed or kept logits) the gradients equal none()'s with the logits kept", function()
      local x, y = batch(dev)
      local ref = step(model_on(dev), x, y, dev, false)
      for _, p in ipairs({ policy.every(1), policy.every(2), policy.sqrt(), policy.selective { "linear" },
                           policy.selective { "gelu" } }) do
        local m = model_on(dev)
        m:checkpoint(p)
        for _, free in ipairs({ true, false }) do
          local g = step(m, x, y, dev, free)
          for i = 1, #ref do same_bits(g[i], ref[i], ("%s, freed %s, parameter %d"):format(tostring(p), free, i)) end
        end
      end
    end)
  end)
end
