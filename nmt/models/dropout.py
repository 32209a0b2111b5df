"""Dropout with cheap masks: one random byte per element instead of a Bernoulli draw.

On CPU, ``F.dropout`` draws each mask element separately; in a profile of a bf16 training step of
a plain PyTorch Transformer it took about a third of the step. Here 64 random bits make 8 mask
bytes, a byte is kept when it is >= round(256 p), and the kept values are scaled by
1 / (1 - p_eff) with p_eff = round(256 p) / 256, the rate actually applied (0.1 -> 0.1016), so the
output stays unbiased. The bits come from torch's generator, so seeding and checkpointed RNG
state govern them like any other dropout. Measured 3x faster than F.dropout (forward + backward,
3600 x 256, bf16 and fp32). GPUs keep F.dropout, whose fused kernel is already cheap.

Every dropout of both models goes through ``dropout`` (or the ``Dropout`` module around it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def byte_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """x * mask / (1 - p_eff), mask[i] = (random byte >= round(256 p))."""
    threshold = round(256 * p)
    if threshold == 0:
        return x
    if threshold >= 256:
        return torch.zeros_like(x)
    n = x.numel()
    bits = torch.empty((n + 7) // 8, dtype=torch.int64, device=x.device).random_(-(2**63), None)  # all 64 bits
    keep = bits.view(torch.uint8)[:n].view(x.shape) >= threshold
    scale = keep.to(x.dtype).mul_(256.0 / (256 - threshold))
    return x * scale


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Training-time dropout of rate ``p``: byte masks on a CPU, PyTorch's fused kernel elsewhere."""
    if p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    return byte_dropout(x, p)


class Dropout(nn.Module):
    """``dropout`` while training, the identity in eval mode."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p) if self.training else x

    def extra_repr(self) -> str:
        return f"p={self.p}"
