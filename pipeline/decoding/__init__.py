"""The decoding core: BiLD and speculative decoding over a small/large Hugging Face model pair.

Pure torch + transformers (no Ray, fsspec or click), so it can be read and tested on its own.
"""

from pipeline.decoding.config import METHODS, DecodingConfig
from pipeline.decoding.generator import GenerationResult, Generator, InputError
from pipeline.decoding.loop import DecodeOutput, DecodeStats, decode_autoregressive, decode_with_drafts
from pipeline.decoding.models import IncompatiblePairError, ModelPair, load_model
from pipeline.decoding.policies import Verdict, bild_verify, fallback, greedy_match_verify, speculative_verify
from pipeline.decoding.runner import CachedDecoder
from pipeline.decoding.sampling import RowSampler

__all__ = [
    "METHODS",
    "CachedDecoder",
    "DecodeOutput",
    "DecodeStats",
    "DecodingConfig",
    "GenerationResult",
    "Generator",
    "IncompatiblePairError",
    "InputError",
    "ModelPair",
    "RowSampler",
    "Verdict",
    "bild_verify",
    "decode_autoregressive",
    "decode_with_drafts",
    "fallback",
    "greedy_match_verify",
    "load_model",
    "speculative_verify",
]
