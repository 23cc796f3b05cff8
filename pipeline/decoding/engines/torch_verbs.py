"""The verbs a model family writes its layers with, run at once on torch tensors (the native engine).

A family (t5_engine.py, bart_engine.py) writes each of its layers once, as calls to verbs: a matrix
product, a residual sum, a norm, an activation, attention. Handed ``TorchVerbs`` (or an attention
object built on it: native.Attention for a decoder step, ``EncoderAttention`` for the encoder), the
layer computes on tensors; handed onnx_graph's ``StepGraph`` or ``EncoderGraph``, which have the same
verbs with the same arguments, the same code adds the layer to an ONNX graph for the onnx engine. So
the two engines run one definition of each family.

A value is a tensor [N, width] here (N = rows * positions); a matrix is a native.Matrix or
int8.Int8Matrix, [in, out].
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN


@cache
def _activation(name: str):
    """ACT2FN's function for ``name``, made once (each ACT2FN[name] builds a new module)."""
    return ACT2FN[name]


def clamp_half(x: torch.Tensor) -> torch.Tensor:
    """Hugging Face clamps float16 activations that overflowed (inf -> finite); so does this, the
    same way (a tensor bound: no host sync on a GPU). Other dtypes pass through."""
    if x.dtype != torch.float16:
        return x
    largest = torch.finfo(torch.float16).max
    limit = torch.where(torch.isinf(x).any(), largest - 1000, largest).to(x.dtype)
    return torch.clamp(x, min=-limit, max=limit)


class TorchVerbs:
    """The verbs but attention (onnx_graph.LayerGraph's, in torch)."""

    def matmul(self, x: torch.Tensor, matrix, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [N, in] @ W [in, out] (+ bias [out])."""
        return matrix.addmm(bias, x)

    def residual(self, x: torch.Tensor, output: torch.Tensor, matrix, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x + output @ W (+ bias): a sub-layer's last product added to the residual stream (one addmm)."""
        if bias is None:
            return clamp_half(matrix.addmm(x, output))
        return clamp_half(matrix.addmm(bias, output).add_(x))

    def rms_norm(self, x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
        """T5's RMSNorm, without its weight (folded into the next matrix) or with it; half precision
        is normalized in float32, as Hugging Face's T5 does."""
        width = (x.shape[-1],)
        if x.dtype in (torch.float16, torch.bfloat16):
            normed = F.rms_norm(x.float(), width, eps=eps).to(x.dtype)
        else:
            normed = F.rms_norm(x, width, eps=eps)
        return normed if weight is None else normed * weight

    def layer_norm(self, x: torch.Tensor, eps: float, weight: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
        """LayerNorm over the last axis: with its weight and bias, or bare (a folded pre-norm)."""
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)

    def activation(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return _activation(name)(x)

    def gated(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """act(gate) * linear for x = [gate | linear] along the last axis (T5 v1.1's gated FF)."""
        gate, linear = x.chunk(2, dim=-1)
        return _activation(name)(gate) * linear


class EncoderAttention(TorchVerbs):
    """The verbs of an encoder layer over ``rows`` right-padded sources of ``width`` positions:
    bidirectional self-attention with ``mask`` added to its scores ([J or 1, H or 1, S, S]: relative
    positions, padded keys at -inf; or None)."""

    def __init__(self, rows: int, width: int, heads: int, mask: torch.Tensor | None):
        self.rows, self.width, self.heads, self.mask = rows, width, heads, mask

    def self_attention(self, hidden: torch.Tensor, matrix, bias: torch.Tensor | None = None,
                       scale: float = 1.0) -> torch.Tensor:
        """hidden [N, d] @ matrix [d, 3 * inner] (+ bias) gives q, k, v; attention -> [N, inner]."""
        qkv = matrix.addmm(bias, hidden)
        qkv = qkv.view(self.rows, self.width, 3, self.heads, -1).transpose(1, 3)  # [J, H, 3, S, dk]
        attended = F.scaled_dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], attn_mask=self.mask,
                                                  scale=scale)
        return attended.transpose(1, 2).reshape(self.rows * self.width, -1)


TORCH = TorchVerbs()  # the verbs outside attention need no state: one instance serves every caller
