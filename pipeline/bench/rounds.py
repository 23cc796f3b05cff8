"""What the decoding loop's rounds cost, measured by running the method's own scheduler on scripted records.

A scripted record (pipeline/decoding/scripted.py: every draft kept) runs exactly the rounds asked for: windows
of 0 (plain large steps), 1 or ``max_draft_tokens``. Beside the script the real engines run the same calls,
whose answers are dropped: each call then costs what it costs in the loop, with the scheduler's Python between
the calls, the other model's calls and the admissions around it, each leaving the caches as the loop leaves
them.

A round is timed from one call of the round's model (the large one; the small one for `small` alone) to the
next, so a record gives many rounds and their median; what a record costs besides its rounds (its admission,
its first step, setting up and finishing) is its wall time less its rounds. From windows of 1 and k:

    round(1) = draft + verify + drafted position,  round(k) = k (draft + drafted position) + verify,

with the cost of a drafted position to a verification measured apart (cost.py: a verification's cost over its
positions) and the small model's admission measured apart (cost.py, prediction.py).

- ``scheduler_python``: the scripts over engines that compute nothing: the scheduler's Python alone.
- ``RoundSampler``: the scripts over the real engines, one scripted record between the records of a run (the
  same phases of a shared machine, each record after another method's, as the run's records are).

prediction.py applies either to a method's counted calls and rounds.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import time

import torch

from pipeline.decoding.config import DRAFTING_METHODS, BatchPolicy, BatchRequest, DecodingConfig
from pipeline.decoding.scripted import Windows, scripted_scheduler
from pipeline.decoding.stats import DecodeStats

# What a record's decode is made of: the record itself (admission of the large model, its first step, the
# scheduler's setting up and finishing), the small model's admission where the record drafts, plain rounds,
# drafting steps, verifications, and each drafted position a verification reads.
ROUND_PARTS = ("record", "small admission", "plain", "draft", "verify", "drafted position")
BUDGET = 32  # tokens of a scripted record


def round_counts(method: str, stats: DecodeStats, records: int, drafted_records: int) -> list[float]:
    """How many of each of ROUND_PARTS ``records`` decodes of ``method`` made (``drafted_records`` of them ran
    the small model); `large` and `small` alone make plain rounds only."""
    if method not in DRAFTING_METHODS:
        return [records, 0, stats.large_calls + stats.small_calls, 0, 0, 0]
    return [records, drafted_records, stats.plain_steps, stats.small_calls, stats.large_calls - stats.plain_steps,
            stats.draft_tokens]


@dataclasses.dataclass(frozen=True)
class Timed:
    """A scripted record's wall seconds and its rounds' seconds (from one call of the round's model to the next)."""

    wall: float
    rounds: list[float]
    calls: int  # of the round's model: the record's rounds


def windows(config: DecodingConfig) -> tuple[int | None, ...]:
    """The scripts of ``config``'s method: plain rounds (None for `large`/`small` alone, else a window of 0),
    and for a drafting method windows of 1 and max_draft_tokens."""
    return (0, 1, config.max_draft_tokens) if config.method in DRAFTING_METHODS else (None,)


class Scripter:
    """Runs scripted records of one method over a pair's engines at batch 1: real ones (``timed``), or ones
    that compute nothing."""

    def __init__(self, pair, config: DecodingConfig, input_ids: torch.Tensor, timed: bool):
        self.pair, self.config, self.input_ids, self.timed = pair, config, input_ids, timed

    def run(self, window: int | None) -> Timed:
        """One record of BUDGET tokens in rounds of ``window``."""
        config = dataclasses.replace(self.config, max_new_tokens=BUDGET)
        chooser = None if window is None else Windows(window, config.max_draft_tokens)
        scheduler = scripted_scheduler(self.pair, config, BatchPolicy(1), chooser, timed=self.timed)
        started = time.perf_counter()
        scheduler.run([BatchRequest(self.input_ids)])
        wall = time.perf_counter() - started
        clock = (scheduler.large or scheduler.small).called_at
        return Timed(wall, [after - before for before, after in zip(clock, clock[1:])], len(clock))


def median_round(found: list[Timed]) -> float:
    return statistics.median(seconds for timed in found for seconds in timed.rounds)


def besides_rounds(runs: dict[int | None, list[Timed]], small_admission: float) -> list[float]:
    """Each scripted record's wall time less its rounds at their median (the first rounds after another method's
    record run slower, which is the record's cost, not a round's) and less the small model's admission where
    it drafted."""
    return [timed.wall - timed.calls * median_round(found) - (small_admission if window else 0.0)
            for window, found in runs.items() for timed in found]


def parts_of(config: DecodingConfig, runs: dict[int | None, list[Timed]], drafted_position: float,
             small_admission: float, record: float | None = None) -> dict[str, float]:
    """Seconds per part of ROUND_PARTS from scripted records of each window (``runs``; medians), a drafted
    position's cost to a verification and the small model's admission given (measured apart), and what a
    record costs besides its rounds where given (else from these records)."""
    rounds = {window: median_round(found) for window, found in runs.items()}
    if record is None:
        record = statistics.median(besides_rounds(runs, small_admission))
    parts = dict.fromkeys(ROUND_PARTS, 0.0)
    parts.update(record=record, plain=rounds[windows(config)[0]])
    if config.method in DRAFTING_METHODS:
        most = config.max_draft_tokens
        per_draft = (rounds[most] - rounds[1]) / (most - 1)  # a drafting step and its drafted position
        parts.update({"small admission": small_admission, "draft": per_draft - drafted_position,
                      "verify": rounds[1] - per_draft, "drafted position": drafted_position})
    return parts


def scheduler_python(pair, config: DecodingConfig, input_ids: torch.Tensor, repeats: int = 5) -> dict[str, float]:
    """The scheduler's Python per part for ``config``'s method: its scripted records on engines that compute
    nothing (``repeats`` of each)."""
    scripter = Scripter(pair, config, input_ids, timed=False)
    runs = {window: [scripter.run(window) for _ in range(repeats)] for window in windows(config)}
    return parts_of(config, runs, drafted_position=0.0, small_admission=0.0)


class RoundSampler:
    """The parts' costs in the loop: one scripted record at a time on the real engines, the methods and windows
    in turn, between the records of a run."""

    def __init__(self, pair, configs: dict[str, DecodingConfig], input_ids: torch.Tensor):
        # One scripter per method as its scheduler runs it (the windows' choice aside: the script sets them).
        self.scripters = {}
        for config in configs.values():
            key = dataclasses.replace(config, adaptive_draft=False, do_sample=False)
            self.scripters.setdefault(key, Scripter(pair, config, input_ids, timed=True))
        self.turns = itertools.cycle([(key, window) for key in self.scripters for window in windows(key)])
        self.runs: dict = {}  # (config, window) -> [Timed]

    def sample(self) -> None:
        """The next scripted record in turn: one at a time, so that each meets the caches as the run's records
        do, after another method's record (two in a row measured the second's record part 30% lighter)."""
        key, window = next(self.turns)
        self.runs.setdefault((key, window), []).append(self.scripters[key].run(window))

    def warm_up(self) -> None:
        for key, scripter in self.scripters.items():
            for window in windows(key):
                scripter.run(window)

    def parts(self, config: DecodingConfig, drafted_position: float = 0.0,
              small_admission: float = 0.0) -> dict[str, float] | None:
        """Seconds per part of ``config``'s method in the loop, a drafted position's cost and the small model's
        admission given; None before every script of it ran."""
        key = dataclasses.replace(config, adaptive_draft=False, do_sample=False)
        runs = {window: self.runs.get((key, window)) for window in windows(key)}
        if not all(runs.values()):
            return None
        # What a record costs besides its rounds is the same for every method that admits it to the large model
        # (the small model's admission aside): pooled over their scripted records, not a noisy few of one's.
        pooled = [seconds for (other, window), found in self.runs.items()
                  if (other.method == "small") == (key.method == "small")
                  for seconds in besides_rounds({window: found}, small_admission)]
        return parts_of(key, runs, drafted_position, small_admission, statistics.median(pooled))
