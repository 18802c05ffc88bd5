#!/usr/bin/env bash
# Installs what dtrain needs, builds it, and runs every test (ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${DTRAIN_CMAKE_ARGS:-}
cmake --build build -j"$(nproc)"
cd build
ctest --output-on-failure -j1 "$@"
