"""Shared fixtures: tiny model pairs built once per test session."""

from __future__ import annotations

import functools

import pytest
import torch

from pipeline.decoding import ModelPair
from pipeline.tiny import build_pair

# Tiny models: one thread is faster than two (per-call overhead dominates) and leaves a core free.
torch.set_num_threads(1)

TEXTS = [
    "Ein Hund läuft über die Wiese.",
    "Zwei Männer spielen Fußball im Park.",
    "Eine Frau mit rotem Hut liest ein Buch.",
    "Kinder bauen eine Sandburg am Strand.",
]


@functools.lru_cache(maxsize=None)
def tiny_pair(family: str, small: str = "independent", seed: int = 0, dtype: str = "float32") -> ModelPair:
    """A (cached) tiny pair: small="independent" disagrees often, small="noisy" mostly agrees."""
    small_model, large_model, tokenizer = build_pair(family, seed=seed, small=small)
    torch_dtype = getattr(torch, dtype)
    return ModelPair(small_model.to(torch_dtype), large_model.to(torch_dtype), tokenizer, torch.device("cpu"))


@pytest.fixture(scope="session")
def make_pair():
    return tiny_pair
