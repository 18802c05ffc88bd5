# Paddle's PS variables set by hand, no dtrain launcher: one server and two
# workers of dtrain-ps-linear (TRAINING_ROLE, PADDLE_PSERVERS_IP_PORT_LIST,
# PADDLE_PORT, POD_IP, PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM) train and exit 0.
source "$(dirname "$0")/ps_lib.sh"
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
    echo $((20000 + RANDOM % 20000))
}
SPORT=$(free_port)
for v in $(env | sed -n 's/^\(DTRAIN_[A-Z_]*\|PADDLE_[A-Z_]*\|TRAINING_ROLE\|POD_IP\)=.*/\1/p'); do unset "$v"; done
common=(PADDLE_PSERVERS_IP_PORT_LIST=127.0.0.1:$SPORT PADDLE_TRAINERS_NUM=2 POD_IP=127.0.0.1)
env "${common[@]}" TRAINING_ROLE=PSERVER PADDLE_PORT=$SPORT timeout 120 "$BIN/dtrain-ps-linear" "$JOB" \
  >server.txt 2>&1 &
spid=$!
wpids=()
for w in 0 1; do
  env "${common[@]}" TRAINING_ROLE=TRAINER PADDLE_TRAINER_ID=$w PADDLE_PORT=$(free_port) timeout 120 \
    "$BIN/dtrain-ps-linear" "$JOB" >worker$w.txt 2>&1 &
  wpids+=($!)
done
for w in 0 1; do wait "${wpids[$w]}" || fail "worker $w failed: $(tail -5 worker$w.txt)"; done
wait $spid || fail "the server failed: $(tail -5 server.txt)"
grep -q "paddle" worker0.txt || fail "the role did not come from Paddle's variables: $(head -3 worker0.txt)"
grep -q "served; exiting" server.txt || fail "the server did not return from serve()"
for w in 0 1; do expect_loss_fell worker$w.txt; done
expect_no_leftovers
echo "PASS"
