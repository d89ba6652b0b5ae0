-- Command-line flags for scripts run as `remat SCRIPT args...` (models/*.lua):
--   local o = require("remat.cli").parse({ ... }, defaults, { numbers = {...}, ... })
local cli = {}

-- Reads the argument list argv into o, the table of defaults (changed in place and
-- returned). spec.numbers, spec.strings and spec.switches are sets of flag names:
--   "--NAME VALUE" sets o.NAME to tonumber(VALUE) (numbers) or to VALUE (strings);
--   "--NAME" sets o.NAME = true (switches);
--   a word without "--" sets o[spec.positional] when the script takes one.
-- Anything else calls spec.usage(msg), which must not return, with "--NAME needs a
-- value", "--NAME needs a number, got VALUE" or "unknown argument ARG".
function cli.parse(argv, o, spec)
  local numbers, strings, switches = spec.numbers or {}, spec.strings or {}, spec.switches or {}
  local i = 1
  while i <= #argv do
    local a = argv[i]
    local key = a:match("^%-%-(.+)$")
    if key and switches[key] then o[key] = true
    elseif key and (numbers[key] or strings[key]) then
      local v = argv[i + 1]
      if v == nil then spec.usage(a .. " needs a value") end
      if numbers[key] then
        o[key] = tonumber(v)
        if not o[key] then spec.usage(a .. " needs a number, got " .. v) end
      else
        o[key] = v
      end
      i = i + 1
    elseif not key and spec.positional then
      o[spec.positional] = a
    else
      spec.usage("unknown argument " .. a)
    end
    i = i + 1
  end
  return o
end

return cli
