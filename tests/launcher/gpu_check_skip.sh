# scripts/gpu_check.sh lists its checks, and where no GPU is visible says so,
# prints every row as not run (a dry run, whatever the core count) and exits 0
# having run nothing. Skipped (77) on a GPU machine, where the script itself
# is the check (docs/gpu.md).
source "$(dirname "$0")/lib.sh"
script=$(cd "$(dirname "$0")/../.." && pwd)/scripts/gpu_check.sh
bash "$script" --list >out.list.txt 2>err.list.txt || fail "--list failed"
[ "$(wc -l <out.list.txt)" -ge 10 ] || fail "--list shows fewer than 10 checks"
for c in "nccl conformance, world size 1" "ucx on CUDA" "withheld rank" "cls on CUDA vs PyTorch eager"; do
  grep -q "$c" out.list.txt || fail "no check '$c'"
done
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "SKIP: a GPU is visible: run scripts/gpu_check.sh itself"
  exit 77
fi
bash "$script" --bin "$BIN" >out.run.txt 2>err.run.txt || fail "gpu_check.sh failed without a GPU"
grep -q "no GPU is visible" out.run.txt || fail "it does not say that no GPU is visible"
[ -e gpu-check-logs ] && fail "it ran checks without a GPU"
# The dry run still prints every row, each saying why it did not run.
rows=$(wc -l <out.list.txt)
[ "$(grep -c 'not run: no GPU' out.run.txt)" = "$rows" ] ||
  fail "the dry run does not print the rows as not run"
grep -q "ps 64K x 8, pinned, vs raw gRPC" out.run.txt || fail "the dry run leaves out the PS row"
echo "PASS"
