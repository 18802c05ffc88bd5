# Shared by the ps_* launcher tests: bash launcher/ps_<test>.sh BUILD_DIR JOB.toml
# (examples/ps_linear/ps_linear.toml). The job file is copied to a name that
# carries $TAG, so every process of the job has it in its arguments.
JOB_SRC=$(realpath -- "${2:-}" 2>/dev/null)
source "$(dirname "$0")/lib.sh"
[ -f "$JOB_SRC" ] || fail "usage: $0 BUILD_DIR ps_linear.toml"
JOB=$WORK/ps_linear-$TAG.toml
cp "$JOB_SRC" "$JOB" || fail "cannot copy $JOB_SRC"

# The numbers of the "final loss F (first L)" line of a worker's log.
final_loss() { sed -n 's/.*final loss \([0-9.]*\) (first \([0-9.]*\)).*/\1/p' "$1" | tail -1; }
first_loss() { sed -n 's/.*final loss \([0-9.]*\) (first \([0-9.]*\)).*/\2/p' "$1" | tail -1; }
# The loss fell below 80% of the first step's in this log.
expect_loss_fell() {
  local f l
  f=$(final_loss "$1")
  l=$(first_loss "$1")
  [ -n "$f" ] && [ -n "$l" ] || fail "$1 has no final loss line"
  awk -v f="$f" -v l="$l" 'BEGIN { exit !(f < 0.8 * l) }' || fail "$1: the loss did not fall (first $l, final $f)"
  echo "$1: loss $l -> $f"
}
# The pid a process of the job printed first ("pid N") in its log.
pid_in() { grep -o "pid [0-9]*" "$1" | head -1 | awk '{print $2}'; }
