"""Tiny random model pairs (cached), and a few German sentences to decode with them."""

from __future__ import annotations

import functools

import torch

from pipeline.decoding import ModelPair
from pipeline.pairs.tiny import build_pair

# Tiny models: one thread is faster than two (per-call overhead dominates) and leaves a core free.
torch.set_num_threads(1)

TEXTS = [
    "Ein Hund läuft über die Wiese.",
    "Zwei Männer spielen Fußball im Park.",
    "Eine Frau mit rotem Hut liest ein Buch.",
    "Kinder bauen eine Sandburg am Strand.",
]


@functools.lru_cache(maxsize=None)
def tiny_pair(family: str, small: str = "independent", seed: int = 0, dtype: str = "float32",
              engine: str = "auto") -> ModelPair:
    """A (cached) tiny pair: small="independent" disagrees often, small="noisy" mostly agrees.
    engine="auto" runs T5 on the native engine and the other families on Hugging Face's."""
    small_model, large_model, tokenizer = build_pair(family, seed=seed, small=small)
    torch_dtype = getattr(torch, dtype)
    return ModelPair(small_model.to(torch_dtype), large_model.to(torch_dtype), tokenizer, torch.device("cpu"),
                     engine_request=engine)
