# The GPU command's layout, on a fake device count (DTRAIN_FAKE_GPU_COUNT):
# --backend nccl with no device named takes every visible GPU, one worker
# each, worker i on device i; --gpus sets the devices and the worker count
# over the job file's nproc_per_node; the table says where the count came
# from; parameter-server workers get devices in turn; without a GPU,
# --backend nccl is refused before anything starts. Also Paddle's habits:
# the program as a positional (no `--`) and --max_restart.
source "$(dirname "$0")/lib.sh"
cat >probe.sh <<'SH'
#!/bin/bash
echo "rank $DTRAIN_RANK of $DTRAIN_WORLD_SIZE device ${DTRAIN_DEVICE:-none} flags ${FLAGS_selected_gpus:-none} backend ${DTRAIN_BACKEND:-none} arg1 $(basename "$1")"
SH
chmod +x probe.sh
cat >job.toml <<TOML
[job]
program = "$WORK/probe.sh"
backend = "nccl"
nproc_per_node = 2
TOML
# expect_workers LOGDIR N: N worker logs, worker i on device i
expect_workers() {
  local dir=$1 n=$2
  [ "$(ls "$dir"/workerlog.* 2>/dev/null | wc -l)" = "$n" ] || fail "$dir: expected $n workers, got $(ls "$dir")"
  for ((r = 0; r < n; r++)); do
    grep -q "rank $r of $n device $r flags $r backend nccl" "$dir/workerlog.$r" || fail "$dir: worker $r is not on device $r"
  done
}

# 4 fake GPUs, the job file says nproc_per_node = 2: --backend nccl (from the file) takes all 4.
DTRAIN_FAKE_GPU_COUNT=4 timeout 60 "$BIN/dtrain" --log_dir l.all job.toml >out.all.txt 2>err.all.txt ||
  fail "the nccl job on 4 fake GPUs failed"
expect_workers l.all 4
grep -q "workers .*4 on this machine, from every visible GPU (4), --backend nccl" out.all.txt ||
  fail "the table does not say the count came from the visible GPUs"
grep -q "arg1 job.toml" l.all/workerlog.0 || fail "the program did not get the job file"

# --gpus 0,1 gives 2 workers whatever the file says; --gpus 0,1,2,3 is not refused by the file's 2.
DTRAIN_FAKE_GPU_COUNT=4 timeout 60 "$BIN/dtrain" --log_dir l.two --gpus 0,1 job.toml >out.two.txt 2>err.two.txt ||
  fail "--gpus 0,1 failed"
expect_workers l.two 2
grep -q "from --gpus 0,1" out.two.txt || fail "the table does not say the count came from --gpus"
DTRAIN_FAKE_GPU_COUNT=4 timeout 60 "$BIN/dtrain" --log_dir l.four --gpus 0,1,2,3 -o job.nproc_per_node=1 job.toml \
  >out.four.txt 2>err.four.txt || fail "--gpus 0,1,2,3 over a job file's nproc_per_node failed: $(cat err.four.txt)"
expect_workers l.four 4

# An explicit --nproc_per_node below the device count is refused, naming the flag and where the devices came from.
DTRAIN_FAKE_GPU_COUNT=4 timeout 20 "$BIN/dtrain" --log_dir l.few --gpus 0,1,2 --nproc_per_node 2 job.toml \
  >out.few.txt 2>err.few.txt && fail "--nproc_per_node 2 with --gpus 0,1,2 was not refused"
grep -q -- "--nproc_per_node 2 is fewer than the 3 devices of --gpus 0,1,2" err.few.txt || fail "the refusal: $(cat err.few.txt)"

# Parameter-server workers get their devices in turn.
DTRAIN_FAKE_GPU_COUNT=2 timeout 60 "$BIN/dtrain" --log_dir l.ps --gpus 0,1 --server_num 1 --worker_num 2 \
  bash -c 'echo "role $TRAINING_ROLE device ${DTRAIN_DEVICE:-none}"' >out.ps.txt 2>err.ps.txt &
ps_pid=$!
wait $ps_pid || fail "the PS layout job failed: $(cat err.ps.txt)"
grep -q "role TRAINER device 0" l.ps/workerlog.0 || fail "PS worker 0 has no device 0"
grep -q "role TRAINER device 1" l.ps/workerlog.1 || fail "PS worker 1 has no device 1"
grep -q "role PSERVER device none" l.ps/serverlog.0 || fail "the server got a device"

# No GPU (a count of 0): --backend nccl is refused at once, saying what to use.
DTRAIN_FAKE_GPU_COUNT=0 timeout 20 "$BIN/dtrain" --log_dir l.none job.toml >out.none.txt 2>err.none.txt &&
  fail "the nccl job without a GPU was not refused"
grep -q "use --backend gloo or --backend ucx" err.none.txt || fail "the refusal does not say what to use"
[ -e l.none ] && fail "a log folder was made before the refusal"

# Paddle's habits: the program as the first positional, its own options left to it, --max_restart.
timeout 120 "$BIN/dtrain" --nproc_per_node 2 --max_restart 1 --log_dir l.prog "$BIN/dtrain-conformance" --backend gloo \
  --filter allreduce >out.prog.txt 2>err.prog.txt || fail "dtrain PROGRAM without -- failed: $(tail -5 err.prog.txt)"
grep -q "max_restarts *1" out.prog.txt || fail "--max_restart 1 was not taken"
grep -q "command .*dtrain-conformance --backend gloo --filter allreduce" out.prog.txt ||
  fail "the program's own options were not left to it"
echo "PASS"
