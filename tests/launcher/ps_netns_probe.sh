# The end of a parameter-server job on two "machines" (network namespaces),
# with --servers/--workers lists: the server runs on machine B, workers on
# both. Every worker exits 0 -> both launchers say they stop the server, the
# probe server sees ps/stop, both exit 0. A server that exits non-zero after
# the stop fails the job on both machines, each report naming it.
source "$(dirname "$0")/lib.sh"
two_machines dp 8
# run NS LOGDIR ARGS...
run() {
  dtrain_in "$1" --servers $B:$((port + 10)) --workers $A:$((port + 11)),$B:$((port + 12)),$A:$((port + 13)) \
    --log_dir "$2" -- dtrain-job-probe --iterations 20 --tag "$TAG" "${@:3}"
}

start_both ""
both_pass
grep -q "all workers done; stopping 1 server" outA.txt || fail "machine A did not stop the server"
grep -q "all workers done; stopping 1 server" outB.txt || fail "machine B did not stop the server"
grep -q "ps/stop = every worker has finished; exiting with 0" logB/serverlog.0 || fail "the server did not see ps/stop"
[ ! -e logA/serverlog.0 ] || fail "machine A started a server it does not host"

port=$((port + 20))
start_both 2 --server-exit-code 4
wait $pa && fail "machine A's dtrain exited 0 after the server failed"
wait $pb && fail "machine B's dtrain exited 0 after the server failed"
for f in errA2.txt errB2.txt; do
  grep -q "root cause: server 0 exited with code 4" $f || fail "$f does not name server 0"
done
expect_no_leftovers
echo "PASS"
