"""fleet.metrics: a worker's local value in, the value over every worker out (Paddle's names).

Every worker calls the same function in the same order. In a parameter-server
job they go through the workers' side communicator ([ps] collective, the C++
fleet::metrics); in a collective job through torch.distributed's default group.
"""

import torch
import torch.distributed as dist

from dtrain import _ext

__all__ = ["sum", "max", "min", "acc", "auc"]


def _ps():
    from dtrain.fleet import _state
    if _state["role"] is None:
        raise RuntimeError("fleet.metrics: call fleet.init() first")
    return _state["ps"]


def _values(x):
    return torch.as_tensor(x, dtype=torch.float64).flatten().tolist()


def _reduce(values, op):
    """One collective for the whole list."""
    t = torch.tensor(values, dtype=torch.float64)
    if _ps():
        _ext.load().ps.metrics.all_reduce(t, op)
    elif dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
    return t.tolist()


def _scalar_or_list(x, out):
    return out[0] if torch.as_tensor(x).dim() == 0 else out


def sum(value):  # noqa: A001 (Paddle's name)
    """The sum over workers of a number, or of every element of a list or tensor."""
    return _scalar_or_list(value, _reduce(_values(value), "sum"))


def max(value):  # noqa: A001
    return _scalar_or_list(value, _reduce(_values(value), "max"))


def min(value):  # noqa: A001
    return _scalar_or_list(value, _reduce(_values(value), "min"))


def acc(correct, total):
    """sum(correct) / sum(total) over workers (0 when there is no example anywhere)."""
    c, t = _reduce([float(correct), float(total)], "sum")
    return c / t if t > 0 else 0.0


def auc(stat_pos, stat_neg):
    """Paddle's bucketed AUC: bucket i counts the positives (negatives) whose predicted probability p
    has floor(p * buckets) == i; the buckets are summed over workers, then the area is computed
    from them (ties within a bucket count one half). 0.5 when either class is empty."""
    pos, neg = _values(stat_pos), _values(stat_neg)
    if len(pos) != len(neg):
        raise ValueError(f"fleet.metrics.auc: {len(pos)} positive buckets but {len(neg)} negative ones")
    both = _reduce(pos + neg, "sum")
    return _ext.load().ps.metrics.auc_of_buckets(both[:len(pos)], both[len(pos):])
