# Two jobs started at the same moment on one machine: no port clash.
source "$(dirname "$0")/lib.sh"
mkdir a b
(cd a && "$BIN/dtrain" --nproc_per_node 2 -- dtrain-conformance --backend gloo --large-count 100003 >out.txt 2>err.txt) &
pa=$!
(cd b && "$BIN/dtrain" --nproc_per_node 2 -- dtrain-conformance --backend gloo --large-count 100003 >out.txt 2>err.txt) &
pb=$!
wait $pa || fail "job a failed: $(tail -5 a/err.txt)"
wait $pb || fail "job b failed: $(tail -5 b/err.txt)"
grep -q "0 failed" a/out.txt && grep -q "0 failed" b/out.txt || fail "a job did not pass"
sa=$(grep -o "store  *127.0.0.1:[0-9]*" a/out.txt)
sb=$(grep -o "store  *127.0.0.1:[0-9]*" b/out.txt)
[ "$sa" != "$sb" ] || fail "both jobs used the same store port"
echo "PASS: $sa / $sb"
