# --start_port P: every port a job opens on the machine lies in the range the
# table shows (P the store, then an endpoint per process, then a block of 32
# per process for the transports' own listeners: Gloo's pairs through the
# preloaded libdtrain_portrange.so, UCX over TCP through UCX_TCP_PORT_RANGE,
# the PS servers on their endpoints). Checked from the sockets the processes
# really hold while the job runs: every listening socket is in the range, and
# every connection has its listening end in it (Gloo closes a pair's listener
# once its peer is connected). A collective job on gloo and on ucx, and a PS
# job (ps_grpc servers, gloo among the workers).
#   start_port.sh BUILD_DIR ps_linear.toml
source "$(dirname "$0")/ps_lib.sh"
# check_sockets NAME LO HI: the job's processes (carrying $TAG) hold only in-range servers
check_sockets() {
  local name=$1 lo=$2 hi=$3 pids bad
  pids=$(pgrep -f -- "$TAG" | paste -sd'|')
  [ -n "$pids" ] || fail "$name: no process of the job found"
  ss -Htanp | grep -E "pid=($pids)," >sockets.$name.txt
  [ -s sockets.$name.txt ] || fail "$name: the job holds no TCP socket"
  bad=$(awk -v lo="$lo" -v hi="$hi" '
    function port(a) { sub(/.*:/, "", a); return a + 0 }
    function in_range(p) { return p >= lo && p <= hi }
    $1 == "LISTEN" && !in_range(port($4)) { print "listening outside the range: " $0 }
    $1 == "ESTAB" && !in_range(port($4)) && !in_range(port($5)) { print "a connection to a server outside the range: " $0 }
  ' sockets.$name.txt)
  [ -z "$bad" ] || fail "$name: $bad"
  echo "$name: $(grep -c LISTEN sockets.$name.txt) listening and $(grep -c ESTAB sockets.$name.txt) connected sockets, all servers in $lo-$hi"
}
# range_of OUT: "LO HI" from the table's ports row
range_of() { sed -n 's/^  ports *\([0-9]*\)-\([0-9]*\) .*/\1 \2/p' "$1"; }

for backend in gloo ucx; do
  P=$((20000 + RANDOM % 30000))
  timeout 120 "$BIN/dtrain" --start_port $P --nproc_per_node 3 --log_dir log.$backend "$BIN/dtrain-job-probe" \
    --backend $backend --sleep-ms 2 --timeout-s 30 --iterations 100000 --tag "$TAG" >out.$backend.txt 2>&1 &
  job=$!
  for r in 0 1 2; do wait_for log.$backend/workerlog.$r "first all-reduce done"; done
  read -r lo hi <<<"$(range_of out.$backend.txt)"
  [ "$lo" = "$P" ] || fail "$backend: the table shows no range from $P: $(grep ports out.$backend.txt)"
  [ $((hi - lo + 1)) -ge $((1 + 3 + 3 * 32)) ] || fail "$backend: the range $lo-$hi is too small"
  check_sockets $backend "$lo" "$hi"
  kill -TERM $job
  wait $job
  expect_no_leftovers
done

P=$((20000 + RANDOM % 30000))
timeout 120 "$BIN/dtrain" --start_port $P --server_num 1 --worker_num 2 --log_dir log.ps "$JOB" \
  -o ps_linear.steps=100000 -o ps_linear.sleep_ms=5 >out.ps.txt 2>&1 &
job=$!
wait_for log.ps/workerlog.0 "step 20/"
wait_for log.ps/workerlog.1 "step 20/"
read -r lo hi <<<"$(range_of out.ps.txt)"
[ "$lo" = "$P" ] || fail "ps: the table shows no range from $P"
grep -Eq "server +0 +0 +0 +127.0.0.1:($((P + 1))|$((P + 2))|$((P + 3))) " out.ps.txt || fail "ps: the server's endpoint is not in the range"
check_sockets ps "$lo" "$hi"
kill -TERM $job
wait $job
expect_no_leftovers
echo "PASS"
