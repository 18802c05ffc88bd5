"""A parameter-server program for test_ps.py, under dtrain --server_num S --worker_num W.

    ps.py save DIR     trains a small model (a sparse and a dense table) a few steps, saves it into DIR,
                       prints every worker-visible value
    ps.py load DIR     init_server(DIR): prints the values the workers see before any step
    ps.py fresh        the same without DIR
    ps.py delta DIR    a base save, one step touching id 3 only, a delta save (text), shrink: prints each
                       save's ids of table "emb"
    ps.py roles        worker calls on a server and server calls on a worker: prints each error
    ps.py mismatch     worker r declares table "t" with dim 4 + r
    ps.py optimizer    an optimizer with no server-side rule
"""

import os
import sys

import torch

import dtrain.nn
from dtrain import fleet

KEYS = torch.tensor([[3, 5, 7], [7, 11, 3]])


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = dtrain.nn.SparseEmbedding("emb", 4, padding_idx=0, initializer="uniform", init_a=-0.1, init_b=0.1,
                                             seed=3)
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


def values(m, opt):
    with torch.no_grad():
        rows = m.emb(KEYS)
    opt.pull()
    return [round(v, 6) for v in rows.flatten().tolist() + m.fc.weight.flatten().tolist() + m.fc.bias.tolist()]


def train(what, dirname):
    fleet.init(is_collective=False)
    m = fleet.distributed_model(Model())
    opt = fleet.distributed_optimizer(torch.optim.SGD(m.parameters(), lr=0.1), fleet.DistributedStrategy())
    if fleet.is_server():
        fleet.init_server(dirname if what == "load" else None)
        fleet.run_server()
        return
    fleet.init_worker()
    if what == "save":
        for _ in range(3):
            x = m.emb(torch.tensor([[3, 0, 7], [5, 0, 11]]))  # id 0 is padding: a zero row, no gradient
            assert float(x[:, 1].abs().sum()) == 0.0
            (m(x).sum() + x.pow(2).sum()).backward()
            opt.step()
            opt.zero_grad()
        fleet.barrier_worker()
        w = fleet.worker_index()
        assert fleet.metrics.max([w, -w]) == [1, 0] and fleet.metrics.min([w, -w]) == [0, -1], "fleet.metrics"
        assert fleet.metrics.sum(w + 1) == 3 and fleet.metrics.acc(w, 1) == 0.5, "fleet.metrics"
        if fleet.worker_index() == 0:
            fleet.save_persistables(dirname)
        fleet.barrier_worker()
    print("values", values(m, opt), flush=True)
    fleet.stop_worker()


def saved_ids(dirname):
    ids = set()
    for root, _, files in os.walk(os.path.join(dirname, "emb")):
        for f in files:
            if f != "MANIFEST":
                with open(os.path.join(root, f)) as lines:
                    ids.update(int(line.split()[0]) for line in lines if line[:1].isdigit())
    return sorted(ids)


def delta(dirname):
    fleet.init(is_collective=False)
    m = fleet.distributed_model(Model())
    opt = fleet.distributed_optimizer(torch.optim.SGD(m.parameters(), lr=0.1))
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return
    fleet.init_worker()
    for ids in ([[3, 0, 7], [5, 0, 11]], [[3]]):
        m.emb(torch.tensor(ids)).sum().backward()
        opt.step()
        opt.zero_grad()
        if len(ids) > 1:
            fleet.save_persistables(os.path.join(dirname, "base"), "base", text=True)
    fleet.save_persistables(None, os.path.join(dirname, "delta"), None, 2, text=True)  # Paddle's arguments
    fleet.shrink()
    print("base", saved_ids(os.path.join(dirname, "base")), "delta", saved_ids(os.path.join(dirname, "delta")),
          flush=True)
    fleet.stop_worker()


def roles():
    fleet.init(is_collective=False)
    server = fleet.is_server()
    calls = [fleet.init_worker, fleet.barrier_worker, fleet.worker_index] if server else \
        [fleet.init_server, fleet.run_server, fleet.server_index]
    for call in calls:
        try:
            call()
            print(f"{call.__name__}: no error", flush=True)
        except RuntimeError as e:
            print(f"{call.__name__}: {e}", flush=True)
    if server:
        fleet.init_server()
        fleet.run_server()
    else:
        fleet.init_worker()
        fleet.stop_worker()


def mismatch():
    fleet.init(is_collective=False)
    emb = dtrain.nn.SparseEmbedding("t", 4 + (0 if fleet.is_server() else fleet.worker_index()))
    fleet.distributed_optimizer(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1))
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return
    fleet.init_worker()
    fleet.barrier_worker()
    emb(KEYS)
    fleet.stop_worker()


def optimizer():
    fleet.init(is_collective=False)
    fleet.distributed_optimizer(torch.optim.RMSprop([torch.zeros(1, requires_grad=True)]))


if __name__ == "__main__":
    what = sys.argv[1]
    if what in ("save", "load", "fresh"):
        train(what, sys.argv[2] if len(sys.argv) > 2 else None)
    elif what == "delta":
        delta(sys.argv[2])
    else:
        globals()[what]()
