#!/usr/bin/env python3
"""PyTorch eager reference of `dtrain-bench training --device`: the job's model
trained by the plain Python loop (forward, loss, backward, SGD step) on fixed
random inputs, with no dtrain at all, from this python's own torch.

dtrain-bench-training runs it as a subprocess, with the model, batch and
device it read from the job file (it does not read the job itself):

  python3 eager_reference.py --model resnet20 --width 1 --channels 1 --size 28 \
      --classes 10 --batch 64 --device cuda:0 [--bf16] [--channels-last] \
      [--steps 30] [--warmup 5] [--trials 1] [--threads 1] [--probe]

Its stdout is one line per timed trial,

  EAGER trial=1 images_per_s=1234.5 ms_per_step=51.84 params=272474 layout=5d0c... torch=2.5.1 device=cuda:0 python=3.11.2

or, with --probe, one line saying what this python's torch is and how many
parameters the model has (nothing is trained):

  EAGER-PROBE params=272474 layout=5d0c... torch=2.5.1 device=cuda:0 python=3.11.2 torch_file=/.../torch/__init__.py

A torch that cannot be imported, or cannot use the device, is one line
`EAGER-ERROR <why>` and exit status 2.

The models are apps/common/models.cc written again: the same layers in the same
order, so the same parameter count and the same parameter shapes in the same
order (`layout`, a hash of them; dtrain-bench checks both), and the same init
(Kaiming-normal fan-out convolutions, BN weight 1 and bias 0).
"""

import argparse
import contextlib
import math
import os
import platform
import sys
import time


def _no_local_torch():
    # A `torch/` folder in the current directory (as dtrain's C++ Fleet API was
    # at the repository root before it became fleet/) would be imported as an
    # empty namespace package when no PyTorch is installed: drop the entries
    # that name the current or this script's folder, as `python3 -P` does.
    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    cwd = os.path.realpath(os.getcwd())
    keep = []
    for p in sys.path:
        if p in ("", "."):
            continue
        try:
            if os.path.realpath(p) in (here, cwd):
                continue
        except (OSError, ValueError):
            pass
        keep.append(p)
    sys.path[:] = keep


def _error(msg):
    print("EAGER-ERROR " + msg, flush=True)
    sys.exit(2)


_no_local_torch()
try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001 -- any import failure is reported the same way
    _error(f"cannot import torch ({sys.executable}, Python {platform.python_version()}): {type(e).__name__}: {e}")
if getattr(torch, "__file__", None) is None or not hasattr(torch, "__version__"):
    _error(f"`import torch` found {list(getattr(torch, '__path__', []))}, a folder that is not PyTorch")


def conv(cin, cout, k, stride):
    return nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = conv(cin, cout, 3, stride)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = conv(cout, cout, 3, 1)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(conv(cin, cout, 1, stride), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class Bottleneck(nn.Module):
    def __init__(self, cin, mid, stride):
        super().__init__()
        self.conv1 = conv(cin, mid, 1, 1)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = conv(mid, mid, 3, stride)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = conv(mid, mid * 4, 1, 1)
        self.bn3 = nn.BatchNorm2d(mid * 4)
        self.downsample = None
        if stride != 1 or cin != mid * 4:
            self.downsample = nn.Sequential(conv(cin, mid * 4, 1, stride), nn.BatchNorm2d(mid * 4))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class ResNet(nn.Module):
    """stem conv + BN + ReLU (+ 3x3 max-pool for ImageNet-style inputs),
    residual blocks, global average pool, classifier."""

    def __init__(self, stem, stem_channels, stem_pool, blocks, out_channels, classes):
        super().__init__()
        self.stem_pool = stem_pool
        self.stem = stem
        self.bn = nn.BatchNorm2d(stem_channels)
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(out_channels, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, a=0.0, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        if self.stem_pool:
            x = F.max_pool2d(x, 3, 2, 1)
        x = self.blocks(x)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def scaled(c, width):
    return max(1, int(math.floor(c * width + 0.5)))  # C++ std::lround for c * width > 0


def cifar_resnet(depth, width, in_ch, classes):
    n = (depth - 2) // 6
    c1, c2, c3 = scaled(16, width), scaled(32, width), scaled(64, width)
    blocks, cin, s = [], c1, 1
    for cout in (c1, c2, c3):
        for i in range(n):
            blocks.append(BasicBlock(cin, cout, s if i == 0 else 1))
            cin = cout
        s = 2
    return ResNet(conv(in_ch, c1, 3, 1), c1, False, blocks, cin, classes)


def imagenet_resnet(bottleneck, layers, width, in_ch, classes):
    c = scaled(64, width)
    stem = nn.Conv2d(in_ch, c, 7, stride=2, padding=3, bias=False)
    blocks, cin = [], c
    for stage, count in enumerate(layers):
        mid = scaled(64 << stage, width)
        for i in range(count):
            stride = 2 if (i == 0 and stage > 0) else 1
            if bottleneck:
                blocks.append(Bottleneck(cin, mid, stride))
                cin = mid * 4
            else:
                blocks.append(BasicBlock(cin, mid, stride))
                cin = mid
    return ResNet(stem, c, True, blocks, cin, classes)


MODELS = {
    "resnet20": lambda w, c, k: cifar_resnet(20, w, c, k),
    "resnet32": lambda w, c, k: cifar_resnet(32, w, c, k),
    "resnet56": lambda w, c, k: cifar_resnet(56, w, c, k),
    "resnet18": lambda w, c, k: imagenet_resnet(False, [2, 2, 2, 2], w, c, k),
    "resnet50": lambda w, c, k: imagenet_resnet(True, [3, 4, 6, 3], w, c, k),
}


def layout(model):
    """FNV-1a 64 of the parameters' shapes in order ("16x1x3x3;16;16;..."): the
    same string dtrain-bench-training hashes for the C++ model."""
    text = ";".join("x".join(str(d) for d in p.shape) for p in model.parameters())
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet20", choices=sorted(MODELS))
    ap.add_argument("--width", type=float, default=1.0)
    ap.add_argument("--channels", type=int, default=1)
    ap.add_argument("--size", type=int, default=28)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", default="cpu", help="cpu or cuda:N")
    ap.add_argument("--bf16", action="store_true", help="forward under bf16 autocast")
    ap.add_argument("--channels-last", action="store_true", help="model and inputs in channels-last layout")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--probe", action="store_true", help="print the EAGER-PROBE line and exit")
    return ap.parse_args()


def main():
    a = parse_args()
    try:
        device = torch.device(a.device)
    except RuntimeError as e:
        _error(f"--device {a.device}: {e}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            _error(
                f"torch {torch.__version__} ({os.path.dirname(torch.__file__)}) sees no CUDA device "
                f"(built with CUDA {torch.version.cuda}); the reference needs a CUDA-enabled torch on the GPU machine"
            )
        if device.index is None:
            device = torch.device("cuda", 0)
        if device.index >= torch.cuda.device_count():
            _error(f"{device}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    elif a.bf16:
        _error("--bf16 needs a CUDA device")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = MODELS[a.model](a.width, a.channels, a.classes)
    params = sum(p.numel() for p in model.parameters())
    tag = f"params={params} layout={layout(model)} torch={torch.__version__} device={device} python={platform.python_version()}"
    if a.probe:
        print(f"EAGER-PROBE {tag} torch_file={torch.__file__}", flush=True)
        return
    memory_format = torch.channels_last if a.channels_last else torch.contiguous_format
    model = model.to(device, memory_format=memory_format)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay)
    torch.manual_seed(1000)
    images = torch.randn(a.batch, a.channels, a.size, a.size).to(device).contiguous(memory_format=memory_format)
    labels = torch.randint(0, a.classes, (a.batch,), dtype=torch.int64).to(device)

    def autocast():
        if not a.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def step():
        with autocast():
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad()

    model.train()
    for trial in range(1, a.trials + 1):
        for _ in range(a.warmup):
            step()
        sync()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        sync()
        secs = time.perf_counter() - t0
        print(
            f"EAGER trial={trial} images_per_s={a.batch * a.steps / secs:.3f} "
            f"ms_per_step={1e3 * secs / a.steps:.4f} {tag}",
            flush=True,
        )


if __name__ == "__main__":
    main()
