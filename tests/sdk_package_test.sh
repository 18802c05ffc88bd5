#!/usr/bin/env bash
# First the SDK alone: installs only the sdk component, checks that its headers
# include nothing of the core and that no core file came with it, and builds
# the example plugin against it. Then installs the whole dtrain build to a
# temporary prefix, builds sdk/examples/minimal against it with
# find_package(dtrain) only, and runs the conformance suite on
# the example plugin for world sizes 1-4. The example's collectives are naive
# rounds through the store: the suite runs at a large count that still spans
# several of its chunks and tails, which proves the ABI path, not its speed.
set -euo pipefail
build=$1
example=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src=$(cd "$example/../.." && pwd)
if grep -rE '#include *[<"]dtrain/' "$src" | grep -vE 'dtrain/(sdk|abi)/'; then
  echo "FAIL: the SDK's headers include the core's (above)" >&2
  exit 1
fi
cmake --install "$build" --component sdk --prefix "$tmp/sdk" >/dev/null
core=$(find "$tmp/sdk" -name 'libdtrain_core*' -o -name communicator.h -o -name 'dtrainTargets.cmake')
if [[ -n "$core" ]]; then
  echo "FAIL: the SDK component installed core files: $core" >&2
  exit 1
fi
cmake -S "$example" -B "$tmp/sdk_example" -DCMAKE_PREFIX_PATH="$tmp/sdk" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/sdk_example" -j2 >/dev/null
test -f "$tmp/sdk_example/libdtrain_example.so"
echo "the SDK alone: $(find "$tmp/sdk" -type f | wc -l) files; the example plugin built against it"

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$example" -B "$tmp/example" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/example" -j2 >/dev/null
test -f "$tmp/example/libdtrain_example.so"
for n in 1 2 3 4; do
  DTRAIN_PLUGIN_PATH="$tmp/example" "$tmp/prefix/bin/dtrain-conformance" --backend example --world-size "$n" \
    --large-count 65537
done
