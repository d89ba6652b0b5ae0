-- Defects an adversarial sweep found (issue 15), one spec each: every one of them
-- crashed, hung, leaked or answered wrongly before its fix.
local remat = require "remat"
local C = remat._C

-- Asserts that fn raises an error mentioning every pattern (plain text).
local function raises(fn, ...)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error")
  err = tostring(err)
  for _, p in ipairs({ ... }) do
    assert(err:find(p, 1, true), ("error %q does not mention %q"):format(err, p))
  end
  return err
end

describe("D1: in-place writes to tensors saved for backward", function()
  local function setup()
    local w = remat.tensor({ { 1 }, { 2 } }):requires_grad(true)
    local x = remat.tensor { { 3, 4 } }
    return w, x, x:matmul(w):sum()
  end

  it("fill_, zero_, copy_ and x[i] = v on a saved input make backward fail, naming it", function()
    local writes = {
      function(x) x:fill_(0) end,
      function(x) x:zero_() end,
      function(x) x:copy_(remat.tensor { { 5, 6 } }) end,
      function(x) x[1] = remat.tensor { 7, 8 } end,
      function(x) x:view(2):narrow(1, 2, 1):fill_(1) end,
    }
    for _, write in ipairs(writes) do
      local _, x, loss = setup()
      write(x)
      raises(function() loss:backward() end, "backward", "input 1 of matmul", "1x2", "modified in place")
    end
  end)

  it("a write through a detached alias of a saved output is caught too", function()
    local x = remat.tensor({ 0.5, -1, 2 }):requires_grad(true)
    local e = x:exp()
    local loss = e:sum()
    local y = (e * 1):sum() -- mul does not save its output; exp does
    e:detach():fill_(0)
    raises(function() (loss + y):backward() end, "output 1 of exp", "modified in place")
  end)

  it("an optimizer step between forward and backward is caught", function()
    local lin = remat.nn.Linear(2, 1)
    local opt = remat.optim.SGD(lin:parameters(), { lr = 0.1 })
    local loss = lin(remat.tensor { { 1, 2 } }):sum()
    for _, p in ipairs(lin:parameters()) do p.grad = remat.ones(table.unpack(p:shape())) end
    opt:step()
    raises(function() loss:backward() end, "modified in place")
  end)

  it("writes before the op, or to tensors the op does not save, are fine", function()
    local w = remat.tensor({ { 1 }, { 2 } }):requires_grad(true)
    local x = remat.tensor { { 0, 0 } }
    x:copy_(remat.tensor { { 3, 4 } })
    local loss = x:matmul(w):sum()
    local unrelated = x:clone()
    unrelated:fill_(9)
    loss:backward()
    assert.same({ { 3 }, { 4 } }, w.grad:totable())
  end)

  it("a checkpointed replay that would rebuild an overwritten tensor fails", function()
    local nn = remat.nn
    local Scale = nn.module { forward = function(_, h)
      local y = h * 2
      remat.no_grad(function() y:detach():fill_(1) end) -- y is recomputable: a replay would undo this
      return y * h
    end }
    local model = nn.Sequential { nn.Linear(2, 2), Scale, nn.Linear(2, 1) }
    model:checkpoint(remat.policy.every(1))
    local loss = model(remat.tensor { { 1, 2 } }):sum()
    raises(function() loss:backward() end, "modified in place")
  end)
end)
