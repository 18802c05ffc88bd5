# dtrain-bench training --device: dtrain's one worker against PyTorch eager
# (the plain libtorch loop, no dtrain) on the same device, model and batch.
# --device cuda is refused at once, before any worker starts, where libtorch
# sees no CUDA device (Debian's CPU libtorch, or no driver); with a GPU and a
# CUDA libtorch it runs the pair. --device cpu runs the same pair on the CPU:
# both rows, the paired ratio and its target line.
# bash nccl_bench_training.sh BUILD_DIR JOB_FILE
source "$(dirname "$0")/lib.sh"
JOB=$2
[ -x "$BIN/dtrain-bench-training" ] || fail "$BIN/dtrain-bench-training was not built"
SMALL=(--steps 3 --warmup 1 --trials 2 -o train.batch_size=8 -o "train.threads=1")
pair_ok() {  # pair_ok FILE DEVICE: the table has both rows and the ratio with its target
  grep -Eq "^# dtrain-bench training .* --device $2: .* on $2" "$1" || fail "$2: no header naming the device"
  grep -Eq '^dtrain 1 worker +[0-9.]+ ' "$1" || fail "$2: no dtrain row"
  grep -Eq '^PyTorch eager \(libtorch\), 1 process +[0-9.]+ ' "$1" || fail "$2: no PyTorch eager row"
  grep -Eq '^dtrain 1 worker / PyTorch eager +[0-9.]+  \(95% CI [0-9.]+-[0-9.]+; .*\[target >= 1.00: (met|NOT met)\]' \
    "$1" || fail "$2: no paired ratio with its target"
}
cuda_torch=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU' &&
  ldd "$BIN/dtrain-bench-training" | grep -q 'libc10_cuda'; then
  cuda_torch=1
fi
t0=$(date +%s%N)
timeout 300 "$BIN/dtrain-bench" training "$JOB" --device cuda "${SMALL[@]}" >out.cuda.txt 2>err.cuda.txt
rc=$?
elapsed_ms=$((($(date +%s%N) - t0) / 1000000))
cat out.cuda.txt err.cuda.txt
if [ $cuda_torch = 1 ]; then
  [ $rc = 0 ] || fail "--device cuda on a GPU with a CUDA libtorch exited $rc"
  pair_ok out.cuda.txt cuda:0
else
  [ $rc = 1 ] || fail "--device cuda without a CUDA libtorch exited $rc, not 1"
  [ $elapsed_ms -lt 10000 ] || fail "the refusal took $elapsed_ms ms"
  grep -q '^dtrain-bench-training: error: --device cuda: train.device: wants cuda:0 .* but no CUDA device is visible to libtorch' \
    err.cuda.txt || fail "the refusal does not say that libtorch sees no CUDA device"
  grep -q 'without --device dtrain-bench training runs its CPU rows' err.cuda.txt || fail "no hint what to run instead"
  [ -s out.cuda.txt ] && fail "the refused run printed a table"
fi
timeout 300 "$BIN/dtrain-bench" training "$JOB" --device cpu "${SMALL[@]}" >out.cpu.txt 2>err.cpu.txt ||
  fail "--device cpu exited $?"
cat out.cpu.txt
pair_ok out.cpu.txt cpu
echo "PASS"
