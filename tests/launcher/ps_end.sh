# The end of a parameter-server job: every worker exits 0, the launcher says
# "all workers done; stopping S servers", the servers exit 0, the job exits 0,
# the loss fell, and no process is left. In sync (with [ps] save_on_exit: the
# tables are saved in checkpoint_dir/final), async and GEO mode.
source "$(dirname "$0")/ps_lib.sh"
run() {
  local log=$1
  shift
  timeout 120 "$BIN/dtrain" --log_dir "$log" "$@" "$JOB" >"out.$log.txt" 2>"err.$log.txt" ||
    fail "the PS job ($log: $*) failed"
}
run sync --server_num 1 --worker_num 2 -o ps.save_on_exit=true -o ps.checkpoint_dir="$WORK/ckpt"
grep -q "all workers done; stopping 1 server$" out.sync.txt || fail "no stop line"
for t in weights dense; do
  [ -f "$WORK/ckpt/final/$t/MANIFEST" ] || fail "[ps] save_on_exit did not save table $t in ckpt/final"
done
grep -q "served; exiting" sync/serverlog.0 || fail "the server did not return from serve()"
for w in 0 1; do expect_loss_fell sync/workerlog.$w; done
grep -q "mode sync" sync/workerlog.0 || fail "not in sync mode"
expect_no_leftovers

run async --server_num 2 --worker_num 2 -o strategy.a_sync=true
grep -q "all workers done; stopping 2 servers" out.async.txt || fail "no stop line for 2 servers"
grep -q "mode async" async/workerlog.1 || fail "a_sync = true did not give async mode"
for w in 0 1; do expect_loss_fell async/workerlog.$w; done
expect_no_leftovers

# GEO trains with SGD on the workers (as Paddle's): the sparse table's rule too.
run geo --server_num 1 --worker_num 2 -o strategy.a_sync=true -o strategy.a_sync_configs.k_steps=4 \
  -o ps.tables.weights.optimizer=sgd
grep -q "mode geo k_steps 4" geo/workerlog.0 || fail "k_steps = 4 did not give GEO mode"
for w in 0 1; do expect_loss_fell geo/workerlog.$w; done
expect_no_leftovers
echo "PASS"
