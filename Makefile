# remat build. `make` builds the library, the Lua module and the command;
# `make test` runs the specs; `make run` trains the default model. Both first install
# the Debian packages (`make deps`), then build in a second make, which reads this file
# again: the pkg-config lookups below see what deps has just installed.
CC      ?= gcc
NVCC    ?= nvcc
BUILD   := build
PKGS    := lua5.4
# Everything the build and the specs need (Open MPI: remat.dist's specs; luarocks: the
# rock's spec). .ci/run removes and reinstalls the -dev packages from this list.
DEPS_APT := lua5.4 liblua5.4-dev lua-busted libopenblas0-openmp pkg-config zlib1g-dev \
            dataset-fashion-mnist libreadline-dev gnuplot-nox valgrind \
            libopenmpi-dev openmpi-bin luarocks

# The BLAS is opened at run time (kernels/cpu/blas.c says why): the first of these that
# opens and has cblas_sgemm; REMAT_BLAS=path at run time comes before them. Debian's
# OpenMP build of OpenBLAS first: it shares remat's OpenMP thread pool (README, "CPU speed").
MULTIARCH := $(shell $(CC) -print-multiarch 2>/dev/null)
BLAS    ?= /usr/lib/$(MULTIARCH)/openblas-openmp/libopenblas.so.0 libopenblas.so.0 libblis.so.4

PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

WARN    := -Wall -Wextra -Wno-unused-parameter -Wshadow -Wstrict-prototypes
OPT     ?= -O2 -march=x86-64-v2
SAN     ?=
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) $(WARN) -fPIC -fopenmp -fno-math-errno $(SAN) $(PKG_CFLAGS) -Icore
LDLIBS  := $(PKG_LIBS) -lz -lm -ldl -fopenmp $(SAN)

CORE_SRC   := $(wildcard core/*.c)
KERNEL_SRC := $(wildcard kernels/cpu/*.c)
LUA_C_SRC  := $(filter-out lua/main.c lua/repl.c,$(wildcard lua/*.c))
LUA_LIB    := $(sort $(wildcard lua/remat/*.lua))

LIB_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(CORE_SRC) $(KERNEL_SRC) $(LUA_C_SRC)) \
           $(BUILD)/obj/lua_embedded.o

# CUDA: built when nvcc is found, or forced with CUDA=1 / CUDA=0 (empty, as the rock
# passes it when not given: found).
ifeq ($(strip $(CUDA)),)
override CUDA := $(if $(shell command -v $(NVCC) 2>/dev/null),1,0)
endif
CUDA_SRC := $(wildcard kernels/cuda/*.cu)
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC) 2>/dev/null))
CUDA_TARGET := $(if $(filter 1,$(CUDA)),$(if $(CUDA_SRC),$(BUILD)/libremat_cuda.so),)

.PHONY: all deps print-deps test run check-mem clean examples bench build-for-test
all: $(BUILD)/libremat.a $(BUILD)/libremat.so $(BUILD)/remat.so $(BUILD)/remat $(CUDA_TARGET)

$(BUILD)/obj/%.o: %.c $(wildcard core/*.h core/*.def kernels/cpu/*.h lua/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/kernels/cpu/blas.o: CFLAGS += -DREMAT_BLAS_LIBS='"$(strip $(BLAS))"'

$(BUILD)/lua_embedded.c: $(LUA_LIB) tools/embed.lua
	@mkdir -p $(BUILD)
	lua5.4 tools/embed.lua $(LUA_LIB) > $@

$(BUILD)/obj/lua_embedded.o: $(BUILD)/lua_embedded.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libremat.a: $(LIB_OBJ)
	ar rcs $@ $^

# -z nodelete: Lua unloads C modules at lua_close, which would pull code from under
# OpenMP's worker threads.
$(BUILD)/libremat.so: $(LIB_OBJ)
	$(CC) -shared -Wl,-z,nodelete -o $@ $^ $(LDLIBS)

# The Lua module: `require "remat"` finds luaopen_remat here.
$(BUILD)/remat.so: $(LIB_OBJ)
	$(CC) -shared -Wl,-z,nodelete -o $@ $^ $(LDLIBS)

$(BUILD)/remat: lua/main.c lua/repl.c $(LIB_OBJ)
	$(CC) $(CFLAGS) -o $@ lua/main.c lua/repl.c $(LIB_OBJ) $(LDLIBS) -lreadline -Wl,-E

# The CUDA backend: one object per family (parallel with make -j), cudart linked
# statically so the library loads without a driver (init then reports why CUDA is not
# available); only what backend.cu exports is visible (the library is dlopen'ed
# RTLD_LOCAL and must not depend on core symbols: nm -uD shows no rm_*). Linked with
# --no-undefined: an op without its cuk_<op> kernel is a link error, as on the CPU side.
# cuBLAS and cublasLt (bias epilogues) come from the toolkit's lib64. The caching
# allocator is core/blockpool.c, compiled into the plugin too (hidden), so the specs
# check on the CPU the same code that carves device memory.
CUDA_OBJ := $(patsubst kernels/cuda/%.cu,$(BUILD)/obj/cuda/%.o,$(CUDA_SRC)) $(BUILD)/obj/cuda/blockpool.o
CUDA_FLAGS ?= -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -fPIC,-fvisibility=hidden,-Wall \
              -Icore
CUDA_LIBS := -cudart static -lcublasLt -lcublas -Xlinker --no-undefined \
             $(if $(CUDA_HOME),-L$(CUDA_HOME)/lib64 -Xlinker -rpath=$(CUDA_HOME)/lib64)

$(BUILD)/obj/cuda/%.o: kernels/cuda/%.cu $(wildcard kernels/cuda/*.cuh core/*.h core/*.def)
	@mkdir -p $(dir $@)
	$(NVCC) $(CUDA_FLAGS) -c $< -o $@

$(BUILD)/obj/cuda/blockpool.o: core/blockpool.c core/blockpool.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fvisibility=hidden -c $< -o $@

$(BUILD)/libremat_cuda.so: $(CUDA_OBJ)
	$(NVCC) -shared $(CUDA_ARCH) -o $@ $^ $(CUDA_LIBS)

# Installs the Debian packages that are missing (as root); otherwise prints the apt-get
# line and fails. Without dpkg (not Debian) it only names what the build needs.
deps:
	@if ! command -v dpkg >/dev/null 2>&1; then \
	  echo "deps: no dpkg; install the equivalents of: $(DEPS_APT)"; exit 0; fi; \
	missing=$$(for p in $(DEPS_APT); do dpkg -s $$p 2>/dev/null | grep -q '^Status: install ok installed' || echo $$p; done); \
	if [ -z "$$missing" ]; then echo "deps: all installed"; \
	elif [ "$$(id -u)" = 0 ]; then \
	  echo "deps: installing" $$missing; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null \
	    || { echo "deps: apt-get install failed"; exit 1; }; \
	else echo "deps: missing packages; as root run: apt-get install -y" $$missing; exit 1; fi

# The package list, for .ci/run.
print-deps:
	@echo $(DEPS_APT)

LUA_ENV := LUA_PATH="$(CURDIR)/lua/?.lua;$(CURDIR)/spec/?.lua;;" LUA_CPATH="$(CURDIR)/$(BUILD)/?.so;;"
# busted under Lua 5.4 whatever `lua` is (luarocks makes it lua5.1): its script starts
# with `#!/usr/bin/env lua`, and remat.so only loads into the Lua it was built for.
BUSTED = lua5.4 "$$(command -v busted)"

# deps first, then the build in a new make (see the top of this file).
test:
	@$(MAKE) --no-print-directory deps
	@$(MAKE) --no-print-directory build-for-test
	$(LUA_ENV) $(BUSTED) --exclude-tags=gpu,slow -o spec/support/summary.lua spec

build-for-test: all examples

# MODEL: which models/<MODEL>.lua (mlp, cnn, gpt); ARGS: its flags (make run MODEL=cnn ARGS=--quick).
MODEL ?= mlp
run:
	@$(MAKE) --no-print-directory deps
	@$(MAKE) --no-print-directory all
	$(BUILD)/remat models/$(MODEL).lua $(ARGS)

# check-mem: the in-process specs under ASan/UBSan/LSan (specs that start other programs,
# tagged subprocess, would run those under the preloaded runtime too; valgrind runs them),
# with the fuzz specs (spec/fuzz_spec.lua, and examples/host/faults built with the
# sanitizers) at full length.
check-mem:
	$(MAKE) BUILD=build-asan SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" OPT=-O1 CUDA=0 all examples
	LUA_PATH="$(CURDIR)/lua/?.lua;$(CURDIR)/spec/?.lua;;" LUA_CPATH="$(CURDIR)/build-asan/?.so;;" \
	  LD_PRELOAD="$$(gcc -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=1 REMAT_FUZZ=full REMAT_BUILD=build-asan \
	  $(BUSTED) --exclude-tags=gpu,slow,subprocess,valgrind -o spec/support/summary.lua spec

clean:
	rm -rf $(BUILD) build-asan

# ---- Hosts: examples, pkg-config, install ----
# C programs that embed remat (examples/host), linked as a host would: against the
# static archive (the op and kernel tables reference every family, so a plain link
# pulls all of them in; a host may link libremat.so instead).
EXAMPLE_SRC := $(wildcard examples/host/*.c)
EXAMPLE_BIN := $(patsubst examples/host/%.c,$(BUILD)/examples/%,$(EXAMPLE_SRC))

examples: $(EXAMPLE_BIN)

$(BUILD)/examples/%: examples/host/%.c examples/host/common.h core/remat.h $(BUILD)/libremat.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libremat.a $(LDLIBS)

# remat.pc for hosts (pkg-config --cflags --libs remat), and `make install PREFIX=...`
# (default /usr/local), which the rockspec (build type make) drives with the INST_*
# directories of the rock. The plugins (libremat_cuda.so, libremat_mpi.so) go beside
# libremat.so, and also to INST_PLUGINDIR when set (the rock: beside remat.so);
# core/plugin.c finds them from either.
PREFIX       ?= /usr/local
INST_LIBDIR  ?= $(PREFIX)/lib/lua/5.4
INST_BINDIR  ?= $(PREFIX)/bin
INST_INCDIR  ?= $(PREFIX)/include
INST_CLIBDIR ?= $(PREFIX)/lib
INST_PLUGINDIR ?=
REMAT_VER    := $(shell sed -n 's/^\#define REMAT_VERSION "\(.*\)"/\1/p' core/remat.h)

.PHONY: pkgconfig install remat-pc-force
pkgconfig: $(BUILD)/remat.pc

# Remade every time: its paths come from PREFIX / INST_* of this make invocation.
$(BUILD)/remat.pc: remat.pc.in core/remat.h remat-pc-force
	@mkdir -p $(BUILD)
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(INST_CLIBDIR)|g' -e 's|@INCDIR@|$(INST_INCDIR)|g' \
	    -e 's|@VERSION@|$(REMAT_VER)|g' -e 's|@LIBS_PRIVATE@|$(strip $(PKG_LIBS) -lz -lm -ldl -fopenmp)|g' $< > $@

install: all pkgconfig
	install -d $(DESTDIR)$(INST_LIBDIR) $(DESTDIR)$(INST_BINDIR) $(DESTDIR)$(INST_INCDIR) \
	  $(DESTDIR)$(INST_CLIBDIR)/pkgconfig
	install -m 755 $(BUILD)/remat.so $(DESTDIR)$(INST_LIBDIR)/remat.so
	install -m 755 $(BUILD)/remat $(DESTDIR)$(INST_BINDIR)/remat
	install -m 644 core/remat.h $(DESTDIR)$(INST_INCDIR)/remat.h
	install -m 644 $(BUILD)/libremat.a $(DESTDIR)$(INST_CLIBDIR)/libremat.a
	install -m 755 $(BUILD)/libremat.so $(DESTDIR)$(INST_CLIBDIR)/libremat.so
	install -m 644 $(BUILD)/remat.pc $(DESTDIR)$(INST_CLIBDIR)/pkgconfig/remat.pc
	$(if $(PLUGINS),install -m 755 $(PLUGINS) $(DESTDIR)$(INST_CLIBDIR)/)
	$(if $(and $(PLUGINS),$(INST_PLUGINDIR)),install -d $(DESTDIR)$(INST_PLUGINDIR) && \
	  install -m 755 $(PLUGINS) $(DESTDIR)$(INST_PLUGINDIR)/)

# Data parallelism (remat.dist): the MPI backend is its own shared object, built when
# Open MPI is found (pkg-config ompi-c) and dlopen'ed by remat.dist.init(), so remat
# builds and runs without MPI. With nccl.h (the CUDA toolkit) it also carries the NCCL
# path for CUDA tensors; libnccl and libcudart are opened at run time. MPI=0|1 forces.
MPI_CFLAGS := $(shell pkg-config --cflags ompi-c 2>/dev/null)
MPI_LIBS   := $(shell pkg-config --libs ompi-c 2>/dev/null)
MPI ?= $(if $(MPI_LIBS),1,0)
NCCL_H := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/local/cuda/include/nccl.h /usr/include/nccl.h))
NCCL_FLAGS := $(if $(NCCL_H),-DREMAT_NCCL -isystem $(dir $(NCCL_H)) $(if $(CUDA_HOME),-isystem $(CUDA_HOME)/include) -isystem /usr/local/cuda/include)
MPI_TARGET := $(if $(filter 1,$(MPI)),$(BUILD)/libremat_mpi.so)
PLUGINS = $(strip $(CUDA_TARGET) $(MPI_TARGET))
MPIRUN ?= mpirun --allow-run-as-root --oversubscribe
all: $(MPI_TARGET)

$(BUILD)/libremat_mpi.so: dist/mpi.c dist/nccl.c dist/dist_api.h
	@mkdir -p $(BUILD)
	$(CC) -std=c11 -D_GNU_SOURCE $(OPT) $(WARN) -fPIC -shared -fvisibility=hidden $(SAN) \
	  $(MPI_CFLAGS) $(NCCL_FLAGS) -o $@ dist/mpi.c $(MPI_LIBS) -ldl

.PHONY: run-dist
# Trains the default model (models/mlp.lua's) data-parallel on 2 processes.
run-dist:
	@$(MAKE) --no-print-directory deps
	@$(MAKE) --no-print-directory all
	$(MPIRUN) -np 2 $(BUILD)/remat dist/train.lua $(ARGS)
