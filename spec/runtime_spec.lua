-- What runs CPU work: remat.info(), `remat -v`, the BLAS remat opens and the kernels it
-- picks for it (never overriding OPENBLAS_CORETYPE), the warning when the BLAS runs
-- generic kernels, the built-in GEMM, and bitwise reproducibility at a fixed thread count.
local remat = require "remat"
local build = os.getenv("REMAT_BUILD") or "build"
local exe = build .. "/remat"

-- Runs `env ENV remat ARGS`; returns stdout, stderr, exit code.
local function run(envs, args)
  local err = os.tmpname()
  local p = assert(io.popen(("env %s %s %s 2> %s"):format(envs, exe, args, err), "r"))
  local out = p:read("a")
  local _, _, code = p:close()
  local e = assert(io.open(err))
  local errout = e:read("a")
  e:close()
  os.remove(err)
  return out, errout, code
end

local function has_avx2()
  local f = io.open("/proc/cpuinfo")
  local s = f and f:read("a") or ""
  if f then f:close() end
  return s:match("%savx2%s") ~= nil
end

describe("remat.info()", function()
  it("reports the version, the BLAS and its kernels, threads, SIMD level and CUDA", function()
    local i = remat.info()
    assert.are.equal("0.1.0", i.version)
    assert.is_true(#i.blas > 0 and #i.blas_core > 0 and #i.blas_core_from > 0)
    assert.is_true(math.type(i.threads) == "integer" and i.threads >= 1)
    assert.is_truthy(({ sse2 = 1, ["sse4.2"] = 1, avx = 1, avx2 = 1, avx512 = 1 })[i.simd])
    assert.are.equal("boolean", type(i.cuda))
    assert.are.equal("boolean", type(i.blas_generic))
    assert.are.equal("string", type(i.omp_wait))
    assert.is_truthy(({ avx512 = 1, avx2 = 1, portable = 1 })[i.vector_path], i.vector_path)
    if i.simd ~= "avx512" then assert.are_not.equal("avx512", i.vector_path) end
  end)

  it("the default build runs OpenBLAS's OpenMP build, with kernels for this CPU, no variables set", function()
    local i = remat.info()
    if os.getenv("OPENBLAS_CORETYPE") or os.getenv("REMAT_BLAS") then return end
    assert.matches("^OpenBLAS .* %(OpenMP%)$", i.blas)
    assert.is_true(i.blas_openmp)
    assert.is_false(i.blas_generic)
    if has_avx2() then assert.is_truthy(({ Haswell = 1, SkylakeX = 1, Zen = 1, Cooperlake = 1 })[i.blas_core]) end
  end)

  it("leaves the environment as it found it", function()
    local i = remat.info()
    if i.blas_core_from:match("picked by remat") then assert.is_nil(os.getenv("OPENBLAS_CORETYPE")) end
  end)
end)

describe("the BLAS #subprocess", function()
  it("remat -v prints the BLAS, its core and the threads", function()
    local out, err, code = run("", "-v")
    assert.are.equal(0, code, err)
    assert.matches("\nblas: [^\n]+, core %S+ %(", out)
    assert.matches("\nthreads: %d+ %(OpenMP", out)
    assert.matches("\nomp wait: [^\n]+\n", out)
  end)

  it("the command sets GOMP_SPINCOUNT=1000 when no wait policy is set, and keeps one that is", function()
    local clear = "-u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u REMAT_SET_SPINCOUNT -u LD_PRELOAD"
    local out, err, code = run(clear .. " OMP_DISPLAY_ENV=verbose",
      [[-e 'print(remat.info().omp_wait, os.getenv("GOMP_SPINCOUNT"))']])
    assert.are.equal(0, code, err)
    assert.are.equal("GOMP_SPINCOUNT=1000 (set by the remat command)\t1000\n", out)
    -- libgomp read it: its display of the environment (when it loads) says so
    assert.matches("GOMP_SPINCOUNT = '1000'", err, 1, true)
    out, err, code = run(clear .. " OMP_WAIT_POLICY=passive", "-v")
    assert.are.equal(0, code, err)
    assert.matches("\nomp wait: OMP_WAIT_POLICY=passive\n", out)
    out, err, code = run(clear .. " GOMP_SPINCOUNT=77", "-v")
    assert.are.equal(0, code, err)
    assert.matches("\nomp wait: GOMP_SPINCOUNT=77\n", out)
  end)

  it("never overrides OPENBLAS_CORETYPE, and warns when it makes an AVX2 CPU run generic kernels", function()
    if not remat.info().blas:match("^OpenBLAS") then return end
    local out, err, code = run("OPENBLAS_CORETYPE=Prescott", [[-e 'local r = require "remat"; local i = r.info()
      local a = r.randn(8, 8); a:matmul(a); print(i.blas_core, i.blas_core_from, os.getenv("OPENBLAS_CORETYPE"))']])
    assert.are.equal(0, code, err)
    assert.matches("^Prescott\tOPENBLAS_CORETYPE\tPrescott\n$", out)
    if has_avx2() then
      assert.matches("runs its generic Prescott kernels on this avx%d+ CPU because OPENBLAS_CORETYPE=Prescott is set", err)
    else
      assert.are.equal("", err)
    end
  end)

  it("REMAT_BLAS=builtin: the built-in GEMM gives the products the BLAS gives", function()
    local prog = [[-e 'local r = require "remat"; r.manual_seed(3)
      local a, b = r.randn(37, 53), r.randn(53, 29)
      local c, d = r.randn(2, 5, 7):to("float64"), r.randn(7, 4):to("float64")
      local w, x = r.randn(11, 53), r.randn(3, 53)
      local outs = { a:matmul(b), a:transpose(1, 2):transpose(1, 2):matmul(b:transpose(1, 2):contiguous():transpose(1, 2)),
                     c:matmul(d), r.nn.Linear(53, 11)(x), b:transpose(1, 2):matmul(a:transpose(1, 2)) }
      for _, t in ipairs(outs) do for _, v in ipairs(t:to("float64"):view(-1):totable()) do io.write(string.format("%.17g\n", v)) end end
      io.write(r.info().blas, "\n")']]
    local ref, e1, c1 = run("", prog)
    local got, e2, c2 = run("REMAT_BLAS=builtin", prog)
    assert.are.equal(0, c1, e1)
    assert.are.equal(0, c2, e2)
    assert.are.equal("", e2) -- asked for: no warning
    local rv, gv = {}, {}
    for l in ref:gmatch("[^\n]+") do rv[#rv + 1] = l end
    for l in got:gmatch("[^\n]+") do gv[#gv + 1] = l end
    assert.are.equal(#rv, #gv)
    assert.are.equal("built-in", gv[#gv])
    for k = 1, #rv - 1 do
      local x, y = tonumber(rv[k]), tonumber(gv[k])
      assert(math.abs(x - y) <= 1e-4 * (1 + math.abs(x)), ("element %d: BLAS %s, built-in %s"):format(k, rv[k], gv[k]))
    end
  end)

  it("a library that does not open falls back to the next one", function()
    local out, err, code = run("REMAT_BLAS=/nonexistent/libblas.so", [[-e 'print(require("remat").info().blas)']])
    assert.are.equal(0, code, err)
    assert.are_not.equal("", out)
  end)
end)

describe("reproducibility", function()
  -- Parameters after three training steps of a small residual MLP, as bytes.
  local function train_bytes()
    local nn = remat.nn
    remat.manual_seed(7)
    local model = nn.Sequential { nn.Linear(64, 96), nn.GELU(),
      nn.Residual(nn.Sequential { nn.LayerNorm(96), nn.Linear(96, 192), nn.GELU(), nn.Linear(192, 96) }),
      nn.LayerNorm(96), nn.Linear(96, 10) }
    local opt = remat.optim.AdamW(model:parameters(), { lr = 1e-2 })
    local x, y = remat.randn(300, 64), remat.tensor((function() local t = {} for i = 1, 300 do t[i] = i % 10 + 1 end return t end)())
    for _ = 1, 3 do
      local loss = nn.cross_entropy(model(x), y)
      loss:backward()
      opt:step()
      opt:zero_grad()
    end
    local parts = {}
    for _, p in ipairs(model:parameters()) do
      for _, v in ipairs(p:view(-1):totable()) do parts[#parts + 1] = string.pack("<f", v) end
    end
    return table.concat(parts)
  end

  it("training is bitwise identical run to run at a fixed thread count", function()
    assert.is_true(train_bytes() == train_bytes())
  end)
end)
