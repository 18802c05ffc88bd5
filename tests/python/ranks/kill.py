"""A rank dies in the middle of training (SIGKILL): every survivor gets a Python exception naming it."""

import argparse
import datetime
import os
import signal
import time

import torch
import torch.distributed as dist

import dtrain.torch

ap = argparse.ArgumentParser()
ap.add_argument("--plugin", default="")
ap.add_argument("--victim", type=int, default=1)
a = ap.parse_args()
if a.plugin:
    dtrain.torch.set_backend(a.plugin)
dist.init_process_group("dtrain", timeout=datetime.timedelta(seconds=10))
rank = dist.get_rank()
t = torch.ones(1 << 16)
start = None
try:
    for step in range(1000):
        if step == 20:
            print(f"rank {rank}: step 20", flush=True)
            if rank == a.victim:
                os.kill(os.getpid(), signal.SIGKILL)
            start = time.time()
        dist.all_reduce(t)
        t.fill_(1)
except RuntimeError as e:
    print(f"rank {rank}: caught after {time.time() - start:.1f} s: {e}", flush=True)
    raise SystemExit(3 if f"rank {a.victim}" in str(e) else 4)
raise SystemExit(5)
