"""The decoding core: BiLD and speculative decoding over a small/large Hugging Face model pair.

config holds the settings (each written once, settings.py) and rules.py which go together; policies judges
drafts, scheduler drives them over a batch of rows, and the engines (engines/: hf_engine, the native t5_engine
and bart_engine, onnx_engine; one line each in engines/registry.py) run the models behind one seam (engine.py).
generator turns texts into rows around a Decoder (decoder.py): pair_decoder.py over a pair, ct2_decoder.py with
CTranslate2 decoding the ids alone; decoders.open_decoder picks one.

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
    "Decoder": "decoder",
    "open_decoder": "decoders",
    "open_generator": "decoders",
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
