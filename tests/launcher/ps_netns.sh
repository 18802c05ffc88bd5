# dtrain-ps-linear on two "machines" (network namespaces): the server on
# machine B, one worker on each. The job trains and ends with exit 0 on both;
# then a SIGKILLed server stops the job on both machines, each report naming
# the server and the endpoint it served on.
source "$(dirname "$0")/ps_lib.sh"
two_machines ds 9
# run NS LOGDIR ARGS...
run() {
  dtrain_in "$1" --servers $B:$((port + 10)) --workers $A:$((port + 11)),$B:$((port + 12)) --log_dir "$2" "${@:3}" "$JOB"
}

start_both ""
both_pass
for f in outA.txt outB.txt; do grep -q "all workers done; stopping 1 server" $f || fail "$f: no stop line"; done
expect_loss_fell logA/workerlog.0
expect_loss_fell logB/workerlog.1
grep -q "served; exiting" logB/serverlog.0 || fail "the server did not return from serve()"

port=$((port + 20))
start_both 2 --log_level info -o ps.timeout_s=10 -o ps_linear.steps=100000 -o ps_linear.sleep_ms=10
wait_for logA2/workerlog.0 "step 20/"
victim=$(pid_in logB2/serverlog.0)
ep=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' logB2/serverlog.0 | head -1)
case "$ep" in $B:*) ;; *) fail "the server listens on '$ep', not on machine B's address $B" ;; esac
kill -9 "$victim"
wait $pa && fail "machine A's dtrain exited 0 after the server was killed"
wait $pb && fail "machine B's dtrain exited 0 after the server was killed"
for f in errA2.txt errB2.txt; do
  grep -q "root cause: server 0 was killed by SIGKILL" $f || fail "$f does not name the server"
  grep -q "endpoint $ep," $f || fail "$f does not name the server's endpoint $ep"
done
expect_no_leftovers
echo "PASS"
