"""A scripted stand-in for a model: its next-token distribution is a Python function of the prefix.

It is an engine (pipeline.decoding.engine) like the real ones, so the scheduler's behaviour can be
tested case by case without any neural network.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pipeline.decoding.engine import Engine, Feed

VOCAB = 8
EOS = 1


def peaked(token: int, confidence: float) -> torch.Tensor:
    """A distribution with `confidence` on `token`, the rest spread evenly over the vocabulary."""
    probs = torch.full((VOCAB,), (1.0 - confidence) / (VOCAB - 1), dtype=torch.float64)
    probs[token] = confidence
    return probs


class ScriptedEngine(Engine):
    kind = "scripted"

    def __init__(self, script: Callable[[tuple[int, ...]], torch.Tensor], slots: int = 1):
        super().__init__(slots)
        self.script = script  # prefix (tokens up to and including the current one) -> probs [V]
        self.seen: list[list[int]] = [[] for _ in range(slots)]  # each slot's tokens, by position
        self.fed: list[list[int]] = []  # the tokens fed, per row and call
        self.admitted: list[list[int]] = []  # the slots of each admission, in order

    def _admit(self, slots, input_ids, encoded):
        self.admitted.append(list(slots))
        for slot in slots:
            self.seen[slot] = []
        return None

    def _forward(self, feed: Feed) -> torch.Tensor:
        rows = []
        for r, (slot, position, count, read) in enumerate(zip(feed.slots, feed.positions, feed.counts, feed.reads)):
            tokens = feed.tokens[r, :count].tolist()
            self.seen[slot][position:] = tokens
            self.fed.append(tokens)
            end = position + count
            rows.append([self.script(tuple(self.seen[slot][: p + 1])) for p in range(end - read, end)])
        most = max(feed.reads)
        padded = [row + [torch.full((VOCAB,), 1.0 / VOCAB, dtype=torch.float64)] * (most - len(row)) for row in rows]
        return torch.log(torch.stack([torch.stack(row) for row in padded]))  # logits [R, max(reads), V]
