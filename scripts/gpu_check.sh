#!/usr/bin/env bash
# The script for the GPU machine (16 cores, 1 GPU): what needs a GPU or more
# cores than a 2-core machine has, in one table (docs/gpu.md, docs/scale.md).
# Five sections, each under a time cap that its row says it hit; the caps add
# up to 9 minutes, so the whole run fits a 15-minute lease with its start:
#   gpu      (210 s) the GPU unit tests, Gloo and UCX on CUDA buffers, NCCL's
#            conformance at 1, 2 and 3 processes on the GPU, the withheld-rank
#            timeout, the GPU command, cls on CUDA against PyTorch eager
#   scaling  (120 s) cls on the CPU with 1, 2, 4 and 8 workers x 2 threads:
#            images/s and efficiency, beside the seeds' 7.04 of 8 on GPUs
#   ucx       (90 s) UCX all-reduce at 2, 4 and 8 ranks, 256 KB to 4 MB,
#            against Open MPI where mpirun is there
#   ps        (60 s) PS sparse push and pull, 64K keys x 8, server and worker
#            pinned to separate cores, against raw gRPC
#   python    (60 s) the Python package's op suite under the machine's torch
#            (skipped where the package is not built for that python)
#
#   scripts/gpu_check.sh [--bin DIR] [--src DIR] [--markdown] [--list]
#
# --bin: where dtrain and the programs are (default: build/bin of this
# checkout, else the PATH, as in the unpacked GPU bundle after `source
# env.sh`); --src: the dtrain sources (default: this checkout); --markdown:
# the table as Markdown; --list: the rows, nothing run. GPU_CHECK_CAPS="gpu=60
# scaling=10" changes caps (seconds); GPU_CHECK_UCX_MAX=1M the UCX rows'
# largest size. Without a GPU it is a dry run: every row says "not run: no
# GPU", nothing runs, and it exits 0. With a GPU but fewer than 8 cores the
# scaling, UCX and PS rows say "not run: fewer than 8 cores". It exits 1 when
# a row fails. Each row's output is kept in gpu-check-logs/.
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
bin="" markdown=0 list=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --src) src=$2; shift 2 ;;
    --markdown) markdown=1; shift ;;
    --list) list=1; shift ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -z $bin && -x $src/build/bin/dtrain ]]; then bin=$src/build/bin; fi
[[ -n $bin ]] && export PATH=$bin:$PATH
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1}

declare -A cap=([gpu]=210 [scaling]=120 [ucx]=90 [ps]=60 [python]=60)
for kv in ${GPU_CHECK_CAPS:-}; do cap[${kv%%=*}]=${kv#*=}; done
cores=$(nproc)
ucx_max=${GPU_CHECK_UCX_MAX:-4M}  # the UCX rows' largest size (a test narrows it)

# section | name | need | command (run by bash in a fresh folder; "need:" a program that must exist)
cls_run() {  # the scaling rows: W workers x 2 threads, 48 steps of 64 images each, on the CPU
  echo "dtrain --nproc_per_node $1 --backend gloo $src/apps/cls.toml -o train.device=cpu -o train.threads=2 \
-o train.max_steps=48 -o log.every_steps=16 -o data.limit_eval=256 -o checkpoint.resume=false -o checkpoint.dir=ckpt"
}
rows_def=(
  "gpu|unit: nccl_test|need:nccl_test|nccl_test"
  "gpu|unit: cuda_staging_test|need:cuda_staging_test|cuda_staging_test"
  "gpu|unit: cuda_fake_staging_test|need:cuda_fake_staging_test|cuda_fake_staging_test"
  "gpu|gloo on CUDA, 2 ranks|need:dtrain-conformance|dtrain-conformance --backend gloo --world-size 2 --device cuda"
  "gpu|ucx on CUDA, 2 ranks|need:dtrain-conformance|dtrain-conformance --backend ucx --world-size 2 --device cuda"
  "gpu|gloo on CUDA, 2 processes|need:dtrain|dtrain --nproc_per_node 2 --gpus 0 dtrain-conformance --backend gloo --device cuda"
  "gpu|nccl conformance, world size 1|need:dtrain-conformance|dtrain-conformance --backend nccl --world-size 1 --device cuda"
  "gpu|nccl conformance, 2 processes on 1 GPU|need:dtrain|dtrain --nproc_per_node 2 --gpus 0 -- bash -c 'NCCL_HOSTID=h\$DTRAIN_RANK exec dtrain-conformance --backend nccl --device cuda'"
  "gpu|nccl conformance, 3 processes on 1 GPU|need:dtrain|dtrain --nproc_per_node 3 --gpus 0 -- bash -c 'NCCL_HOSTID=h\$DTRAIN_RANK exec dtrain-conformance --backend nccl --device cuda'"
  "gpu|nccl withheld rank times out naming it|need:dtrain-nccl-withhold-probe|bash $src/tests/launcher/nccl_withhold.sh \$(dirname \$(dirname \$(command -v dtrain)))"
  "gpu|the GPU command: every visible GPU|need:dtrain|dtrain --backend nccl -- bash -c 'echo device \$DTRAIN_DEVICE of rank \$DTRAIN_RANK'"
  "gpu|cls on CUDA vs PyTorch eager|need:dtrain-bench|dtrain-bench training $src/apps/cls.toml --device cuda"
  "scaling|cls on CPU, 1 worker x 2 threads|need:dtrain-cls|$(cls_run 1)"
  "scaling|cls on CPU, 2 workers x 2 threads|need:dtrain-cls|$(cls_run 2)"
  "scaling|cls on CPU, 4 workers x 2 threads|need:dtrain-cls|$(cls_run 4)"
  "scaling|cls on CPU, 8 workers x 2 threads|need:dtrain-cls|$(cls_run 8)"
  "ucx|ucx all-reduce, 2 ranks, vs Open MPI|need:dtrain-bench|dtrain-bench collectives --backend ucx --world-size 2 --min-bytes 256K --max-bytes $ucx_max"
  "ucx|ucx all-reduce, 4 ranks, vs Open MPI|need:dtrain-bench|dtrain-bench collectives --backend ucx --world-size 4 --min-bytes 256K --max-bytes $ucx_max"
  "ucx|ucx all-reduce, 8 ranks, vs Open MPI|need:dtrain-bench|dtrain-bench collectives --backend ucx --world-size 8 --min-bytes 256K --max-bytes $ucx_max"
  "ps|ps 64K x 8, pinned, vs raw gRPC|need:dtrain-bench|dtrain-bench ps --pin --no-redis --only sparse --min-keys 64K --max-keys 64K --dims 8 --trials 5"
  "python|python: the op suite under this torch|need:python3|export PYTHONPATH=\$(dirname \$(command -v dtrain))/../lib/dtrain/python; python3 -c 'import dtrain.torch' || exit 77; python3 -m pytest -q -p no:cacheprovider $src/tests/python/test_ops.py"
)

# The figure a row's output gives (its last line otherwise).
detail_of() {  # section log
  local log=$1
  case $2 in
    scaling)
      grep -Eo 'images/s [0-9.]+' "$log" | tail -1 | awk '{print $2 " images/s"}' ;;
    ucx)
      awk '$1 ~ /^[0-9]+$/ && $1 >= 262144 && $1 <= 4194304 {
             s = $1 >= 1048576 ? $1 / 1048576 "M" : $1 / 1024 "K"
             printf "%s%s %s GB/s (%s of MPI)", sep, s, $7, ($13 == "" ? "-" : $13 "x"); sep = ", " }' "$log" ;;
    ps)
      awk -F'|' '/sparse (pull|push) 64K/ { for (i = 2; i <= NF; i++) gsub(/^ +| +$/, "", $i); split($2, c, " ");
             printf "%s%s %s GB/s, %sx raw gRPC", sep, c[2], $5, $9; sep = "; " }' "$log" ;;
    *)
      grep -Eo '[0-9]+ passed, [0-9]+ failed[^|]*|PASS[^|]*|dtrain 1 worker / PyTorch eager[^|]*|[0-9]+ passed[^|]*' "$log" | tail -1 ;;
  esac
}

gpu_line=""
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /tmp/gpu-check-$$.txt 2>&1 && grep -q '^GPU' /tmp/gpu-check-$$.txt; then
  gpu_line=$(head -1 /tmp/gpu-check-$$.txt)
fi
rm -f /tmp/gpu-check-$$.txt
if [[ $list == 1 ]]; then
  for r in "${rows_def[@]}"; do IFS='|' read -r sec name need cmd <<< "$r"; printf '%-8s %-42s %s\n' "$sec" "$name" "$cmd"; done
  exit 0
fi
# Without a GPU this is not the GPU machine: a dry run, every row "not run".
why_not() {  # section: why it does not run here ("" when it does)
  local few=""
  [[ $1 != gpu && $1 != python && $cores -lt 8 ]] && few="fewer than 8 cores ($cores here)"
  if [[ -z $gpu_line ]]; then
    echo "not run: no GPU${few:+; $few}"
  elif [[ -n $few ]]; then
    echo "not run: $few"
  fi
}
[[ -z $gpu_line ]] && echo "gpu_check: no GPU is visible (nvidia-smi -L shows none): a dry run, nothing is run"
[[ -n $gpu_line && $cores -lt 8 ]] && echo "gpu_check: $cores cores here: the scaling, UCX and PS rows need 8 and are not run"

logs=$PWD/gpu-check-logs
rows=() failed=0 section="" t_section=0 base_ips=""
for i in "${!rows_def[@]}"; do
  IFS='|' read -r sec name need cmd <<< "${rows_def[$i]}"
  if [[ $sec != "$section" ]]; then section=$sec t_section=$(date +%s); fi
  skip=$(why_not "$sec")
  if [[ -n $skip ]]; then rows+=("$name|$skip|-|"); continue; fi
  prog=${need#need:}
  if ! command -v "$prog" > /dev/null; then
    rows+=("$name|not run|-|$prog is not built here")
    continue
  fi
  left=$(( ${cap[$sec]} - ($(date +%s) - t_section) ))
  if [[ $left -le 0 ]]; then
    rows+=("$name|not run|-|the $sec section hit its ${cap[$sec]} s cap before this row")
    continue
  fi
  mkdir -p "$logs"
  work=$(mktemp -d)
  t0=$(date +%s%N)
  (cd "$work" && timeout -k 5 "$left" bash -c "$cmd") > "$logs/$i.log" 2>&1
  rc=$?
  secs=$(awk -v n=$(( $(date +%s%N) - t0 )) 'BEGIN {printf "%.1f", n / 1e9}')
  cat "$work"/log/workerlog.0 >> "$logs/$i.log" 2> /dev/null
  cat "$work"/log/workerlog.[1-9]* >> "$logs/$i.log.workers" 2> /dev/null
  rm -rf "$work"
  detail=$(detail_of "$logs/$i.log" "$sec")
  case $rc in
    0) result=pass ;;
    77) result=skipped ;;
    124|137) result="FAIL (hit the $sec section's ${cap[$sec]} s cap)"; failed=1 ;;
    *) result="FAIL (exit $rc)"; failed=1 ;;
  esac
  if [[ $sec == scaling && $rc == 0 && -n $detail ]]; then
    w=$(grep -Eo -- '--nproc_per_node [0-9]+' <<< "$cmd" | awk '{print $2}')
    ips=${detail%% *}
    [[ $w == 1 ]] && base_ips=$ips
    if [[ -n $base_ips ]]; then
      detail+=$(awk -v i="$ips" -v b="$base_ips" -v w="$w" \
        'BEGIN {printf ", efficiency %.2f (%.2f of %d; the seeds: 7.04 of 8 on GPUs)", i / (b * w), i / b, w}')
    fi
  fi
  [[ -z $detail ]] && detail=$(tail -1 "$logs/$i.log" | cut -c1-100)
  rows+=("$name|$result|$secs|${detail//|//}")
done

echo "GPU: ${gpu_line:-none}; cores: $cores"
if [[ $markdown == 1 ]]; then
  echo "| check | result | seconds | detail |"
  echo "| --- | --- | --- | --- |"
  for r in "${rows[@]}"; do IFS='|' read -r a b c d <<< "$r"; echo "| $a | $b | $c | $d |"; done
else
  for r in "${rows[@]}"; do IFS='|' read -r a b c d <<< "$r"; printf '%-42s %-22s %7s  %s\n' "$a" "$b" "$c" "$d"; done
fi
[[ -d $logs ]] && echo "logs: $logs"
exit $failed
