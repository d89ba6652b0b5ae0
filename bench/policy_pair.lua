-- Two policies side by side: none() and every(sqrt N) on bench/checkpoint.lua's 64-block
-- MLP (`mlp`), or none() and selective{softmax,gelu,dropout} on its 12-block GPT (`gpt`).
-- Steps are interleaved (one of each per round, the same steps as bench/checkpoint.lua's:
-- forward, cross entropy, backward, collectgarbage before each); prints the median over
-- rounds of (policy step / none() step) and its quartiles. With only two models alive
-- the caches hold what bench/checkpoint.lua's ten models evict from each other.
-- Run: remat bench/policy_pair.lua [mlp|gpt] [rounds]
local remat = require "remat"
local nn, policy = remat.nn, remat.policy
local which = arg[1] or "mlp"
local rounds = tonumber(arg[2] or 15)
local function labels(n, classes, salt) local t = {} for i = 1, n do t[i] = (i * 7 + salt * 13) % classes + 1 end return t end
local build, x, lab, pols
if which == "mlp" then
  build = function()
    remat.manual_seed(7)
    local layers = {}
    for i = 1, 64 do layers[i] = nn.Residual(nn.Sequential { nn.Linear(128, 512), nn.GELU(), nn.Dropout(0.1), nn.Linear(512, 128) }) end
    return nn.Sequential(layers)
  end
  remat.manual_seed(3)
  x = remat.randn(64, 128); lab = remat.tensor(labels(64, 128, 0))
  pols = { policy.none(), policy.sqrt() }
else
  build = function()
    remat.manual_seed(11)
    local layers = { nn.Embedding(256, 128) }
    for _ = 1, 12 do layers[#layers + 1] = nn.TransformerBlock(128, 4, 0.1) end
    layers[#layers + 1] = nn.LayerNorm(128)
    layers[#layers + 1] = nn.Linear(128, 256)
    return nn.Sequential(layers)
  end
  local xs, ls = {}, {}
  for b = 1, 2 do xs[b] = labels(256, 256, b); ls[b] = labels(256, 256, b + 1) end
  x = remat.tensor(xs); lab = remat.tensor(ls)
  pols = { policy.none(), policy.selective { "softmax", "gelu", "dropout" } }
end
local ms = {}
for i, p in ipairs(pols) do ms[i] = build(); ms[i]:checkpoint(p) end
local function step(m)
  collectgarbage(); collectgarbage()
  local t0 = remat.now()
  local loss = nn.cross_entropy(m(x), lab)
  loss:backward()
  local t = remat.now() - t0
  loss:free(); m:zero_grad()
  return t
end
local ratios, base = {}, {}
for r = 1, rounds + 2 do
  local t1 = step(ms[1]); local t2 = step(ms[2])
  if r > 2 then ratios[#ratios + 1] = t2 / t1; base[#base + 1] = t1 end
end
table.sort(ratios); table.sort(base)
print(string.format("%s: ratio median %.3f (q25 %.3f q75 %.3f), none step %.1f ms", which, ratios[#ratios // 2 + 1], ratios[#ratios // 4 + 1], ratios[3 * #ratios // 4 + 1], base[#base // 2 + 1] * 1e3))
