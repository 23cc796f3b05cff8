"""Text in, text and per-record statistics out: the entry point the pipeline stages call."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from pipeline.decoding.config import BatchPolicy, BatchRequest, DecodingConfig
from pipeline.decoding.decoder import Decoder, Ran
from pipeline.decoding.stats import DecodeOutput, GenerationResult
from pipeline.metrics.row_flags import output_flags, unknown_token_count

ONE_AT_A_TIME = BatchPolicy(batch_size=1)

class InputError(ValueError):
    """A record whose text cannot be decoded (its row gets an error, the job goes on)."""


def encode_text(tokenizer, text: object, limit: int) -> tuple[torch.Tensor, bool]:
    """Token ids [1, S] for one input, truncated to ``limit`` tokens, and whether it was cut."""
    if not isinstance(text, str):
        raise InputError(f"input text must be a string, got {type(text).__name__}")
    if not text.strip():
        raise InputError("input text is empty")
    ids = tokenizer(text)["input_ids"]
    truncated = len(ids) > limit
    if truncated:  # let the tokenizer cut, so special tokens such as EOS stay where they belong
        ids = tokenizer(text, truncation=True, max_length=limit)["input_ids"]
    if not ids:
        raise InputError("input text produced no tokens")
    return torch.tensor([ids], dtype=torch.long), truncated


class Generator:
    """Decodes texts under one DecodingConfig with a Decoder (decoder.py), one record or a batch at a time.

    Texts become token ids here, and decoded ids become rows (GenerationResult) here; the Decoder decodes the
    ids. ``Generator(pair, config)`` decodes with the pair on its engine (pair_decoder.PairDecoder)."""

    def __init__(self, decoder, config: DecodingConfig):
        if not hasattr(decoder, "decode_requests"):  # a ModelPair
            from pipeline.decoding.pair_decoder import PairDecoder

            decoder = PairDecoder(decoder, config)
        self.decoder: Decoder = decoder
        self.config = config

    @property
    def tokenizer(self):
        return self.decoder.tokenizer

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.decoder.eos_token_ids

    def ran(self) -> Ran:
        """What the output's engine, quantize, attention and int8_scheme columns say ran."""
        return self.decoder.ran()

    def encode(self, text: object) -> tuple[torch.Tensor, bool]:
        """Token ids [1, S] for one input, truncated to max_input_tokens, and whether it was cut."""
        return encode_text(self.tokenizer, text, self.config.max_input_tokens)

    def generate_one(self, text: object, seed: int | None = None, budget: int | None = None) -> GenerationResult:
        """Decode one text (``budget``: a smaller max_new_tokens of its own); any failure becomes the result's
        ``error``, never an exception."""
        method = self.config.method
        try:
            input_ids, truncated = self.encode(text)
        except InputError as exc:
            return GenerationResult(prediction=None, error=str(exc), method=method)
        try:
            started = time.perf_counter()
            output = self.decode_ids(input_ids, seed, budget)
            latency_ms = (time.perf_counter() - started) * 1000.0
        except Exception as exc:  # noqa: BLE001 - a record's failure must not stop the job
            return GenerationResult(
                prediction=None,
                error=f"{type(exc).__name__}: {exc}"[:500],
                method=method,
                input_tokens=input_ids.shape[1],
                truncated=truncated,
                unknown_tokens=unknown_token_count(input_ids[0].tolist(), self.tokenizer),
            )
        return self._decoded(output, BatchRequest(input_ids[0], max_new_tokens=budget), truncated, latency_ms)

    def _decoded(self, output: DecodeOutput, request: BatchRequest, truncated: bool, latency_ms: float):
        """The result of a record that decoded."""
        tokenizer, input_ids = self.tokenizer, request.input_ids[None, :]
        prediction = tokenizer.decode(output.tokens, skip_special_tokens=True)
        return GenerationResult(
            prediction=prediction,
            error=None,
            method=self.config.method,
            input_tokens=input_ids.shape[1],
            truncated=truncated,
            latency_ms=latency_ms,
            stats=output.stats,
            token_ids=output.tokens,
            **output_flags(output.tokens, prediction, max_new_tokens=request.budget(self.config),
                           eos_ids=self.eos_token_ids, tokenizer=tokenizer),
            unknown_tokens=unknown_token_count(input_ids[0].tolist(), tokenizer),
        )

    def generate(
        self, texts: Sequence[object], seeds: Sequence[int] | None = None, batch: BatchPolicy | None = None,
        budgets: Sequence[int | None] | None = None,
    ) -> list[GenerationResult]:
        """Decode each text; with seeds=None every record uses config.seed; ``budgets``: a text's own smaller
        max_new_tokens, or None (the config's).

        With a ``batch`` policy of batch_size > 1 the records are decoded together (batch.py):
        each record's tokens and statistics are the same as alone; its latency is its time in
        the batch.
        """
        seeds = list(seeds) if seeds is not None else [self.config.seed] * len(texts)
        budgets = list(budgets) if budgets is not None else [None] * len(texts)
        if batch is None or batch.batch_size == 1 or len(texts) <= 1:
            return [self.generate_one(text, seed, budget) for text, seed, budget in zip(texts, seeds, budgets)]
        return self._generate_batch(texts, seeds, batch, budgets)

    def _generate_batch(self, texts: Sequence[object], seeds: list[int], batch: BatchPolicy,
                        budgets: list[int | None]) -> list[GenerationResult]:
        method = self.config.method
        results: list[GenerationResult | None] = [None] * len(texts)
        encoded = {}
        for i, text in enumerate(texts):
            try:
                encoded[i] = self.encode(text)
            except InputError as exc:
                results[i] = GenerationResult(prediction=None, error=str(exc), method=method)
        order = list(encoded)
        requests = {i: BatchRequest(encoded[i][0][0], seeds[i], budgets[i]) for i in order}
        try:
            outputs = self.decoder.decode_requests(list(requests.values()), batch)
        except Exception:  # noqa: BLE001 - find the record at fault: each one alone gets its own error
            for i in order:
                results[i] = self.generate_one(texts[i], seeds[i], budgets[i])
            return results
        for i, output in zip(order, outputs):
            results[i] = self._decoded(output, requests[i], encoded[i][1], output.seconds * 1000.0)
        return results

    def calibrate(self, batch: BatchPolicy) -> None:
        """What the Decoder measures before the first record (a drafting method's window chooser)."""
        self.decoder.calibrate(batch)

    def decode_ids(self, input_ids: torch.Tensor, seed: int | None = None, budget: int | None = None) -> DecodeOutput:
        """Run the configured method on token ids [1, S] (encoders included): one request."""
        seed = self.config.seed if seed is None else seed
        return self.decoder.decode_requests([BatchRequest(input_ids[0], seed, budget)], ONE_AT_A_TIME)[0]
