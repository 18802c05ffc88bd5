"""Loads dtrain._C after checking that this interpreter's torch is the one it was built for."""

import importlib
import sys

import torch

from dtrain import _build_info


def _major_minor(version):
    return ".".join(version.split("+")[0].split(".")[:2])


def load(name="_C"):
    """Returns the extension module dtrain.<name> (_C, or an app's: _ctr), or raises ImportError saying
    what differs between the torch it was built for and this interpreter's."""
    built, have = _major_minor(_build_info.TORCH_VERSION), _major_minor(torch.__version__)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    if built != have or abi != _build_info.CXX11_ABI:
        raise ImportError(
            f"dtrain was built for torch {_build_info.TORCH_VERSION} (C++ ABI flag "
            f"_GLIBCXX_USE_CXX11_ABI={_build_info.CXX11_ABI}), but {sys.executable} imports "
            f"torch {torch.__version__} (ABI flag {abi}) from {torch.__file__}. Run the "
            f"interpreter dtrain was built for ({_build_info.PYTHON}), or rebuild dtrain for "
            f"this one: cmake -DDTRAIN_PYTHON_EXECUTABLE={sys.executable} ...")
    return importlib.import_module(f"dtrain.{name}")
