"""The c10d op suite and DDP over the "dtrain" backend, on the gloo and ucx plugins."""

import os

import pytest

from harness import assert_all_ok, rank_script, run_ranks

UCX_ENV = {"UCX_NET_DEVICES": "lo"}


@pytest.mark.parametrize("plugin", ["gloo", "ucx"])
def test_every_op_and_dtype(plugin):
    results = run_ranks(rank_script("ops.py"), 3, ["--plugin", plugin], env=UCX_ENV)
    assert_all_ok(results)
    for rc, out in results:
        assert "checks passed" in out


# scripts/python_check.sh (DTRAIN_PYTHON_HEAVY=1) adds ucx at 4 ranks.
DDP_CASES = [("gloo", 2), ("ucx", 2), ("gloo", 4)] + ([("ucx", 4)] if os.environ.get("DTRAIN_PYTHON_HEAVY") else [])


@pytest.mark.parametrize("plugin,world", DDP_CASES)
def test_ddp_matches_c10d_gloo(plugin, world):
    results = run_ranks(rank_script("ddp.py"), world, ["--plugin", plugin], env=UCX_ENV)
    assert_all_ok(results)
    if world == 2:
        for rc, out in results:
            assert out.count("bit for bit") == 3, out
