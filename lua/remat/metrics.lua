-- remat.train.metrics: a metrics log, one record per line, that `remat plot` draws.
--
--   local log = remat.train.metrics("run.jsonl")       -- or "run.csv"
--   log:write{ step = k, loss = l, lr = opt.lr }        -- + time and memory by category
--   log:close()
--
-- JSON lines (one object per line) or CSV (a header, then one row per record), chosen by
-- the file's extension or opts.format. Each record gets `time` (seconds since the log was
-- opened) and the live memory: `mem_live` and `mem_<category>` for every category
-- (bytes, the default device's or opts.device's). Lines are flushed as written, so a
-- plot of a running job sees them.
local remat = package.loaded.remat
local train = remat.train
local fail = remat._fail

local CATEGORIES = { "param", "grad", "optim", "activation", "workspace", "temp", "data" }

local Metrics = {}
Metrics.__index = Metrics
train.Metrics = Metrics

local function describe(v)
  if v == nil then return "nothing" end
  return type(v) .. " " .. tostring(v)
end

-- The columns every record has, in order (a CSV header starts with them).
local function standard_columns()
  local cols = { "step", "time", "mem_live" }
  for _, c in ipairs(CATEGORIES) do cols[#cols + 1] = "mem_" .. c end
  return cols
end

-- remat.train.metrics(path, [{ format = "jsonl" | "csv", device = "cpu" | "cuda" }]) -> log.
-- The file is created (truncated); an unwritable path raises naming it.
function train.metrics(path, opts)
  local fn = "remat.train.metrics"
  if type(path) ~= "string" then fail(fn .. ": the path must be a string, got " .. describe(path)) end
  opts = opts or {}
  if type(opts) ~= "table" then fail(fn .. ": opts must be a table, got " .. describe(opts)) end
  for k in pairs(opts) do
    if k ~= "format" and k ~= "device" then fail(("%s: unknown option '%s' (device, format)"):format(fn, tostring(k))) end
  end
  local format = opts.format or (path:match("%.csv$") and "csv" or "jsonl")
  if format ~= "jsonl" and format ~= "csv" then fail(fn .. ": format must be \"jsonl\" or \"csv\", got " .. describe(format)) end
  local f, err = io.open(path, "w")
  if not f then fail(("%s: cannot write %s: %s"):format(fn, path, tostring(err))) end
  return setmetatable({ path = path, format = format, file = f, device = opts.device, t0 = remat.now(),
                        columns = nil, records = 0 }, Metrics)
end

local function number_text(v)
  if math.type(v) == "integer" then return tostring(v) end
  if v ~= v or v == math.huge or v == -math.huge then return "null" end
  return ("%.10g"):format(v)
end

-- log:write(record): record is a table of string keys and number (or string) values;
-- `step` (an integer) is required. With CSV the first record fixes the columns: a later
-- one with a key not among them raises. Returns the log.
function Metrics:write(record)
  local fn = "metrics:write"
  if not self.file then fail(fn .. ": the log was closed") end
  if type(record) ~= "table" then fail(fn .. ": expected a table of values, got " .. describe(record)) end
  if math.type(record.step) ~= "integer" then fail(fn .. ": step must be an integer, got " .. describe(record.step)) end
  local row = {}
  for k, v in pairs(record) do
    if type(k) ~= "string" or not k:match("^[%a_][%w_]*$") then fail(fn .. ": keys must be names, got " .. describe(k)) end
    if type(v) ~= "number" and type(v) ~= "string" then
      fail(("%s: %s must be a number or a string, got %s"):format(fn, k, describe(v)))
    end
    if type(v) == "string" and (v:find("[\"\\,%c]")) then fail(("%s: %s has a quote, comma, backslash or control character"):format(fn, k)) end
    row[k] = v
  end
  row.time = remat.now() - self.t0
  local m = remat.memory.stats(self.device)
  row.mem_live = m.live
  for _, c in ipairs(CATEGORIES) do row["mem_" .. c] = m.by_category[c] or 0 end
  local parts = {}
  if self.format == "csv" then
    if not self.columns then
      local cols, extra = standard_columns(), {}
      local standard = {}
      for _, c in ipairs(cols) do standard[c] = true end
      for k in pairs(row) do if not standard[k] then extra[#extra + 1] = k end end
      table.sort(extra)
      table.move(extra, 1, #extra, #cols + 1, cols)
      self.columns = cols
      self.file:write(table.concat(cols, ","), "\n")
    end
    local known = {}
    for _, c in ipairs(self.columns) do known[c] = true end
    for k in pairs(row) do
      if not known[k] then fail(("%s: %s is not a column of %s (the first record fixed them)"):format(fn, k, self.path)) end
    end
    for i, c in ipairs(self.columns) do
      local v = row[c]
      parts[i] = v == nil and "" or type(v) == "number" and number_text(v):gsub("^null$", "") or v
    end
    self.file:write(table.concat(parts, ","), "\n")
  else
    local keys = standard_columns()
    local standard = {}
    for _, c in ipairs(keys) do standard[c] = true end
    local extra = {}
    for k in pairs(row) do if not standard[k] then extra[#extra + 1] = k end end
    table.sort(extra)
    table.move(extra, 1, #extra, #keys + 1, keys)
    for _, k in ipairs(keys) do
      local v = row[k]
      parts[#parts + 1] = ('"%s":%s'):format(k, type(v) == "number" and number_text(v) or ('"' .. v .. '"'))
    end
    self.file:write("{", table.concat(parts, ","), "}\n")
  end
  self.file:flush()
  self.records = self.records + 1
  return self
end

-- log:close(): closes the file (a closed log raises on write; closing twice is fine).
function Metrics:close()
  if self.file then self.file:close() end
  self.file = nil
end

Metrics.__close = Metrics.close

function Metrics:__tostring()
  return ("metrics log %s (%s, %d records%s)"):format(self.path, self.format, self.records, self.file and "" or ", closed")
end

-- remat.train.read_metrics(path) -> { columns = {...}, rows = { {col = value}, ... } }: a
-- log written by train.metrics (JSON lines or CSV), numbers as numbers.
function train.read_metrics(path)
  local fn = "remat.train.read_metrics"
  if type(path) ~= "string" then fail(fn .. ": the path must be a string, got " .. describe(path)) end
  local f, err = io.open(path, "r")
  if not f then fail(("%s: cannot read %s: %s"):format(fn, path, tostring(err))) end
  local text, rerr = f:read("a")
  f:close()
  -- io.open succeeds on a directory; reading it fails
  if not text then fail(("%s: cannot read %s: %s"):format(fn, path, tostring(rerr))) end
  local rows, columns, seen = {}, {}, {}
  local function add_column(c)
    if not seen[c] then seen[c] = true columns[#columns + 1] = c end
  end
  local n = 0
  local header
  for line in text:gmatch("[^\n]+") do
    n = n + 1
    if line:match("^%s*{") then
      local row = {}
      local body = line:match("^%s*{(.*)}%s*$")
      if not body then fail(("%s: %s line %d is not a JSON object"):format(fn, path, n)) end
      for k, v in body:gmatch('"([%w_]+)"%s*:%s*("?[^,"]*"?)') do
        add_column(k)
        if v == "null" then row[k] = nil
        elseif v:sub(1, 1) == '"' then row[k] = v:sub(2, -2)
        else
          row[k] = tonumber(v)
          if row[k] == nil then fail(("%s: %s line %d: cannot read %s = %s"):format(fn, path, n, k, v)) end
        end
      end
      rows[#rows + 1] = row
    elseif not header then
      header = {}
      for c in (line .. ","):gmatch("([^,]*),") do header[#header + 1] = c add_column(c) end
    else
      local row, i = {}, 0
      for v in (line .. ","):gmatch("([^,]*),") do
        i = i + 1
        local c = header[i]
        if not c then fail(("%s: %s line %d has more fields than the header"):format(fn, path, n)) end
        if v ~= "" then row[c] = tonumber(v) or v end
      end
      rows[#rows + 1] = row
    end
  end
  return { columns = columns, rows = rows }
end

return Metrics
