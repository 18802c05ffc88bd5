# Shared by the launcher tests: bash launcher/<test>.sh BUILD_DIR
set -uo pipefail
BUILD=$(cd "$1" && pwd)
BIN=$BUILD/bin
WORK=$(mktemp -d /tmp/dtrain-launcher-test.XXXXXX)
cd "$WORK"
TAG="dtrain-test-$$-$RANDOM"
CLEANUP=()
cleanup() {
  for c in "${CLEANUP[@]}"; do eval "$c" >/dev/null 2>&1 || true; done
  pkill -9 -f -- "$TAG" >/dev/null 2>&1 || true
  [ -z "${DTRAIN_TEST_KEEP:-}" ] || cp -r "$WORK" "$DTRAIN_TEST_KEEP"  # the logs, to look at
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in out*.txt err*.txt; do [ -f "$f" ] && { echo "--- $f"; tail -40 "$f"; }; done >&2
  exit 1
}

# Every process of the job (they all carry $TAG in their arguments) is gone.
expect_no_leftovers() {
  sleep 0.5
  if pgrep -f -- "$TAG" >/dev/null; then
    pgrep -af -- "$TAG" >&2
    fail "processes of the job outlived it"
  fi
}

# Waits until file contains text (up to N tenths of a second).
wait_for() {
  local file=$1 text=$2 tenths=${3:-300}
  for _ in $(seq "$tenths"); do
    grep -q -- "$text" "$file" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "timed out waiting for '$text' in $file"
}

# Network namespaces as machines (root only; exit 77 = skipped otherwise).
# new_ns NAME: a namespace with loopback up, deleted at exit.
new_ns() {
  [ "$(id -u)" = 0 ] || { echo "SKIP: network namespaces need root"; exit 77; }
  command -v ip >/dev/null || fail "ip is not installed (Debian: iproute2)"
  ip netns add "$1" 2>err.ns.txt || { cat err.ns.txt; echo "SKIP: cannot create network namespaces here"; exit 77; }
  CLEANUP+=("ip netns del $1")
  ip -n "$1" link set lo up || fail "lo up in $1"
}
# link_ns NS1 ADDR1 NS2 ADDR2 NAME: a veth pair NAME-a/NAME-b between two
# namespaces (NS2 may equal NS1: a link that leads nowhere) with /24 addresses
# (ADDR2 may be empty).
link_ns() {
  local n1=$1 a1=$2 n2=$3 a2=$4 name=$5
  ip link add "$name"a type veth peer name "$name"b || fail "veth $name"
  ip link set "$name"a netns "$n1" && ip link set "$name"b netns "$n2" || fail "moving $name"
  ip -n "$n1" addr add "$a1"/24 dev "$name"a || fail "address $a1"
  [ -z "$a2" ] || ip -n "$n2" addr add "$a2"/24 dev "$name"b || fail "address $a2"
  ip -n "$n1" link set "$name"a up && ip -n "$n2" link set "$name"b up || fail "link up $name"
}
# bridge_machines N TAG NET: N "machines" on one bridge (itself in a namespace
# of its own): namespaces NS[i] with addresses IP[i] = 10.<random>.NET.(i+1)/24
# on interface LINK[i] (`ip -n ${NS[i]} link set ${LINK[i]} down` cuts machine i off).
bridge_machines() {
  local n=$1 tag=$2 net=$3 sw=${2}s$$ sub=$((RANDOM % 200 + 20))
  new_ns $sw
  ip -n $sw link add br0 type bridge && ip -n $sw link set br0 up || fail "bridge"
  NS=() IP=() LINK=()
  for i in $(seq 0 $((n - 1))); do
    NS[i]=$tag$i$$ IP[i]=10.$sub.$net.$((i + 1)) LINK[i]=${tag}e$i$$
    local port=${tag}p$i$$
    new_ns ${NS[i]}
    ip link add ${LINK[i]} type veth peer name $port || fail "veth $i"
    ip link set ${LINK[i]} netns ${NS[i]} && ip link set $port netns $sw || fail "moving veth $i"
    ip -n $sw link set $port master br0 && ip -n $sw link set $port up || fail "bridge port $i"
    ip -n ${NS[i]} addr add ${IP[i]}/24 dev ${LINK[i]} && ip -n ${NS[i]} link set ${LINK[i]} up || fail "address $i"
  done
}
# two_machines NAME NET: two "machines", namespaces NA and NB joined by a veth
# pair, with addresses A and B on 10.<random>.NET.0/24; a secret for the job in
# ./secret and a random base port in $port.
two_machines() {
  NA=${1}a$$ NB=${1}b$$
  new_ns $NA
  new_ns $NB
  sub=$((RANDOM % 200 + 20))
  A=10.$sub.$2.1 B=10.$sub.$2.2
  link_ns $NA $A $NB $B ${1}$$
  make_secret secret
  port=$((20000 + RANDOM % 20000))
}
# dtrain_in NS ARGS...: dtrain on machine NS of two_machines (--ips A,B, its
# port and secret, the test's job id), stopped after 120 s.
dtrain_in() {
  local ns=$1
  shift
  ip netns exec "$ns" timeout 120 "$BIN/dtrain" --ips $A,$B --start_port $port --token_file secret --job_id "$TAG" "$@"
}
# kill_and_wait VICTIM DPID WHAT: SIGKILL VICTIM (WHAT names it), then dtrain
# (pid DPID) must exit non-zero within TIMEOUT + 5 s. Sets rc and elapsed_ms.
kill_and_wait() {
  local t0
  t0=$(date +%s%N)
  kill -9 "$1"
  wait $2
  rc=$?
  elapsed_ms=$((($(date +%s%N) - t0) / 1000000))
  [ $rc -ne 0 ] || fail "dtrain exited 0 after $3 was killed"
  [ $elapsed_ms -lt $(((TIMEOUT + 5) * 1000)) ] || fail "dtrain took $elapsed_ms ms to stop"
}
# start_both N ARGS...: the test's own `run NS LOGDIR ARGS...` on machines A
# and B at once (logA<N>, out/errA<N>.txt; the same for B), pids in pa and pb.
start_both() {
  local n=$1
  shift
  run $NA logA$n "$@" >outA$n.txt 2>errA$n.txt &
  pa=$!
  run $NB logB$n "$@" >outB$n.txt 2>errB$n.txt &
  pb=$!
}
# both_pass WHAT: both machines' dtrain of start_both exit 0.
both_pass() {
  wait $pa || fail "machine A's ${1:-dtrain} failed"
  wait $pb || fail "machine B's ${1:-dtrain} failed"
}
# three_machines NAME NET: two_machines, and a third machine NC (address C on
# 10.<sub>.NET+1.0/24) linked to NA (address A2 there) and routed through it
# to NET: it reaches A's ports but is not in the job.
three_machines() {
  two_machines $1 $2
  NC=${1}c$$
  new_ns $NC
  A2=10.$sub.$(($2 + 1)).1 C=10.$sub.$(($2 + 1)).2
  link_ns $NA $A2 $NC $C ${1}x$$
  ip -n $NC route add 10.$sub.$2.0/24 via $A2 || fail "route from C"
}
# named_nodes NET: two machines in namespaces NA and NB with addresses A and B
# on 10.<random>.NET.0/24, named ${HOST}1 and ${HOST}2 in each one's own
# /etc/netns/NS/hosts (ip netns exec mounts it over /etc/hosts), where this
# machine's host name is the namespace's own address, as on a real node.
named_nodes() {
  two_machines dn $1
  HOST=n$sub
  local ns ip
  for ns in $NA $NB; do
    ip=$([ $ns = $NA ] && echo $A || echo $B)
    mkdir -p /etc/netns/$ns && CLEANUP+=("rm -rf /etc/netns/$ns")
    printf '127.0.0.1 localhost\n%s %s1\n%s %s2\n%s %s\n' $A $HOST $B $HOST $ip "$(hostname)" >/etc/netns/$ns/hosts
  done
}
# A secret for jobs on several machines, readable only by its owner.
make_secret() {
  head -c 32 /dev/urandom | base64 >"$1" && chmod 600 "$1"
}
