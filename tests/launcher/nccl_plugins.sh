# `dtrain plugins` lists nccl with the version of the libnccl it loaded (the
# one in nccl.h next to it when the header is found) and the CUDA runtime.
source "$(dirname "$0")/lib.sh"
"$BIN/dtrain" plugins >out.txt 2>err.txt || fail "dtrain plugins exited $?"
grep -Eq '^nccl +0\.1\.0 \(NCCL [0-9]+\.[0-9]+\.[0-9]+\) +1\.[0-9]+ .*allreduce.* cuda f16/bf16' out.txt ||
  fail "dtrain plugins does not list nccl with its NCCL version and capabilities"
grep -Eq '^  nccl: GPU collectives over NCCL [0-9.]+ .*CUDA runtime [0-9]+\.[0-9]+, driver ' out.txt ||
  fail "the nccl description does not name the CUDA runtime"
for dir in "${CUDA_HOME:-/usr/local/cuda}/include" /usr/include; do
  h=$dir/nccl.h
  [ -f "$h" ] || continue
  v=$(awk '/#define NCCL_MAJOR/{a=$3} /#define NCCL_MINOR/{b=$3} /#define NCCL_PATCH/{c=$3} END{print a"."b"."c}' "$h")
  grep -q "built against $v" out.txt || fail "nccl.h in $dir is $v, the plugin says otherwise"
  break
done
grep -A1 '^nccl' out.txt
grep '^  nccl:' out.txt
echo "PASS: dtrain plugins lists nccl with its versions"
