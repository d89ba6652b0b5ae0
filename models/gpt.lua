-- A small character-level GPT trained on a text file, then sampled.
--
--   remat models/gpt.lua [TEXT] [--steps 400] [--dim 128] [--layers 4] [--heads 4]
--                        [--block 64] [--batch 32] [--lr 3e-3] [--dropout 0.1]
--                        [--policy none|sqrt|every:K|selective|budget:B] [--every 50]
--                        [--sample 300] [--temperature 0.8] [--seed 1] [--save PATH] [--quick]
--
-- TEXT defaults to /usr/share/common-licenses/GPL-3 (on every Debian machine). The model
-- is one nn.Sequential: token + position embedding (a Lua module), TransformerBlocks,
-- LayerNorm, Linear head. AdamW with warmup + cosine and gradient clipping at 1.0.
-- It prints the training loss every --every steps and the validation loss, then samples
-- --sample characters (softmax at --temperature, drawn with remat's generator; 0: greedy),
-- and checks that saved and reloaded weights give the same outputs.
--
-- `--quick`: a tiny model for a few steps, for specs. `--plan` as the first argument (the
-- convention of `remat plan SCRIPT`): returns { model =, input =, loss = } and trains nothing.
local remat = require "remat"
local nn, optim, policy = remat.nn, remat.optim, remat.policy
local fmt = remat.memory.format
local cli = require "remat.cli"

local argv = { ... } -- as `remat SCRIPT args` and `remat plan` pass them

-- msg nil: --help (the usage on stdout, exit 0).
local function usage(msg)
  local text = "usage: remat models/gpt.lua [TEXT] [--steps N] [--dim N] [--layers N] [--heads N] [--block N]\n"
    .. "       [--batch N] [--lr X] [--dropout P] [--policy none|sqrt|every:K|selective|budget:B]\n"
    .. "       [--every N] [--sample N] [--temperature T] [--seed N] [--save PATH] [--quick]\n"
  if not msg then io.write(text) os.exit(0) end
  io.stderr:write("models/gpt.lua: ", msg, "\n", text)
  os.exit(2)
end

local o = { text = "/usr/share/common-licenses/GPL-3", steps = 400, dim = 128, layers = 4, heads = 4, block = 64,
            batch = 32, lr = 3e-3, dropout = 0.1, policy = "none", every = 50, sample = 300, temperature = 0.8,
            seed = 1, save = nil, quick = false, plan = false }
do
  cli.parse(argv, o, {
    numbers = { steps = true, dim = true, layers = true, heads = true, block = true, batch = true, lr = true,
                dropout = true, every = true, sample = true, temperature = true, seed = true },
    strings = { policy = true, save = true }, switches = { quick = true, plan = true }, positional = "text",
    usage = usage })
  if o.quick then
    o.steps, o.dim, o.layers, o.heads, o.block, o.batch, o.every, o.sample = 30, 32, 2, 2, 16, 8, 10, 40
  end
  for _, k in ipairs { "steps", "dim", "layers", "heads", "block", "batch", "every", "seed" } do
    if math.tointeger(o[k]) == nil or o[k] < (k == "seed" and 0 or 1) then usage(("--%s must be a positive integer"):format(k)) end
    o[k] = math.tointeger(o[k])
  end
  if o.dim % o.heads ~= 0 then usage(("--dim %d is not a multiple of --heads %d"):format(o.dim, o.heads)) end
end

-- Token embedding plus a learned position embedding (PyTorch's nn.Embedding init: N(0, 1)).
local function embedding(vocab, d, block)
  return nn.module {
    name = ("TokenPosition(%d, %d, block %d)"):format(vocab, d, block),
    tok = nn.Embedding(vocab, d),
    pos = nn.Embedding(block, d),
    positions = remat.arange(1, block),
    forward = function(self, x)
      local t = x:size(2)
      local idx <close> = self.positions:narrow(1, 1, t)
      local e = self.tok(x)
      local p <close> = self.pos(idx)
      return e + p
    end,
  }
end

local function build(vocab)
  remat.manual_seed(o.seed)
  local layers = { embedding(vocab, o.dim, o.block) }
  for _ = 1, o.layers do layers[#layers + 1] = nn.TransformerBlock(o.dim, o.heads, o.dropout) end
  layers[#layers + 1] = nn.LayerNorm(o.dim)
  layers[#layers + 1] = nn.Linear(o.dim, vocab)
  return nn.Sequential(layers)
end

local function make_policy(s)
  if s == "none" then return policy.none() end
  if s == "sqrt" then return policy.sqrt() end
  if s == "selective" then return policy.selective { "softmax", "gelu" } end
  local k = s:match("^every:(%d+)$")
  if k then return policy.every(math.tointeger(tonumber(k))) end
  local b = s:match("^budget:(.+)$")
  if b then return policy.budget(b) end
  usage("--policy: expected none, sqrt, every:K, selective or budget:B, got " .. s)
end

-- Frees tensors now rather than when the collector gets to them.
local function free(...)
  for i = 1, select("#", ...) do select(i, ...):free() end
end

local ds = remat.data.text(o.text, { block = o.block })

if o.plan then
  local model = build(ds.vocab_size)
  model:checkpoint(make_policy(o.policy))
  remat.manual_seed(o.seed + 1)
  local x, y = ds:batch(o.batch)
  return { model = model, input = function() return x end, loss = function(logits) return nn.cross_entropy(logits, y) end }
end

print(ds)
local model = build(ds.vocab_size)
print(model)
model:checkpoint(make_policy(o.policy))

local opt = optim.AdamW(model:parameters(), { lr = o.lr, betas = { 0.9, 0.99 }, weight_decay = 0.01 })
local sched = optim.scheduler(opt, optim.schedule.warmup_cosine {
  warmup = math.max(1, o.steps // 10), total = o.steps, base = o.lr, min = o.lr * 0.1 })

-- Mean loss over n batches of a split (eval mode, no tape); draws from the generator.
local function estimate(split, n)
  model:eval()
  local sum = 0
  remat.no_grad(function()
    for _ = 1, n do
      local x, y = ds:batch(o.batch, split)
      local logits = model(x)
      local l = nn.cross_entropy(logits, y)
      sum = sum + l:item()
      free(x, y, logits, l)
    end
  end)
  model:train()
  return sum / n
end

remat.manual_seed(o.seed + 2)
local x0, y0 = ds:batch(o.batch)
print(model:plan(x0, { loss = function(l) return nn.cross_entropy(l, y0) end }))
x0:free()
y0:free()

local val0 = estimate("val", 4)
print(("training %d steps, batch %d x %d characters, AdamW lr %g (warmup + cosine), policy %s; val loss at start %.4f"):format(
  o.steps, o.batch, o.block, o.lr, o.policy, val0))
local t_start = remat.now()
local t_last, sum, n, first_loss, last_loss = t_start, 0, 0, nil, nil
for step = 1, o.steps do
  sched:step()
  local x, y = ds:batch(o.batch)
  local logits = model(x)
  local loss = nn.cross_entropy(logits, y)
  logits:free() -- the loss holds them: its backward then writes their gradient over them
  loss:backward()
  optim.clip_grad_norm(opt.params, 1.0)
  opt:step()
  opt:zero_grad()
  local l = loss:item()
  free(x, y, loss)
  first_loss = first_loss or l
  sum, n = sum + l, n + 1
  if step % o.every == 0 or step == o.steps then
    local now = remat.now()
    local m = remat.memory.stats()
    print(("step %4d/%d  loss %.4f  %6.0f chars/s  %5.0f ms/step  memory live %s peak %s (activation peak %s)  lr %.2e"):format(
      step, o.steps, sum / n, n * o.batch * o.block / (now - t_last), 1000 * (now - t_last) / n, fmt(m.live), fmt(m.peak),
      fmt(m.peak_by_category.activation), opt.lr))
    last_loss = sum / n
    sum, n, t_last = 0, 0, now
  end
end
local elapsed = remat.now() - t_start
local val1 = estimate("val", 8)
print(("trained in %.1f s: training loss %.4f -> %.4f, val loss %.4f -> %.4f"):format(elapsed, first_loss, last_loss,
  val0, val1))

-- Sampling: feed the last `block` characters, draw the next from softmax(logits / T).
local function sample(prompt, count, temperature)
  model:eval()
  local ctx = {}
  local enc = ds:encode(prompt)
  for i, v in ipairs(enc:totable()) do ctx[i] = v end
  enc:free()
  local out = {}
  remat.no_grad(function()
    for _ = 1, count do
      local from = math.max(1, #ctx - o.block + 1)
      local x <close> = remat.tensor({ table.move(ctx, from, #ctx, 1, {}) })
      local logits <close> = model(x)
      local last <close> = logits[1][#ctx - from + 1]
      local probs
      local next_id
      if temperature <= 0 then
        local a <close> = last:argmax(1)
        next_id = math.tointeger(a:item())
      else
        local scaled <close> = last / temperature
        local p <close> = scaled:softmax(1)
        probs = p:totable()
        local u <close> = remat.rand(1)
        local r, acc = u:item(), 0
        next_id = #probs
        for i, q in ipairs(probs) do
          acc = acc + q
          if r < acc then next_id = i break end
        end
      end
      ctx[#ctx + 1] = next_id
      out[#out + 1] = next_id
    end
  end)
  model:train()
  return ds:decode(out)
end

if o.sample > 0 then
  remat.manual_seed(o.seed + 3)
  local prompt = "The "
  print(("sample (%d characters, temperature %g):\n%s%s\n"):format(o.sample, o.temperature, prompt,
    sample(prompt, o.sample, o.temperature)))
end

local m = remat.memory.stats()
local cats = {}
for _, c in ipairs { "param", "grad", "optim", "activation", "workspace", "temp", "data" } do
  cats[#cats + 1] = ("%s %s"):format(c, fmt(m.peak_by_category[c] or 0))
end
print("peak memory by category: " .. table.concat(cats, ", "))

-- Save, reload into a fresh model, and check the outputs agree.
local path = o.save or os.tmpname()
remat.save(path, model:state_dict())
local copy = build(ds.vocab_size)
copy:load_state_dict(remat.load(path))
model:eval()
copy:eval()
remat.manual_seed(o.seed + 4)
local xb = ds:batch(2, "val")
local same = remat.no_grad(function()
  local a, b = model(xb), copy(xb)
  local fa, fb = remat._C.flat(a), remat._C.flat(b)
  free(a, b)
  for i = 1, #fa do if fa[i] ~= fb[i] then return false end end
  return true
end)
if not o.save then os.remove(path) end
print(("saved weights to %s and reloaded them: outputs %s"):format(o.save or "a temporary file",
  same and "identical" or "DIFFER"))
if not same then os.exit(1) end
