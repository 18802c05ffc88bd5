# dtrain check against a store port nobody serves reports it in its table
# within seconds instead of waiting.
source "$(dirname "$0")/lib.sh"
port=$((20000 + RANDOM % 20000))
t0=$(date +%s%N)
timeout 30 "$BIN/dtrain" check --master 127.0.0.1:$port --nnodes 2 --rank 1 --timeout 3 >out.txt 2>err.txt
rc=$?
elapsed_ms=$((($(date +%s%N) - t0) / 1000000))
cat out.txt
[ $rc -eq 1 ] || fail "dtrain check exited $rc, want 1"
grep -E "store 127.0.0.1:$port reachable +FAIL +Connection refused" out.txt || fail "no unreachable-store row"
[ $elapsed_ms -lt 10000 ] || fail "dtrain check took $elapsed_ms ms"
# And a healthy single machine passes every check.
"$BIN/dtrain" check --start_port $port --backend gloo >ok.txt 2>&1 || { cat ok.txt; fail "dtrain check failed on a healthy machine"; }
grep -q "backend gloo .*ok" ok.txt || fail "backend row missing"
echo "PASS in ${elapsed_ms} ms"
