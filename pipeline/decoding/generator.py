"""Text in, text and per-record statistics out: the entry point the pipeline stages call."""

from __future__ import annotations

import string
import time
from collections.abc import Callable, Sequence

import torch

from pipeline.decoding.config import DecodingConfig
from pipeline.decoding.models import ModelPair
from pipeline.decoding.scheduler import BatchPolicy, BatchRequest, decode_batch
from pipeline.decoding.scripted import calibrate
from pipeline.decoding.stats import DecodeOutput, GenerationResult

ONE_AT_A_TIME = BatchPolicy(batch_size=1)

# Row flags (DESIGN.md §2): what a reader of the output should look at, decided from the row's own tokens.
# The tail of an output loops when its last n tokens, or its last n words, n = 1 .. REPEAT_UNIT, are
# repeated at least REPEAT_TIMES times in a row ("... being being being"); a unit without a letter or
# digit ("!", "...") must be repeated REPEAT_TIMES_SYMBOLS times, so that "Wow!!!" is writing, not a loop.
REPEAT_UNIT = 4
REPEAT_TIMES = 3
REPEAT_TIMES_SYMBOLS = 6


def ends_in_repeats(items: Sequence, longest: int = REPEAT_UNIT, times: int = REPEAT_TIMES) -> list | None:
    """The shortest unit of 1 .. ``longest`` items that ``items`` ends with ``times`` times in a row
    (or more), else None."""
    items = list(items)
    for n in range(1, longest + 1):
        if len(items) < n * times:
            return None
        unit = items[-n:]
        if all(items[len(items) - (k + 1) * n: len(items) - k * n] == unit for k in range(1, times)):
            return unit
    return None


def _loops(items: Sequence, text_of: Callable[[list], str]) -> bool:
    """Whether ``items`` ends in a loop: a unit with a letter or digit REPEAT_TIMES times, or any
    unit REPEAT_TIMES_SYMBOLS times."""
    unit = ends_in_repeats(items)
    if unit is None:
        return False
    return any(ch.isalnum() for ch in text_of(unit)) or ends_in_repeats(items, times=REPEAT_TIMES_SYMBOLS) is not None


def is_repetition(tokens: Sequence[int], prediction: str | None, eos_ids, decode: Callable[[list[int]], str]) -> bool:
    """The ``repetition`` column: the output's tail loops, in its tokens (a trailing EOS left out) or in
    the words of its text (split on whitespace, punctuation around each stripped)."""
    body = list(tokens)
    if body and body[-1] in eos_ids:
        body.pop()
    if _loops(body, decode):
        return True
    words = [word for word in (word.strip(string.punctuation) for word in (prediction or "").split()) if word]
    return _loops(words, " ".join)


def is_stopped_by_budget(tokens: Sequence[int], max_new_tokens: int, eos_ids) -> bool:
    """The ``stopped_by_budget`` column: the output reached max_new_tokens without ending on EOS (cut off)."""
    return len(tokens) >= max_new_tokens and not (len(tokens) and tokens[-1] in eos_ids)


def unknown_token_count(input_ids: Sequence[int], tokenizer) -> int:
    """The ``unknown_tokens`` column: source tokens that are the tokenizer's unknown token (text it has
    no token for, e.g. "€" in a vocabulary without it). 0 for a tokenizer without one, or whose
    "unknown" token is also its BOS, EOS or padding (GPT-2's <|endoftext|>: it marks no unknown text)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    others = {getattr(tokenizer, name, None) for name in ("bos_token_id", "eos_token_id", "pad_token_id")}
    if unk is None or unk in others:
        return 0
    return sum(1 for token in input_ids if int(token) == unk)


def output_flags(tokens: Sequence[int], prediction: str | None, *, max_new_tokens: int, eos_ids, tokenizer) -> dict:
    """A decoded row's ``stopped_by_budget`` and ``repetition``."""
    return {"stopped_by_budget": is_stopped_by_budget(tokens, max_new_tokens, eos_ids),
            "repetition": is_repetition(tokens, prediction, eos_ids,
                                        lambda unit: tokenizer.decode(unit, skip_special_tokens=True))}


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
    """Decodes texts with one ModelPair under one DecodingConfig, one record or a batch at a time.

    Texts become token ids here, and decoded ids become rows (GenerationResult) here; what decodes
    the ids is ``decode_requests``, which another decoder (ct2_generator.CT2Generator) replaces."""

    def __init__(self, pair: ModelPair, config: DecodingConfig):
        self.pair = pair
        self.config = config
        self._slots = 1  # the slots of the engines the last decode ran on (its batch size; 1 before any)

    @property
    def tokenizer(self):
        return self.pair.tokenizer

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.pair.eos_token_ids

    def decode_requests(self, requests: Sequence[BatchRequest], batch: BatchPolicy) -> list[DecodeOutput]:
        """Each request's tokens and statistics, ``batch.batch_size`` rows at a time (scheduler.py)."""
        self._slots = batch.batch_size
        return decode_batch(self.pair, self.config, batch, requests)

    @property
    def engine_kind(self) -> str:
        return self.pair.engine_kind  # what the output's engine column says ran

    @property
    def quantize(self) -> str:
        return self.pair.quantize

    @property
    def attention_path(self) -> str:
        """What the output's attention column says ran: Engine.attention_path of the engines the last
        decode ran on ("small:... large:..." where the two differ)."""
        return self._engines_say("attention_path")

    @property
    def int8_scheme(self) -> str | None:
        """What the output's int8_scheme column says ran: Engine.int8_scheme of those engines."""
        return self._engines_say("int8_scheme")

    def _engines_say(self, name: str):
        roles = [role for role, other in (("small", "large"), ("large", "small")) if self.config.method != other]
        said = {role: getattr(self.pair.engine(role, self._slots), name) for role in roles}
        if len(set(said.values())) == 1:
            return next(iter(said.values()))
        return " ".join(f"{role}:{value}" for role, value in said.items())

    def encode(self, text: object) -> tuple[torch.Tensor, bool]:
        """Token ids [1, S] for one input, truncated to max_input_tokens, and whether it was cut."""
        return encode_text(self.tokenizer, text, self.config.max_input_tokens)

    def generate_one(self, text: object, seed: int | None = None) -> GenerationResult:
        """Decode one text; any failure becomes the result's ``error``, never an exception."""
        method = self.config.method
        try:
            input_ids, truncated = self.encode(text)
        except InputError as exc:
            return GenerationResult(prediction=None, error=str(exc), method=method)
        try:
            started = time.perf_counter()
            output = self.decode_ids(input_ids, seed)
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
        return self._decoded(output, input_ids, truncated, latency_ms)

    def _decoded(self, output: DecodeOutput, input_ids: torch.Tensor, truncated: bool, latency_ms: float):
        """The result of a record that decoded."""
        tokenizer = self.tokenizer
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
            **output_flags(output.tokens, prediction, max_new_tokens=self.config.budget(input_ids.shape[1]),
                           eos_ids=self.eos_token_ids, tokenizer=tokenizer),
            unknown_tokens=unknown_token_count(input_ids[0].tolist(), tokenizer),
        )

    def generate(
        self, texts: Sequence[object], seeds: Sequence[int] | None = None, batch: BatchPolicy | None = None
    ) -> list[GenerationResult]:
        """Decode each text; with seeds=None every record uses config.seed.

        With a ``batch`` policy of batch_size > 1 the records are decoded together (batch.py):
        each record's tokens and statistics are the same as alone; its latency is its time in
        the batch.
        """
        seeds = list(seeds) if seeds is not None else [self.config.seed] * len(texts)
        if batch is None or batch.batch_size == 1 or len(texts) <= 1:
            return [self.generate_one(text, seed) for text, seed in zip(texts, seeds)]
        return self._generate_batch(texts, seeds, batch)

    def _generate_batch(self, texts: Sequence[object], seeds: list[int], batch: BatchPolicy) -> list[GenerationResult]:
        method = self.config.method
        results: list[GenerationResult | None] = [None] * len(texts)
        encoded = {}
        for i, text in enumerate(texts):
            try:
                encoded[i] = self.encode(text)
            except InputError as exc:
                results[i] = GenerationResult(prediction=None, error=str(exc), method=method)
        order = list(encoded)
        requests = [BatchRequest(encoded[i][0][0], seeds[i]) for i in order]
        try:
            outputs = self.decode_requests(requests, batch)
        except Exception:  # noqa: BLE001 - find the record at fault: each one alone gets its own error
            for i in order:
                results[i] = self.generate_one(texts[i], seeds[i])
            return results
        for i, output in zip(order, outputs):
            input_ids, truncated = encoded[i]
            results[i] = self._decoded(output, input_ids, truncated, output.seconds * 1000.0)
        return results

    def calibrate(self, batch: BatchPolicy) -> None:
        """Teach the window chooser of this config what rounds cost here, before the first record (a drafting
        method with measured windows; nothing for another): scripted.calibrate."""
        calibrate(self.pair, self.config, batch)

    def decode_ids(self, input_ids: torch.Tensor, seed: int | None = None) -> DecodeOutput:
        """Run the configured method on token ids [1, S] (encoders included): the scheduler with one row."""
        seed = self.config.seed if seed is None else seed
        return self.decode_requests([BatchRequest(input_ids[0], seed)], ONE_AT_A_TIME)[0]
