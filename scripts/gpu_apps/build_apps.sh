#!/usr/bin/env bash
# On the GPU machine, in the unpacked bundle: builds libdtrain_fleet,
# dtrain-gpu-smoke and dtrain-cls against this prefix and the PyTorch wheel's
# CUDA libtorch (scripts/gpu_apps/CMakeLists.txt), into build-gpu/, and writes
# apps/cls.toml: the source tree's, reading the bundled Fashion-MNIST
# (data/fashion-mnist). See docs/gpu.md.
#   ./build_apps.sh [cmake -D options...]
#   DTRAIN_TORCH_PREFIX=<dir with TorchConfig.cmake's prefix>   instead of the python3 torch's
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh"
if [[ -n ${DTRAIN_TORCH_PREFIX:-} ]]; then
  tp=$DTRAIN_TORCH_PREFIX
else
  tp=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
  abi=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
  [[ $abi == 1 ]] || echo "build_apps: warning: this torch uses the old C++ ABI; dtrain's core was built with the new one" >&2
fi
gen=()
command -v ninja > /dev/null && gen=(-G Ninja)
cmake -S "$here/src/scripts/gpu_apps" -B "$here/build-gpu" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tp" -DDTRAIN_PREFIX="$here" -DDTRAIN_SRC="$here/src" "$@"
cmake --build "$here/build-gpu" -j"$(nproc)"
mkdir -p "$here/apps"
sed "s|^dir = \"/usr/share/datasets/fashion-mnist\"|dir = \"$here/data/fashion-mnist\"|" "$here/src/apps/cls.toml" \
  > "$here/apps/cls.toml"
grep -q "^dir = \"$here/data/fashion-mnist\"" "$here/apps/cls.toml" ||
  { echo "build_apps: src/apps/cls.toml has no data.dir line to point at $here/data" >&2; exit 1; }
echo "build_apps: built $here/build-gpu/{dtrain-gpu-smoke,dtrain-cls} and libdtrain_fleet.so; wrote $here/apps/cls.toml"
