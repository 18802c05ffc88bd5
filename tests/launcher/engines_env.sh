# dtrain programs started by other engines, with no dtrain launcher and no
# DTRAIN_* variable: two processes of dtrain-conformance with only Paddle's
# collective variables (as paddle.distributed.launch sets them: trainer 0
# serves the store on its endpoint), with only torchrun's, and with only
# multi-node Slurm's on two "machines" in network namespaces (the store on
# the first host of the compressed node list, names resolved through each
# namespace's /etc/netns/NS/hosts, the job's secret from a file). mpirun -np 2
# is launcher.mpirun_slurm.
source "$(dirname "$0")/lib.sh"
unset DTRAIN_RANK DTRAIN_STORE DTRAIN_JOB_TOKEN DTRAIN_TOKEN_FILE RANK WORLD_SIZE MASTER_ADDR MASTER_PORT \
  PADDLE_TRAINER_ID SLURM_PROCID OMPI_COMM_WORLD_RANK || true
export DTRAIN_LOG_LEVEL=info
conf=("$BIN/dtrain-conformance" --backend gloo --large-count 100003 --filter allreduce)
both_pass() {  # both_pass NAME: out.NAME.0.txt and out.NAME.1.txt each passed, as one job of 2
  for r in 0 1; do
    grep -q "passed, 0 failed" out.$1.$r.txt || fail "$1 rank $r did not pass: $(tail -5 out.$1.$r.txt)"
  done
  grep -q "2 ranks" out.$1.0.txt || fail "$1: the ranks did not form one job of 2"
}

port=$((20000 + RANDOM % 20000))
eps=127.0.0.1:$port,127.0.0.1:$((port + 1))
pids=()
for r in 0 1; do
  env PADDLE_TRAINER_ID=$r PADDLE_TRAINERS_NUM=2 PADDLE_TRAINER_ENDPOINTS=$eps \
    PADDLE_CURRENT_ENDPOINT=127.0.0.1:$((port + r)) timeout 120 "${conf[@]}" >out.paddle.$r.txt 2>&1 &
  pids+=($!)
done
for i in 0 1; do wait "${pids[$i]}" || fail "paddle rank $i failed: $(tail -5 out.paddle.$i.txt)"; done
both_pass paddle
grep -q "serving the job store on 127.0.0.1:$port (paddle env)" out.paddle.0.txt ||
  fail "trainer 0 did not serve the store on its endpoint"

port=$((20000 + RANDOM % 20000))
pids=()
for r in 0 1; do
  env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 120 "${conf[@]}" >out.torchrun.$r.txt 2>&1 &
  pids+=($!)
done
for i in 0 1; do wait "${pids[$i]}" || fail "torchrun rank $i failed: $(tail -5 out.torchrun.$i.txt)"; done
both_pass torchrun

# Slurm across two machines: srun -N 2 -n 2 gives each task these variables.
named_nodes 11
host=$HOST
make_secret secret
jobid=$((4000 + RANDOM % 1000))
pids=()
for r in 0 1; do
  ns=$([ $r = 0 ] && echo $NA || echo $NB)
  ip netns exec $ns env SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_LOCALID=0 SLURM_NODEID=$r SLURM_NNODES=2 \
    SLURM_TASKS_PER_NODE="1(x2)" SLURM_JOB_ID=$jobid SLURM_STEP_ID=0 SLURM_JOB_NODELIST="$host[1-2]" \
    DTRAIN_TOKEN_FILE=secret timeout 120 "${conf[@]}" >out.slurm.$r.txt 2>&1 &
  pids+=($!)
done
for i in 0 1; do wait "${pids[$i]}" || fail "slurm rank $i failed: $(tail -5 out.slurm.$i.txt)"; done
both_pass slurm
grep -q "serving the job store on ${host}1:" out.slurm.0.txt || fail "rank 0 did not serve the store on ${host}1"
echo "PASS"
