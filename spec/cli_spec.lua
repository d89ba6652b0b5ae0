-- remat.cli: the flags of model scripts (numbers, strings, switches, a positional,
-- --NAME=VALUE, --help) and its errors.
local remat = require "remat"
local cli = require "remat.cli"

local function parse(argv)
  local o = { n = 1, s = "x", on = false, text = nil }
  local ok, err = pcall(cli.parse, argv, o, {
    numbers = { n = true }, strings = { s = true }, switches = { on = true }, positional = "text",
    usage = function(msg) error({ usage = msg or "HELP" }) end })
  if ok then return o end
  return nil, type(err) == "table" and err.usage or error(err)
end

describe("remat.cli.parse", function()
  it("reads --NAME VALUE, --NAME=VALUE, switches and a positional", function()
    local o = parse { "--n", "3", "--s=hello", "--on", "file.txt" }
    assert.are.same({ n = 3, s = "hello", on = true, text = "file.txt" }, o)
    assert.are.equal(2.5, parse({ "--n=2.5" }).n)
  end)

  it("calls usage(nil) for --help and -h", function()
    assert.are.equal("HELP", select(2, parse { "--help" }))
    assert.are.equal("HELP", select(2, parse { "--n", "2", "-h" }))
  end)

  it("names what is wrong", function()
    assert.are.equal("--n needs a number, got abc", select(2, parse { "--n=abc" }))
    assert.are.equal("--n needs a value", select(2, parse { "--n" }))
    assert.are.equal("--on takes no value", select(2, parse { "--on=yes" }))
    assert.are.equal("unknown argument --shufle", select(2, parse { "--shufle" }))
    assert.are.equal("unknown argument -x", select(2, parse { "-x" }))
  end)
end)

describe("model scripts' flags #subprocess", function()
  local build = os.getenv("REMAT_BUILD") or "build"
  for _, m in ipairs { "mlp", "gpt" } do
    it(m .. ".lua --help prints the usage and exits 0; a bad flag exits 2 with it", function()
      local p = io.popen(("%s/remat models/%s.lua --help 2>&1"):format(build, m))
      local out = p:read("a")
      local _, _, code = p:close()
      assert.are.equal(0, code, out)
      assert.matches("^usage: remat models/" .. m .. "%.lua", out)
      p = io.popen(("%s/remat models/%s.lua --seed=x 2>&1"):format(build, m))
      out = p:read("a")
      _, _, code = p:close()
      assert.are.equal(2, code, out)
      assert.matches("^models/" .. m .. "%.lua: %-%-seed needs a number, got x\nusage:", out)
    end)
  end
  assert(remat)
end)
