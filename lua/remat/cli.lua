-- Command-line flags and shared conventions for scripts run as `remat SCRIPT args...`
-- (models/*.lua):
--   local o = require("remat.cli").parse({ ... }, defaults, { numbers = {...}, ... })
-- Hand-written rather than lua-argparse: remat's Lua library is embedded in remat.so and
-- runs in any host's lua_State and from a rock with no other Lua module installed; the
-- flags a model script takes (numbers, strings, switches, one positional) fit here.
local cli = {}

-- Reads the argument list argv into o, the table of defaults (changed in place and
-- returned). spec.numbers, spec.strings and spec.switches are sets of flag names:
--   "--NAME VALUE" or "--NAME=VALUE" sets o.NAME to tonumber(VALUE) (numbers) or to
--   VALUE (strings); "--NAME" sets o.NAME = true (switches);
--   a word without "--" sets o[spec.positional] when the script takes one.
-- "--help" or "-h" calls spec.usage(nil), which prints the usage and exits 0. Anything
-- else calls spec.usage(msg), which must not return, with "--NAME needs a value",
-- "--NAME needs a number, got VALUE", "--NAME takes no value" or "unknown argument ARG".
function cli.parse(argv, o, spec)
  local numbers, strings, switches = spec.numbers or {}, spec.strings or {}, spec.switches or {}
  local i = 1
  while i <= #argv do
    local a = argv[i]
    local key, inline = a:match("^%-%-([^=]+)=(.*)$")
    key = key or a:match("^%-%-(.+)$")
    if a == "--help" or a == "-h" then spec.usage(nil)
    elseif key and switches[key] then
      if inline then spec.usage("--" .. key .. " takes no value") end
      o[key] = true
    elseif key and (numbers[key] or strings[key]) then
      local v = inline
      if v == nil then
        v = argv[i + 1]
        i = i + 1
      end
      if v == nil then spec.usage(a .. " needs a value") end
      if numbers[key] then
        o[key] = tonumber(v)
        if not o[key] then spec.usage("--" .. key .. " needs a number, got " .. v) end
      else
        o[key] = v
      end
    elseif not key and spec.positional and a:sub(1, 1) ~= "-" then
      o[spec.positional] = a
    else
      spec.usage("unknown argument " .. a)
    end
    i = i + 1
  end
  return o
end

-- Reads a --budget value: "none" (nil: no budget), "P%" (P percent of keep_peak, the
-- keep-everything activation peak in bytes) or a byte count ("3MiB", "3e6"). Returns
-- the bytes, or nil; raises "--budget: cannot read VALUE" for anything else.
function cli.budget(value, keep_peak)
  if value == "none" then return nil end
  local pct = tostring(value):match("^([%d.]+)%%$")
  if pct and tonumber(pct) then return math.floor(keep_peak * tonumber(pct) / 100) end
  local bytes = require("remat").memory.parse(value)
  if not bytes then error("--budget: cannot read " .. tostring(value) .. " (60%, 3MiB, 3e6 or none)", 0) end
  return bytes
end

-- The loss of a script's `--plan` table (the convention of `remat plan SCRIPT`): cross
-- entropy against n fixed labels 1, 2, ..., classes, 1, 2, ... made once here, because
-- the loss also runs inside dry runs, where tensors have no data to fill.
function cli.example_loss(n, classes)
  local remat = require "remat"
  local labels = {}
  for i = 1, n do labels[i] = (i % classes) + 1 end
  local y = remat.tensor(labels)
  return function(out) return remat.nn.cross_entropy(out, y) end
end

return cli
