# A client with a wrong job token is refused and the refusal is logged, and
# the job goes on and ends well: a second dtrain-ps-linear started by hand
# with the job's store and servers but a wrong DTRAIN_JOB_TOKEN.
source "$(dirname "$0")/ps_lib.sh"
timeout 120 "$BIN/dtrain" --server_num 1 --worker_num 2 -o ps_linear.steps=300 -o ps_linear.sleep_ms=10 "$JOB" \
  >out.txt 2>err.txt &
dpid=$!
wait_for log/workerlog.0 "step 20/"
store=$(sed -n 's/^store: //p' log/endpoints.log)
servers=$(sed -n '/^PADDLE_PSERVERS_IP_PORT_LIST:/,$p' log/endpoints.log | tail -n +2 | paste -sd,)
[ -n "$store" ] && [ -n "$servers" ] || fail "no store or servers in endpoints.log"
env DTRAIN_ROLE=worker DTRAIN_RANK=1 DTRAIN_WORLD_SIZE=2 DTRAIN_STORE="$store" DTRAIN_JOB_TOKEN=not-the-token \
  DTRAIN_SERVER_ENDPOINTS="$servers" timeout 60 "$BIN/dtrain-ps-linear" "$JOB" >rogue.txt 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "the client with a wrong token was not refused (exit $rc): $(tail -3 rogue.txt)"
grep -q "refused" rogue.txt || fail "the client was not told it was refused: $(tail -3 rogue.txt)"
wait $dpid || fail "the job failed after a refused client"
grep -q "refused client" err.txt || fail "the refusal is not in the job's log"
grep -q "all workers done; stopping 1 server" out.txt || fail "no stop line"
expect_no_leftovers
echo "PASS: $(grep -m1 refused rogue.txt)"
