"""A dead rank: a Python exception naming it in every survivor (ranks started without a
launcher), and the launcher's root cause naming it; a Python traceback reaches the report."""

import time

import pytest

from harness import rank_script, run_dtrain, run_ranks


@pytest.mark.parametrize("plugin", ["gloo", "ucx"])
def test_survivors_name_the_dead_rank(plugin):
    t0 = time.time()
    results = run_ranks(rank_script("kill.py"), 3, ["--plugin", plugin, "--victim", "1"],
                        env={"UCX_NET_DEVICES": "lo"}, timeout=120)
    assert results[1][0] == -9, results[1][1]
    for r in (0, 2):
        rc, out = results[r]
        assert rc == 3, f"rank {r} exited {rc} (3: its exception named rank 1):\n{out}"
    assert time.time() - t0 < 45  # within the 10 s timeout, plus start-up


def test_launcher_root_cause_names_the_dead_rank(tmp_path):
    rc, out, err = run_dtrain(["--nproc_per_node", "3", "--log_dir", str(tmp_path), rank_script("kill.py")],
                              timeout=120)
    assert rc != 0
    assert "root cause: worker rank 1 was killed by SIGKILL" in err, err


def test_python_traceback_in_the_report(tmp_path):
    rc, out, err = run_dtrain(["--nproc_per_node", "2", "--log_dir", str(tmp_path), rank_script("record_error.py")],
                              timeout=120)
    assert rc != 0
    assert "root cause: worker rank 1 exited with code 1" in err, err
    assert "ValueError: bad batch 7 in shard 1" in err, err
    assert "raise ValueError" in err, err  # the traceback itself
