# --gpus: workers get their CUDA device (DTRAIN_DEVICE, FLAGS_selected_gpus);
# a device the machine does not show is refused before anything starts, naming
# the devices there are (or why there are none and what to use instead).
source "$(dirname "$0")/lib.sh"
refused() {  # refused WHAT TEXT ARGS...: dtrain ARGS fails at once, printing TEXT, starting nothing
  local what=$1 text=$2
  shift 2
  timeout 20 "$BIN/dtrain" --log_dir log.$what "$@" -- bash -c "echo started-$TAG" >out.$what.txt 2>err.$what.txt &&
    fail "$what: dtrain $* was not refused"
  grep -q -- "$text" err.$what.txt || fail "$what: the refusal does not say '$text'"
  grep -q "started-$TAG" out.$what.txt && fail "$what: a worker started before the refusal"
  [ -e log.$what ] && fail "$what: the job's log folder was created before the refusal"
  return 0
}
refused syntax "'x' is not a device number" --gpus 0,x
refused fewer "fewer than the 2 devices" --gpus 0,1 --nproc_per_node 1
# No machine shows 100 devices: refused, saying what it has.
refused missing "this machine shows" --gpus 99
if grep -q "shows no CUDA device" err.missing.txt; then
  grep -q "with --backend gloo or --backend ucx" err.missing.txt || fail "no hint to train on the CPU"
  echo "no CUDA device here: $(cat err.missing.txt)"
else
  # A machine with a GPU: two workers share device 0 in turn.
  timeout 60 "$BIN/dtrain" --gpus 0 --nproc_per_node 2 -- \
    bash -c 'echo "rank $DTRAIN_RANK device $DTRAIN_DEVICE flags $FLAGS_selected_gpus"' >out.gpu.txt 2>&1 ||
    fail "--gpus 0 on a machine with a GPU failed"
  for r in 0 1; do grep -q "rank $r device 0 flags 0" log/workerlog.$r || fail "worker $r did not get device 0"; done
fi
echo "PASS"
