# Elastic jobs (`--nnodes MIN:MAX`) on network-namespace machines on one
# bridge, the cls app through the trainer (docs/elastic.md):
#   1. three machines; one's processes (not the store host's) get SIGKILL in
#      mid-epoch: the job finishes on two, from the in-memory commit (at most
#      one step redone), and the rest of the epoch is split over the two;
#   2. a machine's link cut: the coordinator loses its heartbeat and the job
#      goes on without it; the cut machine's dtrain stops by itself;
#   3. a machine started later joins, and the world grows to 3;
#   4. below MIN: the job fails naming the lost machine, within --elastic_timeout;
#   5. (full) ZeRO stage 2: goes on from its sharded checkpoint at the new world size;
#   chaos: a random machine other than node 0 killed every 10 steps, 5 times, and started again;
#   eval: the evaluation of a run that lost a machine against 3 seeds of a fixed run.
#   netns_elastic.sh BUILD [ci|full|chaos [SEED]|eval]   (scripts/elastic_check.sh runs all)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "$0")/lib.sh"
MODE=${2:-ci}
N=3
bridge_machines $N de 11
P=()
make_secret secret
port=$((20000 + RANDOM % 20000))

# 0. Elastic options that cannot work are refused by name.
refused() {  # refused TEXT ARGS...: dtrain ARGS exits 2 saying TEXT
  local text=$1
  shift
  "$BIN/dtrain" "$@" >out0.txt 2>&1 && fail "dtrain $* was accepted"
  grep -q -- "$text" out0.txt || fail "dtrain $*: expected '$text', got: $(cat out0.txt)"
}
refused "MIN is larger than MAX" --master 127.0.0.1:$port --nnodes 3:2 -- true
refused "needs --master host:port" --ips 127.0.0.1 --nnodes 1:2 -- true
refused "expected a machine count" --master 127.0.0.1:$port --nnodes 2:x -- true
refused "an elastic job numbers its machines itself" --master 127.0.0.1:$port --nnodes 1:2 --rank 1 -- true
refused "parameter-server job runs on a fixed set" --master 127.0.0.1:$port --nnodes 1:2 --server_num 1 \
  --worker_num 1 -- true
PET_NNODES=1:x refused "PET_NNODES '1:x'" --master 127.0.0.1:$port -- true

# 1,536 training images, batch 16 per worker: 32 steps per worker at 3 machines x 1 worker.
CLS=("$SRC/apps/cls.toml" -o train.epochs=1 -o data.limit_train=1536 -o data.limit_eval=256 -o train.batch_size=16
  -o log.every_steps=1 -o checkpoint.resume=false -o train.warmup_epochs=0 -o eval.every_epochs=1)

# start I RUN NNODES ARGS...; NNODES "N" (no colon): a fixed job of N machines: dtrain on machine I (logs log<RUN>.<I>, out/err<RUN>.<I>.txt); its pid in P[I].
start() {
  local i=$1 run=$2 nnodes=$3
  shift 3
  ip netns exec ${NS[i]} timeout 150 "$BIN/dtrain" --master ${IP[0]}:$port --nnodes $nnodes --nproc_per_node 1 \
    --log_dir log$run.$i --token_file secret --job_id "$TAG" --elastic_timeout 6 "$@" \
    >out$run.$i.txt 2>err$run.$i.txt &
  P[i]=$!
}
# steps RUN: rank 0's progress lines so far (one per step with log.every_steps=1).
steps() {
  local n
  n=$(grep -c "^epoch .* step " log$1.0/workerlog.0 2>/dev/null)
  echo ${n:-0}
}
wait_steps() {  # wait_steps RUN N
  for _ in $(seq 600); do [ "$(steps $1)" -ge $2 ] && return 0; sleep 0.1; done
  fail "run $1: rank 0 did not reach step $2"
}
kill_machine() {  # every process of machine I (SIGKILL), and the commit folder its dtrain could not remove
  local pids
  pids=$(ip netns pids ${NS[$1]})
  [ -z "$pids" ] || kill -9 $pids
  for p in $pids; do rm -rf /dev/shm/dtrain-elastic.$p.*; done
}
generation_line() { grep -m1 "elastic generation $2: " out$1.0.txt; }

if [ $MODE = chaos ]; then
  seed=${3:-$RANDOM}
  RANDOM=$seed
  echo "chaos seed $seed (repeat it: netns_elastic.sh BUILD chaos $seed)"
  run=6 t0=$(date +%s)
  for i in 0 1 2; do start $i $run 1:3 "${CLS[@]}" -o checkpoint.dir=ckpt6 -o train.epochs=3; sleep 0.5; done
  gens() { grep -c "elastic generation [0-9]*: " out$run.0.txt; }
  for k in 1 2 3 4 5; do
    wait_steps $run $((k * 10))
    m=$((1 + RANDOM % 2)) before=$(gens)
    echo "chaos $k: killing machine $m (${IP[m]}) at rank 0's step $(steps $run)"
    kill_machine $m
    wait ${P[m]} 2>/dev/null
    for _ in $(seq 300); do [ "$(gens)" -gt $before ] && break; sleep 0.1; done
    [ "$(gens)" -gt $before ] || fail "chaos $k: no new generation after machine $m was killed"
    start $m $run.$k 1:3 "${CLS[@]}" -o checkpoint.dir=ckpt6 -o train.epochs=3
  done
  wait ${P[0]} || fail "chaos: node 0's dtrain failed"
  for i in 1 2; do wait ${P[i]} || fail "chaos: machine $i's last dtrain failed"; done
  grep -q "^eval epoch 3: top1" log$run.0/workerlog.0 || fail "chaos: rank 0 did not finish the 3 epochs"
  expect_no_leftovers
  echo "PASS: chaos seed $seed: 5 kills and restarts, $(gens) generations, $(steps $run) steps logged by rank 0," \
    "$(($(date +%s) - t0)) s; $(grep -m1 "^eval epoch 3" log$run.0/workerlog.0)"
  exit 0
fi

if [ $MODE = eval ]; then
  # 6,000 images, batch 32, one epoch: a fixed 3-machine run on seeds 1-3, then
  # seed 1 with machine 2 killed at step 20 of 62.
  EV=("$SRC/apps/cls.toml" -o train.epochs=1 -o data.limit_train=6000 -o data.limit_eval=2000 -o train.batch_size=32
    -o log.every_steps=1 -o checkpoint.resume=false -o train.warmup_epochs=0)
  top1() { grep -o "^eval epoch 1: top1 [0-9.]*" log$1.0/workerlog.0 | grep -o "[0-9.]*$"; }
  fixed=()
  for seed in 1 2 3; do
    run=e$seed port=$((port + 1))
    for i in 0 1 2; do start $i $run 3 "${EV[@]}" -o train.seed=$seed -o checkpoint.dir=ck$run.$i; sleep 0.5; done
    for i in 0 1 2; do wait ${P[i]} || fail "fixed run, seed $seed: machine $i failed"; done
    fixed+=("$(top1 $run)")
  done
  run=ek port=$((port + 1))
  for i in 0 1 2; do start $i $run 1:3 "${EV[@]}" -o train.seed=1 -o checkpoint.dir=ck$run.$i; sleep 0.5; done
  wait_steps $run 20
  kill_machine 2
  wait ${P[0]} && wait ${P[1]} || fail "elastic run: a survivor failed"
  got=$(top1 $run)
  lo=$(printf "%s\n" "${fixed[@]}" | sort -n | head -1) hi=$(printf "%s\n" "${fixed[@]}" | sort -n | tail -1)
  echo "fixed 3 machines, seeds 1-3: top1 ${fixed[*]}; elastic (machine 2 lost at step 20 of 62): top1 $got"
  awk -v g=$got -v lo=$lo -v hi=$hi 'BEGIN{exit !(g >= lo && g <= hi)}' ||
    fail "the elastic run's top1 $got is outside the fixed runs' spread [$lo, $hi]"
  echo "PASS: the elastic run's top1 $got is within [$lo, $hi]"
  exit 0
fi

# 1. Three machines, machine 2's processes killed in mid-epoch.
run=1
for i in 0 1 2; do start $i $run 1:3 "${CLS[@]}" -o checkpoint.dir=ckpt$run.$i; sleep 0.5; done
wait_steps $run 8
kill_machine 2
wait ${P[0]} || fail "run 1: node 0's dtrain failed after machine 2 was killed"
wait ${P[1]} || fail "run 1: node 1's dtrain failed after machine 2 was killed"
generation_line $run 1 | grep -q "2 machines" || fail "run 1: no generation 1 of 2 machines"
grep -q "elastic generation 0 ended at global step .*left: machine 2 (${IP[2]})" out$run.0.txt ||
  fail "run 1: node 0 did not name machine 2 as lost"
again=$(grep -o "training (global step [0-9]*) [0-9.]* s after" out$run.0.txt | head -1)
[ -n "$again" ] || fail "run 1: no 'training again' line"
resumed=$(grep -o "commit at global step [0-9]*" log$run.0/workerlog.0 | grep -o "[0-9]*$")
[ -n "$resumed" ] || fail "run 1: rank 0 did not resume from a commit"
before=$(awk '/restart 1 =====/{exit} /^epoch .* step /{n++} END{print n+0}' log$run.0/workerlog.0)
[ $((before - resumed)) -le 1 ] || fail "run 1: $((before - resumed)) steps redone (logged $before, resumed at $resumed)"
grep -q "elastic: generation 1: world 2 (was 3), batch 16 per worker (32 global)" log$run.0/workerlog.0 ||
  fail "run 1: rank 0 did not report the new world"
# Each remaining sample once: the rest of the epoch (1,536 - 48 x resumed) over 2 workers of 16.
after=$(awk '/restart 1 =====/{f=1} f && /^epoch .* step /{n++} END{print n+0}' log$run.0/workerlog.0)
expect=$(((1536 - 48 * resumed) / 2 / 16))
[ "$after" = "$expect" ] || fail "run 1: $after steps after the change, expected $expect"
grep -q "^eval epoch 1: top1" log$run.0/workerlog.0 || fail "run 1: no evaluation"
expect_no_leftovers
echo "PASS: machine 2 killed at step $before: the job went on from global step $resumed on 2 machines ($again the loss)"

# 2. Machine 2's link cut: lost by heartbeat, the job goes on; the cut machine's dtrain stops.
run=2 port=$((port + 1))
for i in 0 1 2; do start $i $run 1:3 "${CLS[@]}" -o checkpoint.dir=ckpt$run.$i; sleep 0.5; done
wait_steps $run 6
t0=$(date +%s)
ip -n ${NS[2]} link set ${LINK[2]} down || fail "link down"
wait ${P[2]} && fail "run 2: the cut machine's dtrain exited 0"
cut_stop=$(($(date +%s) - t0))
wait ${P[0]} || fail "run 2: node 0's dtrain failed after machine 2's link was cut"
wait ${P[1]} || fail "run 2: node 1's dtrain failed after machine 2's link was cut"
ip -n ${NS[2]} link set ${LINK[2]} up
generation_line $run 1 | grep -q "2 machines" || fail "run 2: no generation 1 of 2 machines"
grep -q "lost the job store" err$run.2.txt || fail "run 2: the cut machine did not say it lost the store"
echo "PASS: machine 2's link cut: the job finished on 2 machines; the cut machine's dtrain stopped after $cut_stop s"

# 3. Two machines, a third started later joins; then 4. below MIN.
run=3 port=$((port + 1))
for i in 0 1; do start $i $run 2:3 "${CLS[@]}" -o checkpoint.dir=ckpt$run.$i; sleep 0.5; done
wait_steps $run 4
start 2 $run 2:3 "${CLS[@]}" -o checkpoint.dir=ckpt$run.2
for i in 0 1 2; do wait ${P[i]} || fail "run 3: machine $i's dtrain failed after machine 2 joined"; done
generation_line $run 1 | grep -q "3 machines" || fail "run 3: the world did not grow to 3 machines"
grep -q "joins" out$run.0.txt || fail "run 3: no join reported"
grep -q "elastic: generation 1: world 3 (was 2)" log$run.0/workerlog.0 || fail "run 3: rank 0 did not go on at world 3"
echo "PASS: a machine started later joined: $(generation_line $run 1)"

run=4 port=$((port + 1))
for i in 0 1; do start $i $run 2:3 "${CLS[@]}" -o checkpoint.dir=ckpt$run.$i -o train.epochs=50; sleep 0.5; done
wait_steps $run 4
t0=$(date +%s)
kill_machine 1
wait ${P[0]} && fail "run 4: node 0's dtrain exited 0 below MIN"
took=$(($(date +%s) - t0))
grep -q "fewer than --nnodes 2:3.*machines lost: machine 1 (${IP[1]})" err$run.0.txt ||
  fail "run 4: the report does not name the lost machine"
[ $took -le 30 ] || fail "run 4: the job took $took s to fail below MIN (--elastic_timeout 6)"
expect_no_leftovers
echo "PASS: below MIN the job failed in $took s naming machine 1 (${IP[1]})"

if [ $MODE = full ]; then
  # 5. ZeRO stage 2: the state is partitioned, so the job goes on from its sharded checkpoint.
  run=5 port=$((port + 1))
  for i in 0 1 2; do
    start $i $run 1:3 "${CLS[@]}" -o checkpoint.dir=$WORK/ckpt5 -o checkpoint.every_steps=4 -o strategy.sharding=true \
      -o strategy.sharding_configs.stage=2
    sleep 0.5
  done
  wait_steps $run 10
  kill_machine 2
  wait ${P[0]} || fail "run 5: node 0's dtrain failed"
  wait ${P[1]} || fail "run 5: node 1's dtrain failed"
  grep -q "going on from the latest sharded checkpoint" log$run.0/workerlog.0 || fail "run 5: no sharded resume"
  grep -q "resume: .*sharded-[0-9]*" log$run.0/workerlog.0 || fail "run 5: rank 0 did not load a sharded checkpoint"
  echo "PASS: ZeRO stage 2: $(grep -m1 "resume: .*sharded" log$run.0/workerlog.0)"

  # 6. An unmodified torchrun script: torchrun's behaviour, every worker restarts at the new WORLD_SIZE.
  run=7 port=$((port + 1))
  for i in 0 1 2; do start $i $run 1:3 "$SRC/examples/python/ddp_torchrun.py" --steps 300; sleep 0.5; done
  wait_for log$run.0/workerlog.0 "step 10 loss" 600
  kill_machine 2
  wait ${P[0]} || fail "run 7: node 0's dtrain failed"
  wait ${P[1]} || fail "run 7: node 1's dtrain failed"
  sed -n '/restart 1 =====/,$p' log$run.0/workerlog.0 | grep -q "rank 0 of 2 (gloo)" ||
    fail "run 7: the torchrun script did not restart at world 2"
  echo "PASS: a torchrun script restarted at world 2: $(grep "rank 0 of" log$run.0/workerlog.0 | tail -1)"
fi
