#!/usr/bin/env bash
# Installs what dtrain needs, builds it, and runs every test (ctest).
#   scripts/test.sh [ctest options...]
#   scripts/test.sh --build-only      install and build, run nothing (.ci/run)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${DTRAIN_CMAKE_ARGS:-}
cmake --build build -j"$(nproc)"
[[ ${1:-} == --build-only ]] && exit 0
cd build
ctest --output-on-failure -j1 "$@"
