# SIGKILL one rank in the middle of a collective loop: dtrain exits non-zero
# within the collective timeout plus a few seconds, the report names the rank
# and its signal, and no process of the job is left.
source "$(dirname "$0")/lib.sh"
BACKEND=${2:-gloo}
TIMEOUT=20
"$BIN/dtrain" --nproc_per_node 4 -- dtrain-job-probe --backend $BACKEND --iterations 100000000 --sleep-ms 1 \
  --timeout-s $TIMEOUT --tag "$TAG" >out.txt 2>err.txt &
dpid=$!
wait_for log/workerlog.2 "first all-reduce done"
victim=$(grep -o "pid [0-9]*" log/workerlog.2 | head -1 | awk '{print $2}')
sleep 0.5
kill_and_wait "$victim" $dpid "a rank"
grep -q "root cause: worker rank 2 was killed by SIGKILL" err.txt || fail "the report does not name rank 2 and SIGKILL"
expect_no_leftovers
echo "PASS: stopped ${elapsed_ms} ms after the kill, exit code $rc"
grep -A3 "root cause" err.txt

# SIGKILL to dtrain itself: its processes die with it.
"$BIN/dtrain" --nproc_per_node 3 --log_dir log2 -- dtrain-job-probe --backend $BACKEND --iterations 100000000 --sleep-ms 1 \
  --tag "$TAG" >out2.txt 2>err2.txt &
dpid=$!
wait_for log2/workerlog.2 "first all-reduce done"
[ "$(pgrep -fc -- "$TAG")" -ge 3 ] || fail "the job's processes are not running"
kill -9 $dpid
wait $dpid 2>/dev/null
expect_no_leftovers
echo "PASS: no process outlived a SIGKILLed dtrain"
