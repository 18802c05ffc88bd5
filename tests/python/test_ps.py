"""dtrain.fleet's parameter-server half and dtrain.nn.SparseEmbedding, on real ps_grpc servers.

The wide & deep example (examples/python/wide_and_deep.py) against dtrain-ctr on the same
generated click logs: the same losses and AUC in sync mode (2 workers) and in async and GEO
(1 worker, where the order of pushes is fixed); save and load onto another server count
through init_server(dirname); a killed server named in every worker; misuse named.
"""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

import harness

CTR_TOML = os.path.join(harness.HERE, "..", "..", "apps", "ctr.toml")
WIDE_AND_DEEP = os.path.join(harness.EXAMPLES, "wide_and_deep.py")
PS = harness.rank_script("ps.py")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from dtrain import _ext
    d = str(tmp_path_factory.mktemp("ctr") / "data")
    _ext.load("_ctr").generate(d, 20000, 2000, seed=3)
    return d


def losses(log, prefix):
    """(step, loss) of every progress line, and the test AUC line's auc."""
    steps = [(int(m.group(1)), float(m.group(2))) for m in re.finditer(prefix + r": epoch \d+/\d+ step (\d+)/\d+ loss "
                                                                                r"([0-9.]+)", log)]
    auc = re.search(prefix + r": test auc ([0-9.]+)", log)
    assert steps and auc, log
    return steps, float(auc.group(1))


def run_job(tmp_path, name, servers, workers, program, args):
    rc, out, err = harness.run_dtrain(["--server_num", str(servers), "--worker_num", str(workers), "--log_dir",
                                       name, program, *args], cwd=tmp_path)
    log = (tmp_path / name / "workerlog.0").read_text()
    assert rc == 0, out + err + log
    return log


def cpp_and_python(tmp_path, data, workers, mode, cpp_overrides, py_args):
    common_cpp = ["-o", f'data.dir="{data}"', "-o", "log.every_steps=5", "-o", "checkpoint.every_steps=0",
                  "-o", f'ps.checkpoint_dir="{tmp_path}/ck_{mode}"']
    cpp = run_job(tmp_path, f"cpp_{mode}", 1, workers, CTR_TOML, [*common_cpp, *cpp_overrides])
    py = run_job(tmp_path, f"py_{mode}", 1, workers, WIDE_AND_DEEP,
                 ["--data_dir", data, "--log_every", "5", "--mode", mode, *py_args])
    return losses(cpp, "ctr"), losses(py, "wide_and_deep")


def assert_same(cpp, py):
    (cpp_steps, cpp_auc), (py_steps, py_auc) = cpp, py
    assert [s for s, _ in cpp_steps] == [s for s, _ in py_steps]
    for (s, a), (_, b) in zip(cpp_steps, py_steps):
        assert abs(a - b) <= 1.5e-4, f"step {s}: dtrain-ctr loss {a}, Python {b}"
    assert abs(cpp_auc - py_auc) <= 1.5e-4, f"test auc: dtrain-ctr {cpp_auc}, Python {py_auc}"


def test_sync_equals_the_cpp_app(tmp_path, data):
    cpp, py = cpp_and_python(tmp_path, data, 2, "sync", ["-o", "strategy.a_sync=false"], [])
    assert_same(cpp, py)
    steps = py[0]
    assert steps[-1][1] < steps[0][1] - 0.05, f"the loss did not fall: {steps}"
    assert py[1] > 0.6


def test_async_and_geo_equal_the_cpp_app_on_one_worker(tmp_path, data):
    # One worker, and no push left in flight (send_queue_size 0): nothing interleaves, so the
    # runs are deterministic. test_async_two_workers_learn has pushes in flight.
    cpp, py = cpp_and_python(tmp_path, data, 1, "async", ["-o", "strategy.a_sync_configs.send_queue_size=0"],
                             ["--send_queue_size", "0"])
    assert_same(cpp, py)
    cpp, py = cpp_and_python(tmp_path, data, 1, "geo", ["-o", "strategy.a_sync_configs.k_steps=4"],
                             ["--k_steps", "4"])
    assert_same(cpp, py)


def test_async_two_workers_learn(tmp_path, data):
    log = run_job(tmp_path, "async2", 1, 2, WIDE_AND_DEEP, ["--data_dir", data, "--log_every", "5"])
    steps, auc = losses(log, "wide_and_deep")
    assert steps[-1][1] < steps[0][1] - 0.05 and auc > 0.6, log


def values(log):
    m = re.search(r"^values (\[.*\])$", log, re.M)
    assert m, log
    return m.group(1)


def test_save_on_two_servers_load_on_one(tmp_path):
    saved = run_job(tmp_path, "save", 2, 2, PS, ["save", str(tmp_path / "model")])
    loaded = run_job(tmp_path, "load", 1, 1, PS, ["load", str(tmp_path / "model")])
    assert values(saved) == values(loaded)
    fresh = run_job(tmp_path, "fresh", 1, 1, PS, ["fresh"])
    assert values(fresh) != values(saved), "training changed nothing"


def test_delta_save_holds_the_rows_changed_since_the_base(tmp_path):
    log = run_job(tmp_path, "delta", 1, 1, PS, ["delta", str(tmp_path / "saves")])
    assert re.search(r"^base \[3, 5, 7, 11\] delta \[3\]$", log, re.M), log


def test_role_errors_name_the_role(tmp_path):
    run_job(tmp_path, "roles", 1, 2, PS, ["roles"])
    server = (tmp_path / "roles" / "serverlog.0").read_text()
    worker = (tmp_path / "roles" / "workerlog.1").read_text()
    assert "init_worker: fleet.init_worker is a worker call, but this process is server 0" in server
    assert "run_server: fleet.run_server is a server call, but this process is worker 1" in worker


@pytest.mark.parametrize("what,expected", [
    ("mismatch", r"table 't' was declared differently by worker \d: dim is \d here and \d in the request"),
    ("optimizer", "RMSprop has no server-side rule"),
])
def test_misuse_is_refused_by_name(tmp_path, what, expected):
    rc, out, err = harness.run_dtrain(["--server_num", "1", "--worker_num", "2", "--log_dir", what, PS, what],
                                      cwd=tmp_path)
    assert rc != 0 and re.search(expected, out + err), out + err


def paddle_env(role, port, trainer_id=0):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DTRAIN_", "PADDLE_")) and k not in ("TRAINING_ROLE", "POD_IP")}
    env.update(PADDLE_PSERVERS_IP_PORT_LIST=f"127.0.0.1:{port}", PADDLE_TRAINERS_NUM="2", POD_IP="127.0.0.1",
               TRAINING_ROLE=role, PADDLE_PORT=str(port if role == "PSERVER" else harness.free_port()),
               PADDLE_TRAINER_ID=str(trainer_id), OMP_NUM_THREADS="1")
    return env


def test_a_killed_server_is_named_in_every_worker(tmp_path, data):
    # Paddle's variables set by hand, no launcher (it would stop the workers at the server's exit).
    port = harness.free_port()
    args = [sys.executable, "-u", WIDE_AND_DEEP, "--data_dir", data, "--mode", "sync", "--log_every", "1",
            "--sleep_ms", "100", "--timeout_s", "10"]
    server = subprocess.Popen(args, env=paddle_env("PSERVER", port), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    workers = [subprocess.Popen(args, env=paddle_env("TRAINER", port, w), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=tmp_path) for w in (0, 1)]
    try:
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in workers[0].stdout] + [lines.put("")],
                         daemon=True).start()
        first, deadline = "", time.monotonic() + 120
        while "step 3/" not in first:
            first = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert first, "worker 0 ended before step 3"
        server.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        out1 = workers[1].communicate(timeout=60)[0]
        workers[0].wait(timeout=60)
        rest = []
        while (line := lines.get(timeout=10)):
            rest.append(line)
        outs = [first + "".join(rest), out1]
        took = time.monotonic() - killed
    finally:
        for p in [server, *workers]:
            if p.poll() is None:
                p.kill()
                p.wait()
    for w, (p, out) in enumerate(zip(workers, outs)):
        assert p.returncode != 0, f"worker {w} exited 0 after the server was killed:\n{out}"
        assert re.search(r"(parameter )?server 0\b", out) and "Traceback" in out, f"worker {w}:\n{out}"
    assert took < 30, f"the workers took {took:.0f} s to fail (timeout_s 10)"
