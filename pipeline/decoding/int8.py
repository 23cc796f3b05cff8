"""int8 weights for the native engines on the CPU, as CTranslate2's ``compute_type="int8"`` has them.

A matrix is stored as int8 with one float scale per output channel; each product quantizes its
activations on the fly and runs fbgemm's int8 GEMM (``torch.ops.quantized.linear_dynamic``). A
step reads a quarter of the float32 bytes. PyTorch's weight-only int8 kernel
(``aten._weight_int8pack_mm``, float activations) was measured slower than float32 on this CPU
(BENCHMARKS.md), so the activations are quantized too, as in CTranslate2.
"""

from __future__ import annotations

import warnings

import torch


class Int8Matrix:
    """``x @ W`` for a float matrix W [in, out], kept as int8 per output channel (fbgemm, CPU only)."""

    def __init__(self, weight: torch.Tensor):
        if weight.device.type != "cpu":
            raise ValueError("int8 weights run on the CPU only (fbgemm); use a float dtype on a GPU")
        rows = weight.t().float().contiguous()  # [out, in]
        scales = rows.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        zero_points = torch.zeros(len(scales), dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensors are deprecated, to be replaced by torchao's
            warnings.simplefilter("ignore", UserWarning)
            quantized = torch.quantize_per_channel(rows, scales.double(), zero_points, 0, torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(quantized, None)
        self.shape = tuple(weight.shape)

    def __rmatmul__(self, x: torch.Tensor) -> torch.Tensor:
        # reduce_range as torch.ao's dynamic Linear does on fbgemm: 7-bit activations avoid overflow.
        return torch.ops.quantized.linear_dynamic(x, self.packed, True)


def plus_product(x: torch.Tensor, hidden: torch.Tensor, weight) -> torch.Tensor:
    """x + hidden @ weight, fused into one addmm where the weight is a float tensor."""
    if isinstance(weight, torch.Tensor):
        return torch.addmm(x, hidden, weight)
    return x + hidden @ weight
