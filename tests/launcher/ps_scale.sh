# The parameter server at scale on this machine: 8 servers x 32 workers, every
# one a process under `dtrain`. GEO and async training run and the loss falls;
# a server SIGKILLed mid-run is named by the root cause and no process is left.
# (The exact sums of pushes to shared keys at 8 x 32, async and GEO, are
# dtrain-conformance --ps --servers 8 --workers 32: plugins.ps_conformance.scale.)
#   ps_scale.sh BUILD ps_linear.toml [ci|full]   (ci: the killed server only)
source "$(dirname "$0")/ps_lib.sh"
MODE=${3:-ci}
TIMEOUT=20
S=8 W=32
train() {  # train NAME -o KEY=VALUE...: a short run at S x W; the loss falls on the first and the last worker
  local name=$1
  shift
  timeout 300 "$BIN/dtrain" --server_num $S --worker_num $W --log_dir log.$name -o ps.timeout_s=$TIMEOUT \
    -o ps_linear.steps=60 "$@" "$JOB" >out.$name.txt 2>err.$name.txt || fail "$S x $W $name failed"
  expect_loss_fell log.$name/workerlog.0
  expect_loss_fell log.$name/workerlog.$((W - 1))
}
if [ $MODE = full ]; then
  train async -o strategy.a_sync=true
  train geo -o strategy.a_sync=true -o strategy.a_sync_configs.k_steps=4 -o ps.tables.weights.optimizer=sgd
fi
timeout 300 "$BIN/dtrain" --server_num $S --worker_num $W --log_dir log1 -o strategy.a_sync=true -o ps.timeout_s=$TIMEOUT \
  -o ps_linear.steps=100000 -o ps_linear.sleep_ms=20 "$JOB" >out1.txt 2>err1.txt &
dpid=$!
wait_for log1/workerlog.$((W - 1)) "step 20/" 1200
victim=$(pid_in log1/serverlog.5)
[ -n "$victim" ] || fail "no server pid in serverlog.5"
[ "$(pgrep -fc -- "$TAG")" -ge $((S + W)) ] || fail "fewer than $((S + W)) processes of the job are running"
kill_and_wait "$victim" $dpid "server 5"
grep -q "root cause: server 5 was killed by SIGKILL" err1.txt || fail "the report does not name server 5 and SIGKILL"
grep "root cause:" err1.txt | grep -qv "server 5 was killed" && fail "the report blames another process too"
expect_no_leftovers
echo "PASS: $S servers x $W workers, server 5 killed: stopped ${elapsed_ms} ms after the kill"
grep -A2 "root cause" err1.txt
