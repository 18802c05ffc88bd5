#!/usr/bin/env bash
# Tests of dtrain-cls through the dtrain launcher.
#   cls_test.sh ci      DTRAIN DTRAIN_CLS JOB_TOML WORKDIR   short 2-worker run: loss falls, parameters bit-identical
#   cls_test.sh resume  DTRAIN DTRAIN_CLS JOB_TOML WORKDIR   kill mid-epoch, resume: same losses as an uninterrupted run
#   cls_test.sh errors  DTRAIN DTRAIN_CLS JOB_TOML WORKDIR   bad inputs give clear errors
#   cls_test.sh ucx     DTRAIN DTRAIN_CLS JOB_TOML WORKDIR   the same steps on gloo and ucx give the same parameters
#   cls_test.sh pipeline DTRAIN DTRAIN_CLS JOB_TOML WORKDIR MAKE_IMAGES   a PaddleClas list of non-square RGB
#                       JPEG/PNG images trains with RandCropImage + per-channel NormalizeImage and num_workers = 4,
#                       evaluates with ResizeImage resize_short + CropImage; loader and trainer images/s printed;
#                       an unknown operator is refused at its line
# Exit 77 (skipped) when the Fashion-MNIST package is not installed.
set -euo pipefail
mode=$1 dtrain=$2 cls=$3 job=$4 work=$5 app=$3
[[ $mode != pipeline ]] || need=$6  # its own images, not Fashion-MNIST
source "$(dirname "$0")/app_lib.sh"

# A small, fast job: 512 images, 8 steps of 32 per worker per epoch.
small=(-o model.width=0.5 -o data.limit_train=512 -o data.limit_eval=200 -o train.batch_size=32
       -o train.warmup_epochs=0 -o train.lr=0.1 -o log.every_steps=4 -o eval.every_epochs=0
       -o checkpoint.resume=false -o train.threads=1)


case $mode in
ci)
  ci_job 5 6 0.9
  [[ -s ckpt/latest.pt ]] || fail "no final checkpoint"
  grep -q "eval epoch 5: top1" log/workerlog.0 || fail "no final evaluation"
  grep -qa "train/loss" tb/events.out.tfevents.* && grep -qa "eval/top1" tb/events.out.tfevents.* \
    || fail "no TensorBoard scalars in tb/"
  echo PASS
  ;;
resume)
  common=("${small[@]}" -o train.epochs=3 -o log.every_steps=2 -o checkpoint.every_steps=4)
  "$dtrain" --nproc_per_node 2 --log_dir log_a "$job" "${common[@]}" -o checkpoint.dir=ckpt_a > a.log 2>&1 \
    || { cat a.log log_a/workerlog.* >&2; fail "the uninterrupted run failed"; }
  # Killed after step 11 (epoch 2, step 3 of 8): the last checkpoint is step 8.
  if "$dtrain" --nproc_per_node 2 --log_dir log_b "$job" "${common[@]}" -o checkpoint.dir=ckpt_b \
       -o debug.kill_at_step=11 > b.log 2>&1; then
    fail "the killed run exited 0"
  fi
  grep -q "killing this worker after step 11" log_b/workerlog.0 || { cat b.log >&2; fail "the run was not killed at step 11"; }
  "$dtrain" --nproc_per_node 2 --log_dir log_c "$job" "${common[@]}" -o checkpoint.dir=ckpt_b \
      -o checkpoint.resume=true > c.log 2>&1 || { cat c.log log_c/workerlog.* >&2; fail "the resumed run failed"; }
  grep -q "resume: .*global step 8" log_c/workerlog.0 || { cat log_c/workerlog.0 >&2; fail "did not resume from step 8"; }
  losses log_a/workerlog.0 > a.txt
  losses log_c/workerlog.0 > c.txt
  n=$(wc -l < c.txt)
  (( n >= 6 )) || fail "the resumed run logged $n progress lines"
  # Every step the resumed run logged must show the uninterrupted run's loss.
  awk 'NR == FNR {a[$1 " " $2] = $3; next}
       {k = $1 " " $2; if (!(k in a)) {print "step " k " missing in the uninterrupted run"; bad = 1; next}
        d = a[k] - $3; if (d < 0) d = -d; printf "epoch %s step %s: %s vs %s\n", $1, $2, a[k], $3
        if (d > 1e-5 * (a[k] < 0 ? -a[k] : a[k]) + 1e-6) bad = 1}
       END {exit bad}' a.txt c.txt || fail "losses after resume differ from the uninterrupted run"
  echo PASS
  ;;
errors)
  expect missing_data "missing data file '/nonexistent/fmnist/train-images-idx3-ubyte.gz'" -o data.dir=/nonexistent/fmnist
  expect unknown_model "unknown model 'resnet19'; known models: resnet20, resnet32, resnet56, resnet18, resnet50, liteseg" \
      -o model.name=resnet19
  expect unknown_key "unknown key 'train.epoch'" -o train.epoch=3
  # No GPU here (or a CPU libtorch): train.device = "cuda" fails at start, naming the key.
  if ! nvidia-smi -L > /dev/null 2>&1; then
    expect cuda_no_gpu "key 'train.device': wants cuda:0 (train.device = \"cuda\") but no CUDA device is visible" \
        -o 'train.device="cuda"'
  fi
  expect a_sync "a_sync = true asks for parameter-server training, but init was called for a collective job" -o strategy.a_sync=true
  # PaddleClas list files: 4 tiny PGM images.
  mkdir -p imgs
  for i in 0 1 2 3; do { printf 'P5\n8 8\n255\n'; head -c 64 /dev/urandom; } > imgs/$i.pgm; done
  list=(-o data.dataset=list -o data.root=$PWD -o data.channels=1 -o data.image_size=8 -o data.num_classes=3
        -o model.width=0.25 -o train.batch_size=2 -o train.epochs=1 -o checkpoint.dir=ckpt_list
        -o checkpoint.resume=false -o log.every_steps=1)
  printf '# a comment\nimgs/0.pgm 0\nimgs/1.pgm 1\n\nimgs/2.pgm 2\nimgs/3.pgm 1\n' > good.txt
  printf 'imgs/0.pgm 0\nimgs/1.pgm 7\n' > badlabel.txt
  printf 'imgs/0.pgm 0\nimgs/1.pgm 1\nimgs/nothere.png 2\n' > missing.txt
  "$cls" "$job" "${list[@]}" -o data.train_list=good.txt -o data.val_list=good.txt > list_ok.out 2>&1 \
    || { cat list_ok.out >&2; fail "training on a list file failed"; }
  grep -q "eval epoch 1: top1" list_ok.out || fail "list run did not evaluate"
  echo "ok list file training"
  expect list_label "badlabel.txt:2: label 7 is out of range [0, 3)" "${list[@]}" -o data.train_list=badlabel.txt \
      -o data.val_list=good.txt
  expect list_missing_image "missing.txt:3: image '$PWD/imgs/nothere.png' does not exist" "${list[@]}" \
      -o data.train_list=missing.txt -o data.val_list=good.txt
  expect list_missing_file "cannot open list file 'nolist.txt'" "${list[@]}" -o data.train_list=nolist.txt \
      -o data.val_list=good.txt
  echo PASS
  ;;
ucx)
  # The same 2-worker steps over both backends; parameters must agree to
  # within float reduction-order noise (2 ranks: they are in fact bit-equal).
  for be in gloo ucx; do
    "$dtrain" --backend $be --nproc_per_node 2 --log_dir log_$be "$job" "${small[@]}" -o train.epochs=2 \
        -o checkpoint.dir=ckpt_$be -o "debug.dump_params=params_$be.{rank}.bin" > $be.log 2>&1 \
      || { cat $be.log log_$be/workerlog.* >&2; fail "the $be run failed"; }
  done
  grep -q "backend ucx" log_ucx/workerlog.0 || fail "the ucx run did not use the ucx backend"
  cmp params_ucx.0.bin params_ucx.1.bin || fail "the ucx workers' parameters differ"
  [[ $(stat -c %s params_gloo.0.bin) == $(stat -c %s params_ucx.0.bin) ]] || fail "parameter dumps differ in size"
  paste <(od -An -v -f -w4 params_gloo.0.bin) <(od -An -v -f -w4 params_ucx.0.bin) |
    awk '{d = $1 - $2; if (d < 0) d = -d; m = ($1 < 0 ? -$1 : $1); if (d > m) m = d
          if (d > 1e-4 * m + 1e-6) {bad++; if (bad < 5) print "element " NR ": gloo " $1 ", ucx " $2}
          if (d > worst) worst = d}
         END {printf "%d parameters, largest difference %g\n", NR, worst; exit bad > 0}' \
    || fail "gloo and ucx parameters differ beyond reduction-order noise"
  echo PASS
  ;;
pipeline)
  "$6" cls data 60 || fail "cannot write the test images"  # 48 train, 12 val; 40..80 x 30..70 px
  { cat "$job"; cat <<'EOF'

[data.train.transforms]
DecodeImage = { to_rgb = true, channel_first = false }
RandCropImage = { size = 32, scale = [0.35, 1.0], ratio = [0.75, 1.3333333] }
RandFlipImage = { flip_code = 1 }
NormalizeImage = { scale = "1.0/255.0", mean = [0.485, 0.456, 0.406], std = [0.229, 0.224, 0.225], order = "" }

[data.eval.transforms]
DecodeImage = { to_rgb = true }
ResizeImage = { resize_short = 36 }
CropImage = { size = 32 }
NormalizeImage = { scale = 0.00392156862745098, mean = [0.485, 0.456, 0.406], std = [0.229, 0.224, 0.225] }
EOF
  } > pipeline.toml
  pipe=(-o data.dataset=list -o data.root=$PWD/data -o data.train_list=data/train.txt -o data.val_list=data/val.txt
        -o data.num_classes=3 -o data.channels=3 -o data.num_workers=4 -o model.width=0.5 -o train.batch_size=8
        -o train.eval_batch_size=6 -o train.warmup_epochs=0 -o train.lr=0.05 -o log.every_steps=2
        -o eval.every_epochs=0 -o checkpoint.resume=false -o checkpoint.dir=ckpt -o train.threads=1)
  "$cls" loader_bench pipeline.toml "${pipe[@]}" > bench.out 2>&1 || { cat bench.out >&2; fail "loader_bench failed"; }
  cat bench.out
  grep -E "^loader: 48 images \(6 batches of 8, 3x32x32\) in [0-9.]+ s: [0-9.]+ images/s \(data.num_workers 4, no model\)" \
    bench.out || fail "no loader throughput line"
  "$cls" pipeline.toml "${pipe[@]}" -o train.epochs=4 > train.out 2>&1 || { cat train.out >&2; fail "training failed"; }
  grep -E "^transforms: train DecodeImage -> RandCropImage\(size 32x32 scale \[0.35, 1\]" train.out \
    || fail "no transforms line"
  grep -E "48 train / 12 eval images" train.out || fail "the run did not see 48 + 12 images"
  expect_loss_falls train.out 10 0.8
  grep -E " images/s [0-9.]+ " train.out | tail -1 | sed 's/^.*\( images\/s [0-9.]*\).* data_wait \([0-9.]*\).*$/trainer:\1, data_wait \2 ms\/step/'
  grep -E "^eval epoch 4: top1 [01]\.[0-9]{4} top5 1\.0000 .*\(12 images" train.out || fail "no evaluation of the 12 images"
  # An unknown operator and a centre crop larger than the resized image are refused, naming the line or the size.
  sed 's/^RandFlipImage = /RandomFlip = /' pipeline.toml > bad_op.toml
  line=$(grep -n "^RandomFlip = " bad_op.toml | cut -d: -f1)
  if "$cls" bad_op.toml "${pipe[@]}" > bad_op.out 2>&1; then fail "an unknown operator was accepted"; fi
  grep -F "bad_op.toml:$line" bad_op.out | grep -F "unknown operator 'RandomFlip' (known: CropImage, DecodeImage, NormalizeImage, RandCropImage, RandFlipImage" \
    || { cat bad_op.out >&2; fail "unknown operator: no clear error"; }
  if "$cls" pipeline.toml "${pipe[@]}" -o train.epochs=1 -o data.eval.transforms.CropImage.size=40 > big.out 2>&1; then
    fail "a crop larger than the image was accepted"
  fi
  grep -F "CropImage: size 40x40 is larger than the" big.out || { cat big.out >&2; fail "big crop: no clear error"; }
  echo PASS
  ;;
*) echo "unknown mode $mode" >&2; exit 2 ;;
esac
