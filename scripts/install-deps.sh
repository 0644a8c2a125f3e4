#!/usr/bin/env bash
# Installs exactly the Debian packages arbiter's build, tests and tools need.
# Idempotent: checks each package first and installs only what is missing.
# Usage: scripts/install-deps.sh [--with-fuzz]
#   --with-fuzz  also install clang-16 and its sanitizer/libFuzzer runtime
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libcpp-httplib-dev libboost-dev nlohmann-json3-dev libtomlplusplus-dev
  libspdlog-dev libfmt-dev libcli11-dev
  libssl-dev libxxhash-dev prometheus-cpp-dev
  libopenblas-dev libpcre2-dev
  libutf8proc-dev  # Unicode normalization for tokenizer normalizers (NFC, NFKC, ...)
  libgtest-dev libgmock-dev librapidcheck-dev libbenchmark-dev
  python3 python3-numpy
  curl
  wrk  # bench/http_transport/http_transport.py
)
if [[ "${1:-}" == "--with-fuzz" ]]; then
  packages+=(clang-16 libclang-rt-16-dev)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: missing: ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
  else
    echo "install-deps: not root and no sudo; run as root:" >&2
    echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
else
  SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: installed ${missing[*]}"
