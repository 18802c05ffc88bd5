"""FleetX's collective quick start (train_fleet_dygraph.py), on PyTorch through dtrain.fleet.

    dtrain --nproc_per_node 2 examples/python/train_fleet_dygraph.py

A torchvision ResNet trains on the Fashion-MNIST files of Debian's
dataset-fashion-mnist, with the global batch fixed (each of N workers takes
global_batch / N images a step, a DistributedSampler's share), then evaluates
on the test images. Paddle's script, line for line where PyTorch allows:
fleet.init, DistributedStrategy, distributed_model, distributed_optimizer.
"""

import argparse
import gzip
import os
import time

import torch
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from dtrain import fleet

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(name, count):
    with gzip.open(os.path.join(DATA, name)) as f:
        raw = f.read()
    if "images" in name:
        x = torch.frombuffer(bytearray(raw[16:]), dtype=torch.uint8).view(-1, 1, 28, 28)[:count]
        return (x.float() / 255 - 0.2860) / 0.3530
    return torch.frombuffer(bytearray(raw[8:]), dtype=torch.uint8).long()[:count]


def resnet(depth):
    blocks = {10: [1, 1, 1, 1], 18: [2, 2, 2, 2]}[depth]
    net = torchvision.models.resnet.ResNet(torchvision.models.resnet.BasicBlock, blocks, num_classes=10)
    net.conv1 = torch.nn.Conv2d(1, 64, 3, 1, 1, bias=False)
    net.maxpool = torch.nn.Identity()
    return net


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=4096, help="training images")
    ap.add_argument("--test_images", type=int, default=2000)
    ap.add_argument("--global_batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--depth", type=int, default=10, choices=[10, 18])
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gradient_merge", type=int, default=1, help="k_steps (1: off)")
    ap.add_argument("--fp16_allreduce", action="store_true")
    ap.add_argument("--sync_batch_norm", action="store_true")
    a = ap.parse_args()

    strategy = fleet.DistributedStrategy()
    strategy.fuse_grad_size_in_MB = 16
    strategy.fp16_allreduce = a.fp16_allreduce
    strategy.sync_batch_norm = a.sync_batch_norm
    if a.gradient_merge > 1:
        strategy.gradient_merge = True
        strategy.gradient_merge_configs = {"k_steps": a.gradient_merge, "avg": True}
    fleet.init(is_collective=True, strategy=strategy)
    rank, world = fleet.worker_index(), fleet.worker_num()
    if a.global_batch % (world * a.gradient_merge):
        raise SystemExit(f"--global_batch {a.global_batch} must split over {world} workers x {a.gradient_merge}")
    batch = a.global_batch // world // a.gradient_merge

    torch.manual_seed(a.seed)
    model = fleet.distributed_model(resnet(a.depth))
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9,
                                                            weight_decay=1e-4))
    train = TensorDataset(read_idx("train-images-idx3-ubyte.gz", a.images),
                          read_idx("train-labels-idx1-ubyte.gz", a.images))
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=a.seed)
    loader = DataLoader(train, batch_size=batch, sampler=sampler, drop_last=True)
    if fleet.is_first_worker():
        print(f"fleet: {world} workers, global batch {a.global_batch} ({batch} a worker a micro-step), "
              f"{strategy}", flush=True)
    t0, seen = time.time(), 0
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for step, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
            seen += x.shape[0] * world
            if fleet.is_first_worker() and step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f} "
                      f"{seen / (time.time() - t0):.1f} images/s", flush=True)
    model.eval()
    test_x = read_idx("t10k-images-idx3-ubyte.gz", a.test_images)
    test_y = read_idx("t10k-labels-idx1-ubyte.gz", a.test_images)
    correct, total_loss = torch.zeros(1), torch.zeros(1)
    with torch.no_grad():
        shard = range(rank, a.test_images, world)
        logits = model.module(test_x[list(shard)])
        correct += (logits.argmax(1) == test_y[list(shard)]).sum()
        total_loss += F.cross_entropy(logits, test_y[list(shard)], reduction="sum")
    torch.distributed.all_reduce(correct)
    torch.distributed.all_reduce(total_loss)
    fleet.barrier_worker()
    if fleet.is_first_worker():
        print(f"eval: top1 {correct.item() / a.test_images:.4f} loss {total_loss.item() / a.test_images:.4f}",
              flush=True)


if __name__ == "__main__":
    main()
