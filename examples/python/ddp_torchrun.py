"""A plain torchrun DDP script: it knows torch.distributed only, not dtrain.

    python3 -m torch.distributed.run --nproc_per_node 2 ddp_torchrun.py
    dtrain --nproc_per_node 2 ddp_torchrun.py                    # the same script, unchanged
    dtrain --nproc_per_node 2 --backend ucx ddp_torchrun.py --import dtrain.torch --backend dtrain

--import names a module imported before init_process_group, as third-party
c10d backends need (torch_ucc, oneccl_bindings_for_pytorch, dtrain.torch).
It trains a small CNN on a fixed synthetic set and prints the loss, and at
the end a checksum of the parameters that is the same under every launcher.
"""

import argparse
import importlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--import", dest="module", default="")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32, help="per worker")
    a = ap.parse_args()
    if a.module:
        importlib.import_module(a.module)
    dist.init_process_group(a.backend)  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                          nn.Flatten(), nn.Linear(256, 10))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    images = torch.randn(a.steps * a.batch * world, 1, 28, 28, generator=gen)
    labels = (images.mean(dim=(1, 2, 3)) * 40).long().clamp(-5, 4) + 5
    for step in range(a.steps):
        lo = (step * world + rank) * a.batch
        loss = F.cross_entropy(ddp(images[lo:lo + a.batch]), labels[lo:lo + a.batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step % 5 == 0 or step == a.steps - 1):
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    checksum = sum(p.double().sum().item() for p in model.parameters())
    print(f"rank {rank} of {world} ({dist.get_backend()}): parameter checksum {checksum:.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
