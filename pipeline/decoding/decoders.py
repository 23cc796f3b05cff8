"""Opening a Decoder for a job's models and decoding settings, by the engine's line in engines/registry.py:
a pair engine's pair is loaded once per engine (``pairs``) and decoded by the scheduler (pair_decoder.py); a
whole decoder's module opens its own (ct2_decoder.py)."""

from __future__ import annotations

import importlib

from pipeline.decoding.config import DecodingConfig, ModelSpec
from pipeline.decoding.decoder import Decoder
from pipeline.decoding.engines.registry import entry
from pipeline.decoding.generator import Generator


def open_decoder(spec: ModelSpec, config: DecodingConfig, *, threads: int = 1, pairs: dict | None = None) -> Decoder:
    """A Decoder of ``spec``'s models under ``config``; ``pairs``: engine -> ModelPair already loaded (filled in
    here), so that the passes of one actor share a pair."""
    if not entry(spec.engine).pair:
        return importlib.import_module(entry(spec.engine).module).open_decoder(spec, config, threads)
    from pipeline.decoding.models import ModelPair
    from pipeline.decoding.pair_decoder import PairDecoder

    pairs = {} if pairs is None else pairs
    if spec.engine not in pairs:
        pairs[spec.engine] = ModelPair.from_spec(spec)
    return PairDecoder(pairs[spec.engine], config)


def open_generator(spec: ModelSpec, config: DecodingConfig, *, threads: int = 1, pairs: dict | None = None) -> Generator:
    """Texts in, rows out, over open_decoder's Decoder."""
    return Generator(open_decoder(spec, config, threads=threads, pairs=pairs), config)
