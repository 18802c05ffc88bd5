"""SyncBatchNorm on CPU and CUDA tensors (torch 1.13's own takes CUDA tensors only)."""

import torch
import torch.distributed as dist
from torch import nn


class _SyncBatchNormFunction(torch.autograd.Function):
    """Batch statistics summed over the group: one all-reduce forward, one backward (as torch's)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, group):
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        shape = [1, c] + [1] * (x.dim() - 2)
        xf = x.float()  # statistics in float32 under amp's 16-bit activations
        stats = torch.cat([xf.sum(dims), (xf * xf).sum(dims), xf.new_tensor([x.numel() // c])])
        dist.all_reduce(stats, group=group)
        n = stats[-1]
        mean = stats[:c] / n
        var = (stats[c:2 * c] / n - mean * mean).clamp_min(0)
        invstd = torch.rsqrt(var + eps)
        xhat = (x - mean.view(shape).to(x.dtype)) * invstd.view(shape).to(x.dtype)
        ctx.save_for_backward(xhat, weight, invstd, n)
        ctx.group, ctx.dims, ctx.shape = group, dims, shape
        y = xhat * weight.view(shape) + bias.view(shape) if weight is not None else xhat
        unbiased = var * n / (n - 1).clamp_min(1)
        ctx.mark_non_differentiable(mean, unbiased)
        return y, mean, unbiased

    @staticmethod
    def backward(ctx, grad_y, _grad_mean, _grad_var):
        xhat, weight, invstd, n = ctx.saved_tensors
        dims, shape = ctx.dims, ctx.shape
        c = xhat.shape[1]
        sums = torch.cat([grad_y.sum(dims), (grad_y * xhat).sum(dims)]).float()
        local_dw, local_db = sums[c:].clone(), sums[:c].clone()
        dist.all_reduce(sums, group=ctx.group)
        mean_dy, mean_dy_xhat = sums[:c] / n, sums[c:] / n
        scale = invstd if weight is None else invstd * weight
        grad_x = (grad_y - mean_dy.view(shape) - xhat * mean_dy_xhat.view(shape)) * scale.view(shape)
        grad_w = local_dw.to(grad_y.dtype) if weight is not None else None
        grad_b = local_db.to(grad_y.dtype) if weight is not None else None
        return grad_x, grad_w, grad_b, None, None


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics cover every worker's batch (Paddle's sync_batch_norm)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, group=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.group = group

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects at least 2-D input (got {x.dim()}-D)")

    def forward(self, x):
        self._check_input_dim(x)
        world = dist.get_world_size(self.group) if dist.is_initialized() else 1
        if not self.training or world == 1:
            return super().forward(x)
        y, mean, var = _SyncBatchNormFunction.apply(x, self.weight, self.bias, self.eps, self.group)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                self.running_mean.mul_(1 - m).add_(mean.to(self.running_mean.dtype), alpha=m)
                self.running_var.mul_(1 - m).add_(var.to(self.running_var.dtype), alpha=m)
        return y


def convert_sync_batchnorm(module, group=None):
    """Replaces every BatchNorm1d/2d/3d of module by a SyncBatchNorm with its parameters and statistics."""
    out = module
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, SyncBatchNorm):
        out = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, group)
        if module.affine:
            with torch.no_grad():
                out.weight.copy_(module.weight)
                out.bias.copy_(module.bias)
        if module.track_running_stats:
            out.running_mean.copy_(module.running_mean)
            out.running_var.copy_(module.running_var)
            out.num_batches_tracked.copy_(module.num_batches_tracked)
        out.train(module.training)
    for name, child in module.named_children():
        out.add_module(name, convert_sync_batchnorm(child, group))
    return out
