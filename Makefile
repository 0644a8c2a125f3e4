# arbiter — the two commands a newcomer needs: `make run` and `make test`.
BUILD_DIR ?= build
# ASAN_DIR: only removed by `make clean` (test-asan now builds in FUZZ_DIR).
ASAN_DIR ?= build-asan
TSAN_DIR ?= build-tsan
FUZZ_DIR ?= build-fuzz
TSA_DIR ?= build-tsa
JOBS ?= $(shell nproc)
CMAKE ?= cmake
# New build directories use Ninja when it is installed (scripts/install-deps.sh
# installs ninja-build): it compiles the objects of every target as soon as a
# core is free, where the Makefile generator waits for a library to be
# archived before compiling what links it, so on 2 cores one core idles at
# the end of every layer. cmake reads CMAKE_GENERATOR only when it creates a
# build directory; an existing one keeps its generator.
export CMAKE_GENERATOR ?= $(if $(shell command -v ninja 2>/dev/null),Ninja,Unix Makefiles)

.PHONY: all deps build run test test-asan test-tsan tsa clang-san-config fuzz fuzz-run clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD_DIR)/CMakeCache.txt:
	$(CMAKE) -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release

build: deps $(BUILD_DIR)/CMakeCache.txt
	$(CMAKE) --build $(BUILD_DIR) -j $(JOBS)

run: build
	$(BUILD_DIR)/tools/arbiter serve $(ARGS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# AddressSanitizer + UndefinedBehaviorSanitizer running the unit tests. They
# are built in the clang-16 sanitizer build that also holds the fuzz targets
# (FUZZ_DIR, configured the same way by `make fuzz`: ASan + UBSan, -O1, line
# tables), so CI compiles the libraries under ASan once instead of twice (a
# separate GCC ASan build was a quarter of CI's time). Only the unit test
# binaries are built here (target unit_tests).
# LeakSanitizer is on explicitly (detect_leaks=1): a leak fails the test. Any
# UBSan report fails it too (halt_on_error, with a stack trace).
# `cmake -DARBITER_SANITIZE=ON` still makes a GCC ASan + UBSan build by hand.
ASAN_ENV = ASAN_OPTIONS="detect_leaks=1 abort_on_error=0 $(ASAN_OPTIONS)" \
           UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 $(UBSAN_OPTIONS)"
test-asan: clang-san-config
	$(CMAKE) --build $(FUZZ_DIR) -j $(JOBS) --target unit_tests
	cd $(FUZZ_DIR) && $(ASAN_ENV) ctest --output-on-failure --no-tests=error -j $(JOBS) -L unit

# ThreadSanitizer build (gcc's libtsan) running the tests labelled `tsan`: the
# test binaries that start threads, marked arbiter_test(... TSAN) in CMake.
# Only those binaries are built. Any report fails the test (halt_on_error).
# The arbiter stress test then runs 5 more times (its interleavings vary).
# If TSan dies with "unexpected memory mapping" (kernels with
# vm.mmap_rnd_bits > 28), run `setarch $$(uname -m) -R make test-tsan`.
TSAN_ENV = TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 $(TSAN_OPTIONS)"
test-tsan: deps
	$(CMAKE) -S . -B $(TSAN_DIR) -DCMAKE_BUILD_TYPE=Debug -DARBITER_TSAN=ON
	$(CMAKE) --build $(TSAN_DIR) -j $(JOBS) --target tsan_tests
	cd $(TSAN_DIR) && $(TSAN_ENV) ctest --output-on-failure --no-tests=error -j $(JOBS) -L tsan
	$(TSAN_ENV) $(TSAN_DIR)/src/arbiter/arbiter_test --gtest_filter='*ArbiterStressTest*' --gtest_repeat=5 --gtest_brief=1

# clang-16 build with -Wthread-safety as errors: checks every GUARDED_BY /
# REQUIRES annotation (STYLE.md rule 5). Builds the libraries and the CLI.
tsa:
	@scripts/install-deps.sh --with-fuzz
	CC=clang-16 CXX=clang++-16 $(CMAKE) -S . -B $(TSA_DIR) -DCMAKE_BUILD_TYPE=Debug -DARBITER_TESTS=OFF -DARBITER_WERROR_TSA=ON
	$(CMAKE) --build $(TSA_DIR) -j $(JOBS)

# The clang-16 sanitizer build (FUZZ_DIR): libFuzzer targets, the unit tests
# for `make test-asan`, and with FUZZ_TSA=1 the CLI. Clang's thread-safety
# warnings are errors in it (-Werror=thread-safety): the same check as
# `make tsa` over the same code, without another full build. One configure
# line for every target, so switching between them never recompiles.
FUZZ_TSA ?=
clang-san-config:
	@scripts/install-deps.sh --with-fuzz
	CC=clang-16 CXX=clang++-16 $(CMAKE) -S . -B $(FUZZ_DIR) -DCMAKE_BUILD_TYPE=Debug -DARBITER_FUZZ=ON -DARBITER_TESTS=ON -DARBITER_WERROR_TSA=ON

# libFuzzer targets (fuzz/CMakeLists.txt); FUZZ_TSA=1 (what .ci/run does)
# also builds the CLI, so the thread-safety check covers tools/.
fuzz: clang-san-config
	$(CMAKE) --build $(FUZZ_DIR) -j $(JOBS) --target fuzz_targets $(if $(FUZZ_TSA),arbiter,)

# Runs every fuzz target for SECONDS each from its seeds (fuzz/corpus/<name>/)
# and prints executions, crashes and coverage per target; fails on a crash.
# JOBS targets run at once (FUZZ_JOBS; each libFuzzer run uses one core), each
# still for SECONDS. TARGETS="kv_file safetensors" limits the run. See scripts/fuzz-run.sh.
SECONDS ?= 60
fuzz-run: fuzz
	FUZZ_DIR=$(FUZZ_DIR) FUZZ_JOBS=$(JOBS) scripts/fuzz-run.sh $(SECONDS) $(TARGETS)

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR) $(TSAN_DIR) $(FUZZ_DIR) $(TSA_DIR)
