#!/bin/sh
# Runs Node end-to-end tests (SRC_DIR/*.test.mjs) with `node --test`
# against the real server: copies them next to the npm packages that
# scripts/install-deps.sh installed (so `import 'openai'` resolves), with
# the shared helpers of tests/clients/lib, and runs them one file at a time
# (each file starts its own server).
# usage: run-node-tests.sh SRC_DIR DEPS_DIR WORK_DIR ARBITER_BIN [PACKAGE...]
#   PACKAGE  npm packages the tests import (default: openai ollama ajv)
# Environment: NODE_TEST_REQUIRES — files that must exist (e.g. the
# browser, /usr/bin/chromium).
# Exit 77 (CTest's skip) when Node 20, a package or a required file is
# missing.
set -eu
src=$1 deps=$2 work=$3 bin=$4
shift 4
[ $# -gt 0 ] || set -- openai ollama ajv
if ! command -v node >/dev/null 2>&1 ||
   [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 20 ]; then
  echo "SKIP: node 20 not found"; exit 77
fi
for p in "$@"; do
  if [ ! -f "$deps/node_modules/$p/package.json" ]; then
    echo "SKIP: $deps/node_modules/$p missing (run scripts/install-deps.sh)"; exit 77
  fi
done
for f in ${NODE_TEST_REQUIRES:-}; do
  if [ ! -e "$f" ]; then echo "SKIP: $f missing (run scripts/install-deps.sh)"; exit 77; fi
done
rm -rf "$work"
mkdir -p "$work"
cp "$src"/*.test.mjs "$work"/
cp -r "$(dirname "$0")"/lib "$work"/lib
ln -s "$deps/node_modules" "$work/node_modules"
cd "$work"
ARBITER_BIN=$bin exec node --test --test-concurrency=1 ./*.test.mjs
