#!/usr/bin/env bash
# On the GPU machine, in the unpacked bundle: builds libdtrain_torch and
# dtrain-gpu-smoke against this prefix and the PyTorch wheel's CUDA libtorch
# (scripts/gpu_apps/CMakeLists.txt), into build-gpu/. See docs/gpu.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh"
tp=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
abi=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
[[ $abi == 1 ]] || echo "build_apps: warning: this torch uses the old C++ ABI; dtrain's core was built with the new one" >&2
gen=()
command -v ninja > /dev/null && gen=(-G Ninja)
cmake -S "$here/src/scripts/gpu_apps" -B "$here/build-gpu" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tp" -DDTRAIN_PREFIX="$here" -DDTRAIN_SRC="$here/src" "$@"
cmake --build "$here/build-gpu" -j"$(nproc)"
echo "build_apps: built $here/build-gpu/dtrain-gpu-smoke and libdtrain_torch.so"
