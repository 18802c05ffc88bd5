# A job started without dtrain, from torchrun's variables, on two machines:
# rank 0 serves the store itself. Without a secret neither machine starts and
# both say how to provide one; with DTRAIN_TOKEN_FILE the store listens only
# on MASTER_ADDR, a third machine that reaches the port without the secret is
# refused, and the job finishes. DTRAIN_INSECURE_OPEN_JOB=1 runs it open, loudly.
source "$(dirname "$0")/lib.sh"
three_machines dh 9
unset DTRAIN_JOB_TOKEN DTRAIN_TOKEN_FILE DTRAIN_INSECURE_OPEN_JOB DTRAIN_RANK DTRAIN_STORE || true
# DTRAIN_HOST_IP: the machine's address for Gloo (the namespaces share one
# /etc/hosts, where the host name is loopback).
declare -A host_ip=([$NA]=$A [$NB]=$B [$NC]=$C)
rank() {  # rank NS RANK ITERATIONS [VAR=VALUE...]
  local ns=$1 r=$2 n=$3
  shift 3
  ip netns exec "$ns" env DTRAIN_HOST_IP=${host_ip[$ns]} RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=$A MASTER_PORT=$port \
    "$@" timeout 60 "$BIN/dtrain-job-probe" --backend gloo --sleep-ms 1 --timeout-s 20 \
    --iterations "$n" --tag "$TAG"
}

# 1. No secret: both ranks refuse, saying how to provide one.
rank $NA 0 10 >out.nosecret0.txt 2>&1 && fail "rank 0 started a two-machine job without a secret"
rank $NB 1 10 >out.nosecret1.txt 2>&1 && fail "rank 1 joined a two-machine job without a secret"
for f in out.nosecret0.txt out.nosecret1.txt; do
  grep -q "needs a shared secret" $f && grep -q "DTRAIN_TOKEN_FILE" $f || fail "$f does not say how to provide a secret"
done
make_secret secret
chmod 640 secret
rank $NA 0 10 DTRAIN_TOKEN_FILE=secret >out.mode.txt 2>&1 && fail "a group-readable DTRAIN_TOKEN_FILE was accepted"
grep -q "DTRAIN_TOKEN_FILE secret is accessible by group or others" out.mode.txt || fail "no chmod advice"
chmod 600 secret

# 2. With the secret, and an uninvited machine C.
rank $NA 0 3000 DTRAIN_TOKEN_FILE=secret >outA.txt 2>&1 &
pa=$!
rank $NB 1 3000 DTRAIN_TOKEN_FILE=secret >outB.txt 2>&1 &
pb=$!
wait_for outA.txt "first all-reduce done"
listen=$(ip netns exec $NA ss -Hltn "sport = :$port")
echo "listening: $listen"
echo "$listen" | grep -q "$A:$port" || fail "the store does not listen on MASTER_ADDR $A:$port"
echo "$listen" | grep -Eq "(0\.0\.0\.0|\*|\[::\]):$port" && fail "the store listens on every interface"
ip netns exec $NC timeout 5 bash -c "exec 3<>/dev/tcp/$A/$port" || fail "C cannot reach $A:$port (test setup)"
rank $NC 1 10 DTRAIN_JOB_TOKEN=guessed-secret-0123456789abcdef >out.intruder.txt 2>&1 &&
  fail "C joined with a guessed secret"
grep -q "wrong job token" out.intruder.txt || fail "C was not told it was refused"
wait $pa || fail "machine A's rank failed after C's attempt"
wait $pb || fail "machine B's rank failed after C's attempt"
grep -q "iterations ok" outA.txt && grep -q "iterations ok" outB.txt || fail "the job did not finish"
grep -q "refused client $C:" outA.txt || fail "rank 0 did not log C's refusal"
grep -qF "$(cat secret)" outA.txt outB.txt && fail "the secret was printed"

# 3. Explicitly open: runs, and says so.
port=$((port + 1))
rank $NA 0 20 DTRAIN_INSECURE_OPEN_JOB=1 >outA3.txt 2>&1 &
pa=$!
rank $NB 1 20 DTRAIN_INSECURE_OPEN_JOB=1 >outB3.txt 2>&1 &
pb=$!
wait $pa || fail "rank 0 of the open job failed"
wait $pb || fail "rank 1 of the open job failed"
grep -q "OPEN JOB" outA3.txt || fail "rank 0 did not warn that the job is open"
expect_no_leftovers
echo "PASS"
