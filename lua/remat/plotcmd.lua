-- `remat plot LOG [--out PATH]`: draws a metrics log (remat.train.metrics: JSON lines or
-- CSV) with gnuplot: the loss against the step, and under it the live memory by
-- category (MiB) against the step. Writes PATH (default LOG with the extension .png;
-- .svg gives SVG) and prints its name. Errors here are the user's: messages, no
-- tracebacks (main.c).
local remat = package.loaded.remat

local USAGE = [[usage: remat plot LOG [--out PATH]
  LOG         a metrics log written by remat.train.metrics (.jsonl or .csv), e.g. by
              `remat models/cnn.lua --log run.jsonl`
  --out PATH  the picture to write (.png or .svg; default LOG with .png)]]

local function usage(msg) error(msg .. "\n" .. USAGE, 0) end

local CATEGORIES = { "param", "grad", "optim", "activation", "workspace", "temp", "data" }

local function quote(s) return "'" .. s:gsub("'", "''") .. "'" end

local function main(args)
  local log, out
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "--help" or a == "-h" then print(USAGE) return end
    if a == "--out" then
      out = args[i + 1]
      if not out then usage("--out needs a path") end
      i = i + 2
    elseif a:sub(1, 2) == "--" then
      usage("unknown option " .. a)
    elseif log then
      usage("one log at a time (got " .. log .. " and " .. a .. ")")
    else
      log, i = a, i + 1
    end
  end
  if not log then usage("which log?") end
  out = out or (log:gsub("%.[%w]+$", "") .. ".png")
  local ok, m = pcall(remat.train.read_metrics, log)
  if not ok then error(tostring(m):gsub("^remat.train.read_metrics: ", ""), 0) end
  local rows = {}
  for _, r in ipairs(m.rows) do if r.step then rows[#rows + 1] = r end end
  if #rows == 0 then error(log .. ": no records with a step", 0) end
  local has_loss = false
  for _, r in ipairs(rows) do if type(r.loss) == "number" then has_loss = true break end end
  local cats = {}
  for _, c in ipairs(CATEGORIES) do
    for _, r in ipairs(rows) do
      if (tonumber(r["mem_" .. c]) or 0) > 0 then cats[#cats + 1] = c break end
    end
  end

  local term = out:match("%.svg$") and "svg size 900,700" or "pngcairo size 900,700"
  local gp = {
    "set terminal " .. term,
    "set output " .. quote(out),
    ("set multiplot layout %d,1 title %s"):format(has_loss and 2 or 1, quote(log)),
    "set grid",
    "set lmargin 10",
    "set rmargin 16",
    "set key outside right",
    "set xlabel 'step'",
  }
  local function block(col, scale)
    local lines = {}
    for _, r in ipairs(rows) do
      local v = tonumber(r[col])
      if v then lines[#lines + 1] = ("%d %.10g"):format(r.step, v * scale) end
    end
    lines[#lines + 1] = "e"
    return table.concat(lines, "\n")
  end
  if has_loss then
    gp[#gp + 1] = "set ylabel 'loss'"
    gp[#gp + 1] = "plot '-' using 1:2 with lines lw 2 title 'loss'"
    gp[#gp + 1] = block("loss", 1)
  end
  gp[#gp + 1] = "set ylabel 'live memory (MiB)'"
  local series, data = {}, {}
  series[1] = "'-' using 1:2 with lines lw 2 title 'live'"
  data[1] = block("mem_live", 1 / 2 ^ 20)
  for _, c in ipairs(cats) do
    series[#series + 1] = ("'-' using 1:2 with lines title %s"):format(quote(c))
    data[#data + 1] = block("mem_" .. c, 1 / 2 ^ 20)
  end
  gp[#gp + 1] = "plot " .. table.concat(series, ", ")
  for _, d in ipairs(data) do gp[#gp + 1] = d end
  gp[#gp + 1] = "unset multiplot"

  local script = os.tmpname()
  local f = assert(io.open(script, "w"))
  f:write(table.concat(gp, "\n"), "\n")
  f:close()
  local p = io.popen("gnuplot " .. script .. " 2>&1", "r")
  local said = p and p:read("a") or ""
  local done = p and p:close()
  os.remove(script)
  if not done then
    error(("gnuplot failed (is it installed? Debian: gnuplot-nox): %s"):format(said ~= "" and said or "no output"), 0)
  end
  print(("wrote %s (%d records%s, memory: live%s)"):format(out, #rows, has_loss and ", loss" or "",
    #cats > 0 and ", " .. table.concat(cats, ", ") or ""))
end

main(arg and { table.unpack(arg, 1) } or {})
