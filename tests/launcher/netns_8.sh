# Eight "machines" (network namespaces) x 2 workers on one bridge, the same
# dtrain command on each: the conformance cases with --ips and with --master
# (machines numbered in the order they join), then a machine's link cut
# (`ip link set ... down`) in the middle of a collective loop: every machine's
# dtrain ends within the collective timeout, the root cause names the cut
# machine and no survivor is blamed.
#   netns_8.sh BUILD [ci|full]   full (scripts/scale_check.sh) adds every
#   conformance case, a short cls job, and the store host's link cut
source "$(dirname "$0")/lib.sh"
MODE=${2:-ci}
N=8
bridge_machines $N d8 8
IPS=$(IFS=,; echo "${IP[*]}")
make_secret secret
port=$((20000 + RANDOM % 20000))
TIMEOUT=20

# start_all WHAT N ARGS...: dtrain on every machine (logs log<N>.<i>, out<N>.<i>.txt, err<N>.<i>.txt); pids in P.
start_all() {
  local how=$1 n=$2
  shift 2
  P=()
  for i in $(seq 0 $((N - 1))); do
    local place=(--ips $IPS --start_port $port)
    [ $how = master ] && place=(--master ${IP[0]}:$port --nnodes $N) && [ $i = 0 ] && place+=(--rank 0)
    ip netns exec ${NS[i]} timeout 120 "$BIN/dtrain" "${place[@]}" --nproc_per_node 2 --log_dir log$n.$i \
      --token_file secret --job_id "$TAG" "$@" >out$n.$i.txt 2>err$n.$i.txt &
    P[i]=$!
    [ $how = master ] && [ $i = 0 ] && sleep 0.5  # the master first, so the others number themselves 1..7
  done
}
all_pass() {
  for i in $(seq 0 $((N - 1))); do wait ${P[i]} || fail "machine $i's dtrain failed ($1)"; done
}

filter=allreduce/f32
[ $MODE = full ] && filter=""
# 1. --ips: 16 ranks, conformance.
start_all ips 1 -- dtrain-conformance --backend gloo --large-count 4099 --filter "$filter"
all_pass "--ips"
grep -q "16 ranks (this process is one of them)" out1.0.txt || fail "rank 0 did not run with 16 ranks"
grep -Eq "passed, 0 failed" out1.0.txt || fail "rank 0's cases failed"
grep -Eq "passed, 0 failed" log1.7/workerlog.15 || fail "rank 15 (machine 7) did not pass"
echo "PASS: --ips, 8 machines x 2: $(tail -1 out1.0.txt)"

# 2. --master: the same, machines numbered as they join.
port=$((port + 1))
start_all master 2 -- dtrain-conformance --backend gloo --large-count 4099 --filter "$filter"
all_pass "--master"
grep -q "16 ranks (this process is one of them)" out2.0.txt || fail "rank 0 did not run with 16 ranks (--master)"
for i in $(seq 0 $((N - 1))); do
  grep -q "${IP[i]}" log2.0/endpoints.log || fail "machine $i (${IP[i]}) is not in endpoints.log (--master)"
done
echo "PASS: --master, 8 machines x 2"

if [ $MODE = full ]; then
  port=$((port + 1))
  start_all ips 3 "$(cd "$(dirname "$0")/../.." && pwd)/apps/cls.toml" -o train.max_steps=20 -o log.every_steps=10 \
    -o data.limit_eval=256 -o checkpoint.resume=false -o checkpoint.dir=ckpt3 -o train.batch_size=16
  all_pass "the cls job"
  grep -h "images/s" log3.0/workerlog.0 | tail -1
  echo "PASS: cls on 8 machines x 2"
fi

# 3. Machine 5's link cut while every rank loops on all-reduce.
cut_link() {  # cut_link MACHINE N: the probe job, then machine MACHINE's link down
  local m=$1 n=$2
  port=$((port + 1))
  start_all ips $n -- dtrain-job-probe --backend gloo --iterations 100000000 --sleep-ms 1 --timeout-s $TIMEOUT \
    --tag "$TAG"
  wait_for log$n.$m/workerlog.$((2 * m + 1)) "first all-reduce done" 600
  wait_for log$n.0/workerlog.0 "first all-reduce done" 600
  sleep 1
  local t0=$(date +%s)
  ip -n ${NS[m]} link set ${LINK[m]} down || fail "link down"
  for i in $(seq 0 $((N - 1))); do
    wait ${P[i]} && fail "machine $i's dtrain exited 0 after machine $m's link was cut"
  done
  elapsed=$(($(date +%s) - t0))
  ip -n ${NS[m]} link set ${LINK[m]} up
  [ $elapsed -le $((TIMEOUT + 30)) ] || fail "the machines took $elapsed s to stop (timeout $TIMEOUT s)"
}
cut_link 5 4
for i in 0 3 7; do
  grep -q "root cause:" err4.$i.txt || fail "machine $i printed no root cause"
  grep -A2 "root cause:" err4.$i.txt | grep -Eq "machine 5|node 5|${IP[5]}|rank 1[01]\b" ||
    fail "machine $i's root cause does not name machine 5"
done
grep -q "root cause: lost the job store" err4.5.txt || fail "machine 5 does not say it lost the job store"
echo "PASS: machine 5's link cut: every machine stopped within $elapsed s"
grep -A3 "root cause" err4.0.txt

# 4. (full) The store host's link cut: every other machine names it.
if [ $MODE = full ]; then
  cut_link 0 5
  for i in 1 4 7; do
    grep -A2 "root cause:" err5.$i.txt | grep -q "lost the job store.*${IP[0]}" ||
      fail "machine $i's root cause does not name the store host"
  done
  echo "PASS: the store host's link cut: every machine stopped within $elapsed s, naming it"
fi
