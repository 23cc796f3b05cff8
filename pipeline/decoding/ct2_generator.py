"""The job's face of CTranslate2: `Generator`'s texts-in, rows-out, with CTranslate2 decoding the ids.

What the decoding stage calls in place of `Generator` where models.engine is ct2: one model decodes
alone (method large or small), greedily (config.ct2_method_problem). Encoding, error rows, the row
flags and the fall-back to one record at a time when a batch fails are Generator's own; only
``decode_requests`` differs: CTranslate2 decodes a batch in groups of ``batch_size`` inputs of similar
length (as it rebatches), and each record's time is its group's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pipeline.decoding.config import BatchPolicy, BatchRequest, DecodingConfig, ModelSpec, ct2_method_problem
from pipeline.decoding.engines.ct2_engine import load_checkpoint
from pipeline.decoding.generator import Generator
from pipeline.decoding.stats import DecodeOutput, DecodeStats


class CT2Generator(Generator):
    """Decodes texts with the model ``config.method`` names, converted for and run by CTranslate2."""

    engine_kind = "ct2"  # the output's engine column
    attention_path = "model"  # the output's attention column: CTranslate2's own (as Engine.attention_path)

    def __init__(self, spec: ModelSpec, config: DecodingConfig, threads: int = 1):
        problem = ct2_method_problem([config.method], config.do_sample)  # for callers that skip the job schema
        if problem:
            raise ValueError(problem)
        super().__init__(pair=None, config=config)
        self._quantize = spec.quantize
        self.model = load_checkpoint(getattr(spec, config.method), spec, threads)

    @property
    def tokenizer(self):
        return self.model.tokenizer

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset({self.tokenizer.eos_token_id} - {None})  # the end token CTranslate2 returns

    @property
    def quantize(self) -> str:
        return self._quantize

    @property
    def int8_scheme(self) -> str | None:
        """The output's int8_scheme column: CTranslate2's compute type where it is int8 ("ctranslate2-int8",
        or "ctranslate2-int8_float16" on a GPU), else None."""
        compute_type = self.model.compute_type
        return f"ctranslate2-{compute_type}" if compute_type.startswith("int8") else None

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
            decoded = self.model.generate([inputs[i] for i in group], self.config.budget(max(len(inputs[i]) for i in group)),
                                          max_batch_size=len(group))
            seconds = time.perf_counter() - started
            for i, tokens in zip(group, decoded):
                stats = DecodeStats(output_tokens=len(tokens), **{written: len(tokens)})
                outputs[i] = DecodeOutput(tokens=tokens, stats=stats, seconds=seconds)
        return outputs
