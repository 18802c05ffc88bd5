# dtrain-bench collectives --backend nccl, which compares dtrain with raw NCCL
# on the same CUDA buffers in the same run (bench/nccl_reference.h).
# Without a GPU: it fails at once (no rank started, nothing waits for a peer)
# with a message that says no CUDA device is visible and what to use instead,
# and leaves no process. With one: a short run at world size 1, then 2 ranks
# sharing the GPU (each its own NCCL_HOSTID), must print the table with the
# ratio to raw NCCL and the target line for every size (the figures themselves
# are judged by hand: docs/gpu.md).
source "$(dirname "$0")/lib.sh"
[ -x "$BIN/dtrain-bench" ] || fail "$BIN/dtrain-bench was not built"
# The ranks rerun the bench's own command line: a link named with $TAG marks them.
BENCH="$WORK/dtrain-bench-$TAG"
ln -s "$BIN/dtrain-bench" "$BENCH"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >gpus.txt 2>&1 && grep -q '^GPU' gpus.txt; then
  cat gpus.txt
  for n in 1 2; do
    timeout 300 "$BENCH" collectives --backend nccl --world-size $n -b 8 -e 4M -f 64 --trials 5 --time-limit 240 \
      >out.$n.txt 2>err.$n.txt || fail "world size $n: dtrain-bench exited $?"
    cat out.$n.txt
    grep -q '^# raw NCCL: nccl{AllReduce' out.$n.txt || fail "world size $n: no raw-NCCL reference in the header"
    rows=$(grep -Ec '^ +[0-9]+ +[0-9]+ +f32 .* [0-9.]+ +[0-9.]+-[0-9.]+ +[-+][0-9.]+ +(met|NOT)$' out.$n.txt)
    [ "$rows" = 4 ] || fail "world size $n: $rows of 4 sizes have dtrain, raw NCCL, the ratio and the target"
    grep -Eq '^# dtrain within 5% .* of raw NCCL per op: [0-9]+ of 4 sizes' out.$n.txt ||
      fail "world size $n: no target line"
  done
  expect_no_leftovers
  echo "PASS: dtrain-bench compared dtrain with raw NCCL at world size 1 and 2"
  exit 0
fi
t0=$(date +%s%N)
timeout 60 "$BENCH" collectives --backend nccl --world-size 2 >out.txt 2>err.txt
rc=$?
elapsed_ms=$((($(date +%s%N) - t0) / 1000000))
[ $rc -ne 0 ] || fail "dtrain-bench --backend nccl exited 0 without a GPU"
[ $rc -ne 124 ] || fail "dtrain-bench --backend nccl hung (killed after 60 s)"
[ $elapsed_ms -lt 5000 ] || fail "dtrain-bench took $elapsed_ms ms to fail"
grep -q "^dtrain-bench: --backend nccl runs on CUDA buffers, but no CUDA device is visible (cudaGetDeviceCount: " \
  err.txt || fail "no clear no-device message"
grep -q "benchmark --backend gloo or --backend ucx on this machine" err.txt || fail "the message does not say what to use"
grep -q "running .* ranks" err.txt && fail "ranks were started"
expect_no_leftovers
echo "PASS: failed in ${elapsed_ms} ms with exit code $rc"
cat err.txt
