-- Printing tensors, Torch7 style: one number format for every value shown, 2-d slices
-- under a "(i,j,.,.)" header, the middle elided past SUMMARY_AT elements, and a footer
-- "[remat.FloatTensor of size 2x3]". Returns the installer: tensor.lua passes its
-- helpers (info, readable) and gets the __tostring function back.
return function(h)
  local C = package.loaded.remat._C
  local info, readable = h.info, h.readable

  local EDGE, SUMMARY_AT = 3, 1000

  -- Number -> string with the chosen format.
  local function fmt_value(v, f)
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" end
    if v == -math.huge then return "-inf" end
    local s = string.format(f, v)
    if s == "-0" then s = "0" end
    return s
  end

  -- One format for every displayed value: integers, fixed point, or exponents.
  local function choose_format(vals)
    local maxabs, minabs, allint, integers = 0, math.huge, true, true
    for _, v in ipairs(vals) do
      if math.type(v) ~= "integer" then integers = false end
      if v == v and v ~= math.huge and v ~= -math.huge then
        local a = math.abs(v)
        if a > maxabs then maxabs = a end
        if a > 0 and a < minabs then minabs = a end
        if v ~= math.floor(v) then allint = false end
      end
    end
    if integers then return "%d" end -- an int32/int64 tensor: exact, whatever the size
    if allint and maxabs < 1e9 then return "%.0f" end
    if maxabs >= 1e5 or (maxabs > 0 and maxabs < 1e-3) or (minabs < math.huge and maxabs / minabs >= 1e5) then
      return "%.4e"
    end
    return "%.4f"
  end

  -- Positions shown along a dimension of size n (false: the elided middle).
  local function positions(n, summarize)
    local p = {}
    if summarize and n > 2 * EDGE then
      for i = 1, EDGE do p[#p + 1] = i end
      p[#p + 1] = false
      for i = n - EDGE + 1, n do p[#p + 1] = i end
    else
      for i = 1, n do p[i] = i end
    end
    return p
  end

  local function format_tensor(x)
    if C.is_freed(x) then return "[remat.Tensor, freed]" end
    local shape = info(x)
    local name = x:type()
    local nd, numel = #shape, x:numel()
    if numel == 0 then return ("[%s of size %s]"):format(name, table.concat(shape, "x")) end
    local t, owned = readable(x)
    local summarize = numel > SUMMARY_AT
    local flat = not summarize and C.flat(t) or nil
    local strides = {}
    do
      local s = 1
      for d = nd, 1, -1 do strides[d] = s; s = s * shape[d] end
    end
    local idx = {}
    local function value()
      if flat then
        local k = 1
        for d = 1, nd do k = k + (idx[d] - 1) * strides[d] end
        return flat[k]
      end
      return C.at(t, table.unpack(idx, 1, nd))
    end
    local out = {}
    if nd == 0 then
      local v = value()
      out[1] = fmt_value(v, choose_format({ v }))
    else
      -- the displayed elements as a list of rows: { header = ..., vals = {...} } or false (elided)
      local rows, all = {}, {}
      local rdim, cdimn = nd == 1 and 1 or nd - 1, nd
      local lead = {}
      for d = 1, nd - 2 do lead[d] = positions(shape[d], summarize) end
      local function each_slice(d)
        if d > nd - 2 then
          if nd >= 3 then
            local h = {}
            for k = 1, nd - 2 do h[k] = idx[k] end
            rows[#rows + 1] = { header = "(" .. table.concat(h, ",") .. ",.,.) = " }
          end
          for _, r in ipairs(positions(shape[rdim], summarize)) do
            if not r then rows[#rows + 1] = { ellipsis = true }
            else
              idx[rdim] = r
              local vals = {}
              if nd == 1 then
                vals[1] = value()
              else
                for _, c in ipairs(positions(shape[cdimn], summarize)) do
                  if c then idx[cdimn] = c; vals[#vals + 1] = value() else vals[#vals + 1] = false end
                end
              end
              for _, v in ipairs(vals) do if v then all[#all + 1] = v end end
              rows[#rows + 1] = { vals = vals }
            end
          end
          return
        end
        for _, p in ipairs(lead[d]) do
          if not p then rows[#rows + 1] = { ellipsis = true, slices = true }
          else idx[d] = p; each_slice(d + 1) end
        end
      end
      each_slice(1)
      local f = choose_format(all)
      local width = 1
      for _, v in ipairs(all) do width = math.max(width, #fmt_value(math.abs(v), f) + 1, #fmt_value(v, f)) end
      local first = true
      for _, r in ipairs(rows) do
        if r.header then
          if not first then out[#out + 1] = "" end
          out[#out + 1] = r.header
        elseif r.ellipsis then
          if r.slices and not first then out[#out + 1] = "" end
          out[#out + 1] = string.rep(" ", width - 3) .. "..."
        else
          local cells = {}
          for k, v in ipairs(r.vals) do
            cells[k] = v and string.format("%" .. width .. "s", fmt_value(v, f)) or string.rep(" ", width - 3) .. "..."
          end
          out[#out + 1] = table.concat(cells, " ")
        end
        first = false
      end
    end
    if owned then C.free(t) end
    local size = nd == 0 and "scalar" or "of size " .. table.concat(shape, "x")
    out[#out + 1] = ("[%s %s]"):format(name, size)
    return table.concat(out, "\n")
  end

  return format_tensor
end
