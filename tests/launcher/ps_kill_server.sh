# SIGKILL the parameter server mid-run: the job ends within the PS op timeout
# plus a few seconds, the report names the server and its log, no process is
# left. With --max_restarts 1 the job comes back, the workers restore the last
# checkpoint (not step 0) and finish.
source "$(dirname "$0")/ps_lib.sh"
TIMEOUT=10
timeout 120 "$BIN/dtrain" --log_level info --server_num 1 --worker_num 2 --log_dir log1 -o ps.timeout_s=$TIMEOUT \
  -o ps_linear.steps=100000 -o ps_linear.sleep_ms=10 "$JOB" >out1.txt 2>err1.txt &
dpid=$!
wait_for log1/workerlog.0 "step 20/"
victim=$(pid_in log1/serverlog.0)
[ -n "$victim" ] || fail "no server pid in serverlog.0"
kill_and_wait "$victim" $dpid "the server"
grep -q "root cause: server 0 was killed by SIGKILL" err1.txt || fail "the report does not name server 0 and SIGKILL"
grep -q "log log1/serverlog.0" err1.txt || fail "the report does not name serverlog.0"
ep=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' log1/serverlog.0 | head -1)
[ -n "$ep" ] || fail "serverlog.0 does not say where the server listened"
grep -q "endpoint $ep," err1.txt || fail "the report does not name the server's endpoint $ep"
expect_no_leftovers
echo "stopped ${elapsed_ms} ms after the kill"

STEPS=200
timeout 180 "$BIN/dtrain" --server_num 1 --worker_num 2 --max_restarts 1 --log_dir log2 -o ps.timeout_s=$TIMEOUT \
  -o ps.checkpoint_dir="$WORK/ckpt" -o ps_linear.steps=$STEPS -o ps_linear.checkpoint_every=20 \
  -o ps_linear.sleep_ms=10 "$JOB" >out2.txt 2>err2.txt &
dpid=$!
wait_for log2/workerlog.0 "checkpoint step 60 saved"
victim=$(pid_in log2/serverlog.0)
kill -9 "$victim"
wait $dpid || fail "the job with --max_restarts 1 failed"
grep -q "restarting the job (1 of 1 restarts)" out2.txt || fail "no restart announced"
grep -q "root cause: server 0 was killed by SIGKILL" err2.txt || fail "the first attempt's report does not name the server"
for w in 0 1; do
  restored=$(sed -n 's/.*restored step \([0-9]*\) from the checkpoint.*/\1/p' log2/workerlog.$w | tail -1)
  [ -n "$restored" ] || fail "worker $w did not restore a checkpoint"
  [ "$restored" -ge 60 ] || fail "worker $w restored step $restored, before the checkpoint of step 60"
  # The restarted attempt's first logged step comes after the restored one.
  next=$(sed -n '/===== dtrain: restart 1 =====/,$p' log2/workerlog.$w | sed -n 's/.*: step \([0-9]*\)\/.*/\1/p' | head -1)
  [ -n "$next" ] && [ "$next" -gt "$restored" ] || fail "worker $w went on at step '$next' after restoring $restored"
  grep -q "step $STEPS/$STEPS loss" log2/workerlog.$w || fail "worker $w did not finish"
  echo "worker $w: restored step $restored, went on at step $next"
done
grep -q "all workers done; stopping 1 server" out2.txt || fail "no stop line after the restart"
expect_no_leftovers
echo "PASS"
