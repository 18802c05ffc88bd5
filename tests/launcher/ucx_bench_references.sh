# dtrain-bench collectives --backend ucx with every reference built here (raw
# Gloo in the ranks, Open MPI under mpirun beside them) at small sizes, with
# iterations sized automatically: it must finish and print a full table row
# for every size. Each implementation sizes its own iterations from its own
# warm-up (raw Gloo's op is ~1000x dtrain-ucx's; with dtrain's count it ran
# for hours). No timing is checked.
source "$(dirname "$0")/lib.sh"
[ -x "$BIN/dtrain-bench" ] || fail "$BIN/dtrain-bench was not built"
# The ranks rerun the bench's own command line: a link named with $TAG marks them.
BENCH="$WORK/dtrain-bench-$TAG"
ln -s "$BIN/dtrain-bench" "$BENCH"
mpi=0
if [ -x "$BIN/dtrain-bench-mpi" ] && command -v mpirun >/dev/null; then mpi=1; fi
t0=$(date +%s%N)
timeout 150 "$BENCH" collectives --backend ucx --world-size 2 -b 8 -e 32K -f 8 --target-ms 2 --trials 5 \
  --time-limit 120 >out.txt 2>err.txt || fail "dtrain-bench exited $?"
elapsed_ms=$((($(date +%s%N) - t0) / 1000000))
cat out.txt
grep -q "^# raw Gloo: the gloo plugin's algorithm" out.txt || {
  grep '^# raw Gloo:' out.txt
  [ -e "$BUILD/lib/dtrain/plugins/libdtrain_gloo.so" ] && fail "Gloo is built here but the raw-Gloo reference is off"
  fail "no raw-Gloo reference (dtrain-bench was built without Gloo)"
}
num='[0-9.]+'
if [ $mpi = 1 ]; then
  grep -q "^# Open MPI: MPI_Allreduce in place (Open MPI's default transport" out.txt || fail "Open MPI did not run"
  mpi_cols="$num +$num"
  ratio_cols="$num +$num +$num-$num"
else
  echo "note: no Open MPI reference here (dtrain-bench-mpi or mpirun missing)"
  mpi_cols="- +-"
  ratio_cols="$num +- +-"
fi
# size count type algo | dtrain time algbw busbw | Gloo time busbw | MPI time busbw | ratios | dt-gloo
row="^ +[0-9]+ +[0-9]+ +f32 +- +$num +$num +$num +$num +$num +$mpi_cols +$ratio_cols +[-+]$num\$"
rows=$(grep -Ec "$row" out.txt)
[ "$rows" = 5 ] || fail "$rows of 5 sizes (8 B .. 32 KiB) have dtrain, raw Gloo$([ $mpi = 1 ] && echo ", Open MPI") and the ratios"
grep -q '^# wall time: ' out.txt || fail "no wall time line"
expect_no_leftovers
echo "PASS: dtrain-bench collectives --backend ucx with raw Gloo$([ $mpi = 1 ] && echo " and Open MPI") in ${elapsed_ms} ms"
