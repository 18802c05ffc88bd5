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
