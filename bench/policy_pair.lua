-- Two policies side by side: none() and every(sqrt N) on bench/checkpoint.lua's 64-block
-- MLP (`mlp`), or none() and selective{softmax,gelu,dropout} on its 12-block GPT (`gpt`).
-- Steps are interleaved (one of each per round, the same steps as bench/checkpoint.lua's:
-- forward, cross entropy, backward, collectgarbage before each); prints the median over
-- rounds of (policy step / none() step) and its quartiles. With only two models alive
-- the caches hold what bench/checkpoint.lua's ten models evict from each other.
-- --ops: where the steps' time goes, op by op: the per-op timers (remat._C.op_timers)
-- run through every step, and a table gives each op's median ms per step in first runs
-- for both policies and in the policy's replays (the timers' clock reads add a little to
-- every op, so the ratio of that run is not the plain one).
-- Run: remat bench/policy_pair.lua [mlp|gpt] [rounds] [--ops]
local remat = require "remat"
local C = remat._C
local nn, policy = remat.nn, remat.policy
local pos, ops = {}, false
for _, a in ipairs(arg) do if a == "--ops" then ops = true else pos[#pos + 1] = a end end
local which = pos[1] or "mlp"
local rounds = tonumber(pos[2] or 15)
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
-- one step of m: its seconds, and the op timings when --ops
local function step(m)
  collectgarbage(); collectgarbage()
  if ops then C.op_timers(true) end
  local t0 = remat.now()
  local loss = nn.cross_entropy(m(x), lab)
  loss:backward()
  local t = remat.now() - t0
  local timing = ops and C.op_timing() or nil
  if ops then C.op_timers(false) end
  loss:free(); m:zero_grad()
  return t, timing
end
local function median(t) if #t == 0 then return 0 end table.sort(t) return t[#t // 2 + 1] end
local ratios, base = {}, {}
local per_op = { {}, {} }   -- per model: op -> { first = {s...}, replay = {s...}, calls, rcalls }
for r = 1, rounds + 2 do
  local t1, p1 = step(ms[1]); local t2, p2 = step(ms[2])
  if r > 2 then
    ratios[#ratios + 1] = t2 / t1; base[#base + 1] = t1
    for i, timing in ipairs { p1, p2 } do
      for name, v in pairs(timing or {}) do
        local a = per_op[i][name] or { first = {}, replay = {}, calls = v.calls, rcalls = v.replay_calls }
        a.first[#a.first + 1], a.replay[#a.replay + 1] = v.seconds, v.replay_seconds
        per_op[i][name] = a
      end
    end
  end
end
table.sort(ratios)
print(string.format("%s: ratio median %.3f (q25 %.3f q75 %.3f), none step %.1f ms%s", which, ratios[#ratios // 2 + 1],
  ratios[#ratios // 4 + 1], ratios[3 * #ratios // 4 + 1], median(base) * 1e3, ops and " (op timers on)" or ""))
if ops then
  local names, seen = {}, {}
  for i = 1, 2 do for n in pairs(per_op[i]) do if not seen[n] then seen[n], names[#names + 1] = true, n end end end
  local function cell(i, n, k) local a = per_op[i][n] return a and median(a[k]) or 0 end
  local function cost(n) return math.max(cell(1, n, "first"), cell(2, n, "first") + cell(2, n, "replay")) end
  table.sort(names, function(p, q) return cost(p) > cost(q) end)
  print(("ms per step, median of %d rounds; the policy: %s"):format(rounds, tostring(pols[2])))
  print(("%-24s %10s %10s %10s %7s %7s"):format("op", "none()", "policy", "replays", "calls", "replays"))
  local tot = { 0, 0, 0 }
  for _, n in ipairs(names) do
    local f1, f2, rp = cell(1, n, "first"), cell(2, n, "first"), cell(2, n, "replay")
    tot[1], tot[2], tot[3] = tot[1] + f1, tot[2] + f2, tot[3] + rp
    local b = per_op[2][n]
    print(("%-24s %10.2f %10.2f %10.2f %7d %7d"):format(n, f1 * 1e3, f2 * 1e3, rp * 1e3, b and b.calls or 0, b and b.rcalls or 0))
  end
  print(("%-24s %10.2f %10.2f %10.2f"):format("sum of medians", tot[1] * 1e3, tot[2] * 1e3, tot[3] * 1e3))
end
