# A withheld rank on --backend nccl (issue 12): 2 processes on the one GPU,
# each its own NCCL "host" (NCCL_HOSTID) talking over loopback sockets. Both
# all-reduce once; then rank 1 withholds the second all-reduce. Rank 0's op
# must fail with the timeout error naming rank 1 within the op timeout plus a
# second (the core's watchdog aborts the NCCL communicator: no hang), and
# every process of the job must exit (the launcher stops rank 1).
# Needs a GPU: skipped (77) without one, reported as skipped, not passed.
#   bash nccl_withhold.sh BUILD_DIR [gloo]: with gloo, the same run on host
#   buffers, no GPU needed (checks the script, the probe and the launcher).
source "$(dirname "$0")/lib.sh"
BACKEND=${2:-nccl}
PROBE="$BIN/dtrain-nccl-withhold-probe"
[ -x "$PROBE" ] || fail "$PROBE was not built"
TIMEOUT_MS=3000
if [ "$BACKEND" = nccl ]; then
  if ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >gpus.txt 2>&1 && grep -q '^GPU' gpus.txt; }; then
    echo "SKIP: no GPU (nvidia-smi -L shows none): the withheld-rank NCCL test needs one (docs/gpu.md)"
    exit 77
  fi
  cat gpus.txt
  export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_IB_DISABLE=1
  job=(--gpus 0 --backend nccl -- bash -c 'NCCL_HOSTID=dtrain-withhold-$DTRAIN_RANK exec "$0" "$@"' "$PROBE")
else
  job=(--backend "$BACKEND" -- "$PROBE" --backend "$BACKEND" --cpu)
fi
t0=$(date +%s%N)
timeout 120 "$BIN/dtrain" --nproc_per_node 2 "${job[@]}" --withhold-rank 1 --timeout-ms $TIMEOUT_MS --tag "$TAG" \
  >out.txt 2>err.txt
rc=$?
elapsed_ms=$((($(date +%s%N) - t0) / 1000000))
for r in 0 1; do [ -f log/workerlog.$r ] && { echo "--- log/workerlog.$r"; cat log/workerlog.$r; }; done
[ $rc -ne 124 ] || fail "dtrain hung (killed after 120 s)"
[ $rc -ne 0 ] || fail "dtrain exited 0: rank 0's all-reduce did not time out"
grep -q "probe rank 1: withholding all-reduce #2" log/workerlog.1 || fail "rank 1 never reached the withheld op"
grep -q "never stopped" log/workerlog.1 && fail "rank 1 was not stopped when rank 0 failed"
line=$(grep -E "^probe rank 0: timeout after [0-9]+ ms: " log/workerlog.0) ||
  fail "rank 0's all-reduce #2 did not fail with a timeout"
echo "$line"
took=$(echo "$line" | sed -E 's/^probe rank 0: timeout after ([0-9]+) ms: .*/\1/')
[ "$took" -ge $((TIMEOUT_MS - 50)) ] || fail "the timeout came early: $took ms of $TIMEOUT_MS"
[ "$took" -le $((TIMEOUT_MS + 1000)) ] || fail "the timeout came $took ms after the op, over $TIMEOUT_MS ms + 1 s"
echo "$line" | grep -q "waiting for rank 1" || fail "the error does not name the missing rank 1"
grep -q "root cause" err.txt || fail "no root-cause report"
# Rank 0 failed at ~3 s; the launcher's culprit grace and SIGTERM bound the rest.
[ $elapsed_ms -lt 60000 ] || fail "the job took $elapsed_ms ms to end"
expect_no_leftovers
echo "PASS: rank 0 timed out after $took ms naming rank 1; the job ended in $elapsed_ms ms (exit $rc)"
grep -A4 "root cause" err.txt
