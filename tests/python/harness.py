"""Starts ranks without a launcher (torchrun's variables set by hand) and runs dtrain jobs."""

import os
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("DTRAIN_BUILD", os.path.join(HERE, "..", "..", "build"))
DTRAIN = os.path.join(BUILD, "bin", "dtrain")
EXAMPLES = os.path.join(HERE, "..", "..", "examples", "python")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_script(name):
    return os.path.join(HERE, "ranks", name)


def run_ranks(script, world, args=(), env=None, timeout=180):
    """Runs `python3 script args` as ranks 0..world-1 of an env:// job; returns [(returncode, output)]."""
    port = free_port()
    procs = []
    for r in range(world):
        e = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", **(env or {}))
        procs.append(subprocess.Popen([sys.executable, "-u", script, *args], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            results.append((p.returncode, out))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        outs = [p.communicate()[0] for p in procs]
        raise AssertionError(f"ranks still running after {timeout} s:\n" + "\n".join(outs))
    return results


def assert_all_ok(results):
    for r, (rc, out) in enumerate(results):
        assert rc == 0, f"rank {r} exited {rc}:\n{out}"


def run_dtrain(args, timeout=300, env=None, cwd=None):
    """Runs the dtrain launcher; returns (returncode, stdout, stderr)."""
    p = subprocess.run([DTRAIN, *args], capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})), cwd=cwd)
    return p.returncode, p.stdout, p.stderr
