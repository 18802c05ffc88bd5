#!/usr/bin/env bash
# Installs what dtrain needs, builds it, and runs the main job: a short version
# of apps/cls.toml (ResNet-20 on Fashion-MNIST, 2 workers over Gloo, one epoch
# on 12,000 training images, evaluated on the 10,000 test images) through the
# dtrain launcher. The full job is `build/bin/dtrain --backend gloo apps/cls.toml`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$(nproc)"
build/bin/dtrain --backend gloo --log_dir log/main_job apps/cls.toml \
  -o train.epochs=1 -o data.limit_train=12000 \
  -o checkpoint.dir=output/main_job -o checkpoint.resume=false "$@"
