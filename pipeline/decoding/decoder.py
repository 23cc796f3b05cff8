"""What the decoding stage and ``generate`` hold: a Decoder, which turns requests (token ids and a seed) into
outputs (tokens and statistics), and says what ran. generator.py turns texts into requests and outputs into rows
around any Decoder; pair_decoder.py (a small/large pair on a pair engine) and ct2_decoder.py (CTranslate2, one
model alone) implement it; decoders.open_decoder picks one by the engine's registry line (engines/registry.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pipeline.decoding.config import BatchPolicy, BatchRequest, DecodingConfig
from pipeline.decoding.stats import DecodeOutput


@dataclass(frozen=True)
class Ran:
    """What ran, as the output's columns say it: engine, quantize, attention, int8_scheme (io/schema.py)."""

    engine: str
    quantize: str
    attention: str
    int8_scheme: str | None


class Decoder(Protocol):
    config: DecodingConfig
    tokenizer: object  # a Hugging Face tokenizer: texts <-> ids
    eos_token_ids: frozenset[int]

    def decode_requests(self, requests: Sequence[BatchRequest], batch: BatchPolicy) -> list[DecodeOutput]:
        """Each request's tokens and statistics, ``batch.batch_size`` rows at a time."""

    def ran(self) -> Ran:
        """What the last decode ran on."""

    def calibrate(self, batch: BatchPolicy) -> None:
        """Anything to measure before the first record (an actor's warm-up); may do nothing."""

    def forget_measurements(self) -> None:
        """Drop what was measured so far (a warm-up's first calls cost what later ones do not)."""
