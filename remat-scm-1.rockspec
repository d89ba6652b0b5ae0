-- luarocks make remat-scm-1.rockspec   (from the source tree)
-- Builds with the project's Makefile (`make all`, then `make install` with the rock's
-- directories): the Lua module remat.so (the Lua library is embedded in it), the
-- `remat` command, and for C hosts libremat.a/.so, remat.h and remat.pc under the rock's
-- prefix. Lua 5.4 and OpenBLAS are found with pkg-config, as in a plain `make`; the
-- CUDA backend is built when nvcc is on the PATH (CUDA=0 in build_variables skips it).
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
  },
  install_target = "install",
  install_variables = {
    BUILD = "build-rock",
    PREFIX = "$(PREFIX)",
    INST_LIBDIR = "$(LIBDIR)",
    INST_BINDIR = "$(BINDIR)",
    INST_INCDIR = "$(PREFIX)/include",
    INST_CLIBDIR = "$(PREFIX)/lib",
  },
}
