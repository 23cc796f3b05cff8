"""The decoding core: BiLD and speculative decoding over a small/large Hugging Face model pair.

Pure torch + transformers (no Ray, fsspec or click), so it can be read and tested on its own.
Names load lazily, so that reading a config (``pipeline.decoding.config``) does not import torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "BatchOutput": "batch",
    "BatchPolicy": "batch",
    "BatchRequest": "batch",
    "decode_batch": "batch",
    "BatchedDecoder": "batch_runner",
    "UnsupportedModelError": "batch_runner",
    "METHODS": "config",
    "DecodingConfig": "config",
    "GenerationResult": "generator",
    "Generator": "generator",
    "InputError": "generator",
    "DecodeOutput": "loop",
    "DecodeStats": "loop",
    "decode_autoregressive": "loop",
    "decode_with_drafts": "loop",
    "IncompatiblePairError": "models",
    "ModelPair": "models",
    "load_model": "models",
    "Verdict": "policies",
    "bild_verify": "policies",
    "fallback": "policies",
    "greedy_match_verify": "policies",
    "speculative_verify": "policies",
    "CachedDecoder": "runner",
    "RowSampler": "sampling",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pipeline.decoding' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pipeline.decoding.{_EXPORTS[name]}"), name)
