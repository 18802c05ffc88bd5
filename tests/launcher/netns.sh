# Two "machines": network namespaces joined by a veth pair. The same dtrain
# command runs in each with --ips A,B; the 2x2-process conformance run passes;
# then stopping the job on one machine stops it on the other with the report.
source "$(dirname "$0")/lib.sh"
BACKEND=${2:-gloo}
two_machines dt 7
run() {  # run NS LOGDIR ARGS...
  local ns=$1 dir=$2
  shift 2
  ip netns exec "$ns" "$BIN/dtrain" --ips $A,$B --start_port $port --nproc_per_node 2 --log_dir "$dir" \
    --token_file secret --job_id "$TAG" "$@"
}

# Pre-flight from machine B while machine A serves nothing: reported, not waited on.
ip netns exec $NB "$BIN/dtrain" check --ips $A,$B --start_port $port --timeout 2 >out.check.txt 2>&1 && fail "check passed without machine A"
grep -Eq "store $A:$port reachable +FAIL" out.check.txt || fail "check did not report the unreachable store"

# 1. 2 machines x 2 processes, conformance.
start_both "" -- dtrain-conformance --backend $BACKEND --large-count 100003
both_pass
grep -q "4 ranks" outA.txt && grep -q "0 failed" outA.txt || fail "rank 0 did not pass with 4 ranks"
for f in logA/workerlog.0 logA/workerlog.1 logB/workerlog.2 logB/workerlog.3; do
  grep -Eq "passed, 0 failed" $f || fail "$f did not pass"
done
grep -q "$B" logA/endpoints.log || fail "machine A's endpoints.log does not list machine B's workers"

# Starts the endless probe job on both machines (logs logA<n>, logB<n>); sets pa, pb.
start_probe_pair() {
  local n=$1
  run $NA logA$n -- dtrain-job-probe --backend $BACKEND --iterations 100000000 --sleep-ms 1 --timeout-s 20 --tag "$TAG" \
    >outA$n.txt 2>errA$n.txt &
  pa=$!
  run $NB logB$n -- dtrain-job-probe --backend $BACKEND --iterations 100000000 --sleep-ms 1 --timeout-s 20 --tag "$TAG" \
    >outB$n.txt 2>errB$n.txt &
  pb=$!
}

# 2. SIGKILL a worker on machine B: both machines stop, both print the root cause.
port=$((port + 1))
start_probe_pair 2
wait_for logB2/workerlog.3 "first all-reduce done"
victim=$(grep -o "pid [0-9]*" logB2/workerlog.3 | head -1 | awk '{print $2}')
sleep 0.5
kill -9 "$victim"
wait $pa && fail "machine A's dtrain exited 0"
wait $pb && fail "machine B's dtrain exited 0"
for f in errA2.txt errB2.txt; do
  grep -q "root cause: worker rank 3 was killed by SIGKILL" $f || fail "$f does not name rank 3 and SIGKILL"
done

# 3. SIGTERM to machine B's dtrain stops machine A's job too.
port=$((port + 1))
start_probe_pair 3
wait_for logB3/workerlog.3 "first all-reduce done"
dpid=$(pgrep -f -- "dtrain --ips .*--log_dir logB3" | head -1)
[ -n "$dpid" ] || fail "cannot find machine B's dtrain"
kill -TERM "$dpid"
wait $pa && fail "machine A's dtrain exited 0 after B was stopped"
wait $pb
grep -q "dtrain on node 1 ($B) received SIGTERM" errA3.txt || fail "machine A's report does not say B was stopped"
expect_no_leftovers
echo "PASS"
grep -h "root cause" errA2.txt errA3.txt
