#!/usr/bin/env bash
# The offline GPU bundle's apps, checked here on the CPU (docs/gpu.md, "The
# offline bundle"): scripts/gpu_bundle.sh packs the bundle from BUILD (the
# main build tree: its outputs are reused) and the committed sources; it is
# unpacked in WORK, its build_apps.sh builds libdtrain_fleet, dtrain-gpu-smoke
# and dtrain-cls against Debian's CPU libtorch (as the GPU machine does against
# a wheel's) without OpenCV and without protobuf (log.tensorboard refused); a one-epoch cls job on the
# bundled Fashion-MNIST trains through the bundled launcher on gloo and prints
# its evaluation (top-1 >= 0.3, chance 0.1), and a list data set is refused naming the key and the fix.
#   gpu_bundle_apps.sh SRC BUILD WORK
# Exit 77 (skipped) without Debian's dataset-fashion-mnist (the bundle carries it).
set -euo pipefail
src=$1 build=$2 work=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
[[ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] || { echo "no dataset-fashion-mnist: skipped"; exit 77; }
rm -rf "$work"
mkdir -p "$work"
cd "$work"

t0=$SECONDS
BUILD_DIR=$build "$src/scripts/gpu_bundle.sh" "$work/b.tar.gz" > pack.log 2>&1 || { cat pack.log >&2; fail "gpu_bundle.sh failed"; }
size=$(stat -c %s b.tar.gz)
echo "packed in $((SECONDS - t0)) s: $((size / 1024 / 1024)) MiB ($size bytes)"
((size < 64 * 1024 * 1024)) || fail "the bundle is over 64 MiB"
tar -xzf b.tar.gz
b=$work/dtrain-gpu
[[ -s $b/data/fashion-mnist/train-images-idx3-ubyte.gz ]] || fail "the bundle carries no Fashion-MNIST"

t0=$SECONDS
launch=()
command -v ccache > /dev/null && launch=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# -O0: the build is what is checked here, the job is short (30-65 s less on 2 cores).
# On 2 cores, fewer and larger sources cost less than a precompiled header
# (the GPU machine's 16 cores keep the bundle's own settings).
DTRAIN_TORCH_PREFIX=/usr "$b/build_apps.sh" "${launch[@]}" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 \
  -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=0 > build.log 2>&1 ||
  { tail -60 build.log >&2; fail "build_apps.sh failed"; }
echo "build_apps.sh in $((SECONDS - t0)) s"
grep -q "apps without OpenCV" build.log || fail "build_apps.sh did not build the apps without OpenCV"
[[ -x $b/build-gpu/dtrain-cls ]] || fail "no build-gpu/dtrain-cls"
if readelf -d "$b/build-gpu/dtrain-cls" | grep -iE "NEEDED.*(opencv|protobuf)"; then fail "dtrain-cls links OpenCV or protobuf"; fi
grep -q "^dir = \"$b/data/fashion-mnist\"" "$b/apps/cls.toml" || fail "apps/cls.toml does not read the bundled data"

# As docs/gpu.md says, from the unpacked bundle (gloo on the CPU instead of --gpus 0 --backend nccl).
cd "$b"
(
  source env.sh
  [[ $(command -v dtrain) == "$b/bin/dtrain" ]] || fail "env.sh: dtrain is $(command -v dtrain)"
  t0=$SECONDS
  dtrain --backend gloo --nproc_per_node 1 --log_dir "$work/log" apps/cls.toml -o train.epochs=1 \
    -o data.limit_train=2048 -o data.limit_eval=500 -o train.batch_size=64 -o model.width=0.5 -o train.warmup_epochs=0 \
    -o eval.every_epochs=1 -o log.every_steps=8 -o train.threads=2 -o checkpoint.dir="$work/ckpt" \
    -o checkpoint.resume=false > "$work/job.log" 2>&1 ||
    { cat "$work/job.log" "$work"/log/workerlog.* >&2; fail "the cls job failed"; }
  echo "cls job in $((SECONDS - t0)) s"
  line=$(grep -h "eval epoch 1: top1" "$work"/log/workerlog.0 | head -1) ||
    { cat "$work"/log/workerlog.0 >&2; fail "no evaluation line"; }
  echo "$line"
  # 32 steps of 64 images: about 0.47 here; chance is 0.10.
  awk '{for (i = 1; i < NF; ++i) if ($i == "top1") exit !($(i + 1) >= 0.3)}' <<< "$line" ||
    fail "top-1 after one short epoch is below 0.3: it did not train"
  # Without protobuf, log.tensorboard is refused at the key, naming the reason and the fix.
  if timeout 120 dtrain --backend gloo --nproc_per_node 1 --log_dir "$work/log_tb" apps/cls.toml -o train.epochs=1 \
    -o data.limit_train=64 -o data.limit_eval=64 -o checkpoint.dir="$work/ckpt_tb" -o checkpoint.resume=false \
    -o log.tensorboard="$work/tb" > "$work/tb.log" 2>&1; then
    fail "log.tensorboard was accepted without protobuf"
  fi
  cat "$work/tb.log" "$work"/log_tb/workerlog.* > "$work/tb_all.log" 2> /dev/null || true
  for want in "key 'log.tensorboard'" 'built without it' 'DTRAIN_APPS_TENSORBOARD=ON'; do
    grep -qF "$want" "$work/tb_all.log" || { cat "$work/tb_all.log" >&2; fail "the refusal does not say '$want'"; }
  done
  [[ ! -e $work/tb ]] || fail "log.tensorboard refused, but $work/tb was created"

  if dtrain --backend gloo --nproc_per_node 1 --log_dir "$work/log_list" apps/cls.toml -o data.dataset=list \
    -o data.train_list=train.txt -o data.val_list=val.txt > "$work/list.log" 2>&1; then
    fail "a list data set was accepted without OpenCV"
  fi
  cat "$work/list.log" "$work"/log_list/workerlog.* > "$work/list_all.log" 2> /dev/null || true
  for want in 'data.dataset' 'built without OpenCV' 'DTRAIN_APPS_OPENCV=ON' 'fashion-mnist'; do
    grep -qF "$want" "$work/list_all.log" || { cat "$work/list_all.log" >&2; fail "the refusal does not say '$want'"; }
  done
  grep -hF 'built without OpenCV' "$work/list_all.log" | head -1
)
echo PASS
