#!/usr/bin/env bash
# Elastic training beyond CI (docs/elastic.md), on network-namespace machines:
# launcher.netns_elastic in full mode (adds ZeRO stage 2), a seeded chaos run
# and the evaluation against three seeds of a fixed run. Prints each part's
# time; exits non-zero when one fails.
#   scripts/elastic_check.sh [BUILD_DIR] [SEED]     (root, for the namespaces)
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$src/build}" && pwd)
seed=${2:-$RANDOM}
failed=0
run() {
  local what=$1
  shift
  local t0=$(date +%s)
  echo "== $what"
  "$@" 2>&1 | grep -E "^(PASS|FAIL|SKIP|chaos|fixed|---|    )" | grep -v "^    |"
  local rc=${PIPESTATUS[0]}
  echo "== $what: $([ $rc = 0 ] && echo pass || echo "FAIL (exit $rc)") in $(($(date +%s) - t0)) s"
  [ $rc = 0 ] || failed=1
}
run "three machines: kill, cut link, join, below MIN, ZeRO stage 2" \
  bash "$src/tests/launcher/netns_elastic.sh" "$BUILD" full
run "chaos, seed $seed" bash "$src/tests/launcher/netns_elastic.sh" "$BUILD" chaos "$seed"
run "evaluation against 3 seeds of a fixed run" bash "$src/tests/launcher/netns_elastic.sh" "$BUILD" eval
exit $failed
