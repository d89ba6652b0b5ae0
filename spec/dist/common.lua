-- Helpers shared by the scripts spec/dist_spec.lua launches under mpirun: a small
-- model, a fixed batch (the same on every rank), parameter comparisons, and results
-- printed as "RESULT <rank> <key> <value>" lines for the spec to read.
local remat = require "remat"
local nn = remat.nn
local M = {}

-- A small model with odd sizes; the same weights for the same seed.
function M.model(seed)
  remat.manual_seed(seed or 7)
  return nn.Sequential { nn.Linear(13, 17), nn.GELU(), nn.LayerNorm(17), nn.Linear(17, 9), nn.ReLU(), nn.Linear(9, 5) }
end

-- Batch k of `rows` examples (inputs, 1-based labels), identical on every rank.
function M.batch(k, rows)
  remat.manual_seed(1000 + k)
  local x = remat.randn(rows, 13)
  local labels = {}
  for i = 1, rows do labels[i] = ((i * 7 + k) % 5) + 1 end
  return x, remat.tensor(labels)
end

-- Rows [lo, lo + n) (1-based lo) of x and y, as contiguous copies.
function M.rows(x, y, lo, n)
  return x:narrow(1, lo, n):contiguous(), y:narrow(1, lo, n):contiguous()
end

-- Appends t's values (row-major) to out; returns out.
function M.values(t, out)
  out = out or {}
  local function walk(v)
    if type(v) == "table" then for _, e in ipairs(v) do walk(e) end else out[#out + 1] = v end
  end
  walk(t:totable())
  return out
end

-- Flat list of every parameter value.
function M.flat(model)
  local out = {}
  for _, p in ipairs(model:parameters()) do M.values(p, out) end
  return out
end

-- Largest absolute and relative (to the largest magnitude) difference of two lists.
function M.maxdiff(a, b)
  assert(#a == #b, ("lengths differ: %d vs %d"):format(#a, #b))
  local d, big = 0, 0
  for i = 1, #a do
    d = math.max(d, math.abs(a[i] - b[i]))
    big = math.max(big, math.abs(a[i]))
  end
  return d, d / math.max(big, 1e-30)
end

function M.result(key, value)
  io.stdout:write(("RESULT %d %s %s\n"):format(remat.dist.rank(), key, tostring(value)))
  io.stdout:flush()
end

return M
