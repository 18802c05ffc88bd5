#!/usr/bin/env bash
# The Python package's heavier checks, outside CI (docs/python.md): the DDP
# comparison on ucx at 4 ranks and the Fleet example's 1-against-2-workers
# agreement over 3 seeds (~10 min on 2 cores, 7 of them the Fleet check),
# then the benchmark.
#   scripts/python_check.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(cd "${1:-build}" && pwd)
py=$(sed -n 's/^PYTHON = "\(.*\)"$/\1/p' "$BUILD/lib/dtrain/python/dtrain/_build_info.py")
export PYTHONPATH=$BUILD/lib/dtrain/python DTRAIN_BUILD=$BUILD DTRAIN_PYTHON_HEAVY=1
"$py" -m pytest -q -s -p no:cacheprovider tests/python/test_ops.py tests/python/test_fleet.py -k "ucx-4 or seed_spread"
"$py" bench/python_bench.py --ranks 2 --trials 7
