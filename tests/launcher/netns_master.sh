# `dtrain check` and the launcher lay out the machines with one function: with
# --master, both name the address this machine reaches the master through, even
# when another interface's address comes first in the machine's list (the check
# used to take the first non-loopback IPv4 address, which the job did not use).
source "$(dirname "$0")/lib.sh"
NA=dma$$ NB=dmb$$
new_ns $NA
new_ns $NB
sub=$((RANDOM % 200 + 20))
A=10.$sub.7.1 B=10.$sub.7.2
# Decoys first (lower interface index: listed first), leading nowhere.
link_ns $NA 10.$sub.9.1 $NA "" xa$$
link_ns $NB 10.$sub.10.1 $NB "" xb$$
link_ns $NA $A $NB $B v$$
make_secret secret
port=$((20000 + RANDOM % 20000))

# 1. dtrain check on both machines.
ip netns exec $NA "$BIN/dtrain" check --master $A:$port --nnodes 2 --rank 0 --token_file secret --timeout 5 \
  >out.checkA.txt 2>&1 &
ca=$!
for _ in $(seq 100); do ip netns exec $NA ss -Hltn "sport = :$port" | grep -q . && break; sleep 0.1; done
ip netns exec $NB "$BIN/dtrain" check --master $A:$port --nnodes 2 --rank 1 --token_file secret --timeout 5 \
  >out.checkB.txt 2>&1 || fail "dtrain check failed on machine B"
wait $ca || fail "dtrain check failed on machine A"
check_ip() { grep -E "^interface +ok " "$1" | sed -E 's/.*\((.*)\)$/\1/'; }
checkA=$(check_ip out.checkA.txt) checkB=$(check_ip out.checkB.txt)

# 2. The job with the same options (the conformance cases at small counts: this
# test is about the addresses, the algorithms are tested elsewhere).
port=$((port + 1))
run() {  # run NS RANK LOGDIR ARGS...
  local ns=$1 rank=$2 dir=$3
  shift 3
  ip netns exec "$ns" "$BIN/dtrain" --master $A:$port --nnodes 2 --rank $rank --nproc_per_node 2 --log_dir "$dir" \
    --token_file secret --job_id "$TAG" "$@"
}
run $NA 0 logA -- dtrain-conformance --backend gloo --large-count 4099 >outA.txt 2>errA.txt &
pa=$!
run $NB 1 logB -- dtrain-conformance --backend gloo --large-count 4099 >outB.txt 2>errB.txt &
pb=$!
wait $pa || fail "machine A's dtrain failed"
wait $pb || fail "machine B's dtrain failed"
job_ip() { grep -o "this is node $2, [0-9.]*" "$1" | awk '{print $NF}'; }
jobA=$(job_ip outA.txt 0) jobB=$(job_ip outB.txt 1)
echo "machine A: check $checkA, job $jobA; machine B: check $checkB, job $jobB"
[ "$jobA" = "$A" ] || fail "machine A's job uses $jobA, not $A"
[ "$jobB" = "$B" ] || fail "machine B's job uses $jobB, not $B (the decoy?)"
[ "$checkA" = "$jobA" ] || fail "on machine A, dtrain check tested $checkA but the job uses $jobA"
[ "$checkB" = "$jobB" ] || fail "on machine B, dtrain check tested $checkB but the job uses $jobB"
grep -q "4 ranks" outA.txt && grep -q "0 failed" outA.txt || fail "the job did not pass with 4 ranks"
expect_no_leftovers
echo "PASS"
