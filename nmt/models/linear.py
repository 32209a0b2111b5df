"""Affine maps y = x W^T + b with faster fp32 CPU paths: the Transformer's layers, the output layer.

``nn.Linear`` computes y with one ``addmm``: on a CPU it first copies the bias into every row of
the output and then accumulates the product onto it. Taking the product alone and adding the bias
in place afterwards does the same arithmetic and is faster where the output is wide (fp32, 4000
rows, 2-core Xeon: 10% for 256 -> 1024, 5% for 256 -> 768, even for 256 -> 256 and 1024 -> 256):
the product then writes its output once instead of reading the copied bias back. Elsewhere (GPUs,
whose libraries fuse the bias into the product; bf16 autocast, where oneDNN does) F.linear runs.
``Linear`` keeps nn.Linear's parameters, their names and initialisation.

Which library computes fp32 products on a CPU is a second choice (``fp32_matmul``, measured by
``auto``). torch sends them to its BLAS, Intel's MKL on x86 builds, and MKL runs its AVX2 kernels
on AMD CPUs: on a 2-core AMD EPYC (family 26, AVX-512) its products reached 230-240 GFLOP/s where
oneDNN's reached 530-555 at the same shapes. With "onednn" the model's fp32 products go through
oneDNN instead (every ``Linear`` and the output layer; the LSTM baseline's output layer only): in
training forward and both gradients, in decoding the forward products.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FP32_MATMULS = ("blas", "onednn")


def _autocast_query_takes_device() -> bool:
    try:
        torch.is_autocast_enabled("cpu")
    except TypeError:  # torch < 2.4: is_autocast_enabled() takes no device
        return False
    return True


# Asked once, here: under torch.compile (torch < 2.4) the TypeError of a traced call comes out as
# dynamo's own InternalTorchDynamoError, which no except clause in the traced code sees.
_AUTOCAST_QUERY_TAKES_DEVICE = _autocast_query_takes_device()


def cpu_autocast_enabled() -> bool:
    if _AUTOCAST_QUERY_TAKES_DEVICE:
        return torch.is_autocast_enabled("cpu")
    return torch.is_autocast_cpu_enabled()


def onednn_available() -> bool:
    """Whether this torch build can send products to oneDNN (``torch.ops.mkldnn._linear_pointwise``,
    the op torch's own compiler uses on CPUs)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return torch.ops.mkldnn._linear_pointwise.default is not None
    except (AttributeError, RuntimeError):
        return False


def onednn_affine(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T + b for 2-D x (rows, in) and weight (out, in), computed by oneDNN (bias added in the product)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def onednn_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The product a @ b, computed by oneDNN; transposed operands are read in place."""
    return onednn_affine(a, b.t())


def onednn_rows_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a^T b for a (rows, m) and b (rows, n), by oneDNN: the sum over rows that a weight gradient is.

    oneDNN reads its first operand in row-major layout only, and torch copies it there first; so
    the narrower of a and b is made that operand (a copy of rows x min(m, n) values instead of
    rows x max(m, n)), and for m > n the result is the transposed view of (b^T a). On a 2-core AMD
    EPYC (4,096 rows, 256 -> 1024) that took the product from 276 to 396 GFLOP/s.
    """
    if a.shape[1] <= b.shape[1]:
        return onednn_mm(a.t(), b)
    return onednn_mm(b.t(), a).t()


def compiling() -> bool:
    """Whether torch.compile is tracing: its compiler picks its own CPU kernels (and cannot lower the
    oneDNN op called with a transposed weight)."""
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)  # torch >= 2.3
    return bool(is_compiling()) if is_compiling is not None else torch._dynamo.is_compiling()


class _OneDnnAffine(torch.autograd.Function):
    """y = x W^T + b on rows, every product of the forward and backward pass done by oneDNN."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return onednn_affine(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        want_x, want_weight, want_bias = ctx.needs_input_grad
        grad_x = onednn_mm(grad, weight) if want_x else None
        grad_weight = onednn_rows_product(grad, x) if want_weight else None
        grad_bias = grad.sum(0) if want_bias else None  # never wanted where there is no bias
        return grad_x, grad_weight, grad_bias


def affine(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, fp32_matmul: str = "blas") -> torch.Tensor:
    """x W^T + b for x (..., in) and weight (out, in), as ``F.linear``. For fp32 on a CPU outside
    autocast the product is ``fp32_matmul``'s, on rows: oneDNN's adds the bias itself, the BLAS's is
    followed by an in-place sum. Elsewhere (GPUs, whose libraries fuse the bias into the product; bf16
    autocast, where oneDNN does) F.linear."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or cpu_autocast_enabled():
        return F.linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1])
    if fp32_matmul == "onednn" and not compiling():
        y = _OneDnnAffine.apply(rows, weight, bias) if torch.is_grad_enabled() else onednn_affine(rows, weight, bias)
    elif bias is None:
        return F.linear(x, weight)
    else:
        # The in-place sum is on the product itself, not on a view of it (which autograd would
        # have to copy back into its base).
        y = torch.mm(rows, weight.t()).add_(bias)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], y.shape[-1])  # rows in, the product itself out


class Linear(nn.Linear):
    fp32_matmul = "blas"  # the library for fp32 CPU products: "blas" or "onednn" (Seq2Seq.set_fp32_matmul)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return affine(x, self.weight, self.bias, self.fp32_matmul)
