"""Proposing drafts (docs/design.md §1, step 1): each round's window (the configured one, or the measured best,
within the row's token budget), and the small model's drafts until a row falls back (max pS < alpha_FB),
writes EOS or fills its window. Greedy rows draft a whole window in one call (``draft_window``), sampled and
cascade rows one step per round (their q and the row's own random stream are kept on the row).

Judging the drafts is policies.py's; the scheduler (scheduler.py) only decides when to draft and when to
verify. The rows are the scheduler's: this module reads and writes their window, drafts and counters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pipeline.decoding.config import DecodingConfig
from pipeline.decoding.engine import Engine, Feed
from pipeline.decoding.policies import fallback, model_probs
from pipeline.decoding.sampling import greedy, to_probs


@dataclass(frozen=True)
class DraftRule:
    """When each row of a greedy draft window stops."""

    windows: list[int]  # [R] the most drafts each row may write in this call (>= 1)
    fallback_threshold: float | None  # a row falls back (stops without a draft) when max p_S < this; None: never
    eos_ids: frozenset[int]
    enough: int  # the call returns once this many rows have stopped (BatchPolicy.verify_share)


@dataclass
class Drafted:
    """What a draft call wrote, per row of its feed."""

    tokens: list[list[int]]  # [R] the row's drafts, in order
    calls: list[int]  # [R] forward passes the row took part in
    fell_back: list[bool]  # [R] the row's last pass gave no draft (a fallback)
    stopped: list[bool]  # [R] the row's window is over: a fallback, EOS or its window full
    steps: int = 0  # forward passes of the call

    @classmethod
    def empty(cls, rows: int) -> "Drafted":
        return cls([[] for _ in range(rows)], [0] * rows, [False] * rows, [False] * rows)

    def advance(self, live: list[int], logits: torch.Tensor, rule: DraftRule) -> list[int]:
        """One step of the rows ``live`` (their logits [len(live), V]): each keeps its argmax draft
        unless it falls back; returns the rows still drafting."""
        probs = to_probs(logits)  # the sampled path's test and choice, so counters match it
        tokens = greedy(probs).tolist()
        unsure = fallback(probs, rule.fallback_threshold).tolist() if rule.fallback_threshold is not None else None
        self.steps += 1
        going = []
        for i, row in enumerate(live):
            self.calls[row] += 1
            if unsure is not None and unsure[i]:
                self.fell_back[row] = self.stopped[row] = True
                continue
            self.tokens[row].append(tokens[i])
            if tokens[i] in rule.eos_ids or len(self.tokens[row]) >= rule.windows[row]:
                self.stopped[row] = True
            else:
                going.append(row)
        return going

    def done(self, live: list[int], rule: DraftRule) -> bool:
        return not live or len(self.stopped) - len(live) >= rule.enough


def draft_window(engine: Engine, feed: Feed, rule: DraftRule) -> Drafted:
    """A greedy draft window for ``feed``'s rows (each reads 1): argmax drafts until each row falls back, writes
    EOS or fills its window, or until ``rule.enough`` rows stopped; one token per still-drafting row after the
    first pass."""
    drafted = Drafted.empty(len(feed.slots))
    live, all_slots = list(range(len(feed.slots))), feed.slots
    while True:
        live = drafted.advance(live, engine.forward(feed)[:, 0], rule)
        if drafted.done(live, rule):
            return drafted
        slots = [all_slots[row] for row in live]
        tokens = torch.tensor([[drafted.tokens[row][-1]] for row in live])
        feed = Feed(slots, tokens, [engine.lengths[slot] for slot in slots], [1] * len(live), [1] * len(live))


class Drafter:
    """The small model's side of a round, over the scheduler's rows and token buffer: ``feed(rows)`` gives the
    rows' uncached tokens, ``choose(probs, rows)`` a sampled row's draw from its own stream."""

    def __init__(self, small: Engine, config: DecodingConfig, eos_ids: frozenset[int],
                 feed: Callable[[list], Feed], choose: Callable[[torch.Tensor, list], torch.Tensor]):
        self.small, self.config, self.eos_ids, self.feed, self.choose = small, config, eos_ids, feed, choose
        self.use_fallback = config.method == "bild" or config.draft_window == "fallback"

    def open_windows(self, rows: list, most: int) -> None:
        """Rows starting a round get its window: ``most``, within the row's token budget. A window of 0 is a plain
        large-model step: the row waits at once."""
        for row in rows:
            if row.window is None:
                row.window = min(most, row.budget - row.produced())
                if row.window == 0:
                    row.waiting = True
                    row.stats.plain_steps += 1

    def draft(self, rows: list, sequence: torch.Tensor, enough: int) -> int:
        """The drafting rows draft into ``sequence`` until ``enough`` of them stop. Returns the small model's
        forward passes."""
        if self.config.do_sample or self.config.method == "cascade":
            self._draft_step(rows, sequence)
            return 1
        rule = DraftRule(windows=[row.window - row.drafts for row in rows],
                         fallback_threshold=self.config.fallback_threshold if self.use_fallback else None,
                         eos_ids=self.eos_ids, enough=enough)
        drafted = draft_window(self.small, self.feed(rows), rule)
        for row, tokens, calls, fell_back, stopped in zip(rows, drafted.tokens, drafted.calls, drafted.fell_back,
                                                          drafted.stopped):
            sequence[row.slot, row.length + row.drafts : row.length + row.drafts + len(tokens)] = torch.tensor(tokens)
            row.drafts += len(tokens)
            row.stats.small_calls += calls
            row.window_calls += calls
            row.stats.fallbacks += int(fell_back)
            row.ended_on_eos = bool(tokens) and tokens[-1] in self.eos_ids
            row.waiting = stopped
        return drafted.steps

    def _draft_step(self, rows: list, sequence: torch.Tensor) -> None:
        """One small-model step for each drafting row: a draft, or a fallback (sampling, cascades)."""
        logits = self.small.forward(self.feed(rows))[:, 0]  # [R, V]
        probs = model_probs(self.config, logits)
        unsure = fallback(probs, self.config.fallback_threshold).tolist() if self.use_fallback else [False] * len(rows)
        sure = [i for i, flag in enumerate(unsure) if not flag]
        # Only rows that keep a draft draw from their random stream, as they would alone.
        if len(sure) == len(rows):
            chosen = self.choose(probs, rows).tolist()
        else:
            chosen = self.choose(probs[sure], [rows[i] for i in sure]).tolist() if sure else []
        tokens = dict(zip(sure, chosen))
        for i, row in enumerate(rows):
            row.stats.small_calls += 1
            row.window_calls += 1
            if i not in tokens:
                row.stats.fallbacks += 1
                row.waiting = True
                continue
            sequence[row.slot, row.length + row.drafts] = tokens[i]
            row.drafts += 1
            if self.config.do_sample:
                row.draft_probs.append(probs[i])
            if self.config.method == "cascade":
                row.draft_logits.append(logits[i])
            if tokens[i] in self.eos_ids:
                row.ended_on_eos = row.waiting = True
            elif row.drafts >= row.window:
                row.waiting = True
