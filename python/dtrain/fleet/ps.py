"""The parameter-server half of dtrain.fleet (Paddle's fleet.init(is_collective=False)).

    fleet.init(is_collective=False)
    model = fleet.distributed_model(WideDeep())       # names the dense tables
    optimizer = fleet.distributed_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3), strategy)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
    else:
        fleet.init_worker()
        ...  loss.backward(); optimizer.step(); optimizer.zero_grad()
        fleet.stop_worker()

This process joins the job through the C++ Fleet API (dtrain/fleet/ps.h) at
init_server() or init_worker(), so a strategy given to distributed_optimizer
still sets the mode: sync (a_sync = False), async, or GEO (a_sync with
a_sync_configs = {"k_steps": k}). The torch optimizer becomes the servers'
rule for the dense parameters and for every SparseEmbedding that names none.
"""

import atexit
import os
import warnings

import torch

from dtrain import _ext, _toml
from dtrain import nn as _nn

# What a server passes to the workers through the job's store: the folder its
# init_server(dirname) was given ("" for none). The workers load it once the
# tables are declared.
_LOAD_KEY = "py/ps/init_server/{}"

_state = {"role": None, "strategy": None, "ps_configs": {}, "joined": False, "optimizer": None, "model": None,
          "load_dir": ""}


def _C():
    return _ext.load()


def _role():
    if _state["role"] is None:
        raise RuntimeError("dtrain.fleet: call fleet.init(is_collective=False) first")
    return _state["role"]


def _who():
    r = _role()
    return f"server {r['server_index']}" if r["role"] == "server" else f"worker {r['rank']}"


def _require(role, what):
    if _role()["role"] != role:
        raise RuntimeError(f"fleet.{what} is a {role} call, but this process is {_who()}")


def init(role, strategy, ps_configs):
    if role["role"] == "worker" and not role["server_endpoints"]:
        raise RuntimeError("fleet.init(is_collective=False): this job has no parameter servers; start it with "
                           "dtrain --server_num S --worker_num W (or set Paddle's PADDLE_PSERVERS_IP_PORT_LIST)")
    _state.update(role=role, strategy=strategy, ps_configs=dict(ps_configs or {}), joined=False, optimizer=None,
                  model=None, load_dir="")


def set_strategy(strategy):
    if _state["joined"]:
        raise RuntimeError("fleet.distributed_optimizer: the strategy must be given before fleet.init_worker() "
                           "(the mode is fixed when the worker joins)")
    _state["strategy"] = strategy


def _job_toml():
    return _state["strategy"].to_toml() + _toml.table("ps", {"backend": "ps_grpc", **_state["ps_configs"]})


def _join():
    if not _state["joined"]:
        _state["strategy"].options()  # a bad strategy is named before anything connects
        _C().ps.init(_job_toml())
        _state["joined"] = True
        atexit.register(_leave)


def _leave():
    """At exit, while gRPC is loaded: the modules' tables go first (their ops in flight are waited
    for), then the job (a worker that did not call stop_worker() tells the servers it leaves)."""
    for e in _nn._live_embeddings():
        e._table = None
    if _state["optimizer"] is not None:
        _state["optimizer"]._dense = None
    _state["joined"] = False
    _C().ps.shutdown()


def is_server():
    return _role()["role"] == "server"


def is_worker():
    return not is_server()


def server_index():
    _require("server", "server_index")
    return _role()["server_index"]


def server_num():
    return _role()["num_servers"]


def worker_index():
    _require("worker", "worker_index")
    return _role()["rank"]


def worker_num():
    return _role()["world_size"]


def init_server(dirname=None):
    """Joins as a server; dirname: a save_persistables folder the tables start from (loaded by
    worker 0 once the workers have declared them, since tables are declared by the workers)."""
    _require("server", "init_server")
    _join()
    _C().ps.init_server()
    _C().ps.store_set(_LOAD_KEY.format(server_index()), str(dirname or ""))


def run_server():
    """Serves until every worker has called stop_worker() (or exited under the launcher)."""
    _require("server", "run_server")
    if not _state["joined"]:
        raise RuntimeError("fleet.run_server: call fleet.init_server() first")
    _C().ps.run_server()


def init_worker():
    """Joins as a worker: connects to every server and declares every SparseEmbedding's table and the
    dense parameters of the optimizer's model; then loads what init_server(dirname) named."""
    _require("worker", "init_worker")
    _join()
    timeout = float(_state["ps_configs"].get("timeout_s", 300))
    dirs = {_C().ps.store_get(_LOAD_KEY.format(s), timeout) for s in range(server_num())} - {""}
    if len(dirs) > 1:
        raise RuntimeError(f"fleet.init_server: the servers were given different folders to load: {sorted(dirs)}")
    declare_tables("init_worker")
    if dirs:
        _refuse_geo("init_server(dirname)")
        _state["load_dir"] = dirs.pop()
        if worker_index() == 0:
            load_persistables(_state["load_dir"])
        barrier_worker()
        opt = _state["optimizer"]
        if opt is not None and opt._dense is not None:
            opt._dense.pull()


def declare_tables(what):
    """Declares the tables of every SparseEmbedding created so far (and the dense parameters)."""
    _require("worker", what)
    if not _state["joined"]:
        raise RuntimeError(f"{what}: call fleet.init_worker() first (it connects to the servers)")
    opt = _state["optimizer"]
    rule = opt._rule if opt is not None else {}
    late = [e.name for e in _nn._live_embeddings() if e._table is None]
    if opt is not None and opt._dense is None:
        late.append("the optimizer's dense parameters")
    if late and _state["load_dir"]:
        raise RuntimeError(f"{what}: {', '.join(late)} declared after init_worker() loaded "
                           f"fleet.init_server's folder {_state['load_dir']}; create every SparseEmbedding and call "
                           "fleet.distributed_optimizer before fleet.init_worker()")
    for e in _nn._live_embeddings():
        e._declare(rule)
    if opt is not None:
        opt._declare()


def stop_worker():
    """Tells the servers this worker is done (after its pushes in flight are in)."""
    _require("worker", "stop_worker")
    if _state["joined"]:
        _C().ps.stop_worker()


def barrier_worker():
    _require("worker", "barrier_worker")
    if not _state["joined"]:
        raise RuntimeError("fleet.barrier_worker: call fleet.init_worker() first")
    _C().ps.barrier_worker()


_SAVE_MODES = {"full": 0, "base": 1, "delta": 2}


def _is_path(x):
    return isinstance(x, (str, bytes)) or hasattr(x, "__fspath__")


def _refuse_geo(what):
    if _C().ps.mode() == "geo":
        raise RuntimeError(f"fleet.{what} in GEO mode: the workers train local copies that a load does not "
                           "reach; load in sync or async mode")


def save_persistables(executor=None, dirname=None, main_program=None, mode=0, *, text=False):
    """Saves every table into dirname (one folder per table, written atomically): loadable onto any
    number of servers. mode: 0 or "full", 1 or "base", 2 or "delta" (rows changed since the last
    base or delta). Call it on one worker, after barrier_worker() when every worker's pushes must be
    in. save_persistables(dirname, mode=0), or Paddle's save_persistables(executor, dirname,
    main_program=None, mode=0). text: Paddle-readable text files instead of binary ones."""
    if _is_path(executor):  # dtrain's form: (dirname[, mode])
        executor, dirname, mode = None, executor, dirname if dirname is not None else mode
    if dirname is None:
        raise TypeError("fleet.save_persistables: no dirname given")
    mode = _SAVE_MODES.get(mode, mode)
    if mode not in (0, 1, 2):
        raise ValueError(f"fleet.save_persistables: mode {mode!r} is not 0/'full', 1/'base' or 2/'delta'")
    _require("worker", "save_persistables")
    declare_tables("save_persistables")
    _C().ps.save_persistables(os.fspath(dirname), mode, text)


def load_persistables(executor=None, dirname=None, main_program=None):
    """Loads every declared table from dirname (on one worker; then barrier_worker(), and the next
    forward or step sees the loaded values). load_persistables(dirname), or Paddle's
    load_persistables(executor, dirname, main_program=None)."""
    if _is_path(executor):
        executor, dirname = None, executor
    if dirname is None:
        raise TypeError("fleet.load_persistables: no dirname given")
    _require("worker", "load_persistables")
    declare_tables("load_persistables")
    _refuse_geo("load_persistables")
    _C().ps.load_persistables(os.fspath(dirname))
    opt = _state["optimizer"]
    if opt is not None and opt._dense is not None:
        opt._dense.pull()


def shrink(new_day=False):
    """Evicts rows of every sparse table by its eviction keys (decay_rate, delete_threshold,
    delete_after_unseen_days); new_day ages every row by one day first. On one worker."""
    _require("worker", "shrink")
    declare_tables("shrink")
    for e in _nn._live_embeddings():
        e._table.shrink(new_day)


def set_model(model):
    _state["model"] = model
    return model


# torch optimizer -> the servers' rule ([ps.tables] keys). Anything a rule
# cannot express is refused by name rather than silently dropped.
def _rule_of(optimizer):
    groups = optimizer.param_groups
    g = groups[0]
    for other in groups[1:]:
        diff = [k for k in g if k != "params" and other.get(k) != g[k]]
        if diff:
            raise ValueError(f"fleet.distributed_optimizer: parameter groups differ in {diff}; the servers apply one "
                             "rule per table set (use one group, or SparseEmbedding's own keys)")
    kind = type(optimizer).__name__

    def refuse(key, default):
        if key in g and g[key] != default:
            raise ValueError(f"fleet.distributed_optimizer: {kind}({key}={g[key]!r}) has no server-side rule in "
                             f"dtrain's parameter server; leave {key} at {default!r}")

    if isinstance(optimizer, torch.optim.SGD):
        for key, default in (("momentum", 0), ("dampening", 0), ("weight_decay", 0), ("nesterov", False),
                             ("maximize", False)):
            refuse(key, default)
        return {"optimizer": "sgd", "learning_rate": float(g["lr"])}
    if isinstance(optimizer, torch.optim.Adagrad):
        for key, default in (("lr_decay", 0), ("weight_decay", 0), ("maximize", False)):
            refuse(key, default)
        return {"optimizer": "adagrad", "learning_rate": float(g["lr"]),
                "initial_g2sum": float(g["initial_accumulator_value"]), "epsilon": float(g["eps"])}
    if isinstance(optimizer, torch.optim.Adam) and not isinstance(optimizer, torch.optim.AdamW):
        for key, default in (("weight_decay", 0), ("amsgrad", False), ("maximize", False)):
            refuse(key, default)
        beta1, beta2 = g["betas"]
        return {"optimizer": "adam", "learning_rate": float(g["lr"]), "beta1": float(beta1), "beta2": float(beta2),
                "epsilon": float(g["eps"])}
    raise ValueError(f"fleet.distributed_optimizer: {kind} has no server-side rule in dtrain's parameter server; "
                     "use torch.optim.SGD, Adagrad or Adam (the servers' sgd, adagrad and adam)")


class PsOptimizer:
    """fleet.distributed_optimizer in PS mode: step() pushes every SparseEmbedding's gradients and the
    dense gradients, then brings back the servers' values (async with send_queue_size: in flight)."""

    def __init__(self, optimizer):
        self.inner = optimizer
        self._rule = _rule_of(optimizer)
        self._dense = None
        self._steps = 0
        if _state["optimizer"] is not None:
            raise RuntimeError("fleet.distributed_optimizer: a parameter-server job has one optimizer (the servers "
                               "hold its state); call it once")
        _state["optimizer"] = self

    @property
    def param_groups(self):
        return self.inner.param_groups

    def _params(self):
        return [p for g in self.inner.param_groups for p in g["params"]]

    def _names(self, params):
        model = _state["model"]
        known = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
        names = [known.get(id(p), f"param_{i}") for i, p in enumerate(params)]
        if len(known) < len(params):
            warnings.warn("fleet.distributed_optimizer: dense parameters not in fleet.distributed_model's model are "
                          "named by position (dense.param_<i>); a save then loads only into the same order")
        return names

    def _declare(self):
        if self._dense is None:
            params = self._params()
            for p in params:
                if p.dtype != torch.float32 or p.device.type != "cpu":
                    raise ValueError("fleet.distributed_optimizer: dense parameters on the servers must be float32 "
                                     f"CPU tensors, got {p.dtype} on {p.device}")
            from dtrain.nn import _table_toml
            self._dense = _C().ps.DenseParameters(self._names(params), params,
                                                  _table_toml("dense", {"dim": 1, **self._rule}))
        return self._dense

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("fleet's PS optimizer takes no closure")
        declare_tables("optimizer.step")
        for e in _nn._live_embeddings():
            e._table.push_gradients()
        self._dense.step()
        self._steps += 1

    def zero_grad(self, set_to_none=False):
        self.inner.zero_grad(set_to_none=set_to_none)

    clear_grad = zero_grad

    def minimize(self, loss):
        loss.backward()
        self.step()

    def flush(self):
        """Waits for every push and pull left in flight."""
        for e in _nn._live_embeddings():
            if e._table is not None:
                e._table.flush()
        if self._dense is not None:
            self._dense.flush()

    def pull(self):
        """Copies the servers' dense values into the parameters (before an evaluation)."""
        self._dense.pull()

    @property
    def steps(self):
        return self._steps


def distributed_optimizer(optimizer):
    _role()
    if is_server():
        # A server keeps the rule only: its tables are declared by the workers.
        _rule_of(optimizer)
        return optimizer
    return PsOptimizer(optimizer)
