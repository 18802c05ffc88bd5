"""FleetX's parameter-server quick start (wide & deep CTR), on PyTorch through dtrain.fleet.

    dtrain --server_num 1 --worker_num 2 examples/python/wide_and_deep.py
    dtrain --server_num 1 --worker_num 2 examples/python/wide_and_deep.py --mode sync
    dtrain --server_num 1 --worker_num 2 examples/python/wide_and_deep.py --mode geo --k_steps 10

The model, tables and settings of dtrain-ctr (apps/ctr.toml): two sparse
tables (wide, dim 1; deep, dim 8; AdaGrad on the servers), the MLP's dense
parameters on the servers (Adam), the pairwise dot interaction, batch 512 per
worker, on the Criteo-format click logs dtrain-ctr generates from a known
teacher (output/ctr/data; written here on the first run if missing). The
lines are parsed by the C++ reader (dtrain._ctr) on its own thread. Prints the
test AUC as dtrain-ctr does.
"""

import argparse
import os
import time

import torch

import dtrain.nn
from dtrain import _ext, fleet

_ctr = _ext.load("_ctr")  # the CTR app's C++ (apps/ctr/python_module.cc), checked against this torch

# apps/ctr.toml's tables.
WIDE = dict(optimizer="adagrad", learning_rate=0.05, initial_g2sum=3.0, initializer="constant", init_a=0.0)
DEEP = dict(optimizer="adagrad", learning_rate=0.05, initial_g2sum=3.0, initializer="uniform", init_a=-0.05,
            init_b=0.05, seed=7)


class WideDeep(torch.nn.Module):
    """apps/ctr/model.h's WideDeep, with its embeddings as SparseEmbedding modules (same parameter
    names, so the dense tables are named as dtrain-ctr's)."""

    def __init__(self, dim, hidden, dot, geo_sparse_lr=None):
        super().__init__()
        wide, deep = dict(WIDE), dict(DEEP)
        if geo_sparse_lr is not None:  # GEO trains local copies with SGD (dtrain-ctr's geo_sparse_lr)
            for t in (wide, deep):
                t.update(optimizer="sgd", learning_rate=geo_sparse_lr)
                del t["initial_g2sum"]
        self.wide_emb = dtrain.nn.SparseEmbedding("wide", 1, **wide)
        self.deep_emb = dtrain.nn.SparseEmbedding("deep", dim, **deep)
        self.dot = dot
        self.wide_dense = torch.nn.Linear(_ctr.DENSE, 1)
        width = _ctr.SPARSE * dim + _ctr.DENSE
        if dot:
            pairs = _ctr.SPARSE * (_ctr.SPARSE - 1) // 2
            width += pairs
            self.pair_weight = torch.nn.Linear(pairs, 1)
        layers = []
        for h in hidden:
            layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
            width = h
        self.mlp = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))

    def forward(self, keys, dense, next_keys=None):
        """next_keys: the next batch's, pulled while this one computes (async mode)."""
        b = dense.shape[0]
        wide_rows, emb = self.wide_emb(keys), self.deep_emb(keys)
        if next_keys is not None:
            self.wide_emb.prefetch(next_keys)
            self.deep_emb.prefetch(next_keys)
        wide = wide_rows.reshape(b, -1).sum(1) + self.wide_dense(dense).squeeze(1)
        if not self.dot:
            return wide + self.mlp(torch.cat([emb.reshape(b, -1), dense], 1)).squeeze(1)
        dots = _ctr.pair_dots(emb)
        deep = self.mlp(torch.cat([emb.reshape(b, -1), dense, dots], 1)).squeeze(1)
        return wide + deep + self.pair_weight(dots).squeeze(1)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["sync", "async", "geo"], default="async")
    p.add_argument("--k_steps", type=int, default=10, help="GEO: push deltas every k steps")
    p.add_argument("--send_queue_size", type=int, default=1, help="async: pushes left in flight")
    p.add_argument("--data_dir", default="output/ctr/data")
    p.add_argument("--gen_train_lines", type=int, default=4000000, help="lines to generate if data_dir has none")
    p.add_argument("--gen_test_lines", type=int, default=50000)
    p.add_argument("--limit_train", type=int, default=0, help="use the first N training lines (0: all)")
    p.add_argument("--limit_test", type=int, default=0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch_size", type=int, default=512, help="per worker")
    p.add_argument("--embedding_dim", type=int, default=8)
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 32])
    p.add_argument("--interaction", choices=["dot", "none"], default="dot")
    p.add_argument("--lr", type=float, default=0.001, help="Adam's rate for the dense parameters")
    p.add_argument("--geo_sparse_lr", type=float, default=2.0)
    p.add_argument("--geo_dense_lr", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--log_every", type=int, default=100)
    p.add_argument("--timeout_s", type=float, default=60)
    p.add_argument("--save_dir", default="", help="worker 0 saves every table here at the end")
    p.add_argument("--sleep_ms", type=int, default=0, help="sleep after every step (tests)")
    return p.parse_args()


def evaluate(model, files, limit, rank, world):
    stats = _ctr.EvalStats()  # dtrain-ctr's AUC buckets and log loss
    with torch.no_grad():
        for labels, dense, keys in _ctr.Reader(files, rank=rank, world=world, batch_size=4096, limit=limit):
            if labels.numel():
                stats.add(torch.sigmoid(model(keys, dense)), labels)
    auc = fleet.metrics.auc(stats.pos, stats.neg)
    loss_sum, count = fleet.metrics.sum([stats.loss_sum, stats.count])
    return auc, loss_sum / max(count, 1), count


def teacher_line(data_dir):
    try:
        with open(os.path.join(data_dir, "teacher.toml")) as f:
            return next((line.strip() for line in f if line.startswith("teacher_auc")), "")
    except OSError:
        return ""


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = args.mode != "sync"
    strategy.a_sync_configs = {"k_steps": args.k_steps if args.mode == "geo" else 0,
                               "send_queue_size": args.send_queue_size if args.mode == "async" else 0}
    fleet.init(is_collective=False, strategy=strategy, ps_configs={"timeout_s": args.timeout_s})

    geo = args.mode == "geo"
    model = fleet.distributed_model(WideDeep(args.embedding_dim, args.hidden, args.interaction == "dot",
                                             args.geo_sparse_lr if geo else None))
    inner = torch.optim.SGD(model.parameters(), lr=args.geo_dense_lr) if geo else \
        torch.optim.Adam(model.parameters(), lr=args.lr)
    optimizer = fleet.distributed_optimizer(inner, strategy)

    if fleet.is_server():
        fleet.init_server()
        print(f"wide_and_deep: server {fleet.server_index()} of {fleet.server_num()} serving (pid {os.getpid()})",
              flush=True)
        fleet.run_server()
        print("wide_and_deep: server done", flush=True)
        return

    fleet.init_worker()
    rank, world = fleet.worker_index(), fleet.worker_num()
    train_files = [os.path.join(args.data_dir, "train.txt")]
    test_files = [os.path.join(args.data_dir, "test.txt")]
    if rank == 0 and not all(os.path.exists(f) for f in train_files + test_files):
        t0 = time.time()
        r = _ctr.generate(args.data_dir, args.gen_train_lines, args.gen_test_lines)
        print(f"wide_and_deep: generated {args.gen_train_lines} training and {args.gen_test_lines} test lines in "
              f"{args.data_dir} ({time.time() - t0:.1f} s): teacher auc {r['teacher_auc']:.4f}", flush=True)
    fleet.barrier_worker()
    lines = _ctr.count_lines(train_files, args.limit_train)
    per_worker = lines // world
    steps = (per_worker + args.batch_size - 1) // args.batch_size
    # dtrain-ctr's loss_reduction "auto": per-example gradients summed over the global batch in sync
    # (the servers average the workers' pushes) and async; GEO's local SGD takes the batch mean.
    scale = 0 if geo else (world if args.mode == "sync" else 1)
    print(f"wide_and_deep: worker {rank}/{world} mode {args.mode}, {lines} lines, {steps} steps per epoch, batch "
          f"{args.batch_size}", flush=True)

    start, examples, step, loss_sum, loss_n = time.time(), 0, 0, 0.0, 0
    spent = [0.0, 0.0, 0.0]  # reading, forward + backward, optimizer step
    for epoch in range(args.epochs):
        reader = _ctr.Reader(train_files, rank=rank, world=world, batch_size=args.batch_size,
                             limit=args.limit_train, per_worker=per_worker)
        batch = next(reader, None)
        while batch is not None:
            t0 = time.perf_counter()
            upcoming = next(reader, None)
            labels, dense, keys = batch
            n = labels.numel()
            t1 = time.perf_counter()
            logits = model(keys, dense, upcoming[2] if upcoming is not None and args.mode == "async" else None)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
            if n > 0:
                (loss * (scale * n) if scale else loss).backward()
            t2 = time.perf_counter()
            optimizer.step()
            optimizer.zero_grad()
            t3 = time.perf_counter()
            spent = [spent[0] + t1 - t0, spent[1] + t2 - t1, spent[2] + t3 - t2]
            step += 1
            examples += n
            loss_sum += loss.item() * n
            loss_n += n
            if step % args.log_every == 0 or step == steps * args.epochs:
                el = time.time() - start
                print(f"wide_and_deep: epoch {epoch + 1}/{args.epochs} step {step}/{steps * args.epochs} loss "
                      f"{loss_sum / max(loss_n, 1):.6f} examples/s {examples * world / el:.0f} (all workers)",
                      flush=True)
                loss_sum, loss_n = 0.0, 0
            if args.sleep_ms:
                time.sleep(args.sleep_ms / 1000)
            batch = upcoming
        if reader.skipped:
            print(f"wide_and_deep: worker {rank} skipped {reader.skipped} malformed lines ({reader.first_error})")

    train_s = time.time() - start
    fleet.barrier_worker()
    if not geo:
        optimizer.pull()
    auc, logloss, count = evaluate(model, test_files, args.limit_test, rank, world)
    read, compute, push = (1e3 * t / max(step, 1) for t in spent)
    print(f"wide_and_deep: test auc {auc:.4f} logloss {logloss:.4f} over {count:.0f} examples "
          f"({teacher_line(args.data_dir)}); trained {train_s:.1f} s, {examples * world / train_s:.0f} examples/s; "
          f"per step: read {read:.2f} ms, forward+backward {compute:.2f} ms, step {push:.2f} ms", flush=True)
    if args.save_dir and rank == 0:
        fleet.save_persistables(args.save_dir)
    fleet.barrier_worker()
    fleet.stop_worker()


if __name__ == "__main__":
    main()
