"""torch.distributed's backend ``"dtrain"``: c10d ops over dtrain's plugins.

    import dtrain.torch
    torch.distributed.init_process_group("dtrain")        # env://, as under torchrun or dtrain

Under ``dtrain`` the groups meet in the job's authenticated store, so a rank
that dies is named by the launcher's root-cause report; under torchrun or a
plain ``env://`` in the store torch hands over. The plugin is the one chosen
with :func:`set_backend`, else the launcher's ``--backend`` (DTRAIN_BACKEND),
else gloo for CPU tensors and nccl for CUDA tensors.
"""

import atexit
import inspect
import os

import torch.distributed as dist

from dtrain import _ext, _toml

_C = _ext.load()

NAME = "dtrain"
ProcessGroupDtrain = _C.ProcessGroupDtrain
_choice = {"backend": "", "options": {}, "plugin_dirs": []}


def set_backend(name="", options=None, plugin_dirs=None):
    """Chooses the plugin of the groups created after this call.

    name: a plugin ("gloo", "ucx", "nccl", or a third party's); "" restores the
    default (DTRAIN_BACKEND, else gloo on CPU and nccl on CUDA tensors).
    options: the plugin's own keys, as its TOML table would hold them.
    plugin_dirs: folders searched for plugins before the installed ones.
    """
    try:
        _toml.table("", options or {})
    except TypeError as e:
        raise TypeError(f"dtrain.torch.set_backend: option {e}") from None
    _choice["backend"] = name
    _choice["options"] = dict(options or {})
    _choice["plugin_dirs"] = list(plugin_dirs or [])


def backend():
    """The plugin the next group will use ("" for the per-device default)."""
    return _choice["backend"] or os.environ.get("DTRAIN_BACKEND", "")


def plugins():
    """The installed plugins: name, version, ABI and capabilities of each."""
    return _C.plugins()


def _create(store, rank, size, timeout):
    toml = _toml.table("", _choice["options"])
    return _C.create_group(store, rank, size, timeout, backend(), toml, _choice["plugin_dirs"])


def _register():
    if hasattr(dist.Backend, NAME.upper()):
        return
    params = inspect.signature(dist.Backend.register_backend).parameters
    if "devices" in params:  # torch 2.x: one c10d::Backend for both device types
        dist.Backend.register_backend(NAME, _create, devices=["cpu", "cuda"])
    else:
        dist.Backend.register_backend(NAME, _create)


_register()
# Ops still in flight at exit complete while Python can run their futures'
# callbacks (one run by a thread during finalization kills that thread).
atexit.register(_C.drain)
