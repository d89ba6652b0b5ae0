-- luarocks --lua-version=5.4 make remat-scm-1.rockspec [CUDA=0]   (from the source tree)
-- Builds with the project's Makefile (`make all`, then `make install` with the rock's
-- directories). Deployed into the tree: the Lua module remat.so (the Lua library is
-- embedded in it) and its plugins libremat_cuda.so / libremat_mpi.so in lib/lua/5.4/,
-- the `remat` command in bin/. For C hosts, libremat.a/.so, remat.h and remat.pc stay
-- in the rock's directory, under host/:
--   PKG_CONFIG_PATH=$(luarocks --lua-version=5.4 show --rock-dir remat)/host/lib/pkgconfig
-- Lua 5.4 and OpenBLAS are found with pkg-config, as in a plain `make`. The CUDA
-- backend is built when nvcc is on the PATH; CUDA=0 (or CUDA=1) decides. Without it
-- luarocks warns "unmatched variable CUDA", and the Makefile looks for nvcc.
rockspec_format = "3.0"
package = "remat"
version = "scm-1"

source = {
  -- not fetched by `luarocks make`; set to the published repository for `luarocks install`
  url = "git+https://example.invalid/remat.git",
}

description = {
  summary = "Training runtime for neural networks with activation checkpointing, driven by Lua 5.4",
  detailed = [[
remat is a tensor core and autograd in C (CPU with OpenBLAS and OpenMP; CUDA with
cuBLAS), driven by Lua 5.4 scripts, a REPL, or a C host that embeds it. It trades
compute for memory: checkpoint policies written in Lua become plans the C engine runs.
]],
  labels = { "machine-learning", "neural-networks", "autograd", "embedding" },
}

dependencies = {
  "lua >= 5.4, < 5.5",
}

external_dependencies = {
  ZLIB = { header = "zlib.h", library = "z" },
}

build = {
  type = "make",
  build_target = "all",
  build_variables = {
    BUILD = "build-rock",
    CUDA = "$(CUDA)",
  },
  install_target = "install",
  install_variables = {
    BUILD = "build-rock",
    CUDA = "$(CUDA)",
    -- luarocks deploys the rock's lib/ into the tree's lib/lua/5.4/: only the module
    -- and its plugins go there; what C hosts use stays in the rock, under host/.
    PREFIX = "$(PREFIX)/host",
    INST_LIBDIR = "$(LIBDIR)",
    INST_PLUGINDIR = "$(LIBDIR)",
    INST_BINDIR = "$(BINDIR)",
    INST_INCDIR = "$(PREFIX)/host/include",
    INST_CLIBDIR = "$(PREFIX)/host/lib",
  },
}
