"""Paddle's Fleet API, collective half, over PyTorch.

    from dtrain import fleet
    strategy = fleet.DistributedStrategy()
    strategy.gradient_merge = True
    strategy.gradient_merge_configs = {"k_steps": 4}
    fleet.init(is_collective=True, strategy=strategy)
    model = fleet.distributed_model(model)
    optimizer = fleet.distributed_optimizer(optimizer)

distributed_model is torch's DistributedDataParallel over the "dtrain" group
(DDP's reducer and comm hooks run on Python modules; the C++ DataParallel
works on C++ modules only). The strategy is read by the C++ [strategy]
reader of the C++ Fleet API, and the float16 loss scaling is its LossScaler.
The role comes from the same C++ role maker (dtrain's, Paddle's, torchrun's,
Slurm's or Open MPI's variables). docs/python.md lists what each attribute does.

fleet.init(is_collective=False) is the parameter-server half (dtrain.fleet.ps):
is_server(), init_server(), run_server(), init_worker(), stop_worker(),
save_persistables()... on the C++ Fleet API's tables and client.
"""

import contextlib
import functools
import os
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import dtrain.torch as _dtorch
from dtrain.fleet import metrics, ps
from dtrain.fleet.ps import (init_server, run_server, init_worker, stop_worker, save_persistables,
                             load_persistables, shrink, is_server, is_worker, server_index, server_num)
from dtrain.fleet.strategy import DistributedStrategy
from dtrain.fleet.sync_batch_norm import SyncBatchNorm, convert_sync_batchnorm

__all__ = ["DistributedStrategy", "SyncBatchNorm", "init", "is_initialized", "worker_index", "worker_num",
           "is_first_worker", "local_rank", "barrier_worker", "distributed_model", "distributed_optimizer",
           "convert_sync_batchnorm", "metrics", "init_server", "run_server", "init_worker", "stop_worker",
           "save_persistables", "load_persistables", "shrink", "is_server", "is_worker", "server_index",
           "server_num"]

_state = {"role": None, "strategy": None, "strategy_given": False, "options": None, "micro_step": 0, "ps": False}


def _require_init(what):
    if _state["role"] is None:
        raise RuntimeError(f"fleet.{what}: call fleet.init() first")


def init(role_maker=None, is_collective=True, strategy=None, backend="", ps_configs=None):
    """fleet.init: joins the job's workers and sets up torch's default group over "dtrain".

    The role comes from the launcher's variables (dtrain's, Paddle's, torchrun's...).
    backend: the plugin ("gloo", "ucx", ...); default: the launcher's --backend.
    is_collective=False: a parameter-server job (dtrain.fleet.ps); ps_configs: its [ps]
    keys (timeout_s, collective, checkpoint_dir, save_on_exit, backend).
    """
    if role_maker is not None:
        raise ValueError("fleet.init: role_maker is not taken; dtrain finds the role in the environment "
                         "(DTRAIN_*, PADDLE_*, torchrun's RANK/WORLD_SIZE, Slurm, Open MPI)")
    if _state["role"] is not None:
        raise RuntimeError("fleet.init was called already in this process")
    _state["strategy_given"] = strategy is not None
    strategy = strategy if strategy is not None else DistributedStrategy()
    options = strategy.options()
    role = _dtorch._C.role()
    if not is_collective:
        ps.init(role, strategy, ps_configs)
        _state.update(role=role, strategy=strategy, options=options, micro_step=0, ps=True)
        return
    if ps_configs is not None:
        raise ValueError("fleet.init: ps_configs is for a parameter-server job (is_collective=False)")
    if options["a_sync"]:
        raise ValueError("fleet.init: strategy.a_sync = True asks for parameter-server training, but "
                         "is_collective=True; call fleet.init(is_collective=False) in a job with servers")
    if role["role"] == "server":
        raise RuntimeError("fleet.init(is_collective=True) in a parameter-server server process")
    if backend:
        _dtorch.set_backend(backend)
    if not dist.is_initialized():
        rank, world = role["rank"], role["world_size"]
        if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
            dist.init_process_group(_dtorch.NAME, rank=rank, world_size=world)
        elif world > 1 and role["worker_endpoints"]:
            # Paddle's variables alone: worker 0's endpoint serves torch's store.
            dist.init_process_group(_dtorch.NAME, init_method=f"tcp://{role['worker_endpoints'][0]}",
                                    rank=rank, world_size=world)
        else:
            dist.init_process_group(_dtorch.NAME, store=dist.HashStore(), rank=0, world_size=1)
    _state.update(role=role, strategy=strategy, options=options, micro_step=0)


def is_initialized():
    return _state["role"] is not None


def worker_index():
    _require_init("worker_index")
    return ps.worker_index() if _state["ps"] else dist.get_rank()


def worker_num():
    _require_init("worker_num")
    return ps.worker_num() if _state["ps"] else dist.get_world_size()


def is_first_worker():
    return worker_index() == 0


def local_rank():
    _require_init("local_rank")
    return _state["role"]["local_rank"]


def barrier_worker():
    _require_init("barrier_worker")
    if _state["ps"]:
        ps.barrier_worker()
    else:
        dist.barrier()


def _merge_k():
    return _state["options"]["gradient_merge_k_steps"]


def _autocast(device, options):
    if not options["amp"]:
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if options["amp_dtype"] == "bfloat16" else torch.float16
    if device.type == "cpu" and dtype == torch.float16:
        raise ValueError("strategy.amp: float16 autocast needs CUDA tensors in this torch; on CPU set "
                         "strategy.amp_configs = {'dtype': 'bfloat16'}")
    return torch.autocast(device_type=device.type, dtype=dtype)


class _FleetModel(DistributedDataParallel):
    """DDP that skips the gradient all-reduce inside a gradient-merge group and runs under autocast."""

    def forward(self, *args, **kwargs):
        k = _merge_k()
        self.require_backward_grad_sync = _state["micro_step"] % k == k - 1
        device = next(self.module.parameters()).device
        with _autocast(device, _state["options"]):
            return super().forward(*args, **kwargs)


def _recompute(model, names):
    from torch.utils.checkpoint import checkpoint
    targets = [model.get_submodule(n) for n in names] if names else [
        m for m in model.children() if any(True for _ in m.parameters())]
    for m in targets:
        m.forward = functools.partial(checkpoint, m.forward, use_reentrant=False)


def distributed_model(model):
    """fleet.distributed_model: DDP over the "dtrain" group, with the strategy's bucket size,
    fp16_allreduce (a comm hook), sync_batch_norm, recompute, amp and gradient_merge.

    In a parameter-server job the model is returned as it is: its parameter names
    name the dense tables (as the C++ DenseParameters names them)."""
    _require_init("distributed_model")
    if _state["ps"]:
        return ps.set_model(model)
    o = _state["options"]
    if o["sync_batch_norm"]:
        model = convert_sync_batchnorm(model)
    if o["recompute"]:
        _recompute(model, o["recompute_checkpoints"])
    if o["amp"]:
        _autocast(next(model.parameters()).device, o)  # refuses an impossible dtype now
    cap = o["fuse_grad_size_in_MB"] if o["fuse_all_reduce_ops"] else 0
    ddp = _FleetModel(model, bucket_cap_mb=cap)
    if o["fp16_allreduce"]:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        hook = default_hooks.bf16_compress_hook if o["fp16_allreduce_dtype"] == "bf16" else \
            default_hooks.fp16_compress_hook
        ddp.register_comm_hook(None, hook)
    return ddp


class DistributedOptimizer:
    """The user's optimizer under the strategy: gradient merge, float16 loss scaling, ZeRO stage 1."""

    def __init__(self, optimizer, options):
        self._options = options
        if options["sharding"]:
            if options["sharding_stage"] != 1:
                raise ValueError(f"strategy.sharding_configs stage {options['sharding_stage']}: dtrain.fleet "
                                 "shards optimizer state (stage 1, torch's ZeroRedundancyOptimizer); stages 2 and 3 "
                                 "are in the C++ Fleet API, or FSDP on torch 2.x")
            from torch.distributed.optim import ZeroRedundancyOptimizer
            defaults = dict(optimizer.defaults)
            params = [p for g in optimizer.param_groups for p in g["params"]]
            optimizer = ZeroRedundancyOptimizer(params, optimizer_class=type(optimizer), **defaults)
        self.inner = optimizer
        _state["micro_step"] = 0
        self._scaler = _dtorch._C.LossScaler(_state["strategy"].to_toml()) if options["loss_scaling"] else None
        self._applied = True

    @property
    def param_groups(self):
        return self.inner.param_groups

    def _params(self):
        return [p for g in self.inner.param_groups for p in g["params"] if p.grad is not None]

    def scale(self, loss):
        """loss times the loss scale (amp with float16); call backward on what it returns."""
        return loss * self._scaler.scale if self._scaler else loss

    def step(self, closure=None):
        """One micro-step: the inner optimizer steps once per gradient-merge group, not on overflow."""
        _state["micro_step"] += 1
        k = _merge_k()
        self._applied = False
        if _state["micro_step"] % k:
            return None
        factor = 1.0 / k if k > 1 and self._options["gradient_merge_avg"] else 1.0
        if self._scaler:
            factor /= self._scaler.scale
        if factor != 1.0:
            for p in self._params():
                p.grad.mul_(factor)
        if self._scaler:
            found = torch.zeros(1)
            for p in self._params():
                if not torch.isfinite(p.grad).all():
                    found.fill_(1)
                    break
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
            if self._scaler.update(bool(found.item())):
                self._applied = True
                return None
        self._applied = True
        return self.inner.step(closure) if closure else self.inner.step()

    def zero_grad(self, set_to_none=False):
        """Clears the gradients once the inner optimizer has stepped (they accumulate within a merge group)."""
        if self._applied:
            self.inner.zero_grad(set_to_none=set_to_none)

    clear_grad = zero_grad

    def minimize(self, loss):
        """Paddle's minimize: backward, then step."""
        self.scale(loss).backward()
        self.step()

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state):
        self.inner.load_state_dict(state)


def distributed_optimizer(optimizer, strategy=None):
    """fleet.distributed_optimizer; a strategy given here replaces fleet.init's (Paddle accepts both)."""
    _require_init("distributed_optimizer")
    if strategy is not None:
        options = strategy.options()
        if _state["ps"]:
            ps.set_strategy(strategy)
        if _state["strategy_given"] and strategy.to_toml() != _state["strategy"].to_toml():
            warnings.warn("fleet.distributed_optimizer: the strategy given here replaces the one given to fleet.init")
        _state["strategy"], _state["options"] = strategy, options
    if _state["ps"]:
        return ps.distributed_optimizer(optimizer)
    if _state["options"]["a_sync"]:
        raise ValueError("fleet.distributed_optimizer: strategy.a_sync = True needs a parameter-server job "
                         "(fleet.init(is_collective=False))")
    return DistributedOptimizer(optimizer, _state["options"])
