"""The c10d op suite and DDP over the "dtrain" backend, on the gloo and ucx plugins."""

import os

import pytest
import torch

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
            # Where c10d Gloo has no float16, the hook is compared with float32 DDP (not bit for bit).
            assert out.count("bit for bit") == (2 if "has no float16" in out else 3), out


# 1.13's torch.distributed.fsdp does not import under Python 3.11, and has no
# fully_shard; scripts/torch2_check.sh runs this under Debian's torch 2.x.
@pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2, reason="FSDP over dtrain needs torch 2.x")
@pytest.mark.parametrize("plugin", ["gloo", "ucx"])
def test_fsdp_matches_one_process_and_c10d_gloo(plugin):
    results = run_ranks(rank_script("fsdp.py"), 2, ["--plugin", plugin], env=UCX_ENV)
    assert_all_ok(results)
    for rc, out in results:
        assert "fsdp checks passed" in out
        assert out.count("vs one process") == 2, out
