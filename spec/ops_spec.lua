-- Walks every op in the registry on every available backend: each op must have spec
-- cases (spec/cases/<family>.lua), forward cases run in float32 and float64 against the
-- naive Lua references, and every differentiable op has a float64 gradient check.
local remat = require "remat"
local kit = require "support.kit"
local C = remat._C

-- the families, as core/ops.def names them (each X entry's third field)
local families, seen = {}, {}
for fam in require("support.files").read("core/ops.def"):gmatch("\nX%(%s*[%w_]+%s*,%s*[%w_]+%s*,%s*([%w_]+)") do
  if not seen[fam] then seen[fam], families[#families + 1] = true, fam end
end
assert(#families >= 10, "no families read from core/ops.def")

local function load_cases(K)
  local all = {}
  for _, fam in ipairs(families) do
    local ok, mod = pcall(require, "cases." .. fam)
    if ok then
      for name, case in pairs(mod(K)) do all[name] = case end
    elseif not tostring(mod):find("module 'cases." .. fam .. "' not found", 1, true) then
      error(mod)
    end
  end
  return all
end

local devices = { "cpu" }
if C.device_available("cuda") then devices[#devices + 1] = "cuda" end

local ops = C.op_list()

describe("op registry", function()
  local cases = load_cases(kit.new("float64", "cpu"))
  for _, op in ipairs(ops) do
    it(op.name .. " is implemented and has spec cases", function()
      assert(op.implemented, "op " .. op.name .. " has no definition")
      local c = cases[op.name]
      assert(c, "op " .. op.name .. " has no spec case")
      assert(c.forward and next(c.forward), "op " .. op.name .. " has no forward case")
      if op.differentiable then
        assert(c.grad and next(c.grad), "differentiable op " .. op.name .. " has no gradient case")
      else
        assert(c.nodiff or c.grad, "op " .. op.name .. " is not differentiable: its cases must say why (nodiff)")
      end
    end)
  end
end)

for _, device in ipairs(devices) do
  for _, dtype in ipairs({ "float32", "float64" }) do
    local tags = device == "cuda" and " #gpu" or ""
    describe(("ops forward on %s %s%s"):format(device, dtype, tags), function()
      local K = kit.new(dtype, device)
      local cases = load_cases(K)
      for _, op in ipairs(ops) do
        local c = cases[op.name]
        for cname, run in pairs(c and c.forward or {}) do
          it(op.name .. ": " .. cname, function()
            kit.seed(#cname * 7919 + #op.name)
            run()
          end)
        end
      end
    end)
  end
end

describe("ops backward (central differences, float64, cpu)", function()
  local K = kit.new("float64", "cpu")
  local cases = load_cases(K)
  for _, op in ipairs(ops) do
    local c = cases[op.name]
    for cname, run in pairs(c and c.grad or {}) do
      it(op.name .. ": " .. cname, function()
        kit.seed(#cname * 104729 + #op.name)
        run()
      end)
    end
  end
end)
