# A client with a wrong job token is refused and the refusal is logged, and
# the job goes on and ends well: a second dtrain-ps-linear started by hand
# with the job's store and servers but a wrong DTRAIN_JOB_TOKEN (the store
# refuses it), and dtrain-ps-token-probe straight at the PS server with a
# wrong token and with none (the server refuses it).
source "$(dirname "$0")/ps_lib.sh"
# The job runs until the checks below are done (async: its workers stop on the file).
timeout 180 "$BIN/dtrain" --log_level info --server_num 1 --worker_num 2 -o strategy.a_sync=true \
  -o ps_linear.steps=100000 -o ps_linear.sleep_ms=10 -o ps_linear.stop_file="$WORK/stop" "$JOB" >out.txt 2>err.txt &
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
# A client that reaches the PS server itself (its address from its log) with
# a wrong token, then with none: refused by the server, which logs it.
ep=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' log/serverlog.0 | head -1)
[ -n "$ep" ] || fail "serverlog.0 does not say where the server listens"
for t in not-the-token ""; do
  timeout 60 "$BIN/dtrain-ps-token-probe" --servers "$ep" --workers 2 --token "$t" --tag "$TAG" >>probe.txt 2>&1
  rc=$?
  [ $rc -eq 3 ] || fail "the PS server did not refuse token '$t' (exit $rc): $(tail -3 probe.txt)"
done
touch "$WORK/stop"
grep -q "refused a client from" log/serverlog.0 || fail "the PS server did not log the refusal"
[ "$(grep -c "refused a client from" log/serverlog.0)" -ge 2 ] || fail "the PS server logged fewer than 2 refusals"
wait $dpid || fail "the job failed after a refused client"
grep -q "refused client" err.txt || fail "the refusal is not in the job's log"
grep -q "all workers done; stopping 1 server" out.txt || fail "no stop line"
expect_no_leftovers
echo "PASS: $(grep -m1 refused rogue.txt)"
grep -m2 "refused a client from" log/serverlog.0
