"""The Decoder of CTranslate2: one model decodes alone (method large or small), greedily (rules.ct2_method_problem).

Encoding, error rows, the row flags and the fall-back to one record at a time when a batch fails are
generator.py's, as for any Decoder; CTranslate2 decodes a batch in groups of ``batch_size`` inputs of similar
length (as it rebatches), and each record's time is its group's."""

from __future__ import annotations

import time
from collections.abc import Sequence

from pipeline.decoding import rules
from pipeline.decoding.config import BatchPolicy, BatchRequest, DecodingConfig, ModelSpec
from pipeline.decoding.decoder import Ran
from pipeline.decoding.engines.ct2_engine import load_checkpoint
from pipeline.decoding.stats import DecodeOutput, DecodeStats


class CT2Decoder:
    """Decodes requests with the model ``config.method`` names, converted for and run by CTranslate2."""

    def __init__(self, spec: ModelSpec, config: DecodingConfig, threads: int = 1):
        problem = rules.ct2_method_problem([config.method], config.do_sample)  # for callers that skip the schema
        if problem:
            raise ValueError(problem)
        self.config, self._quantize = config, spec.quantize
        self.model = load_checkpoint(getattr(spec, config.method), spec, threads)

    @property
    def tokenizer(self):
        return self.model.tokenizer

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset({self.tokenizer.eos_token_id} - {None})  # the end token CTranslate2 returns

    def ran(self) -> Ran:
        """Attention "model": CTranslate2's own; int8_scheme: its compute type where it is int8
        ("ctranslate2-int8", or "ctranslate2-int8_float16" on a GPU), else None."""
        compute_type = self.model.compute_type
        return Ran("ct2", self._quantize, "model",
                   f"ctranslate2-{compute_type}" if compute_type.startswith("int8") else None)

    def calibrate(self, batch: BatchPolicy) -> None:
        """Nothing to measure: CTranslate2 drafts no windows."""

    def forget_measurements(self) -> None:
        """Nothing measured."""

    def decode_requests(self, requests: Sequence[BatchRequest], batch: BatchPolicy) -> list[DecodeOutput]:
        """Each request's tokens, shortest inputs first in groups of ``batch.batch_size`` (one
        translate_batch call each); a record's seconds are its group's."""
        inputs = [request.input_ids.tolist() for request in requests]
        written = "large_tokens" if self.config.method == "large" else "small_tokens"
        outputs: list[DecodeOutput | None] = [None] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: len(inputs[i]))
        size = max(1, batch.batch_size)
        for start in range(0, len(order), size):
            group = order[start:start + size]
            started = time.perf_counter()
            decoded = self.model.generate([inputs[i] for i in group], max(requests[i].budget(self.config) for i in group),
                                          max_batch_size=len(group))
            seconds = time.perf_counter() - started
            for i, tokens in zip(group, decoded):
                stats = DecodeStats(output_tokens=len(tokens), **{written: len(tokens)})
                outputs[i] = DecodeOutput(tokens=tokens, stats=stats, seconds=seconds)
        return outputs


def open_decoder(spec: ModelSpec, config: DecodingConfig, threads: int = 1) -> CT2Decoder:
    """The registry's door (engines/registry.py: a whole decoder's module defines open_decoder)."""
    from pipeline.decoding.engines.ct2_engine import available

    if not available():
        raise ImportError("models.engine ct2 needs the ctranslate2 package: pip install 'bild-pipeline[ct2]'")
    return CT2Decoder(spec, config, threads)
