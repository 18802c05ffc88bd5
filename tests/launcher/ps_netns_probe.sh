# The end of a parameter-server job on two "machines" (network namespaces),
# with --servers/--workers lists: the server runs on machine B, workers on
# both. Every worker exits 0 -> both launchers say they stop the server, the
# probe server sees ps/stop, both exit 0. A server that exits non-zero after
# the stop fails the job on both machines, each report naming it.
source "$(dirname "$0")/lib.sh"
two_machines dp 8
run() {  # run NS LOGDIR ARGS...
  local ns=$1 dir=$2
  shift 2
  ip netns exec "$ns" timeout 120 "$BIN/dtrain" --ips $A,$B --start_port $port --servers $B:$((port + 10)) \
    --workers $A:$((port + 11)),$B:$((port + 12)),$A:$((port + 13)) --log_dir "$dir" --token_file secret \
    --job_id "$TAG" -- dtrain-job-probe --iterations 20 --tag "$TAG" "$@"
}

run $NA logA >outA.txt 2>errA.txt &
pa=$!
run $NB logB >outB.txt 2>errB.txt &
pb=$!
wait $pa || fail "machine A's dtrain failed"
wait $pb || fail "machine B's dtrain failed"
grep -q "all workers done; stopping 1 server" outA.txt || fail "machine A did not stop the server"
grep -q "all workers done; stopping 1 server" outB.txt || fail "machine B did not stop the server"
grep -q "ps/stop = every worker has finished; exiting with 0" logB/serverlog.0 || fail "the server did not see ps/stop"
[ ! -e logA/serverlog.0 ] || fail "machine A started a server it does not host"

port=$((port + 20))
run $NA logA2 --server-exit-code 4 >outA2.txt 2>errA2.txt &
pa=$!
run $NB logB2 --server-exit-code 4 >outB2.txt 2>errB2.txt &
pb=$!
wait $pa && fail "machine A's dtrain exited 0 after the server failed"
wait $pb && fail "machine B's dtrain exited 0 after the server failed"
for f in errA2.txt errB2.txt; do
  grep -q "root cause: server 0 exited with code 4" $f || fail "$f does not name server 0"
done
expect_no_leftovers
echo "PASS"
