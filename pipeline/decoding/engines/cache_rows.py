"""The mechanics every cached engine shares: how its buffers grow, which slots a step reads, the
padded ids of an admission. One rule each, so the engines cannot drift (where the read logits go:
engine.logit_places).
"""

from __future__ import annotations

from typing import Sequence

import torch

# A step over several rows runs over the span of slots they occupy, in place (idle slots between them
# run along, their outputs unread), while the span is at most this many times the rows fed; wider, it
# gathers the rows. Measured on the onnx engine, `bild` at batch 32, order alternating per round:
# 1 (gather unless contiguous) 0.98x of 2, 3 0.97x, never gathering 0.80x.
SPAN_AT_MOST = 2


def grown(needed: int, held: int) -> int:
    """The size a buffer that holds ``held`` positions grows to for ``needed``: at least double, so
    growing (a copy of every cache) is rare."""
    return max(needed, 2 * held)


def resized(cache: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``cache`` with its ``dim`` grown or cut to ``size``, the content up to it kept."""
    shape = list(cache.shape)
    kept, shape[dim] = min(shape[dim], size), size
    out = torch.zeros(shape, dtype=cache.dtype, device=cache.device)
    out.narrow(dim, 0, kept).copy_(cache.narrow(dim, 0, kept))
    return out


def span_of(slots: Sequence[int]) -> slice | None:
    """The span of slots a step over ``slots`` reads in place, or None where it gathers them."""
    first, last = min(slots), max(slots)
    return slice(first, last + 1) if last - first + 1 <= SPAN_AT_MOST * len(slots) else None


def padded_ids(input_ids: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """[J, width] the newcomers' ids, right-padded with 0 (masked keys, unread queries)."""
    padded = torch.zeros((len(input_ids), width), dtype=torch.long)
    for row, ids in enumerate(input_ids):
        padded[row, : len(ids)] = ids.cpu()
    return padded

