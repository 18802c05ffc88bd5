"""dtrain.fleet: Paddle's DistributedStrategy checked by the C++ reader, its strategies acting,
and the examples under dtrain and under torchrun."""

import os
import re
import sys

import pytest

from harness import EXAMPLES, assert_all_ok, free_port, rank_script, run_dtrain, run_ranks

from dtrain import fleet


def test_strategy_attributes_are_checked():
    s = fleet.DistributedStrategy()
    s.fuse_grad_size_in_MB = 8
    s.gradient_merge = True
    s.gradient_merge_configs = {"k_steps": 4}
    o = s.options()
    assert o["gradient_merge_k_steps"] == 4 and o["bucket_bytes"] == 8 << 20
    with pytest.raises(AttributeError, match="did you mean 'fuse_grad_size_in_MB'"):
        s.fuse_grad_size_in_mb = 8
    with pytest.raises(AttributeError, match="did you mean 'gradient_merge_configs'"):
        s.gradient_merge_config = {"k_steps": 2}
    with pytest.raises(ValueError, match="k_steps"):
        s.gradient_merge_configs = {"k_step": 2}
    with pytest.raises(ValueError, match="k_steps"):
        fleet.DistributedStrategy().gradient_merge_configs = {"k_steps": 0}
    with pytest.raises(ValueError, match="lamb"):
        fleet.DistributedStrategy().lamb = True
    g = fleet.DistributedStrategy()
    g.a_sync = True
    g.a_sync_configs = {"k_steps": 8}
    assert g.options()["ps_mode"] == "geo"


def test_strategies_act():
    assert_all_ok(run_ranks(rank_script("fleet.py"), 2))


def checksum(text):
    found = re.findall(r"parameter checksum (-?[0-9.]+)", text)
    assert found, text
    return found[0]


def test_ddp_example_same_under_every_launcher(tmp_path):
    script = os.path.join(EXAMPLES, "ddp_torchrun.py")
    args = [script, "--steps", "8"]
    rc, out, err = run_dtrain(["--nproc_per_node", "2", "--log_dir", str(tmp_path / "a"), *args])
    assert rc == 0, err
    plain = checksum(out)
    for backend in ("gloo", "ucx"):
        rc, out, err = run_dtrain(["--nproc_per_node", "2", "--backend", backend, "--log_dir", str(tmp_path / backend),
                                   *args, "--import", "dtrain.torch", "--backend", "dtrain"],
                                  env={"UCX_NET_DEVICES": "lo"})
        assert rc == 0, err
        assert checksum(out) == plain, f"dtrain ({backend}) and c10d Gloo trained differently"
    import subprocess
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        # torch 1.13's torchrun under Python 3.11 cannot parse the defaults 0 of these.
                        "--redirects", "1", "--tee", "1", "--log_dir", str(tmp_path / "torchrun"),
                        *args, "--import", "dtrain.torch", "--backend", "dtrain"],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0 and "PyTorch was built without libuv support" in p.stderr:
        # Debian's torch 2.14 (scripts/torch2_check.sh): its torchrun asks its own TCPStore for libuv.
        pytest.skip("this torch's torchrun cannot start its store (built without libuv, which torchrun asks for)")
    assert p.returncode == 0, p.stderr
    assert checksum(p.stdout) == plain, "under torchrun it trained differently"


def test_fleet_example_trains(tmp_path):
    args = [os.path.join(EXAMPLES, "train_fleet_dygraph.py"), "--images", "640", "--test_images", "400"]
    rc, out, err = run_dtrain(["--nproc_per_node", "2", "--log_dir", str(tmp_path / "d"), *args], timeout=600)
    assert rc == 0, err
    first = float(re.search(r"step 0 loss ([0-9.]+)", out).group(1))
    evaluated = re.search(r"eval: top1 ([0-9.]+) loss ([0-9.]+)", out)
    assert evaluated, out
    assert float(evaluated.group(2)) < first * 0.9, out  # the loss falls


def eval_top1(out):
    found = re.search(r"eval: top1 ([0-9.]+)", out)
    assert found, out
    return float(found.group(1))


def two_workers_within_one_workers_seed_spread(tmp_path):
    """Global batch, seed and images fixed: 2 workers evaluate within 1 worker's spread over 3 seeds."""
    # SyncBatchNorm: 2 workers then normalize over the same 64 images a step as 1
    # worker does, and the runs are the same computation up to rounding. At
    # lr 0.05 (the example's default) 32 steps are chaotic: rounding alone moves
    # top-1 by more than the seeds do.
    args = ["--", os.path.join(EXAMPLES, "train_fleet_dygraph.py"), "--images", "2048", "--test_images", "10000",
            "--lr", "0.01", "--sync_batch_norm"]
    single = []
    for seed in (0, 1, 2):
        rc, out, err = run_dtrain(["--nproc_per_node", "1", "--log_dir", str(tmp_path / f"s{seed}"), *args,
                                   "--seed", str(seed)], timeout=900)
        assert rc == 0, err
        single.append(eval_top1(out))
    rc, out, err = run_dtrain(["--nproc_per_node", "2", "--log_dir", str(tmp_path / "two"), *args, "--seed", "0"],
                              timeout=900)
    assert rc == 0, err
    two = eval_top1(out)
    print(f"1 worker, seeds 0-2: top1 {single}; 2 workers, seed 0: top1 {two}")
    assert min(single) <= two <= max(single) or abs(two - sum(single) / 3) <= max(single) - min(single), (single, two)


# Collected only by scripts/python_check.sh (DTRAIN_PYTHON_HEAVY=1): ~7 min on 2 cores.
if os.environ.get("DTRAIN_PYTHON_HEAVY"):
    test_two_workers_within_one_workers_seed_spread = two_workers_within_one_workers_seed_spread


def test_elastic_state_goes_on_from_the_commit(tmp_path):
    """A crash in generation 0 of an elastic job: generation 1 restores the last commit (weights and
    momentum) and ends where an uninterrupted run ends."""
    script = rank_script("elastic.py")
    rc, out, err = run_dtrain(["--nproc_per_node", "2", "--log_dir", str(tmp_path / "plain"), script, "--no-crash"])
    assert rc == 0, err
    want = re.search(r"checksum (\S+)", out).group(1)
    port = free_port()
    rc, out, err = run_dtrain(["--master", f"127.0.0.1:{port}", "--nnodes", "1:1", "--max_restarts", "1",
                               "--nproc_per_node", "2", "--log_dir", str(tmp_path / "elastic"), script])
    assert rc == 0, out + err
    assert "elastic generation 0 ended at global step 6 (a process failed)" in out, out
    log = (tmp_path / "elastic" / "workerlog.1").read_text()
    assert "rank 1 generation 1: start at step 6, extra {'generation': 0}" in log, log
    assert re.search(r"checksum (\S+)", out).group(1) == want, "the restored run trained differently"
    rc, out, err = run_dtrain(["--master", f"127.0.0.1:{free_port()}", "--nnodes", "1:1", "--nproc_per_node", "2",
                               "--log_dir", str(tmp_path / "again"), script])
    assert rc != 0 and "a process failed in 1 generation with every machine still there (--max_restarts 0)" in err, err
