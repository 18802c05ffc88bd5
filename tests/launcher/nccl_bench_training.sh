# dtrain-bench training --device: dtrain's one worker against PyTorch eager
# in Python (bench/eager_reference.py under a python with torch, no dtrain)
# and the same loop in C++, on the same device, model and batch.
# --device cuda is refused at once, before any worker starts, where libtorch
# sees no CUDA device (Debian's CPU libtorch, or no driver); with a GPU and a
# CUDA libtorch it runs the rows. --device cpu runs the same rows on the CPU:
# the three rows, the parameter counts (equal in C++ and Python), the paired
# ratio and its target line; a folder named torch/ on PYTHONPATH (as the Fleet
# API's folder was at the repository root before it became fleet/) must not
# pass for PyTorch. A python that cannot run the reference
# (/bin/false, one without torch, one building a narrower model, one whose
# model has the same count in another order) is refused at once, naming it and
# its error. --check compares the models for every name, odd widths and a
# list dataset's shape.
# bash nccl_bench_training.sh BUILD_DIR JOB_FILE
source "$(dirname "$0")/lib.sh"
JOB=$2
SRC=$(cd "$(dirname "$0")/../.." && pwd)
[ -x "$BIN/dtrain-bench-training" ] || fail "$BIN/dtrain-bench-training was not built"
[ -f "$BIN/eager_reference.py" ] || fail "$BIN/eager_reference.py was not copied next to dtrain-bench-training"
# The bench runs from a folder holding a torch/ without __init__.py (a namespace
# package that would shadow PyTorch), as the repository root did before fleet/.
RUN_DIR=$WORK/shadow
mkdir -p "$RUN_DIR/torch" && echo "# not PyTorch" >"$RUN_DIR/torch/README.md"
# The python whose torch runs the reference: python3 from PATH (the wheel's on a
# GPU machine) if it imports torch, else Debian's (python3-torch, scripts/setup.sh).
PY=
for p in python3 /usr/bin/python3; do
  "$p" -c 'import torch, sys; sys.exit(0 if torch.__file__ else 1)' >/dev/null 2>&1 && { PY=$(command -v "$p"); break; }
done
[ -n "$PY" ] || fail "no python3 imports torch (Debian: python3-torch, which scripts/setup.sh installs)"
BASE=(--steps 3 --warmup 1 --trials 2 -o train.batch_size=8 -o "train.threads=1")
SMALL=("${BASE[@]}" --python "$PY")
NUM='[0-9]+\.[0-9]+' INT='[0-9]+'
pair_ok() {  # pair_ok FILE DEVICE: the table has the three rows and the ratios, the first with its target
  grep -Eq "^# dtrain-bench training .* --device $2: .* on $2" "$1" || fail "$2: no header naming the device"
  grep -Eq "^# dtrain-bench training .*: model resnet20 width 1 \(272186 parameters in C\+\+ and in Python\)" "$1" ||
    fail "$2: the header does not give the parameter count of both models"
  grep -Eq "PyTorch eager \(Python\): .*/eager_reference.py under $PY \(Python [0-9.]+, torch [^ ]+ from /" "$1" ||
    fail "$2: the header does not name the python and torch of the reference"
  grep -Eq "^# trial 2: eager-python $INT eager-c\+\+ $INT dtrain $INT$" "$1" || fail "$2: trial 2 is not in rotated order"
  grep -Eq "^dtrain 1 worker +$NUM +$INT-$INT +$NUM " "$1" || fail "$2: no dtrain row"
  grep -Eq "^PyTorch eager \(Python\), 1 process +$NUM +$INT-$INT +$NUM +-$" "$1" || fail "$2: no PyTorch eager row"
  grep -Eq "^libtorch eager \(C\+\+\), 1 process +$NUM " "$1" || fail "$2: no libtorch eager (C++) row"
  grep -Eq '^dtrain 1 worker / PyTorch eager +[0-9.]+  \(95% CI [0-9.]+-[0-9.]+; .*\[target >= 1.00: (met|NOT met)\]$' \
    "$1" || fail "$2: no paired ratio with its target"
  grep -Eq '^dtrain 1 worker / libtorch eager \(C\+\+\) +[0-9.]+  \(95% CI [0-9.]+-[0-9.]+; [^[]*$' "$1" ||
    fail "$2: no dtrain / libtorch ratio (without a target)"
  grep -Eq '^libtorch eager \(C\+\+\) / PyTorch eager +[0-9.]+  \(95% CI ' "$1" || fail "$2: no C++ / Python ratio"
}
refused() {  # refused NAME PYTHON MESSAGE_REGEX [ENV...]: --device cpu with that python stops at once
  local name=$1 py=$2 msg=$3
  shift 3
  local t0 rc ms
  t0=$(date +%s%N)
  (cd "$RUN_DIR" && env "$@" timeout 60 "$BIN/dtrain-bench" training "$JOB" --device cpu "${BASE[@]}" --python "$py") \
    >"out.$name.txt" 2>"err.$name.txt"
  rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  cat "err.$name.txt"
  [ $rc = 1 ] || fail "$name: --python $py exited $rc, not 1"
  [ $ms -lt 15000 ] || fail "$name: the refusal took $ms ms"
  [ -s "out.$name.txt" ] && fail "$name: the refused run printed a table"
  grep -Eq "^dtrain-bench-training: error: $msg" "err.$name.txt" || fail "$name: the error is not /$msg/"
  [[ $name == mismatch || $name == layout ]] ||
    grep -q 'point --python at a python whose torch can run on cpu' "err.$name.txt" ||
    fail "$name: the error does not say to use --python"
}
cuda_torch=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU' &&
  ldd "$BIN/dtrain-bench-training" | grep -q 'libc10_cuda'; then
  cuda_torch=1
fi
t0=$(date +%s%N)
timeout 300 "$BIN/dtrain-bench" training "$JOB" --device cuda "${SMALL[@]}" >out.cuda.txt 2>err.cuda.txt
rc=$?
elapsed_ms=$((($(date +%s%N) - t0) / 1000000))
cat out.cuda.txt err.cuda.txt
if [ $cuda_torch = 1 ]; then
  [ $rc = 0 ] || fail "--device cuda on a GPU with a CUDA libtorch exited $rc"
  pair_ok out.cuda.txt cuda:0
else
  [ $rc = 1 ] || fail "--device cuda without a CUDA libtorch exited $rc, not 1"
  [ $elapsed_ms -lt 10000 ] || fail "the refusal took $elapsed_ms ms"
  grep -q '^dtrain-bench-training: error: --device cuda: train.device: wants cuda:0 .* but no CUDA device is visible to libtorch' \
    err.cuda.txt || fail "the refusal does not say that libtorch sees no CUDA device"
  grep -q 'without --device dtrain-bench training runs its CPU rows' err.cuda.txt || fail "no hint what to run instead"
  [ -s out.cuda.txt ] && fail "the refused run printed a table"
fi
# From that folder, with it on PYTHONPATH too: its torch/ (no __init__.py) would
# be a namespace package `torch` wherever no PyTorch is found.
(cd "$RUN_DIR" && PYTHONPATH=$RUN_DIR timeout 300 "$BIN/dtrain-bench" training "$JOB" --device cpu "${SMALL[@]}") \
  >"$WORK/out.cpu.txt" 2>"$WORK/err.cpu.txt" || fail "--device cpu exited $?"
cat out.cpu.txt
pair_ok out.cpu.txt cpu

printf '#!/bin/sh\nexec %s -S "$@"\n' "$PY" >nosite.sh  # no site-packages: no torch
printf '#!/bin/sh\nexec %s "$@" --width 0.5\n' "$PY" >narrow.sh  # the real script, building a narrower ResNet
chmod +x nosite.sh narrow.sh
refused false /bin/false "the PyTorch eager reference \(.*eager_reference.py\) cannot run under /bin/false: exited with code 1 without an EAGER-PROBE line"
refused missing /no/such/python "the PyTorch eager reference runs under --python /no/such/python, which is not an executable file"
refused notonpath no-such-python3 "the PyTorch eager reference runs under no-such-python3, but there is no no-such-python3 on PATH"
refused nosite "$WORK/nosite.sh" "the PyTorch eager reference \(.*\) cannot run under $WORK/nosite.sh: cannot import torch \(.*\): ModuleNotFoundError: No module named 'torch'" \
  PYTHONPATH="$RUN_DIR"
refused mismatch "$WORK/narrow.sh" "the PyTorch eager reference's resnet20 \(width 1, 1 input channels, 10 classes\) has 68642 parameters, dtrain's \(C\+\+, apps/common/models.cc\) has 272186: .*eager_reference.py builds a different model"
# The same count in another order: blocks and classifier swapped in a copy of the script.
"$PY" - "$SRC/bench/eager_reference.py" "$WORK/swapped.py" <<'PYEOF' || fail "cannot make the swapped copy"
import sys
s = open(sys.argv[1]).read()
a = "        self.blocks = nn.Sequential(*blocks)\n        self.fc = nn.Linear(out_channels, classes)\n"
assert a in s, "eager_reference.py no longer declares blocks then fc"
open(sys.argv[2], "w").write(s.replace(a, "\n".join(reversed(a.rstrip("\n").split("\n"))) + "\n"))
PYEOF
printf '#!/bin/sh\nshift\nexec %s %s "$@"\n' "$PY" "$WORK/swapped.py" >swapped.sh
chmod +x swapped.sh
refused layout "$WORK/swapped.sh" "the PyTorch eager reference's resnet20 has dtrain's 272186 parameters but other shapes or another order \(layout [0-9a-f]{16} in Python, [0-9a-f]{16} in C\+\+, apps/common/models.cc\)"

# --check: every model of apps/common/models.cc, odd widths (rounding) and a
# list dataset's shape build the same model in Python; at 3x32x32 and 1000
# classes resnet18 and resnet50 have torchvision's counts.
check() {  # check EXPECTED_PARAMS|any -o KEY=VALUE...
  local want=$1
  shift
  timeout 60 "$BIN/dtrain-bench" training "$JOB" --device cpu --python "$PY" --check "$@" >out.check.txt \
    2>err.check.txt || fail "--check $*: exited $?"
  grep -Eq '^# --check: the PyTorch eager reference builds the same model \([0-9]+ parameters\); no trial run$' \
    out.check.txt || fail "--check $*: no verdict"
  [ "$want" = any ] || grep -q "^# --check: .* ($want parameters)" out.check.txt || fail "--check $*: not $want parameters"
}
LIST=(-o 'data.dataset="list"' -o data.channels=3 -o data.image_size=32 -o data.num_classes=1000)
check any -o model.name=resnet32 -o model.width=0.53125
check any -o model.name=resnet56 -o model.width=1.3
check any -o model.name=resnet18 -o model.width=0.25
check any -o model.name=resnet50 -o model.width=0.75
check 11689512 "${LIST[@]}" -o model.name=resnet18
check 25557032 "${LIST[@]}" -o model.name=resnet50
echo "PASS"
