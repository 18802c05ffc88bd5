#!/usr/bin/env bash
# export_model: an app's trained model as TorchScript, run outside dtrain.
#   export_test.sh APP DTRAIN DTRAIN_APP JOB_TOML TORCHSCRIPT_RUN WORKDIR     APP: cls | seg | ocr
# Trains a small job of the app (2 workers), exports it (TorchScript + the traced batch and dtrain's
# output), then Python PyTorch (torchscript_check.py) and a plain libtorch C++ program
# (torchscript_run) load the file and get dtrain's output. cls also exports a sharded (stage 3)
# checkpoint, checks the default job's shapes ([N, 1, 28, 28] -> [N, 10]), and fine-tunes from both
# checkpoints onto a 3-class list (model.pretrained: the new head is skipped, named).
# Exit 77 (skipped) without the app's data (Fashion-MNIST; the OCR fonts and word list).
set -euo pipefail
app=$1 dtrain=$2 prog=$3 job=$4 runner=$5 work=$6
here=$(cd "$(dirname "$0")" && pwd)
case $app in
cls)
  small=(-o model.width=0.25 -o data.limit_train=512 -o data.limit_eval=200 -o train.batch_size=32)
  kinds=(whole sharded)
  ;;
seg)
  small=(-o data.train_scenes=64 -o data.eval_scenes=24 -o data.scene_size=48 -o model.width=8 -o model.depth=2
         -o train.batch_size=8 -o train.eval_batch_size=12 -o train.lr=0.02)
  kinds=(whole)
  ;;
ocr)
  need="/usr/share/dict/words /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
        /usr/share/fonts/truetype/liberation2/LiberationSerif-Regular.ttf /usr/share/fonts/opentype/urw-base35/P052-Roman.otf"
  small=(-o model.width=8 -o model.hidden=32 -o model.layers=1 -o data.eval_samples=40 -o data.train_samples=160
         -o 'data.fonts=["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf","/usr/share/fonts/truetype/liberation2/LiberationSerif-Regular.ttf"]'
         -o 'data.heldout_fonts=["/usr/share/fonts/opentype/urw-base35/P052-Roman.otf"]'
         -o train.batch_size=16 -o train.eval_batch_size=20 -o train.lr=0.003)
  kinds=(whole)
  ;;
*) echo "unknown app $app" >&2; exit 2 ;;
esac
source "$here/app_lib.sh"
small+=(-o train.epochs=1 -o train.warmup_epochs=0 -o eval.every_epochs=0 -o checkpoint.resume=false -o train.threads=1)
for kind in "${kinds[@]}"; do
  extra=()
  [[ $kind == sharded ]] && extra=(-o strategy.sharding=true -o strategy.sharding_configs.stage=3)
  "$dtrain" --nproc_per_node 2 --log_dir "log_$kind" "$job" "${small[@]}" "${extra[@]}" -o "checkpoint.dir=ckpt_$kind" \
      > "train_$kind.log" 2>&1 || { cat "train_$kind.log" "log_$kind"/workerlog.* >&2; fail "training ($kind) failed"; }
  "$prog" export_model "$job" "${small[@]}" -o "checkpoint.dir=ckpt_$kind" --output "$kind/model.pt" \
      --verify "$kind/verify" > "export_$kind.log" 2>&1 || { cat "export_$kind.log" >&2; fail "export_model ($kind) failed"; }
  cat "export_$kind.log"
  if [[ $app == cls ]]; then grep -q "input 8x1x28x28 -> output 8x10" "export_$kind.log" || fail "unexpected shapes"; fi
  /usr/bin/python3 "$here/torchscript_check.py" "$kind/model.pt" "$kind/verify" || fail "Python ($kind)"
  "$runner" "$kind/model.pt" "$kind/verify" || fail "libtorch C++ ($kind)"
done
if [[ $app == cls ]]; then
  # Fine-tuning: a 3-class list data set from the 10-class checkpoint takes every tensor but the new head's.
  mkdir -p imgs
  for i in 0 1 2 3 4 5 6 7; do { printf 'P5\n28 28\n255\n'; head -c 784 /dev/urandom; } > imgs/$i.pgm; done
  for i in 0 1 2 3 4 5 6 7; do echo "imgs/$i.pgm $((i % 3))"; done > list.txt
  list=(-o model.width=0.25 -o data.dataset=\"list\" -o data.root=$PWD -o data.train_list=list.txt -o data.val_list=list.txt
        -o data.channels=1 -o data.image_size=28 -o data.num_classes=3 -o train.batch_size=4 -o train.epochs=1
        -o checkpoint.dir=ckpt_ft -o checkpoint.resume=false -o train.threads=1)
  for kind in "${kinds[@]}"; do
    from=ckpt_$kind/latest.pt
    [[ $kind == sharded ]] && from=ckpt_sharded/$(head -1 ckpt_sharded/latest-sharded)
    "$prog" "$job" "${list[@]}" -o "model.pretrained=$from" > "ft_$kind.log" 2>&1 || { cat "ft_$kind.log" >&2; fail "fine-tuning from $kind failed"; }
    grep -m1 "^pretrained:" "ft_$kind.log"
    grep -q "^pretrained: 126 tensors from .*; skipped fc.weight \[3, 16\] (checkpoint \[10, 16\]), fc.bias \[3\] (checkpoint \[10\])$" \
        "ft_$kind.log" || fail "fine-tuning from $kind did not take the backbone and skip the head"
  done
  if "$prog" "$job" "${list[@]}" -o model.pretrained=nowhere.pt > ft_none.log 2>&1; then fail "a missing pretrained checkpoint exited 0"; fi
  grep -q "key 'model.pretrained': 'nowhere.pt' does not exist" ft_none.log || { cat ft_none.log >&2; fail "no clear error"; }
fi
# No checkpoint: a clear error naming the key.
if "$prog" export_model "$job" "${small[@]}" -o checkpoint.dir=nothing_here --output x.pt > none.log 2>&1; then
  fail "export_model without a checkpoint exited 0"
fi
grep -q "key 'checkpoint.dir': export_model found no checkpoint" none.log || { cat none.log >&2; fail "no clear error"; }
echo PASS
