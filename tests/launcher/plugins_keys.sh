# `dtrain plugins --keys` lists each backend's keys as the plugin declares
# them (its SDK ConfigTable, through the ABI's key table): name, type, default
# and doc, an int key's bound at the end of its doc. Plain `dtrain plugins`
# lists no keys.
source "$(dirname "$0")/lib.sh"
PLUGINS=$BUILD/lib/dtrain/plugins
"$BIN/dtrain" plugins --keys >out.txt 2>err.txt || fail "dtrain plugins --keys exited $?"
# The lines of one backend's key section.
section() { awk -v h="[$1] keys" 'index($0, h) == 1 {on = 1; next} on && /^$/ {exit} on' out.txt; }
checked=0
if [ -f "$PLUGINS/libdtrain_ucx.so" ]; then
  section ucx >ucx.txt
  grep -Eq '^  chunk_bytes +int +131072 +ring pipeline chunk.*\(at least 4096\)$' ucx.txt ||
    fail "the ucx keys do not list chunk_bytes with its default and bound"
  grep -Eq '^  pipeline_depth +int +8 +.*\(at least 1\)$' ucx.txt || fail "no pipeline_depth with its bound"
  grep -Eq '^  algorithm +string +"auto" +all-reduce algorithm' ucx.txt || fail "no ucx algorithm key"
  [ "$(grep -c '^  ' ucx.txt)" -eq 12 ] || fail "the ucx section does not hold its 12 keys"
  checked=$((checked + 1))
fi
if [ -f "$PLUGINS/libdtrain_gloo.so" ]; then
  section gloo >gloo.txt
  grep -Eq '^  bcube_base +int +2 +group size of the bcube algorithm \(at least 2\)$' gloo.txt ||
    fail "the gloo keys do not list bcube_base with its bound"
  checked=$((checked + 1))
fi
if [ -f "$PLUGINS/libdtrain_ps_grpc.so" ]; then
  section ps_grpc >ps.txt
  grep -Eq '^  channels +int +1 +.*\(in \[1, 64\]\)$' ps.txt || fail "the ps_grpc keys do not list channels' bound"
  checked=$((checked + 1))
fi
[ "$checked" -gt 0 ] || { echo "SKIP: none of ucx, gloo, ps_grpc is built"; exit 77; }
"$BIN/dtrain" plugins >plain.txt 2>err.txt || fail "dtrain plugins exited $?"
grep -q '] keys' plain.txt && fail "plain dtrain plugins lists keys"
cat ucx.txt 2>/dev/null
echo "PASS: dtrain plugins --keys lists the keys with their bounds ($checked backends)"
