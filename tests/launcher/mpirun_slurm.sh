# The same program without dtrain: under mpirun -np 2, and under a Slurm-like
# environment set by hand (rank 0 serves the store itself).
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_if_include=lo
command -v mpirun >/dev/null || fail "mpirun is not installed (Debian: openmpi-bin)"
timeout 240 mpirun --oversubscribe -np 2 "$BIN/dtrain-conformance" --backend gloo --large-count 100003 \
  >out.mpi.txt 2>err.mpi.txt || fail "mpirun run failed"
[ "$(grep -c "passed, 0 failed" out.mpi.txt)" = 2 ] || fail "both mpirun ranks must pass"

port=$((20000 + RANDOM % 20000))
pids=()
for r in 0 1 2; do
  env SLURM_PROCID=$r SLURM_NTASKS=3 SLURM_LOCALID=$r SLURM_NODEID=0 SLURM_NNODES=1 SLURM_TASKS_PER_NODE=3 \
      SLURM_JOB_ID=4242 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout 240 "$BIN/dtrain-conformance" --backend gloo --large-count 100003 >out.slurm.$r.txt 2>&1 &
  pids+=($!)
done
for i in 0 1 2; do wait "${pids[$i]}" || fail "slurm rank $i failed: $(tail -5 out.slurm.$i.txt)"; done
grep -q "3 ranks" out.slurm.0.txt || fail "slurm ranks did not form one job of 3"
echo "PASS"
