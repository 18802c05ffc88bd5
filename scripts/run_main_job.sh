#!/usr/bin/env bash
# Installs what dtrain needs, builds it, and runs the main job. Until the
# launcher and the apps land, the main job is the conformance suite of the
# Gloo backend on 4 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$(nproc)"
build/bin/dtrain-conformance --backend gloo --world-size 4
