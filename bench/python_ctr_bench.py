"""Wide & deep on the parameter server: examples/python/wide_and_deep.py against dtrain-ctr.

    /usr/bin/python3 bench/python_ctr_bench.py [--build build] [--trials 2] [--modes sync async]

Both run apps/ctr.toml's model, tables and settings as `dtrain --server_num 1
--worker_num 2` jobs on the same generated click logs (apps/ctr.toml's: 4M
training lines, 50k test lines, written once into --data by `dtrain-ctr gen`).
Each trial runs the C++ app and the Python script back to back, the order
alternating, so the ratio of their examples/s is paired; it is pooled as the
geometric mean over the trials with a 95% interval. The table gives each
one's test AUC and training examples/s (all workers), and the Python
script's time per step: reading (waiting for the C++ reader's thread), the
forward and backward (the embeddings' pulls included) and the optimizer step
(the pushes).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_bench import pooled  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def run(build, data, work, mode, python):
    dtrain = os.path.join(build, "bin", "dtrain")
    common = ["--server_num", "1", "--worker_num", "2", "--log_dir", "log"]
    if python:
        args = [os.path.join(ROOT, "examples", "python", "wide_and_deep.py"), "--data_dir", data, "--mode", mode,
                "--log_every", "1000"]
    else:
        args = [os.path.join(ROOT, "apps", "ctr.toml"), "-o", f'data.dir="{data}"', "-o", "log.every_steps=1000",
                "-o", "checkpoint.every_steps=0", "-o", f'ps.checkpoint_dir="{work}/ck"',
                "-o", f"strategy.a_sync={'true' if mode == 'async' else 'false'}"]
    p = subprocess.run([dtrain, *common, *args], cwd=work, capture_output=True, text=True)
    log = open(os.path.join(work, "log", "workerlog.0")).read() if os.path.exists(
        os.path.join(work, "log", "workerlog.0")) else ""
    m = re.search(r"test auc ([0-9.]+) .*trained ([0-9.]+) s, ([0-9.]+) examples/s", log)
    if p.returncode != 0 or not m:
        sys.exit(f"{'python' if python else 'dtrain-ctr'} {mode} failed:\n{p.stdout}{p.stderr}{log}")
    split = re.search(r"per step: read ([0-9.]+) ms, forward\+backward ([0-9.]+) ms, step ([0-9.]+) ms", log)
    return float(m.group(1)), float(m.group(3)), split.groups() if split else None


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--build", default=os.path.join(ROOT, "build"))
    a.add_argument("--data", default=os.path.join(ROOT, "output", "ctr", "data"))
    a.add_argument("--trials", type=int, default=2)
    a.add_argument("--modes", nargs="+", default=["sync", "async"], choices=["sync", "async"])
    a = a.parse_args()
    if not os.path.exists(os.path.join(a.data, "train.txt")):
        subprocess.run([os.path.join(a.build, "bin", "dtrain-ctr"), "gen", "--dir", a.data, "--train_lines",
                        "4000000", "--test_lines", "50000"], check=True)
    print(f"# wide & deep, 1 server + 2 workers, apps/ctr.toml's settings, data {a.data}; {a.trials} paired trials")
    print(f"{'mode':>6} {'C++ auc':>8} {'Py auc':>8} {'C++ ex/s':>9} {'Py ex/s':>9}   Python / C++ examples/s"
          "        Python per step: read, fwd+bwd, step (ms)")
    for mode in a.modes:
        cpp, py = [], []
        for t in range(a.trials):
            for python in ([False, True] if t % 2 == 0 else [True, False]):
                with tempfile.TemporaryDirectory() as work:
                    (py if python else cpp).append(run(a.build, a.data, work, mode, python))
        r, lo, hi = pooled([p[1] / c[1] for c, p in zip(cpp, py)])
        splits = [p[2] for p in py if p[2]]
        split = ", ".join(f"{statistics.median(float(s[i]) for s in splits):.2f}" for i in range(3)) if splits else "-"
        print(f"{mode:>6} {statistics.median(c[0] for c in cpp):>8.4f} {statistics.median(p[0] for p in py):>8.4f} "
              f"{statistics.median(c[1] for c in cpp):>9.0f} {statistics.median(p[1] for p in py):>9.0f}   "
              f"{r:5.2f}x [{lo:4.2f}, {hi:4.2f}]             {split}", flush=True)


if __name__ == "__main__":
    main()
