#!/usr/bin/env bash
# Installs the dtrain build to a temporary prefix, builds sdk/examples/minimal
# against it with find_package(dtrain) only, and runs the conformance suite on
# the example plugin for world sizes 1-4. The example's collectives are naive
# rounds through the store: the suite runs at a large count that still spans
# several of its chunks and tails, which proves the ABI path, not its speed.
set -euo pipefail
build=$1
example=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$example" -B "$tmp/example" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/example" -j2 >/dev/null
test -f "$tmp/example/libdtrain_example.so"
for n in 1 2 3 4; do
  DTRAIN_PLUGIN_PATH="$tmp/example" "$tmp/prefix/bin/dtrain-conformance" --backend example --world-size "$n" \
    --large-count 65537
done
