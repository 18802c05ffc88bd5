#!/usr/bin/env bash
# The C++ Fleet API (dtrain::fleet) as a user sees it.
#   fleet_test.sh package BUILD EXAMPLE WORKDIR   install dtrain to a prefix, build examples/resnet_fleet
#       from an unrelated folder with find_package(dtrain COMPONENTS torch), run it with 2 workers under
#       the dtrain launcher, under mpirun -np 2 and under torchrun-style variables: loss falls, the
#       workers' parameters are identical at the end
#   fleet_test.sh misuse DTRAIN MISUSE WORKDIR    wrappers before init(), a model that differs between
#       ranks, parameter-server mode, two backwards in one step: clear errors
# Exit 77 (skipped) when the Fashion-MNIST package is not installed.
set -euo pipefail
mode=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT DTRAIN_RANK PADDLE_TRAINER_ID SLURM_PROCID \
      OMPI_COMM_WORLD_RANK || true

# check_run NAME LOG0 LOG1 ...: loss falls on worker 0, all workers print the same parameter hash.
check_run() {
  local name=$1 log0=$2
  shift
  sed -n 's/^\[Epoch \([0-9]*\), batch \([0-9]*\)\] loss \([0-9.eE+-]*\), acc1 .*$/\1 \2 \3/p' "$log0" > "$name.losses"
  local n
  n=$(wc -l < "$name.losses")
  (( n >= 6 )) || { cat "$@" >&2; fail "$name: expected at least 6 progress lines, got $n"; }
  local first last
  first=$(head -2 "$name.losses" | awk '{s += $3} END {print s / NR}')
  last=$(tail -2 "$name.losses" | awk '{s += $3} END {print s / NR}')
  awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < 0.8 * a)}' || fail "$name: loss did not fall: $first -> $last"
  local hashes
  hashes=$(cat "$@" | sed -n 's/^worker [0-9]*\/2 done: .*params fnv1a64 \([0-9a-f]*\)$/\1/p')
  [[ $(wc -l <<< "$hashes") == 2 ]] || { cat "$@" >&2; fail "$name: expected 2 finished workers"; }
  [[ $(sort -u <<< "$hashes" | wc -l) == 1 ]] || fail "$name: the workers' parameters differ: $hashes"
  echo "ok $name: loss $first -> $last, parameters identical ($(head -1 <<< "$hashes"))"
}

case $mode in
package)
  build=$2 example=$3 work=$4
  data=/usr/share/datasets/fashion-mnist
  [[ -e $data/train-images-idx3-ubyte.gz ]] || { echo "SKIP: $data missing"; exit 77; }
  rm -rf "$work" && mkdir -p "$work" && cd "$work"
  cmake --install "$build" --prefix "$work/prefix" > install.log
  for f in lib/libdtrain_fleet.so include/dtrain/fleet/fleet.h lib/cmake/dtrain/dtrainFleetTargets.cmake; do
    [[ -e prefix/$f ]] || fail "the install has no $f"
  done
  # Round 3's names still build, with a warning: find_package(dtrain COMPONENTS
  # torch), the target dtrain::torch and <dtrain/torch/...> (preprocessed only:
  # the forwards are headers and an alias, and a libtorch compile costs ~20 s).
  mkdir -p old/src
  printf '%s\n' 'cmake_minimum_required(VERSION 3.20)' 'project(old LANGUAGES CXX)' \
    'find_package(dtrain REQUIRED COMPONENTS torch)' 'add_library(old OBJECT old.cc)' \
    'target_link_libraries(old PRIVATE dtrain::torch)' 'target_compile_options(old PRIVATE -E)' > old/src/CMakeLists.txt
  printf '#include <dtrain/torch/fleet.h>\nusing Old = dtrain::torch::DataParallel;\n' > old/src/old.cc
  cmake -S old/src -B old/build -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" > old.log 2>&1 \
    && cmake --build old/build >> old.log 2>&1 || { cat old.log >&2; fail "round 3's names (dtrain/torch/, dtrain::torch) do not build"; }
  grep -q 'is deprecated' old.log || { cat old.log >&2; fail "the deprecated names build without a warning"; }
  # An unrelated folder: only the installed package is visible to the example.
  mkdir -p user && cp -r "$example"/. user/src
  cmake -S user/src -B user/build -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release \
      > configure.log 2>&1 || { cat configure.log >&2; fail "configuring the example failed"; }
  cmake --build user/build > build.log 2>&1 || { cat build.log >&2; fail "building the example failed"; }
  prog=$work/user/build/resnet_fleet
  args=(--batches 40 --batch_size 32)

  timeout 300 prefix/bin/dtrain --nproc_per_node 2 --log_dir log -- "$prog" "${args[@]}" > launcher.out 2>&1 \
    || { cat launcher.out log/workerlog.* >&2; fail "the run under the dtrain launcher failed"; }
  check_run launcher log/workerlog.0 log/workerlog.1

  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_if_include=lo
  command -v mpirun > /dev/null || fail "mpirun is not installed (Debian: openmpi-bin)"
  timeout 300 mpirun -np 2 --output-filename mpi "$prog" "${args[@]}" > mpirun.out 2>&1 \
    || { cat mpirun.out >&2; fail "the run under mpirun failed"; }
  check_run mpirun mpi/*/rank.0/stdout mpi/*/rank.1/stdout

  port=$((20000 + RANDOM % 20000))
  pids=()
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout 300 "$prog" "${args[@]}" > torchrun.$r.out 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do wait "${pids[$r]}" || { cat torchrun.$r.out >&2; fail "torchrun-style rank $r failed"; }; done
  check_run torchrun torchrun.0.out torchrun.1.out

  # The parameter-server example (examples/wide_deep_fleet) from the same package:
  # 1 server and 2 workers, async and sync; the loss falls on every worker.
  [[ -e prefix/lib/dtrain/plugins/libdtrain_ps_grpc.so ]] || fail "the install has no ps_grpc plugin"
  mkdir -p ps_user && cp -r "$example/../wide_deep_fleet"/. ps_user/src
  cmake -S ps_user/src -B ps_user/build -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release \
      > ps_configure.log 2>&1 || { cat ps_configure.log >&2; fail "configuring the PS example failed"; }
  cmake --build ps_user/build > ps_build.log 2>&1 || { cat ps_build.log >&2; fail "building the PS example failed"; }
  for m in async sync; do
    flag=(); [[ $m == sync ]] && flag=(--sync)
    timeout 300 prefix/bin/dtrain --server_num 1 --worker_num 2 --log_dir pslog_$m -- \
        "$work/ps_user/build/wide_deep_fleet" --steps 150 --save_dir "$work/model_$m" "${flag[@]}" > ps_$m.out 2>&1 \
      || { cat ps_$m.out pslog_$m/*log.* >&2; fail "the PS example ($m) failed"; }
    grep -q "all workers done; stopping 1 server" ps_$m.out || { cat ps_$m.out >&2; fail "PS $m: no stop line"; }
    for w in 0 1; do
      line=$(grep -m1 "^worker $w/2 done: loss" pslog_$m/workerlog.$w) || { cat pslog_$m/workerlog.$w >&2; fail "PS $m: worker $w did not finish"; }
      read -r first last < <(sed -E 's/.*loss ([0-9.]+) -> ([0-9.]+).*/\1 \2/' <<< "$line")
      awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < 0.9 * a)}' || fail "PS $m worker $w: loss did not fall: $line"
      echo "ok PS example $m, worker $w: $line"
    done
    for t in embedding wide dense.0.weight; do
      [[ -e model_$m/$t/MANIFEST ]] || fail "PS $m: save_persistables wrote no model_$m/$t/MANIFEST"
    done
  done
  echo PASS
  ;;
misuse)
  dtrain=$2 misuse=$3 work=$4
  rm -rf "$work" && mkdir -p "$work" && cd "$work"
  expect() {  # expect NAME PATTERN
    grep -qF -- "$2" "$1.out" || { cat "$1.out" >&2; fail "$1: no '$2' in the output"; }
    echo "ok $1: $(grep -m1 -F -- "$2" "$1.out")"
  }
  timeout 60 "$misuse" before_init > before_init.out 2>&1 || { cat before_init.out >&2; fail "before_init"; }
  expect before_init "distributed_model: error: dtrain::fleet::distributed_model called before dtrain::fleet::init()"
  expect before_init "distributed_optimizer: error: dtrain::fleet::distributed_optimizer called before dtrain::fleet::init()"
  expect before_init "worker_index: error: dtrain::fleet::worker_index called before dtrain::fleet::init()"
  timeout 60 "$misuse" ps > ps.out 2>&1 || { cat ps.out >&2; fail "ps"; }
  expect ps "needs a parameter-server job, but this one is collective"
  timeout 120 "$dtrain" --nproc_per_node 2 --log_dir log -- "$misuse" mismatch > mismatch.out 2>&1 \
    || { cat mismatch.out log/workerlog.* >&2; fail "mismatch: a worker did not report the error"; }
  cp log/workerlog.1 mismatch1.out
  timeout 120 "$dtrain" --nproc_per_node 2 --log_dir log2 -- "$misuse" backward_twice > twice.out 2>&1 \
    || { cat twice.out log2/workerlog.* >&2; fail "backward_twice: a worker did not report the error"; }
  for r in 0 1; do
    cp log2/workerlog.$r twice$r.out
    expect twice$r "second backward: error: DataParallel: parameter 'bias' got a gradient from a second backward"
  done
  expect mismatch1 "model parameters differ between ranks: parameter #2 is '2.weight' [9, 8] on rank 1 but '2.weight' [8, 8] on rank 0"
  cp log/workerlog.0 mismatch0.out
  expect mismatch0 "model parameters differ between ranks"
  echo PASS
  ;;
*) echo "unknown mode $mode" >&2; exit 2 ;;
esac
