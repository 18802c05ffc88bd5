#!/usr/bin/env bash
# Installs what dtrain needs, builds it, and runs the main job: apps/cls.toml
# (ResNet-20 on Fashion-MNIST, 2 workers over Gloo) cut to one epoch on 20,000
# training images with a schedule made for that one epoch (a short linear
# warm-up, then cosine to zero), evaluated on the 10,000 test images, through
# the dtrain launcher. The run is deterministic: the figures in README.md are
# what it prints, and tests/apps/main_job_test.sh (ctest apps.main_job) checks
# them. The full job is `build/bin/dtrain --backend gloo apps/cls.toml`.
#
#   scripts/run_main_job.sh [-o key=value ...]              setup, build, run
#   scripts/run_main_job.sh --no-build [-o key=value ...]   run only (DTRAIN_BUILD_DIR, default build)
# Output: logs in $DTRAIN_MAIN_JOB_DIR/log, the checkpoint in $DTRAIN_MAIN_JOB_DIR/ckpt
# (default output/main_job).
set -euo pipefail
cd "$(dirname "$0")/.."
main_job=(-o train.epochs=1 -o data.limit_train=20000 -o train.warmup_epochs=0.1 -o checkpoint.resume=false)
build=${DTRAIN_BUILD_DIR:-build}
out=${DTRAIN_MAIN_JOB_DIR:-output/main_job}
if [[ ${1:-} == --no-build ]]; then
  shift
else
  bash scripts/setup.sh
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  cmake --build "$build" -j"$(nproc)"
fi
"$build/bin/dtrain" --backend gloo --log_dir "$out/log" apps/cls.toml "${main_job[@]}" \
  -o checkpoint.dir="$out/ckpt" "$@"
