# dtrain --nproc_per_node 4 -- dtrain-conformance --backend $BACKEND (ranks as processes).
source "$(dirname "$0")/lib.sh"
BACKEND=${2:-gloo}
# The large cases at 1M elements, as conformance.*.threads.4 (4 ranks on 2 cores):
# what runs here is the launcher's part, the store and the plugin across processes.
"$BIN/dtrain" --nproc_per_node 4 -- dtrain-conformance --backend $BACKEND --large-count 1048583 >out.txt 2>err.txt \
  || fail "dtrain exited $?"
grep -q "0 failed" out.txt || fail "rank 0 did not report a clean run"
for r in 0 1 2 3; do
  grep -Eq "^[0-9]+ passed, 0 failed" "log/workerlog.$r" || fail "rank $r did not pass"
done
grep -q "127.0.0.1" log/endpoints.log || fail "no endpoints.log"
grep -q "DTRAIN_RANK\|worker   3" out.txt || fail "no environment table"
echo "PASS: $(tail -1 out.txt)"
