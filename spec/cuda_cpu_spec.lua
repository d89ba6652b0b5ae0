-- The parts of the CUDA work that a machine without a GPU can check: the backend links
-- only when every op has its kernel, bench/gpu_check.sh parses and reports "no GPU"
-- cleanly, attention takes strided q, k, v (its CPU twin copies them), and
-- clip_grad_norm reads the device once per call, not once per parameter.
local remat = require "remat"
local kit = require "support.kit"
local C = remat._C

local function sh(cmd)
  local f = assert(io.popen(cmd .. " 2>&1; echo \"rc=$?\""))
  local out = f:read("a")
  f:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end

local exists = require("support.shell").exists

describe("the CUDA build #subprocess", function()
  local nvcc = sh("PATH=$PATH:/usr/local/cuda/bin command -v nvcc"):match("^(/%S+)")

  it("fails to link when an op has no kernel (no weak symbols), and links cublasLt", function()
    if not nvcc or not exists("build/obj/cuda/attention.o") or not exists("build/libremat_cuda.so") then
      pending("nvcc or the CUDA objects are not here (built by make when nvcc is found)")
      return
    end
    local list = {}
    for o in sh("ls build/obj/cuda/*.o"):gmatch("(%S+%.o)") do
      if o ~= "build/obj/cuda/attention.o" then list[#list + 1] = o end
    end
    local lib = os.tmpname()
    local out, rc = sh(("%s -shared -o %s %s -cudart static -lcublasLt -lcublas -Xlinker --no-undefined -L%s"):format(
      nvcc, lib, table.concat(list, " "), (nvcc:gsub("/bin/nvcc$", "/lib64"))))
    os.remove(lib)
    assert(rc ~= 0, "linking without attention.o succeeded:\n" .. out)
    assert(out:find("cuk_attention"), out)
    local deps = sh("readelf -d build/libremat_cuda.so")
    assert(deps:find("libcublasLt"), deps)
    local undef = sh("nm -uD build/libremat_cuda.so | grep ' rm_' || true")
    assert.equal("rc=0\n", (undef:gsub("^%s+", "")))
  end)
end)

describe("bench/gpu_check.sh #subprocess", function()
  it("parses, and without a GPU says so and stops (exit 0, no table of zeros)", function()
    local out, rc = sh("bash -n bench/gpu_check.sh")
    assert.equal(0, rc, out)
    if sh("command -v nvidia-smi"):find("^/") then
      pending("nvidia-smi is here: the no-GPU path does not apply")
      return
    end
    out, rc = sh("LOG=$(mktemp -d) TOTAL_S=60 bash bench/gpu_check.sh")
    assert.equal(0, rc, out)
    assert(out:find("no GPU: "), out)
    assert.is_nil(out:find("passed, 0 failed"), out)
  end)
end)

describe("attention takes strided q, k, v", function()
  it("views of one packed (B, T, 3, H, D) projection give what contiguous copies give, with gradients", function()
    kit.seed(21)
    local B, T, H, D = 2, 9, 2, 4
    for _, dt in ipairs({ "float32", "float64" }) do
      local base = C.from_table(kit.values({ B, T, 3, H, D }), { B, T, 3, H, D }, dt)
      local packed, copies = C.op(C.ops.copy, nil, base), C.op(C.ops.copy, nil, base)
      C.requires_grad(packed, true)
      C.requires_grad(copies, true)
      local function view(t, i) return C.op(C.ops.transpose, { dim0 = 1, dim1 = 2 }, C.op(C.ops.select, { dim = 2, index = i }, t)) end
      local function copy(t, i) return C.op(C.ops.copy, nil, view(t, i)) end
      local at = { causal = true, scale = 0 }
      local y1 = C.op(C.ops.attention, at, view(packed, 0), view(packed, 1), view(packed, 2))
      local y2 = C.op(C.ops.attention, at, copy(copies, 0), copy(copies, 1), copy(copies, 2))
      assert.same(C.flat(y2), C.flat(y1))
      local w = C.from_table(kit.values({ B, H, T, D }), { B, H, T, D }, dt)
      C.backward(y1, w)
      C.backward(y2, w)
      assert.same(C.flat(C.grad(copies)), C.flat(C.grad(packed)))
    end
  end)
end)

describe("optim.clip_grad_norm", function()
  it("reads the total norm once per call, not once per parameter", function()
    local params = {}
    for i = 1, 5 do
      local p = C.from_table({ i, -i }, { 2 }, "float32")
      C.requires_grad(p, true)
      C.set_grad(p, C.from_table({ 3 * i, 4 * i }, { 2 }, "float32"))
      params[i] = p
    end
    local item, reads = C.item, 0
    C.item = function(...) reads = reads + 1 return item(...) end
    local ok, total = pcall(remat.optim.clip_grad_norm, params, 1e9)
    C.item = item
    assert(ok, total)
    assert.equal(1, reads)
    assert(math.abs(total - 5 * math.sqrt(55)) < 1e-4, tostring(total))
  end)
end)
