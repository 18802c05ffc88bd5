"""torch.distributed from Python: dtrain's plugins against c10d Gloo, in the same run.

    /usr/bin/python3 bench/python_bench.py [--ranks 2] [--trials 7] [--max-bytes 64M]

Starts --ranks processes (env://, no launcher). In every process the default
group is c10d Gloo, and two "dtrain" groups carry the gloo and ucx plugins, so
every backend runs on the same processes, machine and moment. Each trial runs
every backend back to back (the order rotates), so the ratios are paired; a
ratio is pooled as the geometric mean of the trials with a 95% interval
(Student's t on the logs). Tables:
  1. all_reduce (sum, float32) from 8 B to --max-bytes: busbw in GB/s, as
     nccl-tests count it (algbw * 2(n-1)/n), beside one core's memcpy of the
     same size (the machine's ceiling for a local all-reduce);
  2. a DDP training step of a small CNN: steps/s. Within a trial the
     backends take turns step by step (who goes first rotates every step),
     so the machine's drift over a trial reaches every backend alike;
  3. with --ddp-breakdown N, N more DDP steps a backend (in --trials rounds,
     the order rotating) whose gradient all-reduce goes through a comm hook
     that stamps it: the ranks' skew at the all-reduce's call, and the op's
     time from the last rank's call to each rank's completion. First as DDP's
     default hook does (it returns the op's future), then with the hook
     waiting for the op (a dtrain group then runs it on the calling thread
     when that gets there before the group's progress thread; c10d Gloo
     always on its own). The clocks are CLOCK_MONOTONIC, one for every rank
     of a machine.
Needs PYTHONPATH to hold dtrain's package (build/lib/dtrain/python).
"""

import argparse
import math
import os
import socket
import statistics
import subprocess
import sys
import time

T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131]


def pooled(ratios):
    logs = [math.log(r) for r in ratios]
    m = statistics.mean(logs)
    if len(logs) < 2:
        return math.exp(m), math.exp(m), math.exp(m)
    half = T975[min(len(logs) - 2, len(T975) - 1)] * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(m), math.exp(m - half), math.exp(m + half)


def parse_bytes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def human(n):
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n // size}{unit}"
    return f"{n}B"


def rotated(items, trial):
    """The trial's order: each item goes first in turn."""
    return items[trial % len(items):] + items[:trial % len(items)]


def rank_main(a):
    import torch
    import torch.distributed as dist

    import dtrain.torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"c10d gloo": None}
    for plugin in ("gloo", "ucx"):
        dtrain.torch.set_backend(plugin)
        groups[f"dtrain {plugin}"] = dist.new_group(backend="dtrain")
    names = list(groups)

    def timed(fn, group, iters):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        dist.barrier(group=group)
        return time.perf_counter() - t0

    for n in names:  # connections, allocations and caches warm before any timing
        for size in (8, 1 << 20):
            w = torch.ones(size // 4)
            for _ in range(20):
                dist.all_reduce(w, group=groups[n])
    rows = []
    sizes = [8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
    for size in [s for s in sizes if s <= a.max_bytes]:
        x = torch.ones(size // 4)
        iters = max(3, min(1000, int(2e8 / max(size, 1 << 14))))
        src, dst = torch.ones(size // 4), torch.empty(size // 4)
        times = {n: [] for n in names + ["memcpy"]}
        for trial in range(a.trials):
            for n in rotated(names, trial):
                times[n].append(timed(lambda: dist.all_reduce(x, group=groups[n]), groups[n], iters) / iters)
            t0 = time.perf_counter()
            for _ in range(iters):
                dst.copy_(src)
            times["memcpy"].append((time.perf_counter() - t0) / iters)
        rows.append((size, times))

    ddp_times = {n: [] for n in names}
    models = {n: ddp_step(groups[n]) for n in names}
    for n in names:
        models[n]()
    for trial in range(a.trials):
        dist.barrier()
        spent = dict.fromkeys(names, 0.0)
        for i in range(a.ddp_steps):
            for n in rotated(names, trial + i):
                t0 = time.perf_counter()
                models[n]()
                spent[n] += time.perf_counter() - t0
        for n in names:
            ddp_times[n].append(spent[n] / a.ddp_steps)
    breakdown = {}
    if a.ddp_breakdown:
        probes = {(n, inline): stamped_step(groups[n], inline) for n in names for inline in (False, True)}
        for trial in range(a.trials):
            for k in rotated(list(probes), trial):
                dist.barrier(group=groups[k[0]])
                for _ in range(max(1, a.ddp_breakdown // a.trials)):
                    probes[k][0]()
        for k, (_, stamps, steps_ms) in probes.items():
            breakdown[k] = [None] * world
            dist.all_gather_object(breakdown[k], (stamps, steps_ms))
    if rank == 0:
        report(rows, ddp_times, names, world, a)
        if breakdown:
            report_breakdown(breakdown, world, a)
    dist.barrier()


def small_cnn():
    from torch import nn
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def ddp_step(group, hook=None):
    """One training step of the small CNN under DDP over `group` (batch 32, seed 0), optionally with a comm hook."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    ddp = DistributedDataParallel(small_cnn(), process_group=group)
    if hook:
        ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))

    def step():
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
    return step


def stamped_step(group, inline):
    """A DDP step whose all-reduce goes through a stamping comm hook; returns (step, stamps, step times)."""
    import torch.distributed as dist

    pg = group if group is not None else dist.group.WORLD
    stamps, steps_ms = [], []

    def hook(_, bucket):
        called = time.perf_counter()
        work = dist.all_reduce(bucket.buffer(), group=pg, async_op=True)
        if inline:
            work.wait()

        def done(fut):
            stamps.append((called, time.perf_counter()))
            return fut.value()[0]
        return work.get_future().then(done)

    train = ddp_step(group, hook)

    def step():
        t0 = time.perf_counter()
        train()
        steps_ms.append((time.perf_counter() - t0) * 1e3)
    for _ in range(3):
        step()
    stamps.clear()
    steps_ms.clear()
    return step, stamps, steps_ms


def report_breakdown(breakdown, world, a):
    def q(v):
        v = sorted(v)
        return f"{v[len(v) // 10]:6.2f} {statistics.median(v):6.2f} {v[len(v) * 9 // 10]:6.2f}"
    print(f"\n# DDP step breakdown ({a.ddp_breakdown} steps a row in {a.trials} interleaved rounds, {world} ranks): "
          "ms, p10 median p90; op = from the last rank's call to each rank's completion")
    print(f"{'backend':>12} {'hook waits':>11} {'step':>20} {'skew at the call':>20} {'op':>20}")
    for (n, inline), everyone in breakdown.items():
        skew, op, step = [], [], []
        for i in range(len(everyone[0][0])):
            calls = [r[0][i][0] for r in everyone]
            skew.append((max(calls) - min(calls)) * 1e3)
            op += [(r[0][i][1] - max(calls)) * 1e3 for r in everyone]
            step += [r[1][i] for r in everyone]
        print(f"{n:>12} {'yes' if inline else 'no':>11} {q(step):>20} {q(skew):>20} {q(op):>20}")
    sys.stdout.flush()


def report(rows, ddp_times, names, world, a):
    factor = 2 * (world - 1) / world
    print(f"# all_reduce sum float32, {world} ranks, {a.trials} paired trials; busbw GB/s (median); "
          "ratio to c10d Gloo: geometric mean [95% interval]")
    print(f"{'size':>6} {'memcpy':>8} " + " ".join(f"{n:>10}" for n in names) +
          "   dtrain gloo / c10d        dtrain ucx / c10d")
    for size, times in rows:
        bw = {n: [factor * size / t / 1e9 for t in times[n]] for n in names}
        mem = statistics.median(size / t / 1e9 for t in times["memcpy"])
        ratio = {n: pooled([c / d for c, d in zip(times["c10d gloo"], times[n])]) for n in names[1:]}
        cols = " ".join(f"{statistics.median(bw[n]):>10.3f}" for n in names)
        rs = "   ".join(f"{r:5.2f}x [{lo:4.2f}, {hi:4.2f}]" for r, lo, hi in (ratio[n] for n in names[1:]))
        print(f"{human(size):>6} {mem:>8.2f} {cols}   {rs}")
    print(f"\n# DDP step (small CNN, batch 32 a rank, {a.ddp_steps} steps a trial): steps/s (median), "
          "ratio to c10d Gloo")
    for n in names:
        sps = statistics.median(1 / t for t in ddp_times[n])
        if n == names[0]:
            print(f"{n:>12}: {sps:7.2f} steps/s")
        else:
            r, lo, hi = pooled([c / d for c, d in zip(ddp_times[names[0]], ddp_times[n])])
            print(f"{n:>12}: {sps:7.2f} steps/s   {r:5.2f}x [{lo:4.2f}, {hi:4.2f}]")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--max-bytes", type=parse_bytes, default=64 << 20)
    ap.add_argument("--ddp-steps", type=int, default=10)
    ap.add_argument("--ddp-breakdown", type=int, default=0, metavar="N",
                    help="also time N DDP steps a backend through a stamping comm hook (table 3)")
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_main:
        return rank_main(a)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(a.ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   UCX_NET_DEVICES=os.environ.get("UCX_NET_DEVICES", "lo"), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-u", __file__, "--rank-main", *sys.argv[1:]], env=env))
    codes = [p.wait() for p in procs]
    sys.exit(max(abs(c) for c in codes))


if __name__ == "__main__":
    main()
