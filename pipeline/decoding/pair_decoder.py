"""The Decoder of a small/large pair on a pair engine: the scheduler (scheduler.py) over the pair's engines."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.decoding.config import BatchPolicy, BatchRequest, DecodingConfig
from pipeline.decoding.decoder import Ran
from pipeline.decoding.draft_length import DraftLength
from pipeline.decoding.models import ModelPair
from pipeline.decoding.scheduler import decode_batch
from pipeline.decoding.scripted import calibrate
from pipeline.decoding.stats import DecodeOutput


class PairDecoder:
    """Decodes requests with one ModelPair under one DecodingConfig."""

    def __init__(self, pair: ModelPair, config: DecodingConfig):
        self.pair, self.config = pair, config
        self._slots = 1  # the slots of the engines the last decode ran on (its batch size; 1 before any)
        # The window chooser of each batch size: kept across calls, so that what it measured on one batch of
        # records (or one record, at batch 1) serves the next.
        self._choosers: dict[int, DraftLength] = {}

    @property
    def tokenizer(self):
        return self.pair.tokenizer

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.pair.eos_token_ids

    def decode_requests(self, requests: Sequence[BatchRequest], batch: BatchPolicy) -> list[DecodeOutput]:
        self._slots = batch.batch_size
        return decode_batch(self.pair, self.config, batch, requests, self.chooser(batch.batch_size))

    def ran(self) -> Ran:
        """The pair's engine and quantize, and its engines' attention and int8 scheme (Engine.attention_path,
        Engine.int8_scheme; "small:... large:..." where the two differ)."""
        return Ran(self.pair.engine_kind, self.pair.quantize, self._engines_say("attention_path"),
                   self._engines_say("int8_scheme"))

    def _engines_say(self, name: str):
        roles = [role for role, other in (("small", "large"), ("large", "small")) if self.config.method != other]
        said = {role: getattr(self.pair.engine(role, self._slots), name) for role in roles}
        if len(set(said.values())) == 1:
            return next(iter(said.values()))
        return " ".join(f"{role}:{value}" for role, value in said.items())

    def calibrate(self, batch: BatchPolicy) -> None:
        """Teach the window chooser of this config what rounds cost here, before the first record (a drafting
        method with measured windows; nothing for another): scripted.calibrate."""
        if self.config.measures_windows:
            calibrate(self.pair, self.config, batch, self.chooser(batch.batch_size))

    def chooser(self, slots: int) -> DraftLength:
        """The window chooser of ``slots`` rows (made on first use)."""
        if slots not in self._choosers:
            self._choosers[slots] = DraftLength(self.config.max_draft_tokens, slots)
        return self._choosers[slots]

    def forget_measurements(self) -> None:
        """Drop what the window choosers measured so far: a warm-up's first calls cost what later ones do not."""
        self._choosers.clear()
