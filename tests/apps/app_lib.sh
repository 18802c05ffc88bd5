# Shared by the training-app tests (cls_test.sh, seg_test.sh, ocr_test.sh), sourced after
# `mode=... work=... app=... job=...` (app: the app's program) (and optionally `need="FILE..."`, the files the app's data
# lives in) are set: skips (77) without the data (default: the Fashion-MNIST
# package), starts in a fresh WORKDIR with no scheduler variables, and gives
# the checks the apps' short 2-worker runs make.
data=/usr/share/datasets/fashion-mnist
for f in ${need:-$data/train-images-idx3-ubyte.gz}; do
  [[ -e $f ]] || { echo "SKIP: $f missing (scripts/setup.sh installs it)"; exit 77; }
done
rm -rf "$work" && mkdir -p "$work" && cd "$work"
unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT DTRAIN_RANK PADDLE_TRAINER_ID SLURM_PROCID OMPI_COMM_WORLD_RANK || true

fail() { echo "FAIL: $*" >&2; exit 1; }

# "epoch E/N step S/M loss L ..." -> "E S L"
losses() { sed -n 's/^.*epoch \([0-9]*\)\/[0-9]* step \([0-9]*\)\/[0-9]* loss \([0-9.eE+-]*\) .*$/\1 \2 \3/p' "$1"; }

# expect_loss_falls LOG MIN_LINES FACTOR: at least MIN_LINES progress lines, and
# the mean loss of the last two below FACTOR times that of the first two.
expect_loss_falls() {
  local log=$1 min=$2 factor=$3 n first last
  losses "$log" > losses.txt
  cat losses.txt
  n=$(wc -l < losses.txt)
  (( n >= min )) || fail "expected at least $min progress lines, got $n"
  first=$(head -2 losses.txt | awk '{s += $3} END {print s / NR}')
  last=$(tail -2 losses.txt | awk '{s += $3} END {print s / NR}')
  awk -v a="$first" -v b="$last" -v f="$factor" 'BEGIN {exit !(b < f * a)}' ||
    fail "loss did not fall: first $first, last $last"
  echo "loss $first -> $last"
}

# expect_same_params: the two workers' parameter dumps params.{0,1}.bin are bit-identical.
expect_same_params() {
  [[ -s params.0.bin && -s params.1.bin ]] || fail "parameter dumps missing"
  cmp params.0.bin params.1.bin || fail "the workers' parameters differ after the run"
}

# expect NAME PATTERN ARGS... : "$app" "$job" ARGS... must fail and print PATTERN.
expect() {
  local name=$1 pattern=$2
  shift 2
  if "$app" "$job" "$@" > "$name.out" 2>&1; then cat "$name.out" >&2; fail "$name: exited 0"; fi
  grep -qF -- "$pattern" "$name.out" || { cat "$name.out" >&2; fail "$name: no '$pattern' in the output"; }
  echo "ok $name: $(grep -m1 error "$name.out")"
}

# ci_job EPOCHS MIN_LINES FACTOR [ARGS...]: the app's short 2-worker job
# ("${small[@]}", EPOCHS epochs, checkpoints in ckpt, parameter dumps,
# TensorBoard in tb) passes, its loss falls (expect_loss_falls MIN_LINES
# FACTOR) and its workers end with the same parameters.
ci_job() {
  local epochs=$1 min=$2 factor=$3
  shift 3
  "$dtrain" --nproc_per_node 2 --log_dir log "$job" "${small[@]}" -o train.epochs="$epochs" \
      -o checkpoint.dir=ckpt -o "debug.dump_params=params.{rank}.bin" -o log.tensorboard=tb "$@" > console.log 2>&1 \
    || { cat console.log log/workerlog.* >&2; fail "the job failed"; }
  expect_loss_falls log/workerlog.0 "$min" "$factor"
  expect_same_params
  grep -h "fnv1a64" log/workerlog.0 log/workerlog.1
}
