# scripts/gpu_check.sh's real branch on this machine: a stand-in nvidia-smi
# (one "GPU") and a stand-in nproc (16 cores), with small section caps, so that
# every section runs its real commands, its figures are parsed from their real
# output, and the caps cut rows off and say so (the UCX rows end at 512 KB here). The GPU rows themselves fail
# or skip here (there is no GPU); the table must still come out whole.
source "$(dirname "$0")/lib.sh"
script=$(cd "$(dirname "$0")/../.." && pwd)/scripts/gpu_check.sh
mkdir stubs
printf '#!/bin/sh\necho "GPU 0: NVIDIA H200 (UUID: GPU-stand-in)"\n' >stubs/nvidia-smi
printf '#!/bin/sh\necho 16\n' >stubs/nproc
chmod +x stubs/*
t0=$(date +%s)
PATH=$PWD/stubs:$PATH GPU_CHECK_CAPS="gpu=8 scaling=3 ucx=14 ps=14 python=3" GPU_CHECK_UCX_MAX=512K \
  bash "$script" --bin "$BIN" --markdown >out.txt 2>err.txt
rc=$?
secs=$(($(date +%s) - t0))
cat out.txt
[ $rc = 1 ] || fail "exit code $rc, not 1 (rows fail here: there is no GPU)"
grep -q "^GPU: GPU 0: NVIDIA H200 (UUID: GPU-stand-in); cores: 16" out.txt || fail "the stand-ins were not used"
[ "$(grep -c '^| ' out.txt)" = 23 ] || fail "the table does not have its 21 rows"
grep -q "not run: no GPU\|fewer than 8 cores" out.txt && fail "a row was not run although the stand-ins say it can"
# Caps: the scaling section's first row hits its 3 s cap; the rest say the section hit it.
grep -q "| cls on CPU, 1 worker x 2 threads | FAIL (hit the scaling section's 3 s cap) |" out.txt ||
  fail "the first scaling row did not hit its cap"
grep -q "| cls on CPU, 8 workers x 2 threads | not run | - | the scaling section hit its 3 s cap before this row |" out.txt ||
  fail "the later scaling rows do not say the section hit its cap"
# Parsing: the UCX row's sizes and the PS row's calls, from the benches' real tables.
grep -Eq "^\| ucx all-reduce, 2 ranks, vs Open MPI \| pass \| [0-9.]+ \| 256K [0-9.]+ GB/s \(.*\), 512K [0-9.]+ GB/s" out.txt ||
  fail "the 2-rank UCX row's figures were not parsed"
grep -Eq "^\| ps 64K x 8, pinned, vs raw gRPC \| pass \| [0-9.]+ \| pull [0-9.]+ GB/s, [0-9.]+ \[[0-9.-]+\]x raw gRPC; push " out.txt ||
  fail "the PS row's figures were not parsed"
[ $secs -lt 80 ] || fail "it took $secs s with caps adding up to 42 s"
echo "PASS: $secs s"
