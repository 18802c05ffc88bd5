"""ElasticState through a crash: generation 0 commits after every step and exits 3 after step 6; under
`dtrain --nnodes 1:1 --max_restarts 1` generation 1 restores step 6 (weights and momentum) and trains
to step 10. With --no-crash (outside an elastic job) it trains 0-10 straight: the same checksum."""

import sys

import torch
import torch.distributed as dist

from dtrain.fleet.elastic import ElasticState

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
elastic = ElasticState()
restored = elastic.restore(model, opt)
start = restored[0] if restored else 0
print(f"rank {rank} generation {elastic.generation}: start at step {start}, "
      f"extra {restored[1] if restored else None}", flush=True)
x = torch.arange(32, dtype=torch.float32).reshape(8, 4) / 32
y = torch.ones(8, 1)
for step in range(start, 10):
    loss = ((model(x + rank) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    elastic.commit(model, opt, step + 1, extra={"generation": elastic.generation})
    if "--no-crash" not in sys.argv and elastic.generation == 0 and step + 1 == 6:
        sys.exit(3)
checksum = sum(p.double().sum().item() for p in model.parameters())
print(f"rank {rank}: done at step 10, checksum {checksum:.10f}", flush=True)
dist.destroy_process_group()
