# 32 processes on this machine (16 per core here): one collective's cases of
# dtrain-conformance pass, with the suite's deadlines grown for the
# oversubscribed machine and saying so. scripts/scale_check.sh runs every case.
#   conformance_32.sh BUILD BACKEND FILTER
source "$(dirname "$0")/lib.sh"
BACKEND=$2 FILTER=$3
timeout 280 "$BIN/dtrain" --nproc_per_node 32 -- dtrain-conformance --backend $BACKEND --filter "$FILTER" \
  >out.txt 2>err.txt || fail "the 32-rank run failed"
grep -q "32 ranks (this process is one of them)" out.txt || fail "rank 0 did not run with 32 ranks"
grep -Eq "^[1-9][0-9]* passed, 0 failed" out.txt || fail "cases failed"
cores=$(getconf _NPROCESSORS_ONLN)
if [ "$cores" -lt 32 ]; then
  grep -Eq "32 ranks on [0-9]+ cores here \(oversubscribed\)" out.txt || fail "the deadlines did not grow on $cores cores"
fi
for r in 1 17 31; do grep -Eq "passed, 0 failed" log/workerlog.$r || fail "rank $r did not pass"; done
echo "PASS: $(tail -1 out.txt) on $BACKEND, 32 ranks"
