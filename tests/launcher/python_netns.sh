# Two "machines" (network namespaces joined by a veth pair) run an unchanged
# torchrun DDP script with `dtrain --ips A,B`: c10d Gloo finds its peers by
# MASTER_ADDR and GLOO_SOCKET_IFNAME from the launcher (hostname resolves to
# 127.0.0.1 here, so without them it stays on loopback). Then the same script
# over the "dtrain" backend. Both train the same parameters.
source "$(dirname "$0")/lib.sh"
SCRIPT=$(cd "$(dirname "$0")/../../examples/python" && pwd)/ddp_torchrun.py
two_machines vp 9
run() {  # run NS LOGDIR ARGS...
  local ns=$1 dir=$2
  shift 2
  ip netns exec "$ns" "$BIN/dtrain" --ips $A,$B --start_port $port --nproc_per_node 1 --log_dir "$dir" \
    --token_file secret --job_id "$TAG" "$SCRIPT" --steps 6 "$@"
}
for variant in c10d dtrain; do
  extra=()
  [ $variant = dtrain ] && extra=(--import dtrain.torch --backend dtrain)
  run $NA log$variant.A "${extra[@]}" >out.$variant.A.txt 2>err.$variant.A.txt &
  pa=$!
  run $NB log$variant.B "${extra[@]}" >out.$variant.B.txt 2>err.$variant.B.txt &
  pb=$!
  wait $pa || fail "machine A's dtrain failed ($variant)"
  wait $pb || fail "machine B's dtrain failed ($variant)"
  grep -q "rank 0 of 2" out.$variant.A.txt || fail "machine A's rank 0 did not finish ($variant)"
  grep -q "rank 1 of 2" log$variant.B/workerlog.1 || fail "machine B's rank 1 did not finish ($variant)"
  grep -o "parameter checksum .*" out.$variant.A.txt >sum.$variant.txt
  port=$((port + 100))
done
cmp -s sum.c10d.txt sum.dtrain.txt || fail "c10d Gloo and dtrain trained differently: $(cat sum.*.txt)"
expect_no_leftovers
echo "PASS"
