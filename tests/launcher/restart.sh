# --max_restarts 1 with a program that fails once on its first attempt: the job
# completes and the program sees the restart count. Without restarts the same
# job fails and the report names the rank and its exit code, even when its peer
# (which lost it) exits first.
source "$(dirname "$0")/lib.sh"
"$BIN/dtrain" --nproc_per_node 2 --log_dir log1 -- dtrain-job-probe --fail-first-attempt-rank 1 --iterations 20 \
  --tag "$TAG" >out.txt 2>err.txt
rc=$?
[ $rc -ne 0 ] || fail "the failing job exited 0"
grep -q "root cause: worker rank 1 exited with code 3" err.txt || fail "the report does not name rank 1, code 3"
# Rank 0 fails too when it notices rank 1's death before the launcher stops it:
# its error file marks it as a consequence.
if grep -q "worker rank 0 exited" err.txt; then
  grep -q "worker rank 0 exited with code 1 .*after losing a peer" err.txt || fail "rank 0 is not marked as having lost a peer"
fi

"$BIN/dtrain" --nproc_per_node 2 --max_restarts 1 --log_dir logs/log2 -- dtrain-job-probe --fail-first-attempt-rank 1 \
  --iterations 20 --tag "$TAG" >out2.txt 2>err2.txt || fail "the job with --max_restarts 1 failed"
grep -q "restarting the job" out2.txt || fail "no restart announced"
grep -q "restart_count 1" logs/log2/workerlog.1 || fail "the program did not see DTRAIN_RESTART_COUNT=1"
grep -q "20 iterations ok" logs/log2/workerlog.1 || fail "the restarted attempt did not finish"
expect_no_leftovers
echo "PASS"
