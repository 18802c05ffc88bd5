# Sync mode, one worker stops pushing (--stall_after): the other fails within
# the PS op timeout with the server's message naming the worker it waited
# for, the launcher stops the job, no process is left.
source "$(dirname "$0")/ps_lib.sh"
TIMEOUT=5
t0=$(date +%s%N)
timeout 120 "$BIN/dtrain" --server_num 1 --worker_num 2 -o ps.timeout_s=$TIMEOUT -o ps_linear.steps=100000 \
  -o ps_linear.stall_after=10 -o ps_linear.stall_worker=1 "$JOB" >out.txt 2>err.txt
rc=$?
elapsed_ms=$((($(date +%s%N) - t0) / 1000000))
[ $rc -ne 0 ] || fail "the job exited 0 with a withheld worker"
grep -q "worker 1: stalling after step 10" log/workerlog.1 || fail "worker 1 did not stall"
grep -q "root cause: worker rank 0 exited with code 1" err.txt || fail "the report does not name worker 0's failure"
# The failure names the worker that did not push.
grep "dtrain-ps-linear worker 0:" log/workerlog.0 | grep -q "waiting for worker(s) 1 that have not pushed" ||
  fail "worker 0's error does not name worker 1: $(grep 'dtrain-ps-linear worker 0:' log/workerlog.0)"
[ $elapsed_ms -lt 60000 ] || fail "took $elapsed_ms ms"
expect_no_leftovers
echo "PASS after ${elapsed_ms} ms: $(grep 'waiting for worker(s)' log/workerlog.0)"
