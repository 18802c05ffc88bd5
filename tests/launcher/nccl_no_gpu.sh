# Without a GPU, a job on --backend nccl fails at once: dtrain exits non-zero
# within seconds (no rank waits for a peer), its root-cause report carries the
# plugin's "no CUDA device is visible ... use --backend gloo or --backend ucx"
# message, and no process of the job is left. Skipped (77) where a GPU is
# visible: there the job would run (docs/gpu.md has the GPU checks).
source "$(dirname "$0")/lib.sh"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >gpus.txt 2>&1 && grep -q '^GPU' gpus.txt; then
  cat gpus.txt
  echo "NOT RUN: a GPU is visible, so the no-GPU failure of --backend nccl cannot be checked here"
  exit 77
fi
t0=$(date +%s%N)
timeout 60 "$BIN/dtrain" --nproc_per_node 2 -- dtrain-job-probe --backend nccl --timeout-s 30 --tag "$TAG" \
  >out.txt 2>err.txt
rc=$?
elapsed_ms=$((($(date +%s%N) - t0) / 1000000))
[ $rc -ne 0 ] || fail "dtrain --backend nccl exited 0 without a GPU"
[ $rc -ne 124 ] || fail "dtrain --backend nccl hung (killed after 60 s)"
# Well under the 30 s communicator timeout: nobody waited for a peer.
[ $elapsed_ms -lt 10000 ] || fail "dtrain took $elapsed_ms ms to fail"
grep -q "root cause: worker rank [01] exited with code 1" err.txt || fail "no root-cause report naming a rank"
grep -q "nccl: no CUDA device is visible (cudaGetDeviceCount: " err.txt ||
  fail "the report does not carry the plugin's no-device message"
grep -q "use --backend gloo or --backend ucx on CPU-only machines" err.txt || fail "the report does not say what to use"
expect_no_leftovers
echo "PASS: failed in ${elapsed_ms} ms with exit code $rc"
grep -A4 "root cause" err.txt
