"""dtrain from Python.

``import dtrain.torch`` registers the c10d backend ``"dtrain"`` (torch.distributed
over dtrain's plugins: gloo, ucx, nccl); ``dtrain.fleet`` is Paddle's Fleet API
over PyTorch. See docs/python.md.
"""

__all__ = ["torch", "fleet"]
