-- Where a training step's time goes, op by op: first runs (forward and backward) and
-- replays, for none() and one other policy on bench/checkpoint.lua's models (the 64-block
-- MLP or the 12-block GPT with dropout). Per-op timers (remat._C.op_timers), the median
-- over rounds after two warm-up rounds, the two models' steps interleaved.
-- Run: remat bench/op_profile.lua [gpt|mlp] [rounds]   (default: gpt, 12 rounds; the
-- GPT is compared under selective{softmax,gelu,dropout}, the MLP under every(sqrt N))
local remat = require "remat"
local C = remat._C
local nn, policy = remat.nn, remat.policy
local which, rounds = arg[1] or "gpt", tonumber(arg[2] or 12)
local function labels(n, classes, salt) local t = {} for i = 1, n do t[i] = (i * 7 + salt * 13) % classes + 1 end return t end
local build, x, lab, other
if which == "mlp" then
  build = function()
    remat.manual_seed(7)
    local layers = {}
    for i = 1, 64 do layers[i] = nn.Residual(nn.Sequential { nn.Linear(128, 512), nn.GELU(), nn.Dropout(0.1), nn.Linear(512, 128) }) end
    return nn.Sequential(layers)
  end
  remat.manual_seed(3)
  x, lab, other = remat.randn(64, 128), remat.tensor(labels(64, 128, 0)), policy.sqrt()
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
  x, lab, other = remat.tensor(xs), remat.tensor(ls), policy.selective { "softmax", "gelu", "dropout" }
end
local pols = { policy.none(), other }
local models, acc = {}, { {}, {} }
for i, p in ipairs(pols) do models[i] = build(); models[i]:checkpoint(p) end
for r = 1, rounds + 2 do
  for i = 1, 2 do
    collectgarbage(); collectgarbage()
    C.op_timers(true)
    local loss = nn.cross_entropy(models[i](x), lab)
    loss:backward()
    local t = C.op_timing()
    C.op_timers(false)
    loss:free(); models[i]:zero_grad()
    if r > 2 then
      for name, v in pairs(t) do
        local a = acc[i][name] or { first = {}, replay = {}, calls = v.calls, rcalls = v.replay_calls }
        a.first[#a.first + 1], a.replay[#a.replay + 1] = v.seconds, v.replay_seconds
        acc[i][name] = a
      end
    end
  end
end
local function med(t) if not t or #t == 0 then return 0 end table.sort(t) return t[#t // 2 + 1] end
local names, tot = {}, { 0, 0, 0 }
for n in pairs(acc[1]) do names[#names + 1] = n end
for n in pairs(acc[2]) do if not acc[1][n] then names[#names + 1] = n end end
local function cost(n) local a, b = acc[1][n], acc[2][n] return math.max(a and med(a.first) or 0, b and med(b.first) + med(b.replay) or 0) end
table.sort(names, function(p, q) return cost(p) > cost(q) end)
print(("%s: none() against %s; ms per step, median of %d rounds"):format(which, tostring(other), rounds))
print(("%-24s %10s %10s %10s %7s %7s"):format("op", "none()", "policy", "replays", "calls", "replays"))
for _, n in ipairs(names) do
  local a, b = acc[1][n], acc[2][n]
  local f1, f2, rp = a and med(a.first) or 0, b and med(b.first) or 0, b and med(b.replay) or 0
  tot[1], tot[2], tot[3] = tot[1] + f1, tot[2] + f2, tot[3] + rp
  print(("%-24s %10.2f %10.2f %10.2f %7d %7d"):format(n, f1 * 1e3, f2 * 1e3, rp * 1e3, b and b.calls or 0, b and b.rcalls or 0))
end
print(("%-24s %10.2f %10.2f %10.2f"):format("sum of medians", tot[1] * 1e3, tot[2] * 1e3, tot[3] * 1e3))
