#!/usr/bin/env bash
# Tests of dtrain-seg through the dtrain launcher.
#   seg_test.sh ci    DTRAIN DTRAIN_SEG JOB_TOML WORKDIR   short 2-worker run: loss falls, mIoU computed, parameters
#                                                          bit-identical, pictures and predict masks written
#   seg_test.sh list  DTRAIN DTRAIN_SEG JOB_TOML WORKDIR   a PaddleSeg list trains; a bad label value and missing
#                                                          files give clear errors
#   seg_test.sh slide DTRAIN DTRAIN_SEG JOB_TOML WORKDIR MAKE_IMAGES   a PaddleSeg list of 2:1 images trains with
#                                                          ResizeStepScaling + RandomPaddingCrop (4 loader threads)
#                                                          and is evaluated and predicted with sliding windows at
#                                                          full resolution
#   seg_test.sh pretrained DTRAIN DTRAIN_SEG JOB_TOML WORKDIR DTRAIN_CLS CLS_TOML   a dtrain-cls liteseg checkpoint
#                                                          starts seg's liteseg ([model] pretrained): the backbone
#                                                          is taken, the decoder and the classifier are named
# Exit 77 (skipped) when the Fashion-MNIST package is not installed.
set -euo pipefail
mode=$1 dtrain=$2 seg=$3 job=$4 work=$5 app=$3
[[ $mode != slide ]] || need=$6  # its own images, not Fashion-MNIST
source "$(dirname "$0")/app_lib.sh"

# A few dozen small scenes, the job's model (LiteSeg, Adam) made small: 4 steps of 8 per worker per epoch.
small=(-o data.train_scenes=64 -o data.eval_scenes=24 -o data.scene_size=48 -o model.width=8 -o model.depth=2
       -o train.batch_size=8 -o train.eval_batch_size=12 -o train.warmup_epochs=0 -o train.lr=0.02
       -o log.every_steps=2 -o eval.every_epochs=0 -o checkpoint.resume=false -o train.threads=1)


# A PNG's colour type (byte 25): 3 = palette.
png_type() { od -An -tu1 -j25 -N1 "$1" | tr -d ' '; }

case $mode in
ci)
  ci_job 6 10 0.8
  # Both workers print the same scores: the confusion matrix is summed across them.
  for r in 0 1; do
    grep -E "^eval epoch 6: mIoU 0\.[0-9]{4} acc 0\.[0-9]{4} kappa -?[0-9.]+ .*\(24 images" log/workerlog.$r \
      || fail "worker $r: no final mIoU over the 24 test scenes"
    grep -E "^\[EVAL\] Class IoU: \[([0-9.]+ ){10}[0-9.]+\]$" log/workerlog.$r || fail "worker $r: no per-class IoU"
  done
  [[ $(grep "^eval epoch" log/workerlog.0) == $(grep "^eval epoch" log/workerlog.1) ]] \
    || fail "the workers report different scores"
  # Regions (scene, class): each of the 24 scenes has its background and 1-3 item classes.
  [[ "$(grep "^\[EVAL\] Regions" log/workerlog.0)" == "$(grep "^\[EVAL\] Regions" log/workerlog.1)" ]] \
    || fail "the workers report different region counts"
  regions=$(sed -n 's/^\[EVAL\] Regions: \([0-9]*\) right [01]\.[0-9]\{4\}; mIoU .*: 0\.[0-9]\{4\}$/\1/p' log/workerlog.0 | tail -1)
  [[ -n $regions && $regions -ge 48 && $regions -le 96 ]] || fail "region count '$regions' is not in [48, 96]"
  # mIoU is the mean of the 11 per-class IoUs printed with it.
  miou=$(sed -n 's/^eval epoch 6: mIoU \([0-9.]*\) .*/\1/p' log/workerlog.0)
  mean=$(grep -m1 "^\[EVAL\] Class IoU:" log/workerlog.0 | tr -d '[]' | awk '{for (i = 4; i <= NF; i++) s += $i; print s / (NF - 3)}')
  awk -v m="$miou" -v c="$mean" 'BEGIN {d = m - c; if (d < 0) d = -d; exit !(m > 0 && d < 2e-4)}' \
    || fail "mIoU $miou is not the mean of the class IoUs ($mean)"
  [[ -s ckpt/latest.pt ]] || fail "no final checkpoint"
  ls ckpt/pictures/epoch6_*.png > /dev/null || fail "no evaluation pictures"
  grep -qa "eval/miou" tb/events.out.tfevents.* || fail "no TensorBoard mIoU in tb/"
  # eval.only: the final checkpoint evaluated again gives the training's last scores and trains nothing.
  final=$(grep "^eval epoch 6:" log/workerlog.0 | sed 's/ images, .*//')
  "$dtrain" --nproc_per_node 2 --log_dir log_eval "$job" "${small[@]}" -o checkpoint.dir=ckpt -o eval.only=true \
      -o eval.pictures=0 > eval.log 2>&1 || { cat eval.log log_eval/workerlog.* >&2; fail "eval.only failed"; }
  again=$(grep "^eval epoch 6:" log_eval/workerlog.0 | sed 's/ images, .*//')
  [[ -n $final && $again == "$final" ]] || fail "eval.only printed '$again', the training's last evaluation '$final'"
  grep -q " step [0-9]*/[0-9]* loss " log_eval/workerlog.0 && fail "eval.only trained"
  # Test-time augmentation (eval.flip and eval.scales, on in the job file): the same checkpoint without it
  # scores the plain forward, which differs; a factor of 0 is refused naming the key.
  "$dtrain" --nproc_per_node 2 --log_dir log_noflip "$job" "${small[@]}" -o checkpoint.dir=ckpt -o eval.only=true \
      -o eval.flip=false -o "eval.scales=[1.0]" -o eval.pictures=0 > noflip.log 2>&1 || { cat noflip.log log_noflip/workerlog.* >&2; fail "eval.flip=false failed"; }
  plain=$(grep "^eval epoch 6:" log_noflip/workerlog.0 | sed 's/ images, .*//')
  [[ $plain =~ ^eval\ epoch\ 6:\ mIoU\ 0\.[0-9]{4}\  ]] || fail "eval.flip=false printed no mIoU: '$plain'"
  [[ $plain != "$final" ]] || fail "test-time augmentation changed nothing: '$plain' vs '$final'"
  if "$seg" "$job" "${small[@]}" -o checkpoint.dir=ckpt -o eval.only=true -o "eval.scales=[1.0,0]" > scale0.out 2>&1; then
    fail "eval.scales=[1.0,0] exited 0"
  fi
  grep -q "key 'eval.scales': factor 0 is not in (0, 4]" scale0.out || { cat scale0.out >&2; fail "eval.scales: no clear error"; }
  if "$seg" "$job" "${small[@]}" -o checkpoint.dir=nothere -o eval.only=true > nockpt.out 2>&1; then
    fail "eval.only without a checkpoint exited 0"
  fi
  grep -q "eval.only.*no checkpoint to evaluate: 'nothere/latest.pt' does not exist" nockpt.out \
    || { cat nockpt.out >&2; fail "eval.only without a checkpoint: no clear error"; }
  # predict: the masks of two exported test scenes, as palette PNGs of the image's size.
  "$seg" export "$job" "${small[@]}" --output scenes --count 2 > export.log 2>&1 || { cat export.log >&2; fail "export failed"; }
  "$seg" predict "$job" scenes/images/00000.png scenes/images/00001.png "${small[@]}" -o checkpoint.dir=ckpt \
      --output masks > predict.log 2>&1 || { cat predict.log >&2; fail "predict failed"; }
  cat predict.log
  for i in 00000 00001; do
    [[ -s masks/$i.png ]] || fail "predict wrote no masks/$i.png"
    [[ $(png_type masks/$i.png) == 3 ]] || fail "masks/$i.png is not a palette PNG"
    cmp -n 24 masks/$i.png scenes/labels/$i.png || fail "masks/$i.png differs in size from the scene"
  done
  echo PASS
  ;;
list)
  # 16 scenes as PaddleSeg data: RGB PNGs and palette label PNGs (pixel value = class id).
  "$seg" export "$job" "${small[@]}" --split train --output ds --count 16 > export.log 2>&1 \
    || { cat export.log >&2; fail "export failed"; }
  for i in $(seq -w 0 11); do echo "images/000$i.png labels/000$i.png"; done > ds/train.txt
  printf '# validation\nimages/00012.png labels/00012.png\n\nimages/00013.png labels/00013.png\n' > ds/val.txt
  # A grey label image with one pixel of value 12 (11 classes): x 36, y 1.
  { printf 'P5\n48 48\n255\n'; head -c 84 /dev/zero; printf '\x0c'; head -c 2219 /dev/zero; } > ds/labels/bad.pgm
  printf 'images/00000.png labels/00000.png\nimages/00001.png labels/bad.pgm\n' > ds/badlabel.txt
  printf 'images/00000.png labels/00000.png\nimages/00001.png labels/nothere.png\n' > ds/nolabel.txt
  printf 'images/00000.png labels/00000.png\n\nimages/nothere.png labels/00001.png\n' > ds/noimage.txt
  list=(-o data.dataset=list -o data.root=$PWD/ds -o data.num_classes=11 -o data.channels=3 -o data.image_size=48
        -o model.width=8 -o model.depth=2 -o train.batch_size=4 -o train.eval_batch_size=2 -o train.epochs=2
        -o checkpoint.dir=ckpt_list -o checkpoint.resume=false -o log.every_steps=1 -o eval.every_epochs=1)
  "$seg" "$job" "${list[@]}" -o data.train_list=ds/train.txt -o data.val_list=ds/val.txt > list_ok.out 2>&1 \
    || { cat list_ok.out >&2; fail "training on a PaddleSeg list failed"; }
  grep -E "12 train / 2 eval images" list_ok.out || fail "the list run did not see 12 + 2 samples"
  grep -E "^eval epoch 2: mIoU 0\.[0-9]{4}" list_ok.out || fail "the list run did not evaluate"
  echo "ok list training"
  expect bad_label "label file '$PWD/ds/labels/bad.pgm': pixel value 12 at (x 36, y 1) is outside [0, 11)" \
      "${list[@]}" -o data.train_list=ds/badlabel.txt -o data.val_list=ds/val.txt -o train.batch_size=2
  expect missing_label "ds/nolabel.txt:2: label file '$PWD/ds/labels/nothere.png' does not exist" \
      "${list[@]}" -o data.train_list=ds/nolabel.txt -o data.val_list=ds/val.txt
  expect missing_image "ds/noimage.txt:3: image '$PWD/ds/images/nothere.png' does not exist" \
      "${list[@]}" -o data.train_list=ds/noimage.txt -o data.val_list=ds/val.txt
  expect missing_list "cannot open list file 'ds/none.txt'" "${list[@]}" -o data.train_list=ds/none.txt \
      -o data.val_list=ds/val.txt
  expect unknown_model "unknown segmentation model 'segformer'; known models: unet, liteseg" -o model.name=segformer
  echo PASS
  ;;
slide)
  "$6" seg data 24 128 64 || fail "cannot write the test images"  # 18 train, 6 val, 128x64
  { cat "$job"; cat <<'EOF'

[data.train.transforms]
ResizeStepScaling = { min_scale_factor = 0.75, max_scale_factor = 1.5, scale_step_size = 0.25 }
RandomPaddingCrop = { crop_size = [64, 48], im_padding_value = 127.5, label_padding_value = 255 }
RandomHorizontalFlip = {}
Normalize = { mean = [0.4, 0.4, 0.4], std = [0.25, 0.25, 0.25] }

[data.eval.transforms]
Normalize = { mean = [0.4, 0.4, 0.4], std = [0.25, 0.25, 0.25] }
EOF
  } > slide.toml
  args=(-o data.dataset=list -o data.root=$PWD/data -o data.train_list=data/train.txt -o data.val_list=data/val.txt
        -o data.num_classes=3 -o data.channels=3 -o data.num_workers=4 -o model.width=8 -o model.depth=2
        -o train.batch_size=6 -o train.eval_batch_size=3 -o train.warmup_epochs=0 -o train.lr=0.01
        -o log.every_steps=2 -o eval.every_epochs=0 -o eval.flip=false -o "eval.scales=[1.0]" -o eval.is_slide=true
        -o "eval.crop_size=[64,48]" -o "eval.stride=[48,32]" -o eval.pictures=2 -o checkpoint.resume=false
        -o checkpoint.dir=ckpt -o train.threads=1)
  "$seg" slide.toml "${args[@]}" -o train.epochs=8 > train.out 2>&1 || { cat train.out >&2; fail "training failed"; }
  grep -E "^transforms: train ResizeStepScaling\(min 0.75 max 1.5 step 0.25\) -> RandomPaddingCrop\(crop_size 64x48" \
    train.out || fail "no transforms line"
  grep -E "18 train / 6 eval images" train.out || fail "the run did not see 18 + 6 samples"
  expect_loss_falls train.out 10 0.8
  grep -E "^eval epoch 8: mIoU 0\.[0-9]{4} .*\(6 images" train.out || fail "no evaluation of the 6 images"
  # The evaluation strips are image | truth | prediction at the full 128x64: 3 * 128 + 2 * 2 columns.
  strip=$(ls ckpt/pictures/epoch8_*.png | head -1)
  [[ $(od -An -tu1 -j16 -N8 "$strip" | awk '{print $3 * 256 + $4, $7 * 256 + $8}') == "388 64" ]] \
    || fail "evaluation strip $strip is not 388x64"
  "$seg" predict slide.toml data/images/3.png "${args[@]}" --output masks > predict.out 2>&1 \
    || { cat predict.out >&2; fail "predict failed"; }
  grep -F "(128x64, sliding 64x48 windows" predict.out || { cat predict.out >&2; fail "predict: no sliding windows"; }
  [[ $(od -An -tu1 -j16 -N8 masks/3.png | awk '{print $3 * 256 + $4, $7 * 256 + $8}') == "128 64" ]] \
    || fail "masks/3.png is not 128x64"
  if "$seg" slide.toml "${args[@]}" -o "eval.stride=[0,32]" > stride.out 2>&1; then fail "stride 0 accepted"; fi
  grep -F "key 'eval.stride': eval.is_slide needs [width, height], both >= 1" stride.out \
    || { cat stride.out >&2; fail "stride 0: no clear error"; }
  echo PASS
  ;;
pretrained)
  cls=$6 cls_job=$7
  "$cls" "$cls_job" -o model.name=liteseg -o model.width=0.34 -o data.limit_train=256 -o data.limit_eval=64 \
      -o train.batch_size=32 -o train.epochs=1 -o train.warmup_epochs=0 -o eval.every_epochs=0 -o train.threads=1 \
      -o checkpoint.dir=cls_ckpt -o checkpoint.resume=false > cls.out 2>&1 || { cat cls.out >&2; fail "cls training failed"; }
  grep -E "model liteseg width 0.34" cls.out || { cat cls.out >&2; fail "cls did not train its liteseg classifier"; }
  "$seg" "$job" "${small[@]}" -o train.epochs=1 -o model.pretrained=cls_ckpt/latest.pt -o checkpoint.dir=ckpt \
      > seg.out 2>&1 || { cat seg.out >&2; fail "seg from the cls checkpoint failed"; }
  # The backbone's 45 parameters and 45 buffers (width 8 = cls's 24 x 0.34, depth 2) come from cls, the grey
# stem spread over seg's 3 channels.
  grep -m1 "^pretrained:" seg.out
  grep -qE "^pretrained: 90 tensors from cls_ckpt/latest.pt; adapted stem\\.0\\.conv\\.weight from 1 to 3 input channels; not in the checkpoint \(initial values kept\): \
ppm1\.\* \([0-9]+\), ppm2\.\* \([0-9]+\), ppm4\.\* \([0-9]+\), ppm_out\.\* \([0-9]+\), fuse8\.\* \([0-9]+\), \
fuse4\.\* \([0-9]+\), fuse2\.\* \([0-9]+\), head\.\* \([0-9]+\); not in this model: fc\.\* \(2\)$" seg.out \
    || fail "seg did not take exactly the backbone"
  if "$seg" "$job" "${small[@]}" -o model.name=unet -o model.depth=2 -o model.pretrained=cls_ckpt/latest.pt \
      -o checkpoint.dir=ckpt_unet > unet.out 2>&1; then fail "a unet took a liteseg checkpoint"; fi
  grep -F "not one tensor of 'cls_ckpt/latest.pt' matches this model by name and shape" unet.out \
    || { cat unet.out >&2; fail "unet: no clear error"; }
  echo PASS
  ;;
*) echo "unknown mode $mode" >&2; exit 2 ;;
esac
