"""int8 weights on the CPU (job key ``models.quantize: int8``): a layer's matrix as the native engines
multiply by it, with the interface of ``native.Matrix``.

Weights are quantized once, symmetrically per output channel (scale = max |w| / 127). Activations
are quantized per row at run time, so that a row's product does not depend on the other rows of
the call: a verification of five drafts, a step of one, and batches of any size give the very same
logits for the same position — what keeps BiLD with rollback_threshold 0 and greedy speculative
decoding identical to ``large`` under int8 too.

The kernel is fbgemm's dynamic quantized linear (``torch.ops.quantized.linear_dynamic``, the op
under ``torch.ao``'s deprecated eager entry points; tests/decoding/test_int8.py fails if it goes).
It quantizes its input per tensor, from the tensor's min and max. So each row is first divided by
its own max |x| and the call gets one more row, a fence holding -1 and +1: every call's range is
then exactly [-1, 1], each row is quantized on its own scale, and its product is multiplied back.
``reduce_range`` (7-bit activations) keeps CPUs without VNNI from saturating their int16 sums.

Where int8 does not pay, the product stays float32 (``pays_off``): the fence's few extra small
ops cost more than they save on small matrices.
"""

from __future__ import annotations

import warnings

import torch

# Where int8 pays at one row, the batch-1 step (one thread, measured with the fence: 256x768 0.47x,
# 512x1536 1.16x, 256x6000 1.54x, 1024x4096 4.7x, 512x58101 9.7x; BENCHMARKS.md): from about 786k weights
# on. Below, the fence's few extra small ops cost more than the smaller reads save.
MIN_WEIGHTS = 3 << 18
# What the output's int8_scheme column says of it: fbgemm's int8 product, weights per output channel,
# each row's activations on its own scale (7 bits, fenced); matrices under MIN_WEIGHTS stay float32.
SCHEME = "fbgemm-int8-per-channel"


def pays_off(weight: torch.Tensor) -> bool:
    """Whether an [out, in] float weight is multiplied in int8: by its shape alone, so that every
    actor of a job, and every row count, computes the same products."""
    out_features, in_features = weight.shape
    return out_features * in_features >= MIN_WEIGHTS


class Int8Matrix:
    """x @ W with W held in int8 (per output channel), for x [N, in] in float32."""

    def __init__(self, weight: torch.Tensor):
        """weight: a float [out, in] matrix (a linear layer's), already folded where the family folds."""
        weight = weight.detach().float().contiguous()
        out_features, in_features = weight.shape
        scales = (weight.abs().amax(dim=1) / 127).clamp_min(1e-12).double()
        with warnings.catch_warnings():  # quantized tensors are deprecated; the op takes nothing else yet
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
            quantized = torch.quantize_per_channel(weight, scales, torch.zeros(out_features, dtype=torch.long), 0,
                                                   torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(quantized, None)
        self._shape = torch.Size([in_features, out_features])
        self._buffers: dict[int, torch.Tensor] = {}  # rows -> [rows + 1, in], the last row the fence

    @property
    def shape(self) -> torch.Size:
        """[in, out], as native.Matrix."""
        return self._shape

    def _scaled_product(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x / a) @ W [N, out] and a [N, 1], a being each row's max |x|."""
        rows = len(x)
        fenced = self._buffers.get(rows)
        if fenced is None:
            fenced = self._buffers[rows] = torch.zeros(rows + 1, self._shape[0])
            fenced[rows, 0], fenced[rows, 1] = -1.0, 1.0
        scale = torch.linalg.vector_norm(x, float("inf"), dim=1, keepdim=True).clamp_min_(1e-12)  # [N, 1]
        torch.div(x, scale, out=fenced[:rows])
        product = torch.ops.quantized.linear_dynamic(fenced, self.packed, True)  # [N + 1, out]
        return product[:rows], scale

    def product(self, x: torch.Tensor) -> torch.Tensor:
        return self.addmm(None, x)

    def addmm(self, input: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
        """input + x @ W for x [N, in]; input: None, a bias [out] or a residual [N, out]."""
        product, scale = self._scaled_product(x)
        return product.mul_(scale) if input is None else torch.addcmul(input, product, scale)

    def into(self, out: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """out = x @ W (+ bias), written into ``out`` [N, out]."""
        product, scale = self._scaled_product(x)
        if bias is None:
            torch.mul(product, scale, out=out)
        else:
            torch.addcmul(bias, product, scale, out=out)
