# arbiter — the two commands a newcomer needs: `make run` and `make test`.
BUILD_DIR ?= build
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

.PHONY: all deps build run test test-asan test-tsan tsa fuzz fuzz-run clean

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

# AddressSanitizer + UndefinedBehaviorSanitizer build running the unit tests
# (only the unit test binaries are built: target unit_tests).
# LeakSanitizer is on explicitly (detect_leaks=1): a leak fails the test. Any
# UBSan report fails it too (halt_on_error, with a stack trace).
ASAN_ENV = ASAN_OPTIONS="detect_leaks=1 abort_on_error=0 $(ASAN_OPTIONS)" \
           UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 $(UBSAN_OPTIONS)"
test-asan: deps
	$(CMAKE) -S . -B $(ASAN_DIR) -DCMAKE_BUILD_TYPE=Debug -DARBITER_SANITIZE=ON
	$(CMAKE) --build $(ASAN_DIR) -j $(JOBS) --target unit_tests
	cd $(ASAN_DIR) && $(ASAN_ENV) ctest --output-on-failure --no-tests=error -j $(JOBS) -L unit

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

# libFuzzer targets, built with clang-16 (fuzz/CMakeLists.txt).
# FUZZ_TSA=1 (what .ci/run does) also makes clang's thread-safety warnings
# errors in this build and builds the CLI in it: the same check as
# `make tsa` over the same code, without a fifth full build.
FUZZ_TSA ?=
fuzz:
	@scripts/install-deps.sh --with-fuzz
	CC=clang-16 CXX=clang++-16 $(CMAKE) -S . -B $(FUZZ_DIR) -DCMAKE_BUILD_TYPE=Debug -DARBITER_FUZZ=ON -DARBITER_TESTS=OFF $(if $(FUZZ_TSA),-DARBITER_WERROR_TSA=ON,-DARBITER_WERROR_TSA=OFF)
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
