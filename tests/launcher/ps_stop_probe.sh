# The end of a parameter-server job, with probe servers that only watch the
# job store's ps/stop key (no PS backend needed): the launcher sets it once
# every worker exited 0 and the job exits 0 when the servers do; a server that
# exits non-zero after it, or never exits, or dies mid-run, is the job's root
# cause; --max_restarts restarts servers and workers together.
source "$(dirname "$0")/lib.sh"
probe() { timeout 120 "$BIN/dtrain" "$@"; }

# 1. Two servers, two workers: the stop line, both servers saw the key, exit 0.
probe --server_num 2 --worker_num 2 --log_dir log1 -- dtrain-job-probe --iterations 20 --tag "$TAG" \
  >out1.txt 2>err1.txt || fail "the PS job failed"
grep -q "all workers done; stopping 2 servers" out1.txt || fail "no stop line"
for s in 0 1; do
  grep -q "ps/stop = every worker has finished; exiting with 0" log1/serverlog.$s || fail "server $s did not see ps/stop"
done
expect_no_leftovers

# 2. A server that exits non-zero after the stop: the job fails naming it, not restarted.
probe --server_num 1 --worker_num 2 --max_restarts 1 --log_dir log2 -- dtrain-job-probe --iterations 20 \
  --server-exit-code 5 --tag "$TAG" >out2.txt 2>err2.txt
rc=$?
[ $rc -ne 0 ] || fail "a server exiting 5 left the job at 0"
grep -q "root cause: server 0 exited with code 5" err2.txt || fail "the report does not name server 0 and code 5"
grep -q "log log2/serverlog.0" err2.txt || fail "the report does not name serverlog.0"
grep -q "not restarting: every worker had finished" out2.txt || fail "a failed stop was restarted"
expect_no_leftovers

# 3. A server that ignores the stop: killed after --server_stop_timeout and reported.
t0=$(date +%s%N)
probe --server_num 1 --worker_num 1 --server_stop_timeout 2 --log_dir log3 -- dtrain-job-probe --iterations 5 \
  --server-ignore-stop --tag "$TAG" >out3.txt 2>err3.txt
rc=$?
elapsed_ms=$((($(date +%s%N) - t0) / 1000000))
[ $rc -ne 0 ] || fail "a server that never exited left the job at 0"
grep -q "root cause: server 0 did not exit within 2 s after every worker had finished" err3.txt ||
  fail "the report does not name the stuck server"
[ $elapsed_ms -lt 15000 ] || fail "the stuck server was killed only after $elapsed_ms ms"
expect_no_leftovers

# 4. A server killed mid-run: root cause, the job stops at once; with
#    --max_restarts 1 both roles come back (restart count 1) and finish.
probe --server_num 1 --worker_num 2 --max_restarts 1 --log_dir log4 -- dtrain-job-probe --iterations 2000 \
  --sleep-ms 1 --tag "$TAG" >out4.txt 2>err4.txt &
dpid=$!
wait_for log4/workerlog.0 "first all-reduce done"
victim=$(grep -o "pid [0-9]*" log4/serverlog.0 | head -1 | awk '{print $2}')
kill -9 "$victim"
wait $dpid || fail "the restarted job failed"
grep -q "restarting the job" out4.txt || fail "no restart announced"
grep -q "root cause: server 0 was killed by SIGKILL" err4.txt || fail "the report does not name the killed server"
grep -q "probe server 0 pid [0-9]* restart_count 1" log4/serverlog.0 || fail "the server was not restarted"
grep -q "restart_count 1" log4/workerlog.1 || fail "the workers were not restarted"
grep -q "all workers done; stopping 1 server" out4.txt || fail "no stop line after the restart"
expect_no_leftovers
echo "PASS"
