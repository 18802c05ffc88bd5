#!/usr/bin/env bash
# dtrain on torch 2.x without the GPU machine (docs/python.md, "torch 2.x"):
# a Debian chroot of SUITE (default sid: PyTorch 2.14, Python 3.14, g++ 16)
# made with debootstrap from Debian's registry, the packages of
# scripts/setup.sh installed in it, this tree built there (the Python
# package's c10d::Backend branch, C++20 for libtorch) and the Python tests
# run under that torch, FSDP included (the NCCL plugin still needs a GPU).
# Needs root; ~1.5 GB of downloads the first time, then reuses ROOT.
#   scripts/torch2_check.sh [ROOT [SUITE]]      ROOT default /var/tmp/dtrain-chroot-SUITE
#   DTRAIN_TORCH2_TESTS=PATTERN                the ctest -R pattern (default: the Python tests)
#   DTRAIN_TORCH2_BUILD=DIR                    the build folder inside ROOT (default /var/tmp/dtrain-build)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
suite=${2:-sid}
root=${1:-/var/tmp/dtrain-chroot-$suite}
# Not launcher.python_netns: network namespaces need / to be a mount point.
tests=${DTRAIN_TORCH2_TESTS:-'^python\.'}
[[ $(id -u) == 0 ]] || { echo "torch2_check: needs root (debootstrap, chroot, mount)" >&2; exit 1; }
command -v debootstrap > /dev/null || apt-get install -y -qq debootstrap > /dev/null

if [[ ! -x $root/usr/bin/apt-get ]]; then
  echo "torch2_check: debootstrap $suite into $root"
  debootstrap --variant=minbase "$suite" "$root" http://deb.debian.org/debian > "$root.debootstrap.log" 2>&1 ||
    { tail -20 "$root.debootstrap.log" >&2; exit 1; }
fi
mounts=(proc sys dev dev/pts dev/shm "${src#/}")
cleanup() {
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    mountpoint -q "$root/${mounts[i]}" && umount -l "$root/${mounts[i]}"
  done
  return 0
}
trap cleanup EXIT
for m in "${mounts[@]}"; do
  mkdir -p "$root/$m"
  mountpoint -q "$root/$m" || mount --bind "/$m" "$root/$m"
done
cp /etc/resolv.conf /etc/hosts "$root/etc/"
# A registry snapshot older than its Release file's Valid-Until is still the one to use.
echo 'Acquire::Check-Valid-Until "false";' > "$root/etc/apt/apt.conf.d/99dtrain-snapshot"

# USE_LIBUV=0: Debian's torch 2.x is built without libuv, which TCPStore asks for by default.
in_root() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 USE_LIBUV=0 bash -c "$1"; }
pkgs=$(bash "$src/scripts/setup.sh" --list)
in_root "export DEBIAN_FRONTEND=noninteractive; apt-get update -qq &&
         apt-get install -y -qq --no-install-recommends $pkgs > /var/log/dtrain-apt.log 2>&1" ||
  { tail -20 "$root/var/log/dtrain-apt.log" >&2; exit 1; }
in_root 'echo "torch2_check: $(. /etc/os-release; echo $PRETTY_NAME), $(g++ --version | head -1),
  torch $(python3 -c "import torch; print(torch.__version__)"), $(python3 --version)"'

build=${DTRAIN_TORCH2_BUILD:-/var/tmp/dtrain-build}  # inside ROOT
t0=$SECONDS
in_root "cmake -S $src -B $build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /var/tmp/dtrain-configure.log 2>&1 &&
         grep 'dtrain: Python package for' /var/tmp/dtrain-configure.log &&
         cmake --build $build -j$(nproc) > /var/tmp/dtrain-build.log 2>&1" ||
  { grep -E 'error|dtrain:' "$root/var/tmp/dtrain-configure.log" "$root/var/tmp/dtrain-build.log" | head -40 >&2
    echo "torch2_check: the build failed (logs: $root/var/tmp/dtrain-*.log)" >&2; exit 1; }
echo "torch2_check: built in $((SECONDS - t0)) s"
in_root "cd $build && ctest --output-on-failure -R '$tests'"
