"""Dropout with cheap masks: one random byte per element instead of a Bernoulli draw.

On CPU, ``F.dropout`` draws each mask element separately and was a third of a bf16 training
step (see ../shared/ANCHORS.md). Here 64 random bits make 8 mask bytes, a byte is kept
when it is >= round(256 p), and the kept values are scaled by 1 / (1 - p_eff) with
p_eff = round(256 p) / 256, the rate actually applied (0.1 -> 0.1016), so the output stays
unbiased. The bits come from torch's generator, so seeding and checkpointed RNG state
govern them like any other dropout. Measured 3x faster than F.dropout (forward + backward,
3600 x 256, bf16 and fp32). GPUs keep F.dropout, whose fused kernel is already cheap.
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


class Dropout(nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        return byte_dropout(x, self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"
