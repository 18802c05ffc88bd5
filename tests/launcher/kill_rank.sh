# SIGKILL one rank in the middle of a collective loop: dtrain exits non-zero
# within the collective timeout plus a few seconds, the report names the rank
# and its signal, and no process of the job is left.
#   kill_rank.sh BUILD [BACKEND] [NPROC]   (4 processes unless NPROC; the victim is rank NPROC/2)
source "$(dirname "$0")/lib.sh"
BACKEND=${2:-gloo}
NPROC=${3:-4}
R=$((NPROC / 2))
TIMEOUT=20
"$BIN/dtrain" --nproc_per_node $NPROC -- dtrain-job-probe --backend $BACKEND --iterations 100000000 --sleep-ms 1 \
  --timeout-s $TIMEOUT --tag "$TAG" >out.txt 2>err.txt &
dpid=$!
wait_for log/workerlog.$R "first all-reduce done" 1200
victim=$(grep -o "pid [0-9]*" log/workerlog.$R | head -1 | awk '{print $2}')
[ "$(pgrep -fc -- "$TAG")" -ge $NPROC ] || fail "fewer than $NPROC processes of the job are running"
sleep 0.5
kill_and_wait "$victim" $dpid "a rank"
grep -q "root cause: worker rank $R was killed by SIGKILL" err.txt || fail "the report does not name rank $R and SIGKILL"
grep "root cause:" err.txt | grep -qv "worker rank $R was killed" && fail "the report blames another rank too"
expect_no_leftovers
echo "PASS: $NPROC ranks, stopped ${elapsed_ms} ms after the kill, exit code $rc"
grep -A3 "root cause" err.txt
[ $NPROC -gt 8 ] && exit 0  # the scale run stops here; the SIGKILLed-launcher case is the same at any size

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
