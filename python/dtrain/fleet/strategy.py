"""Paddle's DistributedStrategy, read by the same C++ as the C++ Fleet API's [strategy] table."""

import difflib

from dtrain import _ext, _toml

# Paddle's attribute -> the [strategy] key it sets; a *_configs dict's keys go
# under the table of the same name (gradient_merge and localsgd have theirs
# under their own name, as the TOML writes them).
_FLAGS = ("fuse_all_reduce_ops", "fuse_grad_size_in_MB", "fp16_allreduce", "fp16_allreduce_dtype", "a_sync",
          "sharding", "amp", "recompute", "lamb", "lars", "sync_batch_norm", "gradient_merge", "localsgd")
_CONFIGS = {"gradient_merge_configs": "gradient_merge", "localsgd_configs": "localsgd",
            "a_sync_configs": "a_sync_configs", "sharding_configs": "sharding_configs",
            "amp_configs": "amp_configs", "recompute_configs": "recompute_configs",
            "lamb_configs": "lamb_configs", "lars_configs": "lars_configs"}
# Known to Paddle and to the C++ Fleet API, but not acting from Python yet: refused when set.
_NOT_FROM_PYTHON = {
    "localsgd": "local SGD is in the C++ Fleet API only (fleet::distributed_optimizer)",
    "lamb": "LAMB is in the C++ Fleet API only; use an Adam optimizer here",
    "lars": "LARS is in the C++ Fleet API only; use a Momentum optimizer here",
}


class DistributedStrategy:
    """fleet.DistributedStrategy: Paddle's attribute names and *_configs dicts.

    Any other attribute is refused with the closest known name; values are
    checked by the C++ [strategy] reader (bounds, combinations), the one the
    C++ Fleet API uses.
    """

    def __init__(self):
        object.__setattr__(self, "_values", {})

    def __setattr__(self, name, value):
        if name not in _FLAGS and name not in _CONFIGS:
            close = difflib.get_close_matches(name, list(_FLAGS) + list(_CONFIGS), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise AttributeError(f"DistributedStrategy has no attribute '{name}'{hint}")
        if name in _CONFIGS:
            if not isinstance(value, dict):
                raise TypeError(f"DistributedStrategy.{name} takes a dict, as Paddle's does")
            value = {**self._values.get(name, {}), **value}
        self._values[name] = value
        self.options()  # checks the whole strategy now, where the user set it

    def __getattr__(self, name):
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        if name in _CONFIGS:
            return {}
        if name in _FLAGS:
            return {"fuse_all_reduce_ops": True, "fuse_grad_size_in_MB": 32}.get(name, False)
        raise AttributeError(f"DistributedStrategy has no attribute '{name}'")

    def to_toml(self):
        """The strategy as the job file's [strategy] table."""
        top, tables = {}, {}
        for name, value in self._values.items():
            if name in ("gradient_merge", "localsgd"):
                continue  # enabled by their k_steps
            if name in _CONFIGS:
                tables.setdefault(_CONFIGS[name], {}).update(value)
            else:
                top[name] = value
        for flag in ("gradient_merge", "localsgd"):
            if self._values.get(flag, False) and "k_steps" not in tables.setdefault(flag, {}):
                tables[flag]["k_steps"] = 1
        return _toml.table("strategy", top) + "".join(_toml.table(f"strategy.{t}", keys) for t, keys in tables.items())

    def options(self):
        """The strategy as the C++ reads it (a dict); raises ValueError naming a bad key."""
        for name, why in _NOT_FROM_PYTHON.items():
            if self._values.get(name):
                raise ValueError(f"DistributedStrategy.{name}: {why}")
        try:
            options = _ext.load().strategy(self.to_toml())
        except Exception as e:  # the core's ConfigError, with the key
            raise ValueError(f"DistributedStrategy: {e}") from None
        # A *_configs dict is checked even while its switch is off (as Paddle
        # keeps it); the switch decides whether it acts.
        if not self._values.get("gradient_merge", False):
            options["gradient_merge_k_steps"] = 1
        return options

    def __repr__(self):
        return f"DistributedStrategy({self.options()['describe']})"
