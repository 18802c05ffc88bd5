#!/usr/bin/env bash
# Runs everything of dtrain that needs a GPU and prints one table (the one
# docs/gpu.md shows): the GPU unit tests, Gloo and UCX on CUDA buffers, NCCL's
# conformance at world size 1 and with 2 and 3 processes sharing one GPU (each
# its own NCCL "host" over loopback), the withheld-rank timeout, data-parallel
# training on the GPU, and the cls job on CUDA against PyTorch eager.
#
#   scripts/gpu_check.sh [--bin DIR] [--src DIR] [--markdown] [--list]
#
# --bin: where dtrain, dtrain-conformance and the test programs are (default:
# build/bin of this checkout, else the PATH, as in the unpacked GPU bundle
# after `source env.sh`); --src: the dtrain sources (default: this checkout);
# --markdown: the table as Markdown; --list: the checks, nothing run.
# Without a visible GPU it says so and exits 0 having run nothing. Otherwise it
# exits 1 when a check fails. Each check's output is kept in gpu-check-logs/.
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
bin="" markdown=0 list=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --src) src=$2; shift 2 ;;
    --markdown) markdown=1; shift ;;
    --list) list=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -z $bin && -x $src/build/bin/dtrain ]]; then bin=$src/build/bin; fi
[[ -n $bin ]] && export PATH=$bin:$PATH
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1}

# name | command (run by bash in a fresh folder; "need:" programs that must exist)
checks=(
  "unit: nccl_test|need:nccl_test|nccl_test"
  "unit: cuda_staging_test|need:cuda_staging_test|cuda_staging_test"
  "unit: cuda_fake_staging_test|need:cuda_fake_staging_test|cuda_fake_staging_test"
  "gloo on CUDA, 2 ranks|need:dtrain-conformance|dtrain-conformance --backend gloo --world-size 2 --device cuda"
  "ucx on CUDA, 2 ranks|need:dtrain-conformance|dtrain-conformance --backend ucx --world-size 2 --device cuda"
  "gloo on CUDA, 2 processes|need:dtrain|dtrain --nproc_per_node 2 --gpus 0 dtrain-conformance --backend gloo --device cuda"
  "nccl conformance, world size 1|need:dtrain-conformance|dtrain-conformance --backend nccl --world-size 1 --device cuda"
  "nccl conformance, 2 processes on 1 GPU|need:dtrain|dtrain --nproc_per_node 2 --gpus 0 -- bash -c 'NCCL_HOSTID=h\$DTRAIN_RANK exec dtrain-conformance --backend nccl --device cuda'"
  "nccl conformance, 3 processes on 1 GPU|need:dtrain|dtrain --nproc_per_node 3 --gpus 0 -- bash -c 'NCCL_HOSTID=h\$DTRAIN_RANK exec dtrain-conformance --backend nccl --device cuda'"
  "nccl withheld rank times out naming it|need:dtrain-nccl-withhold-probe|bash $src/tests/launcher/nccl_withhold.sh \$(dirname \$(dirname \$(command -v dtrain)))"
  "the GPU command: every visible GPU|need:dtrain|dtrain --backend nccl -- bash -c 'echo device \$DTRAIN_DEVICE of rank \$DTRAIN_RANK'"
  "cls on CUDA vs PyTorch eager|need:dtrain-bench|dtrain-bench training $src/apps/cls.toml --device cuda"
)

gpu_line=""
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /tmp/gpu-check-$$.txt 2>&1 && grep -q '^GPU' /tmp/gpu-check-$$.txt; then
  gpu_line=$(head -1 /tmp/gpu-check-$$.txt)
fi
rm -f /tmp/gpu-check-$$.txt
if [[ $list == 1 ]]; then
  for c in "${checks[@]}"; do IFS='|' read -r name need cmd <<< "$c"; printf '%-42s %s\n' "$name" "$cmd"; done
  exit 0
fi
if [[ -z $gpu_line ]]; then
  echo "gpu_check: no GPU is visible (nvidia-smi -L shows none): nothing to check here; run it on a GPU machine (docs/gpu.md)"
  exit 0
fi

logs=$PWD/gpu-check-logs
mkdir -p "$logs"
rows=() failed=0
for i in "${!checks[@]}"; do
  IFS='|' read -r name need cmd <<< "${checks[$i]}"
  prog=${need#need:}
  if ! command -v "$prog" > /dev/null; then
    rows+=("$name|not run|-|$prog is not built here")
    continue
  fi
  work=$(mktemp -d)
  t0=$(date +%s%N)
  (cd "$work" && timeout 900 bash -c "$cmd") > "$logs/$i.log" 2>&1
  rc=$?
  secs=$(awk -v n=$(( $(date +%s%N) - t0 )) 'BEGIN {printf "%.1f", n / 1e9}')
  cat "$work"/log/workerlog.* >> "$logs/$i.log" 2> /dev/null
  rm -rf "$work"
  detail=$(grep -Eo '[0-9]+ passed, [0-9]+ failed[^|]*|PASS[^|]*|dtrain 1 worker / PyTorch eager[^|]*' "$logs/$i.log" | tail -1)
  case $rc in
    0) result=pass ;;
    77) result=skipped ;;
    124) result="FAIL (timed out)"; failed=1 ;;
    *) result="FAIL (exit $rc)"; failed=1 ;;
  esac
  [[ -z $detail ]] && detail=$(tail -1 "$logs/$i.log" | cut -c1-100)
  rows+=("$name|$result|$secs|${detail//|//}")
done

echo "GPU: $gpu_line"
if [[ $markdown == 1 ]]; then
  echo "| check | result | seconds | detail |"
  echo "| --- | --- | --- | --- |"
  for r in "${rows[@]}"; do IFS='|' read -r a b c d <<< "$r"; echo "| $a | $b | $c | $d |"; done
else
  for r in "${rows[@]}"; do IFS='|' read -r a b c d <<< "$r"; printf '%-42s %-18s %7s  %s\n' "$a" "$b" "$c" "$d"; done
fi
echo "logs: $logs"
exit $failed
