# A job on several machines is locked with a secret. Machines A and B run the
# job; a third machine C can reach the store's port but has no secret: it is
# refused and logged, and the job is unaffected. Without a secret the job does
# not start, unless --insecure_open_job says so (and then it says so loudly).
# The store listens only on the address A has in --ips.
source "$(dirname "$0")/lib.sh"
three_machines ds 7
run() {  # run NS LOGDIR ARGS...
  local ns=$1 dir=$2
  shift 2
  ip netns exec "$ns" "$BIN/dtrain" --ips $A,$B --start_port $port --nproc_per_node 2 --log_dir "$dir" \
    --job_id "$TAG" "$@"
}
probe() { echo dtrain-job-probe --backend gloo --sleep-ms 1 --timeout-s 20 --tag "$TAG" --iterations "$1"; }

# 1. No secret: refused before anything starts, saying how to make one.
env -u DTRAIN_JOB_TOKEN timeout 20 ip netns exec $NA "$BIN/dtrain" --ips $A,$B --start_port $port -- true \
  >out.nosecret.txt 2>err.nosecret.txt && fail "a job on two machines started without a secret"
grep -q "needs a shared secret" err.nosecret.txt && grep -q -- "--token_file" err.nosecret.txt ||
  fail "the refusal does not say how to provide a secret"
# A secret file others can read is refused, as ssh refuses such a key.
make_secret secret
chmod 644 secret
timeout 20 ip netns exec $NA "$BIN/dtrain" --ips $A,$B --start_port $port --token_file secret -- true \
  >out.mode.txt 2>err.mode.txt && fail "a group/other-readable secret file was accepted"
grep -q "chmod 600" err.mode.txt || fail "the refusal of a readable secret file does not say chmod 600"
chmod 600 secret

# 2. The job with the secret, and an uninvited machine C.
start_both "" --token_file secret -- $(probe 4000)
wait_for logA/workerlog.0 "first all-reduce done"
grep -q "store token *from the file secret" outA.txt || fail "the table does not say where the token came from"
grep -qF "$(cat secret)" outA.txt outB.txt errA.txt errB.txt logA/* logB/* && fail "the secret was printed"
# Bound to A's address in --ips only: not the wildcard, not A's other address.
listen=$(ip netns exec $NA ss -Hltn "sport = :$port")
echo "listening: $listen"
echo "$listen" | grep -q "$A:$port" || fail "the store does not listen on $A:$port"
echo "$listen" | grep -Eq "(0\.0\.0\.0|\*|\[::\]):$port" && fail "the store listens on every interface"
ip netns exec $NC timeout 5 bash -c "exec 3<>/dev/tcp/$A2/$port" 2>/dev/null && fail "C reached the store on $A2"
ip netns exec $NC timeout 5 bash -c "exec 3<>/dev/tcp/$A/$port" || fail "C cannot reach $A:$port (test setup)"
# C without a token: a client that writes garbage, a dtrain with a guessed secret, an open dtrain.
ip netns exec $NC timeout 5 bash -c "exec 3<>/dev/tcp/$A/$port; printf 'GET /keys HTTP/1.0\r\n\r\n' >&3; cat <&3 >/dev/null"
DTRAIN_JOB_TOKEN=guessed-secret-0123456789abcdef timeout 20 ip netns exec $NC "$BIN/dtrain" --ips $A,$C --rank 1 \
  --start_port $port --job_id "$TAG" --log_dir logC -- true >out.intruder1.txt 2>err.intruder1.txt &&
  fail "C joined with a guessed secret"
grep -q "refused this process: wrong job token" err.intruder1.txt || fail "C's dtrain does not say it was refused"
env -u DTRAIN_JOB_TOKEN timeout 20 ip netns exec $NC "$BIN/dtrain" --ips $A,$C --rank 1 --start_port $port \
  --job_id "$TAG" --insecure_open_job --log_dir logC -- true >out.intruder2.txt 2>err.intruder2.txt &&
  fail "C joined as an open job"
wait $pa || fail "machine A's dtrain failed after C's attempts"
wait $pb || fail "machine B's dtrain failed after C's attempts"
for f in logA/workerlog.0 logB/workerlog.3; do grep -q "iterations ok" $f || fail "$f did not finish"; done
refusals=$(grep -c "refused client $C:" errA.txt)
grep "refused client" errA.txt
[ "$refusals" -ge 3 ] || fail "machine A logged $refusals refusals of $C, want 3"

# 3. Explicitly open: runs, and says so.
port=$((port + 1))
start_both 3 --insecure_open_job -- $(probe 20)
both_pass "open job"
for m in A3 B3; do
  grep -q "WARNING: OPEN JOB" err$m.txt || fail "machine ${m%3} did not warn that the job is open"
  grep -q "store token *OPEN (no secret)" out$m.txt || fail "machine ${m%3}'s table does not say the job is open"
done
expect_no_leftovers
echo "PASS"
