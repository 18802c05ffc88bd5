"""FSDP over "dtrain" (torch 2.x): fully_shard (FSDP2) and FullyShardedDataParallel (FSDP1) train a
model as one process does on every rank's batch at once, and as FSDP over c10d Gloo does."""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard

from beside_gloo import start

a, gloo, rank, world = start(steps=5)


def net():
    torch.manual_seed(0)
    # 37 and 11 outputs: shards of uneven sizes (FSDP pads them).
    return nn.Sequential(nn.Linear(20, 37), nn.ReLU(), nn.Linear(37, 11))


def batch(r, step):
    gen = torch.Generator().manual_seed(1000 * r + step)
    return torch.randn(8, 20, generator=gen), torch.randint(0, 11, (8,), generator=gen)


def train(model, batches):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def flat(params):
    return torch.cat([p.detach().reshape(-1) for p in params])


def fsdp2(group):
    model = net()
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    train(model, [batch(rank, s) for s in range(a.steps)])
    return flat(p.full_tensor() for p in model.parameters())


def fsdp1(group):
    model = FSDP(net(), process_group=group, device_id=torch.device("cpu"), use_orig_params=True)
    train(model, [batch(rank, s) for s in range(a.steps)])
    with FSDP.summon_full_params(model):
        return flat(model.parameters()).clone()


def one_process():
    # The mean loss over every rank's batch: what averaging the ranks' gradients computes.
    steps = [[batch(r, s) for r in range(world)] for s in range(a.steps)]
    model = train(net(), [(torch.cat([x for x, _ in b]), torch.cat([y for _, y in b])) for b in steps])
    return flat(model.parameters())


def compare(name, got, ref, bound):
    diff = (got.double() - ref.double()).abs().max().item()
    if diff > bound:
        print(f"FAIL {name}: max |difference| {diff:.3g} > {bound:.1g}", flush=True)
        sys.exit(1)
    print(f"{name}: max |difference| {diff:.3g}" + (" (bit for bit)" if diff == 0 else ""), flush=True)


expected = one_process()
for kind, run in (("fully_shard", fsdp2), ("FSDP1", fsdp1)):
    ours = run(dist.group.WORLD)
    # Summation order differs from one process's (per-rank partial sums, then the reduce-scatter).
    compare(f"{kind} over dtrain/{a.plugin} vs one process", ours, expected, 1e-5)
    try:
        theirs = run(gloo)
    except RuntimeError as e:  # a Gloo without reduce_scatter_tensor: the one-process check stands
        print(f"{kind} over c10d Gloo not run: {str(e).splitlines()[0]}", flush=True)
    else:
        compare(f"{kind} over dtrain/{a.plugin} vs c10d Gloo", ours, theirs, 1e-6)
dist.barrier()
print(f"rank {rank}: fsdp checks passed", flush=True)
dist.destroy_process_group()
