"""Scripted rounds: the scheduler over engines whose answers follow a script, the real engines running the same
calls beside them, so that rounds of exactly the windows asked for cost what they cost in the loop.

A scripted engine answers every call with a logits row sure of one token that the other model agrees with:
every draft is kept, and a record runs its windows whole. The real engine's own answer is dropped; its call,
the scheduler's Python between the calls and the admissions around them are real.

- ``calibrate``: the window chooser's cost fits learnt from scripted rounds of several windows before a pair's
  first record (an actor's warm-up), so that no record is spent teaching them; the acceptance, which a script
  cannot tell, is still learnt from the records.
- bench/rounds.py times scripted records to price a method's rounds part by part.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import torch

from pipeline.decoding.config import BatchPolicy, BatchRequest, DecodingConfig
from pipeline.decoding.draft_length import DraftLength
from pipeline.decoding.engine import Engine, Feed
from pipeline.decoding.scheduler import Scheduler

# The windows a calibration runs (0: plain rounds), each for CALIBRATION_ROUNDS rounds: several widths, so that
# a verification's cost is fitted over the positions drafting will verify.
CALIBRATION_WINDOWS = (0, 1, 4)
CALIBRATION_ROUNDS = 3


class ScriptedEngine(Engine):
    """An engine whose answers follow a script: each call's logits come from ``answers`` (a cycle of [V]
    rows, one per call), and the real ``engine``, where given, runs the same call beside it."""

    kind = "scripted"

    def __init__(self, answers: list[torch.Tensor], engine: Engine | None = None, slots: int = 1):
        super().__init__(engine.slots if engine is not None else slots)
        self.answers, self.engine = itertools.cycle(answers), engine
        self.called_at: list[float] = []  # when each call began (a round's clock)

    def admit(self, slots, input_ids, encoded=None):
        for slot in slots:
            self.lengths[slot] = 0
        return self.engine.admit(slots, input_ids, encoded) if self.engine is not None else None

    def forward(self, feed: Feed) -> torch.Tensor:
        self.called_at.append(time.perf_counter())
        if self.engine is not None:
            self.engine.forward(feed)
        for slot, position, count in zip(feed.slots, feed.positions, feed.counts):
            self.lengths[slot] = position + count
        self.calls += 1
        return next(self.answers).expand(len(feed.slots), max(feed.reads), -1).clone()

    def rewind(self, slot: int, length: int) -> None:
        super().rewind(slot, length)
        if self.engine is not None:
            self.engine.rewind(slot, length)

    def release(self, slot: int) -> None:
        super().release(slot)
        if self.engine is not None:
            self.engine.release(slot)

    def _admit(self, slots, input_ids, encoded):  # admit() above does it all
        return None

    def _forward(self, feed: Feed) -> torch.Tensor:  # forward() above does it all
        raise NotImplementedError


class Windows(DraftLength):
    """A chooser that plays the window given; what the rounds report goes to its own bookkeeping, or, with
    ``costs_to``, to that chooser's cost fits alone (a script's acceptance is not the records')."""

    def __init__(self, window: int, most: int, costs_to: DraftLength | None = None):
        super().__init__(most)
        self.window, self.costs_to = window, costs_to

    def choose(self, rows: int) -> int:
        return self.window

    def drafted(self, rows: int, seconds: float, steps: int = 1) -> None:
        (self.costs_to or super()).drafted(rows, seconds, steps)

    def verified(self, positions: int, seconds: float, *args, **kwargs) -> None:
        if self.costs_to is None:
            return super().verified(positions, seconds, *args, **kwargs)
        self.costs_to.large_cost.add(positions, seconds)


def sure_of_one_token(pair) -> torch.Tensor:
    """A logits row [V] sure of one token that ends nothing (not an EOS)."""
    vocabulary = pair.large.get_output_embeddings().weight.shape[0]
    token = next(t for t in range(3, vocabulary) if t not in pair.eos_token_ids)
    logits = torch.full((vocabulary,), -20.0)
    logits[token] = 20.0
    return logits


def scripted_scheduler(pair, config: DecodingConfig, policy: BatchPolicy, chooser: DraftLength | None,
                       timed: bool = True) -> Scheduler:
    """A scheduler of ``config``'s method over scripted engines (beside the pair's real ones where ``timed``),
    its windows from ``chooser`` (None: the method draws none)."""
    sure, slots = sure_of_one_token(pair), policy.batch_size
    real = {role: pair.engine(role, slots) if timed else None for role in ("small", "large")}
    small = None if config.method == "large" else ScriptedEngine([sure], real["small"], slots)
    large = None if config.method == "small" else ScriptedEngine([sure], real["large"], slots)
    settings = dataclasses.replace(config, do_sample=False, adaptive_draft=False)
    return Scheduler(small, large, settings, policy, pair.eos_token_ids, pair.decoder_prefix, device=pair.device,
                     shares_encoder=pair.shares_encoder and timed, draft_length=chooser)


def calibrate(pair, config: DecodingConfig, policy: BatchPolicy, chooser: DraftLength,
              source_tokens: int = 16) -> None:
    """Teach ``config``'s window chooser on ``pair`` (at ``policy``'s batch size) what rounds cost, from scripted
    rounds of CALIBRATION_WINDOWS on a full batch of ``source_tokens``-token sources: an actor's warm-up."""
    if not config.measures_windows:
        return
    source = torch.full((source_tokens,), int(sure_of_one_token(pair).argmax()))
    for window in CALIBRATION_WINDOWS:
        budget = CALIBRATION_ROUNDS * (window + 1)
        scheduler = scripted_scheduler(pair, dataclasses.replace(config, max_new_tokens=budget), policy,
                                       Windows(window, config.max_draft_tokens, costs_to=chooser))
        scheduler.run([BatchRequest(source)] * policy.batch_size)
