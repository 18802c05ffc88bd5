# deploy/slurm.sbatch on two "nodes" (network namespaces): a stand-in srun
# runs the script's srun line once per node with the variables Slurm's srun
# gives each task (SLURM_PROCID, SLURM_NTASKS, SLURM_NODEID, SLURM_NNODES,
# SLURM_LOCALID, SLURM_TASKS_PER_NODE, SLURM_JOB_ID, SLURM_JOB_NODELIST in its
# compressed form), node names resolved through /etc/netns/NS/hosts. A short
# cls job must finish on both and rank 0 print its evaluation.
#   slurm_sbatch.sh BUILD_DIR SOURCE_DIR
source "$(dirname "$0")/../launcher/lib.sh"
SRC=$(cd "$2" && pwd)
named_nodes 13
host=$HOST
mkdir -p shim prefix && ln -s "$BIN" prefix/bin && ln -s "$SRC/apps" prefix/apps
cat >shim/srun <<SH
#!/bin/bash
# srun -N 2 --ntasks-per-node=1: one task per node, in that node's namespace.
pids=()
for r in 0 1; do
  ns=\$([ \$r = 0 ] && echo $NA || echo $NB)
  ip netns exec \$ns env SLURM_PROCID=\$r SLURM_NTASKS=2 SLURM_NODEID=\$r SLURM_NNODES=2 SLURM_LOCALID=0 \
    SLURM_TASKS_PER_NODE="1(x2)" SLURM_JOB_ID=$((5000 + RANDOM % 1000)) SLURM_STEP_ID=0 SLURM_JOB_NODELIST="$host[1-2]" \
    "\$@" >task.\$r.txt 2>&1 &
  pids+=(\$!)
done
rc=0
for p in "\${pids[@]}"; do wait \$p || rc=1; done
exit \$rc
SH
chmod +x shim/srun
make_secret secret
PATH=$WORK/shim:$PATH DTRAIN=$WORK/prefix DTRAIN_TOKEN_FILE=$WORK/secret timeout 240 bash "$SRC/deploy/slurm.sbatch" \
  -o data.limit_train=1024 -o data.limit_eval=500 -o train.epochs=1 -o train.batch_size=64 \
  -o checkpoint.every_epochs=0 >out.sbatch.txt 2>&1 || fail "the sbatch job failed: $(tail -5 task.*.txt)"
grep -q "eval epoch 1: top1" task.0.txt || fail "rank 0 printed no evaluation: $(tail -5 task.0.txt)"
grep -q "rank 0/2" task.0.txt || fail "the tasks did not form one job of 2: $(head -5 task.0.txt)"
grep -h "eval epoch 1" task.0.txt
echo "PASS"
