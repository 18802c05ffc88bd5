"""What the comparison ranks share (ops.py, ddp.py, fsdp.py): a "dtrain" default group on the plugin
that --plugin names, and a c10d Gloo group beside it in the same processes."""

import argparse
import datetime

import torch
import torch.distributed as dist

import dtrain.torch


def start(**options):
    """Parses --plugin and each option (--NAME, of its default's type) and joins both groups.

    Returns (args, the c10d Gloo group, rank, world size)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--plugin", required=True)
    for name, default in options.items():
        ap.add_argument(f"--{name}", type=type(default), default=default)
    args = ap.parse_args()
    dtrain.torch.set_backend(args.plugin)
    dist.init_process_group("dtrain", timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    return args, dist.new_group(backend="gloo"), dist.get_rank(), dist.get_world_size()


def gloo_has(dtype, gloo):
    """Whether this torch's c10d Gloo reduces `dtype` (Debian's torch 2.14 Gloo has no float16)."""
    try:
        dist.all_reduce(torch.ones(1, dtype=dtype), group=gloo)
        return True
    except RuntimeError as e:
        if "Invalid scalar type" not in str(e):
            raise
        return False
