-- safetensors: round trips, atomic writes, and a strict reader that turns any
-- truncated, corrupted or hand-crafted bad file into a clear error (never a crash).
local remat = require "remat"
local C = remat._C

local files = require "support.files"
local tmpdir, read, write = files.tmpdir, files.read, files.write

local function rmdir(d) os.execute("rm -rf '" .. d .. "'") end

local function ls(d)
  local names = {}
  local p = io.popen("ls -A '" .. d .. "'")
  for line in p:lines() do names[#names + 1] = line end
  p:close()
  table.sort(names)
  return names
end

local function shape(t) return (C.info(t)) end
local function dtype(t) local _, dt = C.info(t) return dt end

-- A file from a header string and data bytes; hdr_len overrides the length field.
local function craft(path, header, bytes, hdr_len)
  write(path, string.pack("<I8", hdr_len or #header) .. header .. (bytes or ""))
end

-- Loads path expecting an error that mentions the path and every pattern given.
local function load_error(path, ...)
  local ok, err = pcall(C.load, path)
  assert(not ok, "expected an error loading " .. path)
  err = tostring(err)
  assert(err:find(path, 1, true), "error does not name the file: " .. err)
  for _, pat in ipairs({ ... }) do
    assert(err:find(pat, 1, true), ("error %q does not mention %q"):format(err, pat))
  end
  return err
end

-- Deterministic generator for corruptions (xorshift32).
local state = 0x1234567
local function rnd(n)
  state = state ~ (state << 13) & 0xffffffff
  state = state ~ (state >> 17)
  state = state ~ (state << 5) & 0xffffffff
  return state % n + 1
end

local dir
before_each(function() dir = tmpdir() end)
after_each(function() rmdir(dir) end)

describe("safetensors round trip", function()
  it("keeps float32 and float64 values, shapes and dtypes exactly", function()
    local vals = { 1.5, -2.25, 3e-8, 1e30, 0, -0.0, 7, 1 / 3 }
    local a = C.from_table(vals, { 2, 4 }, "float32")
    local b = C.from_table(vals, { 2, 2, 2 }, "float64")
    local c = C.from_table({ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 }, { 11 }, "float32")
    local path = dir .. "/m.safetensors"
    C.save(path, { ["layer.0.weight"] = a, ["layer.1.bias"] = b, c = c })
    local t, meta, dts = C.load(path)
    assert.same({ 2, 4 }, shape(t["layer.0.weight"]))
    assert.same({ 2, 2, 2 }, shape(t["layer.1.bias"]))
    assert.same({ 11 }, shape(t.c))
    assert.equal("float32", dtype(t["layer.0.weight"]))
    assert.equal("float64", dtype(t["layer.1.bias"]))
    assert.same(C.flat(a), C.flat(t["layer.0.weight"]))
    assert.same(C.flat(b), C.flat(t["layer.1.bias"]))
    assert.same(C.flat(c), C.flat(t.c))
    assert.same({}, meta)
    assert.same({ ["layer.0.weight"] = "F32", ["layer.1.bias"] = "F64", c = "F32" }, dts)
  end)

  it("keeps NaN and infinities", function()
    local a = C.from_table({ 0 / 0, 1 / 0, -1 / 0 }, { 3 }, "float64")
    local path = dir .. "/n.safetensors"
    C.save(path, { a = a })
    local v = C.flat(C.load(path).a)
    assert(v[1] ~= v[1])
    assert.equal(1 / 0, v[2])
    assert.equal(-1 / 0, v[3])
  end)

  it("keeps metadata, with escapes and non-ASCII text", function()
    local path = dir .. "/meta.safetensors"
    local meta = { format = "pt", note = 'quote " backslash \\ tab \t newline \n', ["clé"] = "värde ✓" }
    C.save(path, { x = C.full({ 2 }, 1) }, meta)
    local _, got = C.load(path)
    assert.same(meta, got)
  end)

  it("saves and loads empty and 0-d tensors", function()
    local path = dir .. "/e.safetensors"
    C.save(path, { empty = C.full({ 0, 3 }, 0), scalar = C.from_table({ 42 }, {}, "float32"),
                   none = C.full({ 0 }, 0, "float64") })
    local t = C.load(path)
    assert.same({ 0, 3 }, shape(t.empty))
    assert.same({}, shape(t.scalar))
    assert.same({ 0 }, shape(t.none))
    assert.equal("float64", dtype(t.none))
    assert.equal(42, C.item(t.scalar))
  end)

  it("saves and loads an empty table of tensors", function()
    local path = dir .. "/nothing.safetensors"
    C.save(path, {})
    local t, meta = C.load(path)
    assert.same({}, t)
    assert.same({}, meta)
  end)

  it("saves a non-contiguous view as its logical values", function()
    local base = C.from_table({ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 }, { 3, 4 }, "float32")
    local tr = C.op(C.ops.transpose, { dim0 = 0, dim1 = 1 }, base)                    -- 4x3
    local nar = C.op(C.ops.narrow, { dim = 1, start = 1, length = 2 }, base)                   -- 3x2, columns 2..3
    local path = dir .. "/v.safetensors"
    C.save(path, { tr = tr, nar = nar })
    local t = C.load(path)
    assert.same({ 4, 3 }, shape(t.tr))
    assert.same({ 1, 5, 9, 2, 6, 10, 3, 7, 11, 4, 8, 12 }, C.flat(t.tr))
    assert.same({ 3, 2 }, shape(t.nar))
    assert.same({ 2, 3, 6, 7, 10, 11 }, C.flat(t.nar))
  end)

  it("writes the header as the format says: sorted names, padded to 8, offsets tiling the data", function()
    local path = dir .. "/h.safetensors"
    C.save(path, { zeta = C.full({ 3 }, 1), alpha = C.full({ 2 }, 2, "float64") }, { k = "v" })
    local s = read(path)
    local n = string.unpack("<I8", s)
    assert.equal(0, (8 + n) % 8)
    local header = s:sub(9, 8 + n)
    assert.truthy(header:match("^{.*} *$"))
    local ia, iz = header:find('"alpha"', 1, true), header:find('"zeta"', 1, true)
    assert(ia and iz and ia < iz, "tensors are not sorted by name: " .. header)
    assert.truthy(header:find('"alpha":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}', 1, true))
    assert.truthy(header:find('"zeta":{"dtype":"F32","shape":[3],"data_offsets":[16,28]}', 1, true))
    assert.truthy(header:find('"__metadata__":{"k":"v"}', 1, true))
    assert.equal(8 + n + 28, #s)
  end)

  it("loads into the memory category the caller names (param by default)", function()
    local path = dir .. "/c.safetensors"
    C.save(path, { w = C.full({ 256 }, 1) })
    collectgarbage()
    local before = remat.memory.stats().by_category
    local t = C.load(path)
    local mid = remat.memory.stats().by_category
    assert.equal(before.param + 1024, mid.param)
    local u = C.load(path, "temp")
    assert.equal(before.temp + 1024, remat.memory.stats().by_category.temp)
    assert.has_error(function() C.load(path, "nope") end)
    C.free(t.w); C.free(u.w)
  end)

  it("remat.save / remat.load: the Lua API, metadata values turned into strings", function()
    local path = dir .. "/api.safetensors"
    remat.save(path, { w = C.full({ 2, 2 }, 3) }, { epoch = 3, done = true, name = "mlp" })
    local t, meta = remat.load(path)
    assert.same({ 3, 3, 3, 3 }, C.flat(t.w))
    assert.same({ epoch = "3", done = "true", name = "mlp" }, meta)
    assert.has_error(function() remat.save(path, "nope") end,
      nil)
    local ok, err = pcall(remat.save, path, { w = 5 })
    assert(not ok and err:find("'w' is a number, not a tensor", 1, true), err)
    ok, err = pcall(remat.save, path, { C.full({ 1 }, 1) })
    assert(not ok and err:find("names must be strings", 1, true), err)
    ok, err = pcall(remat.save, path, { __metadata__ = C.full({ 1 }, 1) })
    assert(not ok and err:find("reserved", 1, true), err)
    ok, err = pcall(remat.save, path, { ["bad\255name"] = C.full({ 1 }, 1) })
    assert(not ok and err:find("UTF-8", 1, true), err)
    ok, err = pcall(remat.load, dir .. "/missing.safetensors")
    assert(not ok and err:find("missing.safetensors: no such file", 1, true), err)
    local f = C.full({ 1 }, 1)
    C.free(f)
    ok, err = pcall(remat.save, path, { f = f })
    assert(not ok and err:find("freed", 1, true), err)
  end)
end)

describe("safetensors atomic writes", function()
  it("leaves no temporary file behind", function()
    local path = dir .. "/a.safetensors"
    C.save(path, { x = C.full({ 1000 }, 1) })
    C.save(path, { y = C.full({ 10 }, 2) })
    assert.same({ "a.safetensors" }, ls(dir))
    local t = C.load(path)
    assert.is_nil(t.x)
    assert.same({ 10 }, shape(t.y))
  end)

  it("on failure leaves the old file intact and no temporary file", function()
    local path = dir .. "/keep.safetensors"
    C.save(path, { x = C.full({ 4 }, 7) })
    local old = read(path)
    assert(os.execute("mkdir '" .. dir .. "/adir'"))
    local ok, err = pcall(C.save, dir .. "/adir", { x = C.full({ 4 }, 1) })
    assert(not ok and err:find("adir", 1, true), err)
    ok, err = pcall(C.save, dir .. "/no/such/dir/x.safetensors", { x = C.full({ 4 }, 1) })
    assert(not ok and err:find("temporary file", 1, true), err)
    assert.same({ "adir", "keep.safetensors" }, ls(dir))
    assert.same({}, ls(dir .. "/adir"))
    assert.equal(old, read(path))
  end)
end)

describe("safetensors reader", function()
  local small
  before_each(function()
    small = dir .. "/small.safetensors"
    C.save(small, {
      a = C.from_table({ 1, 2, 3, 4, 5, 6 }, { 2, 3 }, "float32"),
      b = C.from_table({ 0.5 }, {}, "float64"),
      e = C.full({ 0 }, 0),
    }, { author = "remat" })
  end)

  it("rejects the file truncated at every byte, naming the file", function()
    local s = read(small)
    local cut = dir .. "/cut.safetensors"
    collectgarbage()
    local live = remat.memory.stats().live
    for k = 0, #s - 1 do
      write(cut, s:sub(1, k))
      local ok, err = pcall(C.load, cut)
      assert(not ok, ("truncation at %d bytes loaded"):format(k))
      assert(tostring(err):find(cut, 1, true), err)
    end
    assert.equal(live, remat.memory.stats().live) -- a failed load keeps no tensor
  end)

  it("survives a few hundred random single-byte corruptions: an error or a valid load", function()
    local s = read(small)
    local bad = dir .. "/bad.safetensors"
    local errors = 0
    for _ = 1, 400 do
      local at = rnd(#s)
      local b = rnd(256) - 1
      write(bad, s:sub(1, at - 1) .. string.char(b) .. s:sub(at + 1))
      local ok, res = pcall(C.load, bad)
      if ok then
        for name, t in pairs(res) do
          assert.equal("string", type(name))
          C.flat(t)
        end
      else
        errors = errors + 1
        assert(tostring(res):find(bad, 1, true), res)
      end
    end
    assert(errors > 100, "corruptions were expected to fail more often: " .. errors)
  end)

  it("rejects overlapping offsets", function()
    local p = dir .. "/x.safetensors"
    craft(p, '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
      ("\0"):rep(12))
    load_error(p, "overlaps")
  end)

  it("rejects holes and trailing bytes", function()
    local p = dir .. "/x.safetensors"
    craft(p, '{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', ("\0"):rep(8))
    load_error(p, "4 bytes before tensor 'a'")
    craft(p, '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', ("\0"):rep(9))
    load_error(p, "last 5 bytes")
  end)

  it("rejects sizes that do not match the shape and dtype", function()
    local p = dir .. "/x.safetensors"
    craft(p, '{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', ("\0"):rep(8))
    load_error(p, "tensor 'a'", "needs 12 bytes")
    craft(p, '{"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}}', ("\0"):rep(8))
    load_error(p, "past the end of the data")
    craft(p, '{"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}}', ("\0"):rep(8))
    load_error(p, "end before they begin")
  end)

  it("rejects unknown and unsupported dtypes", function()
    local p = dir .. "/x.safetensors"
    craft(p, '{"a":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}}', ("\0"):rep(4))
    load_error(p, "unknown dtype 'F99'")
    craft(p, '{"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}}', ("\0"):rep(1))
    load_error(p, "dtype F8_E4M3", "cannot load")
  end)

  it("loads integers and booleans as int64/int32 (I64, U32, U64: int64; the narrower: int32), exactly", function()
    local p = dir .. "/x.safetensors"
    craft(p, '{"a":{"dtype":"I64","shape":[4],"data_offsets":[0,32]},"b":{"dtype":"I16","shape":[2],"data_offsets":[32,36]}}',
          string.pack("<i8i8i8i8i2i2", -7, 0, (1 << 53) + 1, math.mininteger, -32768, 300))
    local t = C.load(p)
    assert.equal("int64", dtype(t.a))
    assert.equal("int32", dtype(t.b))
    assert.same({ -7, 0, (1 << 53) + 1, math.mininteger }, C.flat(t.a))
    assert.equal("integer", math.type(C.flat(t.a)[3]))
    assert.same({ -32768, 300 }, C.flat(t.b))
    craft(p, '{"a":{"dtype":"U32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}',
          string.pack("<I4BB", 0xffffffff, 255, 0))
    t = C.load(p)
    assert.equal("int64", dtype(t.a))
    assert.same({ 0xffffffff }, C.flat(t.a))
    assert.equal("int32", dtype(t.b))
    assert.same({ 255, 0 }, C.flat(t.b))
    craft(p, '{"a":{"dtype":"U64","shape":[1],"data_offsets":[0,8]}}', string.pack("<i8", -1))
    load_error(p, "tensor 'a' (U64) holds 18446744073709551615", "beyond int64's range")
  end)

  it("saves int32 and int64 as I32 and I64, and reads them back bit for bit (views too)", function()
    local p = dir .. "/ints.safetensors"
    local a = remat.tensor({ { 1, -2, math.maxinteger }, { math.mininteger, 0, 5 } }, "int64")
    local b = remat.tensor({ 2147483647, -2147483648, 0 }, "int32")
    C.save(p, { a = a, at = a:t(), b = b, one = remat.tensor({ { 9 } }, "int64") })
    local f = io.open(p, "rb")
    local header = f:read(8 + string.unpack("<I8", f:read(8)))
    f:close()
    assert.truthy(header:find('"dtype":"I64"', 1, true))
    assert.truthy(header:find('"dtype":"I32"', 1, true))
    local t = C.load(p)
    assert.equal("int64", dtype(t.a))
    assert.same(C.flat(a), C.flat(t.a))
    assert.same({ 1, math.mininteger, -2, 0, math.maxinteger, 5 }, C.flat(t.at))
    assert.equal("int32", dtype(t.b))
    assert.same({ 2147483647, -2147483648, 0 }, C.flat(t.b))
    assert.same({ 1, 1 }, shape(t.one))
  end)

  it("rejects a huge or impossible header length without allocating it", function()
    local p = dir .. "/x.safetensors"
    craft(p, "{}", "", 1 << 40)
    load_error(p, "limit")
    craft(p, "{}", "", 90000000)
    load_error(p, "truncated")
    craft(p, "{}", "", 0xffffffffffffffff)
    load_error(p, "header length")
    write(p, "abc")
    load_error(p, "too short")
    write(p, "")
    load_error(p, "too short")
  end)

  it("rejects bad shapes: negative, too many dimensions, overflowing", function()
    local p = dir .. "/x.safetensors"
    craft(p, '{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}}')
    load_error(p, "negative")
    craft(p, '{"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}}', ("\0"):rep(4))
    load_error(p, "more than 8 dimensions")
    craft(p, '{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}}', ("\0"):rep(4))
    load_error(p, "impossibly large")
    craft(p, '{"a":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,4]}}', ("\0"):rep(4))
    load_error(p, "too large")
    craft(p, '{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}', ("\0"):rep(4))
    load_error(p, "integer")
  end)

  it("rejects duplicate names, missing fields and malformed JSON", function()
    local p = dir .. "/x.safetensors"
    local e = '{"dtype":"F32","shape":[1],"data_offsets":[%d,%d]}'
    craft(p, '{"a":' .. e:format(0, 4) .. ',"a":' .. e:format(4, 8) .. '}', ("\0"):rep(8))
    load_error(p, "'a' appears twice")
    craft(p, '{"a":{"dtype":"F32","shape":[1]}}')
    load_error(p, "no \"data_offsets\"")
    craft(p, '{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}', ("\0"):rep(4))
    load_error(p, "given twice")
    for _, h in ipairs({ "{", "[]", '{"a"}', '{"a":}', '{"a":{"dtype":F32}}', "{}x", '{"a\\q":1}',
                         '{"a":{"dtype":"F32","shape":[1,],"data_offsets":[0,4]}}', "{} \0",
                         '{"\1":1}', '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}',
                         '{"__metadata__":{"k":1}}', '{"__metadata__":{},"__metadata__":{}}',
                         '{"__metadata__":{"k":"a","k":"b"}}', '{"bad\255":1}', '{"\\ud800x":1}' }) do
      craft(p, h, ("\0"):rep(4))
      load_error(p)
    end
  end)

  it("limits nesting depth in fields it skips", function()
    local p = dir .. "/x.safetensors"
    local deep = ("["):rep(10000) .. ("]"):rep(10000)
    craft(p, '{"a":{"x":' .. deep .. ',"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', ("\0"):rep(4))
    load_error(p, "nesting too deep")
  end)

  it("accepts what the format allows: whitespace, padding, unknown fields, escapes, null metadata", function()
    local p = dir .. "/x.safetensors"
    local h = ' { "__metadata__" : null ,\n "a\\u00e9\\"\\ud83d\\ude00\\/b" : { "extra" : {"x":[1,2.5e3,-0.5,true,false,null,"s"]}, ' ..
      '"data_offsets" : [ 0 , 4 ] , "shape" : [ ] , "dtype" : "F32" } }    '
    craft(p, h, string.pack("<f", 2.5))
    local t, meta = C.load(p)
    assert.same({}, meta)
    local name = 'aé"😀/b'
    assert(t[name], "escaped name not decoded")
    assert.equal(2.5, C.item(t[name]))
  end)

  it("converts F16 and BF16 to float32 on load", function()
    local p = dir .. "/x.safetensors"
    local f16 = string.pack("<I2I2I2I2I2I2", 0x3C00, 0xC000, 0x7BFF, 0x0001, 0x7C00, 0x8000)
    local bf16 = string.pack("<I2I2I2", 0x3F80, 0xC040, 0xFF80)
    craft(p, '{"h":{"dtype":"F16","shape":[6],"data_offsets":[0,12]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[12,18]}}',
      f16 .. bf16)
    local t, _, dts = C.load(p)
    assert.equal("float32", dtype(t.h))
    assert.same({ 1, -2, 65504, 2 ^ -24, 1 / 0, -0.0 }, C.flat(t.h))
    assert.same({ 1, -3, -1 / 0 }, C.flat(t.b))
    assert.same({ h = "F16", b = "BF16" }, dts)
  end)

  it("rejects a directory and a missing file", function()
    load_error(dir, "not a regular file")
    load_error(dir .. "/none.safetensors", "no such file")
  end)
end)

describe("safetensors interoperability", function()
  local function python_ok(mods)
    return os.execute("python3 -c 'import " .. mods .. "' >/dev/null 2>&1") == true
  end

  it("is parsed by Python's own json and struct (an independent reader)", function()
    if not python_ok("json, struct") then pending("python3 not available") return end
    local path = dir .. "/py.safetensors"
    C.save(path, { w = C.from_table({ 1, 2, 3, 4, 5, 6 }, { 2, 3 }, "float32"),
                   b = C.from_table({ -1.5, 2.5 }, { 2 }, "float64") }, { fmt = "pt" })
    local script = [[
import json, struct, sys
d = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', d[:8])[0]
h = json.loads(d[8:8 + n].decode('utf-8'))
buf = d[8 + n:]
assert h.pop('__metadata__') == {'fmt': 'pt'}
w = h['w']; b = h['b']
assert w['dtype'] == 'F32' and w['shape'] == [2, 3]
assert b['dtype'] == 'F64' and b['shape'] == [2]
s, e = w['data_offsets']; assert list(struct.unpack('<6f', buf[s:e])) == [1, 2, 3, 4, 5, 6]
s, e = b['data_offsets']; assert list(struct.unpack('<2d', buf[s:e])) == [-1.5, 2.5]
print('ok')
]]
    local sp = dir .. "/check.py"
    write(sp, script)
    local p = io.popen("python3 '" .. sp .. "' '" .. path .. "' 2>&1")
    local out = p:read("a")
    p:close()
    assert.equal("ok\n", out)
  end)

  it("is readable by the Python safetensors library", function()
    if not python_ok("safetensors.numpy, numpy") then pending("python3 safetensors/numpy not installed") return end
    local path = dir .. "/lib.safetensors"
    C.save(path, { w = C.from_table({ 1, 2, 3, 4, 5, 6 }, { 2, 3 }, "float32") })
    local sp = dir .. "/check.py"
    write(sp, "import sys\nfrom safetensors.numpy import load_file\nt = load_file(sys.argv[1])\n" ..
      "assert t['w'].shape == (2, 3) and t['w'].tolist() == [[1, 2, 3], [4, 5, 6]]\nprint('ok')\n")
    local p = io.popen("python3 '" .. sp .. "' '" .. path .. "' 2>&1")
    local out = p:read("a")
    p:close()
    assert.equal("ok\n", out)
  end)

  -- int_tensors.safetensors was written by spec/fixtures/make_int_tensors.py (the Python
  -- safetensors library, PyTorch's writer); the spec also regenerates it when it can.
  local function check_int_file(path)
    local t = C.load(path)
    assert.equal("int64", dtype(t.labels))
    for _, k in ipairs { "ids", "pixels", "mask" } do assert.equal("int32", dtype(t[k])) end
    assert.same({ 3, 0, 9, -2, 1 << 53 }, C.flat(t.labels))
    assert.same({ 2, 3 }, shape(t.ids))
    assert.same({ 1, 2, 3, -4, 5, 2147483647 }, C.flat(t.ids))
    assert.same({ 0, 17, 255 }, C.flat(t.pixels))
    assert.same({ 1, 0, 1 }, C.flat(t.mask))
    -- the labels work as labels: cross_entropy and gather take them as they are
    local lab = remat.tensor({ 4, 1 }, "float64")
    local logits = remat.zeros(2, 10, "float64")
    assert.is_true(math.abs(remat.nn.cross_entropy(logits, lab):item() - math.log(10)) < 1e-12)
  end

  it("loads the int64/int32/uint8/bool tensors of a file the Python library wrote (committed fixture)", function()
    check_int_file("spec/fixtures/int_tensors.safetensors")
  end)

  -- torch_int64.safetensors was written by spec/fixtures/make_torch_int64.py (PyTorch's
  -- safetensors.torch.save_file, in /work/venv-torch).
  it("loads the int64 tensors PyTorch wrote (committed fixture): values, dtypes, shapes", function()
    local t = C.load("spec/fixtures/torch_int64.safetensors")
    assert.equal("int64", dtype(t.labels))
    assert.same({ 3, 0, 9, -2, 7 }, C.flat(t.labels))
    assert.equal("int64", dtype(t.ids))
    assert.same({ 2, 3 }, shape(t.ids))
    assert.same({ 1, 2, 3, -4, 5, (1 << 62) + 1 }, C.flat(t.ids))
    assert.equal((1 << 62) + 1, t.ids[2][3])
    assert.equal("integer", math.type(t.ids[2][3]))
    assert.same({ 3, 2 }, shape(t.ids_t))
    assert.same({ 1, -4, 2, 5, 3, (1 << 62) + 1 }, C.flat(t.ids_t))
    assert.equal("int32", dtype(t.small))
    assert.same({ 1, 1 }, shape(t.small))
    assert.equal("float32", dtype(t.weight))
    -- the labels work as labels as they are
    local logits = remat.zeros(5, 10, "float64")
    local lab = t.labels:narrow(1, 1, 3) + 1 -- 4, 1, 10
    assert.equal("int64", lab:dtype())
    assert.is_true(math.abs(remat.nn.cross_entropy(logits:narrow(1, 1, 3), lab):item() - math.log(10)) < 1e-12)
  end)

  it("round-trips PyTorch's int64 file: remat saves what it loaded, PyTorch reads the same values", function()
    local t = C.load("spec/fixtures/torch_int64.safetensors")
    local p = dir .. "/torch_rt.safetensors"
    C.save(p, t)
    local r = C.load(p)
    for k, v in pairs(t) do
      assert.equal(dtype(v), dtype(r[k]))
      assert.same(C.flat(v), C.flat(r[k]))
    end
    local py = "/work/venv-torch/bin/python"
    if not io.open(py) or os.execute(py .. " -c 'import safetensors.torch' >/dev/null 2>&1") ~= true then
      pending("no PyTorch with safetensors at " .. py) return
    end
    local out = io.popen(py .. " -c \"import sys; from safetensors.torch import load_file; t = load_file(sys.argv[1]); " ..
      "print(t['ids'].dtype, t['ids'].tolist(), t['small'].dtype)\" '" .. p .. "' 2>&1"):read("a")
    assert.equal("torch.int64 [[1, 2, 3], [-4, 5, 4611686018427387905]] torch.int32\n", out)
  end)

  it("loads a freshly written Python int64 file", function()
    if not python_ok("safetensors.numpy, numpy") then pending("python3 safetensors/numpy not installed") return end
    local path = dir .. "/ints.safetensors"
    assert.is_true(os.execute("python3 spec/fixtures/make_int_tensors.py '" .. path .. "' >/dev/null 2>&1") == true)
    check_int_file(path)
  end)

  it("saves CUDA tensors (strided too) as their values #gpu", function()
    if not C.device_available("cuda") then pending("no CUDA device") return end
    local base = C.to_device(C.from_table({ 1, 2, 3, 4, 5, 6 }, { 2, 3 }, "float32"), "cuda")
    local tr = C.op(C.ops.transpose, { dim0 = 0, dim1 = 1 }, base)
    local path = dir .. "/gpu.safetensors"
    C.save(path, { base = base, tr = tr })
    local t = C.load(path)
    assert.same({ 1, 2, 3, 4, 5, 6 }, C.flat(t.base))
    assert.same({ 1, 4, 2, 5, 3, 6 }, C.flat(t.tr))
  end)
end)
