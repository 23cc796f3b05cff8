"""The decoding core: BiLD and speculative decoding over a small/large Hugging Face model pair.

config and policies hold the rules, scheduler drives them over a batch of rows, and the engines
(engines/: hf_engine, the native t5_engine and bart_engine, onnx_engine) run the models behind one
seam (engine.py). generator turns texts into rows; ct2_generator does so with CTranslate2 (engines/ct2_engine)
decoding the ids instead.

Pure torch + transformers (no Ray, fsspec or click), so it can be read and tested on its own.
Names load lazily, so that reading a config (``pipeline.decoding.config``) does not import torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "METHODS": "config",
    "DecodingConfig": "config",
    "ENGINES": "config",
    "ModelSpec": "config",
    "Engine": "engine",
    "Feed": "engine",
    "GenerationResult": "stats",
    "Generator": "generator",
    "InputError": "generator",
    "HFEngine": "engines.hf_engine",
    "UnsupportedModelError": "engines.hf_engine",
    "IncompatiblePairError": "pair_check",
    "ModelPair": "models",
    "check_pair": "pair_check",
    "load_model": "models",
    "Verdict": "policies",
    "bild_verify": "policies",
    "fallback": "policies",
    "greedy_match_verify": "policies",
    "speculative_verify": "policies",
    "RowSampler": "sampling",
    "BatchPolicy": "config",
    "BatchRequest": "config",
    "Scheduler": "scheduler",
    "decode_batch": "scheduler",
    "DecodeOutput": "stats",
    "DecodeStats": "stats",
    "NativeEngine": "engines.native",
    "OnnxEngine": "engines.onnx_engine",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pipeline.decoding' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pipeline.decoding.{_EXPORTS[name]}"), name)
