#!/usr/bin/env bash
# export_model: an app's trained model as TorchScript, run outside dtrain.
#   export_test.sh cls DTRAIN DTRAIN_CLS JOB_TOML TORCHSCRIPT_RUN WORKDIR
# Trains a small cls job (1 epoch), exports it (TorchScript + the traced batch and dtrain's output),
# then Python PyTorch (torchscript_check.py) and a plain libtorch C++ program (torchscript_run) load
# the file and get dtrain's output; the whole-model and the sharded checkpoint both export.
# Exit 77 (skipped) when the Fashion-MNIST package is not installed.
set -euo pipefail
app=$1 dtrain=$2 prog=$3 job=$4 runner=$5 work=$6
here=$(cd "$(dirname "$0")" && pwd)
source "$here/app_lib.sh"
small=(-o model.width=0.25 -o data.limit_train=512 -o data.limit_eval=200 -o train.batch_size=32
       -o train.epochs=1 -o eval.every_epochs=0 -o checkpoint.resume=false -o train.threads=1)
for kind in whole sharded; do
  extra=()
  [[ $kind == sharded ]] && extra=(-o strategy.sharding=true -o strategy.sharding_configs.stage=3)
  "$dtrain" --nproc_per_node 2 --log_dir "log_$kind" "$job" "${small[@]}" "${extra[@]}" -o "checkpoint.dir=ckpt_$kind" \
      > "train_$kind.log" 2>&1 || { cat "train_$kind.log" "log_$kind"/workerlog.* >&2; fail "training ($kind) failed"; }
  "$prog" export_model "$job" "${small[@]}" -o "checkpoint.dir=ckpt_$kind" --output "$kind/model.pt" \
      --verify "$kind/verify" > "export_$kind.log" 2>&1 || { cat "export_$kind.log" >&2; fail "export_model ($kind) failed"; }
  cat "export_$kind.log"
  grep -q "input 8x1x28x28 -> output 8x10" "export_$kind.log" || fail "unexpected shapes"
  /usr/bin/python3 "$here/torchscript_check.py" "$kind/model.pt" "$kind/verify" || fail "Python ($kind)"
  "$runner" "$kind/model.pt" "$kind/verify" || fail "libtorch C++ ($kind)"
done
# No checkpoint: a clear error naming the key.
if "$prog" export_model "$job" "${small[@]}" -o checkpoint.dir=nothing_here --output x.pt > none.log 2>&1; then
  fail "export_model without a checkpoint exited 0"
fi
grep -q "key 'checkpoint.dir': export_model found no checkpoint" none.log || { cat none.log >&2; fail "no clear error"; }
echo PASS
