#!/usr/bin/env bash
# Installs every Debian package dtrain needs. Idempotent; quiet when all is there.
# Usage: scripts/setup.sh [--list]   (--list: print the package names, install nothing)
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build pkg-config git clang-format
  libboost-dev libtomlplusplus-dev libcli11-dev libspdlog-dev libfmt-dev
  googletest libgtest-dev libgmock-dev
  libgloo-dev libhiredis-dev
  libucx-dev ucx-utils
  libopenmpi-dev openmpi-bin
  zlib1g-dev iproute2 procps
  libtorch-dev libopenblas0 dataset-fashion-mnist libopencv-imgcodecs-dev libopencv-imgproc-dev
  python3-torch python3-dev python3-yaml pybind11-dev python3-pytest python3-torchvision
  libprotobuf-dev protobuf-compiler
  libgrpc++-dev protobuf-compiler-grpc redis-server
  wamerican libfreetype-dev fonts-dejavu-core fonts-liberation2 fonts-freefont-ttf fonts-noto-core fonts-urw-base35 fonts-croscore
)

[[ ${1:-} == --list ]] && { echo "${pkgs[*]}"; exit 0; }

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
