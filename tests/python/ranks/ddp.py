"""DDP over "dtrain" against DDP over c10d Gloo in the same processes: the same model,
data and steps; also with torch's ZeroRedundancyOptimizer and the fp16_compress_hook."""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from beside_gloo import gloo_has, start

a, gloo, rank, world = start(steps=6)


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 6, 3), nn.BatchNorm2d(6), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 10 * 10, 10))


def train(group, zero=False, hook=None):
    model = net()
    if rank == 1:  # DDP must broadcast rank 0's parameters
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.01)
    if hook:
        ddp.register_comm_hook(group, hook)
    if zero:
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, process_group=group,
                                      lr=0.05, momentum=0.9)
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(a.steps):
        x = torch.randn(8, 1, 12, 12, generator=gen)
        y = torch.randint(0, 10, (8,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()] +
                     [b.detach().reshape(-1).double() for b in model.buffers()])


def compare(name, got, ref, f16=False, same=True):
    diff = (got.double() - ref.double()).abs().max().item()
    scale = ref.double().abs().max().item()
    exact = torch.equal(got, ref)
    print(f"rank {rank}: {name}: {'bit for bit' if exact else f'max |diff| {diff:.3g} (of {scale:.3g})'}",
          flush=True)
    # Two ranks: a sum of two floats is the same in any order, so bit for bit.
    # More ranks: the plugins' ring and c10d Gloo's add in other orders, each
    # rounding once per addition: a few float32 ulps a step, grown by the steps.
    # With fp16_compress_hook the sums are float16: an order changes them by
    # up to a float16 ulp (2^-10 relative) a step.
    # Against float32 DDP (same=False), the hook's float16 sums: up to 2^-10 relative too.
    bound = 0.0 if world == 2 and same else (2.0 ** -10 if f16 else 1e-5) * max(scale, 1.0)
    if diff > bound:
        sys.exit(f"rank {rank}: {name} differs from c10d Gloo by {diff} (bound {bound})")


ref = train(gloo)
compare("DDP", train(None), ref)
compare("DDP + ZeroRedundancyOptimizer", train(None, zero=True), train(gloo, zero=True))
hook_ref = None
if gloo_has(torch.float16, gloo):
    hook_ref = train(gloo, hook=default_hooks.fp16_compress_hook)
else:
    print(f"rank {rank}: c10d Gloo has no float16: the hook is compared with float32 DDP", flush=True)
compare("DDP + fp16_compress_hook", train(None, hook=default_hooks.fp16_compress_hook),
        ref if hook_ref is None else hook_ref, f16=True, same=hook_ref is not None)
print(f"rank {rank}: DDP over dtrain ({a.plugin}) matches c10d Gloo", flush=True)

dist.destroy_process_group()
