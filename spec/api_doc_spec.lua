-- docs/API.md covers the public API: every public name of the module (the string keys
-- not starting with "_" of remat and its tables, the methods of its classes included)
-- has an entry there, and every entry names something that exists.
local remat = require "remat"
local files = require "support.files"

-- The class tables whose methods the reference writes as `<var>:<method>`.
local CLASSES = {
  ["x"] = "remat.Tensor", ["m"] = "remat.nn.Module", ["opt"] = "remat.optim.Optimizer",
  ["ds"] = "remat.data.Dataset", ["text"] = "remat.data.Text", ["s"] = "remat.train.Stepper",
  ["log"] = "remat.train.Metrics",
}

-- Tables generated from the op registry, one entry per op of core/ops.def: documented
-- as one entry (each op's meaning is at its definition, core/op_<family>.c).
local GENERATED = { ["remat.ops"] = true }

local function lookup(qualified)
  local v = { remat = remat }
  for part in qualified:gmatch("[^.]+") do
    if type(v) ~= "table" then return nil end
    v = rawget(v, part)
    if v == nil then return nil end
  end
  return v
end

-- Every public name reachable from remat, qualified ("remat.nn.Linear").
local function public_names()
  local names, seen = {}, {}
  local function walk(t, prefix)
    if seen[t] then return end
    seen[t] = true
    for k, v in pairs(t) do
      if type(k) == "string" and not k:find("^_") then
        local name = prefix .. "." .. k
        names[#names + 1] = name
        if type(v) == "table" and #v == 0 and not GENERATED[name] then walk(v, name) end
      end
    end
  end
  walk(remat, "remat")
  table.sort(names)
  return names
end

-- The names the reference documents: its "### " headings.
local function documented()
  local text = assert(files.read("docs/API.md"))
  local names, order = {}, {}
  for line in text:gmatch("[^\n]+") do
    local heading = line:match("^###%s+(.*)$")
    if heading then
      local name = heading:match("^`(remat[%w_.]*)")
      if not name then
        local var, method = heading:match("^`(%a+):([%w_]+)")
        assert(var and CLASSES[var], "docs/API.md: a heading that names nothing: " .. line)
        name = CLASSES[var] .. "." .. method
      end
      if not names[name] then order[#order + 1] = name end
      names[name] = true
    end
  end
  return names, order
end

describe("docs/API.md", function()
  it("has an entry for every public name of the module", function()
    local doc = documented()
    local missing = {}
    for _, name in ipairs(public_names()) do
      if not doc[name] then missing[#missing + 1] = name end
    end
    assert(#missing == 0, "not in docs/API.md: " .. table.concat(missing, ", "))
  end)

  it("documents only names that exist", function()
    local _, order = documented()
    assert(#order > 200, "expected the whole API, found " .. #order .. " entries")
    local gone = {}
    for _, name in ipairs(order) do
      if lookup(name) == nil then gone[#gone + 1] = name end
    end
    assert(#gone == 0, "docs/API.md documents names that do not exist: " .. table.concat(gone, ", "))
  end)
end)
