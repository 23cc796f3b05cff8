"""A scripted stand-in for a model: its next-token distribution is a Python function of the prefix.

It has the runner interface the decode loops use (``forward``, ``rewind``, ``cached``), so loop
behaviour can be tested case by case without any neural network.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

VOCAB = 8
EOS = 1


def peaked(token: int, confidence: float) -> torch.Tensor:
    """A distribution with `confidence` on `token`, the rest spread evenly over the vocabulary."""
    probs = torch.full((VOCAB,), (1.0 - confidence) / (VOCAB - 1), dtype=torch.float64)
    probs[token] = confidence
    return probs


class ScriptedRunner:
    def __init__(self, script: Callable[[tuple[int, ...]], torch.Tensor]):
        self.script = script  # prefix (tokens up to and including the current one) -> probs [V]
        self.cached = 0
        self.calls = 0
        self.fed: list[list[int]] = []  # the tail fed in each call

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:
        tokens = sequence[0].tolist()
        rows = [self.script(tuple(tokens[: position + 1])) for position in range(self.cached, len(tokens))]
        self.fed.append(tokens[self.cached :])
        self.cached = len(tokens)
        self.calls += 1
        return torch.log(torch.stack(rows))[None]  # logits [1, T, V]

    def rewind(self, keep: int) -> None:
        self.cached = min(self.cached, keep)
