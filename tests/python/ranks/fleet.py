"""dtrain.fleet's strategies act: gradient merge equals the full batch, SyncBatchNorm equals
BatchNorm over every worker's batch, sharding stage 1 equals plain SGD, amp runs (bf16 on CPU)."""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dtrain import fleet

fleet.init(is_collective=True)
rank, world = fleet.worker_index(), fleet.worker_num()
assert dist.is_initialized() and dist.get_backend() in ("dtrain", "DTRAIN"), dist.get_backend()
torch.set_num_threads(1)


def close(name, a, b, tol):
    diff = (a - b).abs().max().item()
    print(f"rank {rank}: {name}: max |diff| {diff:.3g}", flush=True)
    if diff > tol:
        sys.exit(f"rank {rank}: {name} differs by {diff} (> {tol})")


def strategy(**kw):
    s = fleet.DistributedStrategy()
    for k, v in kw.items():
        setattr(s, k, v)
    return s


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def train(s, micro, per_step, steps=4, opt_cls=torch.optim.SGD):
    """steps optimizer steps of per_step samples a worker, in micro-batches of `micro`."""
    net = mlp()
    model = fleet.distributed_model(net)
    opt = fleet.distributed_optimizer(opt_cls(model.parameters(), lr=0.1), s)
    g = torch.Generator().manual_seed(10 + rank)
    x_all, y_all = torch.randn(steps * per_step, 6, generator=g), torch.randint(0, 3, (steps * per_step,), generator=g)
    for i in range(steps * per_step // micro):
        x, y = x_all[i * micro:(i + 1) * micro], y_all[i * micro:(i + 1) * micro]
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.clear_grad()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]), opt


full, _ = train(strategy(), 8, 8)
merged, _ = train(strategy(gradient_merge=True, gradient_merge_configs={"k_steps": 2}), 4, 8)
close("gradient_merge k_steps=2 against the full batch", merged, full, 1e-6)
sharded, opt = train(strategy(sharding=True, sharding_configs={"stage": 1}), 8, 8)
assert type(opt.inner).__name__ == "ZeroRedundancyOptimizer", type(opt.inner)
close("sharding stage 1 against plain SGD", sharded, full, 1e-6)
hooked, _ = train(strategy(fp16_allreduce=True), 8, 8)
close("fp16_allreduce against float32 gradients", hooked, full, 2e-3)
amp, _ = train(strategy(amp=True, amp_configs={"dtype": "bfloat16"}), 8, 8)
assert torch.isfinite(amp).all()
close("amp bfloat16 against float32", amp, full, 0.05)
try:
    train(strategy(amp=True), 8, 8)
    sys.exit("amp float16 on CPU was not refused")
except ValueError as e:
    assert "bfloat16" in str(e), e

# SyncBatchNorm: each worker normalizes its half with the statistics of the whole batch.
torch.manual_seed(5)
whole = torch.randn(8, 3, 4, 4) * 3 + 1
bn_ref = nn.BatchNorm2d(3)
bn = fleet.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(3)))[0]
assert isinstance(bn, fleet.SyncBatchNorm)
weights = torch.randn(8, 3, 4, 4)
x_ref = whole.clone().requires_grad_()
y_ref = bn_ref(x_ref)
(y_ref * weights).sum().backward()
part = slice(rank * 8 // world, (rank + 1) * 8 // world)
x = whole[part].clone().requires_grad_()
y = bn(x)
(y * weights[part]).sum().backward()
close("SyncBatchNorm output against BatchNorm over the whole batch", y.detach(), y_ref[part].detach(), 1e-5)
close("SyncBatchNorm input gradient", x.grad, x_ref.grad[part], 1e-5)
close("SyncBatchNorm running mean", bn.running_mean, bn_ref.running_mean, 1e-6)
close("SyncBatchNorm running var", bn.running_var, bn_ref.running_var, 1e-5)
fleet.barrier_worker()
print(f"rank {rank}: fleet strategies act", flush=True)

dist.destroy_process_group()
