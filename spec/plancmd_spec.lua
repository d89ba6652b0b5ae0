-- `remat plan SCRIPT`: arg as lua sets it, --policy in both spellings, a script that is
-- not plannable stopped at once, user errors without tracebacks, and the plan table
-- (full module names, the ops a selective row really recomputes, "saved" explained).
local files = require "support.files"

local build = os.getenv("REMAT_BUILD") or "build"
local exe = build .. "/remat"

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Runs `remat plan ARGS`; returns stdout, stderr, exit code.
local function plan(args) return require("support.shell").run(("%s plan %s"):format(exe, args)) end

local function script(src)
  local path = os.tmpname() .. ".lua"
  files.write(path, src)
  return path
end

-- A plannable script: an Embedding, a long-named module and a block with a GELU.
local MODEL = [[
local remat = require "remat"
local nn = remat.nn
if arg[1] ~= "--plan" or select(1, ...) ~= "--plan" then error("arg and ... disagree: " .. tostring(arg[1]) .. " / " .. tostring(...)) end
io.stderr:write("ARGS ", arg[0], " ", table.concat(arg, " ", 1), " | ", table.concat({ ... }, " "), "\n")
local model = nn.Sequential {
  nn.Embedding(50, 16),
  nn.Residual(nn.Sequential { nn.LayerNorm(16), nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16) }),
  nn.Linear(16, 50),
}
return { model = model, input = function() return remat.tensor { { 1, 2, 3, 4 }, { 5, 6, 7, 8 } } end }
]]

describe("remat plan #subprocess", function()
  local path = script(MODEL)
  teardown(function() os.remove(path) end)

  it("gives the script arg and ... as lua would for `SCRIPT --plan args`", function()
    local out, err, code = plan(sh_quote(path) .. " one two")
    assert.are.equal(0, code, err)
    assert.matches("ARGS " .. path:gsub("%p", "%%%0") .. " %-%-plan one two | %-%-plan one two\n", err)
    assert.matches("^plan for remat%.policy%.none%(%)", out)
  end)

  it("accepts --policy every:K, selective:a,b and the Lua spellings every(2), selective{...}", function()
    for _, p in ipairs { "every:2", "every(2)", "policy.every(2)" } do
      local out, err, code = plan(sh_quote(path) .. " --policy " .. sh_quote(p))
      assert.are.equal(0, code, p .. ": " .. err)
      assert.matches("^plan for remat%.policy%.every%(2%)", out)
    end
    for _, p in ipairs { "selective:gelu,softmax", 'selective{"gelu", "softmax"}' } do
      local out, err, code = plan(sh_quote(path) .. " --policy " .. sh_quote(p))
      assert.are.equal(0, code, p .. ": " .. err)
      assert.matches("^plan for remat%.policy%.selective{gelu, softmax}", out)
    end
  end)

  it("lists the ops a selective row really recomputes, full module names, and explains saved", function()
    local out, err, code = plan(sh_quote(path) .. " --policy 'selective{\"softmax\", \"gelu\", \"dropout\"}'")
    assert.are.equal(0, code, err)
    local rows = {}
    for line in out:gmatch("[^\n]+") do
      local i = tonumber(line:match("^%s+(%d+)%s"))
      if i then rows[i] = line end
    end
    assert.matches("Embedding%(50, 16%)", rows[1])
    assert.matches("has no output of {softmax, gelu, dropout} to drop", rows[1])
    assert.matches("Residual%(Sequential%(4 layers%)%)%s", rows[2]) -- not cut at 22 characters
    assert.matches("recomputes {gelu}$", rows[2])
    assert.matches("Linear%(16 %-> 50%).*has no output of", rows[3])
    assert.matches("\nsaved: activation bytes the layer allocates in forward that stay alive for backward\n", out)
  end)

  it("stops a script that trains instead of returning a plan at its first backward", function()
    local trains = script([[
local remat = require "remat"
local x = remat.randn(2, 2, { requires_grad = true })
local y = (x * 2):sum()
y:backward()
print("trained to the end")
]])
    local out, err, code = plan(sh_quote(trains))
    os.remove(trains)
    assert.are.equal(1, code)
    assert.are.equal("", out)
    assert.matches("^remat plan: .* is not plannable: .*it started training", err)
  end)

  it("reports user errors without a traceback", function()
    for _, args in ipairs { "", "--bogus", sh_quote(path) .. " --policy nope", sh_quote(path) .. " --budget lots",
                            "/nonexistent/model.lua" } do
      local out, err, code = plan(args)
      assert.are.equal(1, code, args)
      assert.are.equal("", out)
      assert.matches("^remat plan: ", err)
      assert.is_nil(err:find("stack traceback", 1, true), args .. ": " .. err)
      assert.is_nil(err:find("[remat]", 1, true), args .. ": " .. err)
    end
    local out, _, code = plan("--help")
    assert.are.equal(0, code)
    assert.matches("%-%-policy P +none | sqrt | every:K | selective:op,op", out)
  end)
end)
