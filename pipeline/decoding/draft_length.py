"""How many tokens to draft before the next verification: the window that buys the most tokens per second,
from what the scheduler measures (docs/design.md §1, "How many drafts").

Speculation pays where a verification of k drafts costs little more than one large-model step (a step
bound by reading weights: a large model on a CPU, every model on a GPU). Where a step is bound by
arithmetic (a model that sits in cache, a batch of 32 on a CPU) verifying k drafts costs nearly k steps,
and drafting only adds the small model's steps: there the best window is 0, a plain `large` step.

With B rows in the batch, a window of k, and the running rates

- ``c``: drafts per small-model call (a BiLD fallback ends a window without a draft), and
- ``a``: the share of drafts kept, given the drafts before them were (a rejection drops the rest),

a round of up to k drafts is expected to make ``1 + sum_{i<=k} (c a)^i`` tokens per row. Its cost is
set by the batch's longest row, not the average one: the drafting call steps until every row stopped, and
the verification pads every row to the longest tail. A row drafts at least i tokens with probability c^i,
so the longest of B rows does with ``1 - (1 - c^i)^B``: a round makes ``sum_{i<k} (1 - (1 - c^i)^B)``
small-model calls and verifies ``B (1 + sum_{i<=k} (1 - (1 - c^i)^B))`` positions (at B = 1 the plain
``sum c^i``). Both models' times come from CallCost fits of whole rounds (scheduler Python included).
Until both fits hold, the configured window is used (it is how the fits learn; an actor teaches them with
scripted rounds before its first record instead: scripted.calibrate); that epoch ends once they hold and is
paired with nothing (its rounds also take first calls' costs), and so are the plain epochs that follow it
while the process settles (``SETTLING_EPOCHS``).

The model picks the best window k > 0; whether to draft at all is then settled by measurement, not by the
model: fits of rounds miss what a round costs outside its two calls (the loop, rows joining), and a linear fit
of verifications misprices a one-position step. Rounds run in *epochs* of ``EPOCH_SECONDS`` each, drafting
(window k) or plain (window 0), and an epoch's tokens per second is measured over its whole wall time,
everything between its rounds included (epochs of so many rounds would not do: a drafting round makes
several tokens, a plain one one, so trying the other arm one epoch in 8 would spend a third of the time).
The clock stops while the scheduler is paused: between its runs (so at batch 1 an epoch spans records) and
while newcomers are admitted, which both arms pay alike and which come in bursts (demo pair, batch 32: a plain
epoch that took a burst of admissions ran at 0.55x its neighbours, and two such samples kept drafting, 0.8x
as fast, for the rest of a run). A drafting epoch next to a plain one while the batch is as full (*full*: at
least half its slots busy; else *draining*) gives one sample of their ratio: neighbours share the machine's
phase (a shared CPU's speed drifts by a quarter over seconds), as the benchmarks' interleaved repetitions do.
The arms alternate for the first samples, plain steps first (`large`'s own: the safe arm); then the arm the
samples put ahead is played, drafting only where its gain stands a standard error above nought (``SURE``,
the error drawn towards ``NOISE`` while the samples are few), and the other is tried again now and then, the
further behind the more rarely, so that trying costs about ``EXPLORE_GAP / EXPLORE_EVERY`` of the time
whatever the gap; a try waits for an epoch it can be paired with (one that played the arm ahead as full a
batch), so that none is spent for nothing.

Whatever the window, every invariant holds: greedy speculative and BiLD with alpha_RB = 0 return the
large model's tokens, sampling keeps its distribution. Only lossy settings (BiLD's rollback threshold,
a cascade, lenience) and a sampled row's random draws depend on the windows chosen, and so on measured
speed. It is the default (``decoding.adaptive_draft``), so that a drafting method is never slower than
`large` where it runs; a job whose lossy or sampled rows must repeat exactly asks for fixed windows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.decoding.engine import CallCost


# The model's own window (``modelled``: the arm played first, before anything is measured) drafts only where
# it expects to beat plain steps by this factor: its fits are of noisy whole rounds (demo pair, batch 32:
# windows of 1 predicted 1-5% ahead ran behind plain steps).
MARGIN = 1.05
# The choice is worked out anew every this many seconds of rounds (an epoch; or when the batch turns from full
# to draining): it costs ~0.02 ms of Python, and an epoch is short enough that neighbouring epochs share the
# machine's phase.
EPOCH_SECONDS = 0.05
# The arms alternate until this many ratios are measured; then the arm behind is tried again every
# EXPLORE_EVERY epochs while it is within EXPLORE_GAP, more rarely the further behind it is. (A third first
# ratio, and a try every 8 epochs, cost the demo job 1-2% each through the CLI: its 150 records an actor
# last about 40 epochs.)
FIRST_RATIOS = 2
EXPLORE_EVERY = 16
EXPLORE_GAP = 0.1
# Where drafting is played on fewer than SETTLED samples, plain steps are tried again the sooner the fewer there
# are (a choice to draft on two samples is checked soon: the demo pair at batch 1 drafted for 87 of an actor's
# 150 records on two early samples); plain steps played are not checked sooner (a try of drafting where it
# runs 0.2x as fast, at batch 32, costs what four plain epochs make).
SETTLED = 8
# Once the costs are known, the first this many epochs take plain steps and are compared with nothing: a
# process's first records still pay one-time costs (each new source length's first runtime calls), which fell
# on whichever arm ran first (demo pair, batch 1, calibrated: an actor's first two samples put drafting ahead
# and it drafted for 110 of its 150 records).
SETTLING_EPOCHS = 4
# The ratio weighs its last samples most (each earlier one this much less).
DECAY = 0.9
# Drafting is played only where its measured gain stands this many standard errors above 0: a wrong draft costs
# what plain steps are ahead, and on a shared 2-core VM neighbouring epochs of a few records differ by a quarter
# (the demo pair at batch 1 beside a second busy actor: first samples of +20% and +14% for drafting that runs
# 0.8x, then 12 drafting epochs). Plain steps are `large`'s own: the safe arm.
SURE = 1.0
# Until its samples can say, a sample's spread is taken as NOISE (the log ratio of neighbouring epochs on that VM),
# weighing as PRIOR_SAMPLES samples: two samples that agree by chance do not settle it.
NOISE, PRIOR_SAMPLES = 0.15, 2.0


@dataclass
class PairedRatio:
    """log(drafting tokens/s / plain tokens/s) over pairs of neighbouring epochs, recent pairs weighing most."""

    total: float = 0.0
    squares: float = 0.0
    weight: float = 0.0
    samples: int = 0

    def add(self, log_ratio: float) -> None:
        self.total = DECAY * self.total + log_ratio
        self.squares = DECAY * self.squares + log_ratio * log_ratio
        self.weight = DECAY * self.weight + 1.0
        self.samples += 1

    @property
    def log_gain(self) -> float:
        return self.total / self.weight if self.weight else 0.0

    @property
    def spread(self) -> float:
        """The standard error of log_gain (its samples' weights counted as so many samples), their variance
        drawn towards NOISE**2 as if PRIOR_SAMPLES more samples had it."""
        if not self.samples:
            return NOISE
        measured = max(0.0, self.squares / self.weight - self.log_gain**2)
        variance = (self.weight * measured + PRIOR_SAMPLES * NOISE**2) / (self.weight + PRIOR_SAMPLES)
        return math.sqrt(variance / self.weight)

    @property
    def drafting_ahead(self) -> bool:
        """Whether drafting is ahead of plain steps beyond doubt (SURE standard errors)."""
        return self.log_gain - SURE * self.spread >= 0


class DraftLength:
    """Chooses each round's window in [0, ``most``]: k from measured costs and the running acceptance, and
    whether to draft at all from the measured rates of epochs that did and did not (``slots``: the batch's
    rows at most; ``clock``: the time, a test's own where given)."""

    def __init__(self, most: int, slots: int = 1, min_calls: int = 4, clock: Callable[[], float] = time.perf_counter):
        self.most = most
        self.slots = slots  # the batch's rows at most
        self.clock = clock
        self._window = most  # the current epoch's window
        # (batch full, drafting, started, tokens then, whether it measures its arm)
        self._epoch: tuple[bool, bool, float, int, bool] | None = None
        self._previous: tuple[bool, bool, float] | None = None  # the last epoch: (batch full, drafting, tokens/s)
        self._paused_at: float | None = None  # when the scheduler stopped, until its next round
        self._last_arm: dict[bool, bool] = {}  # batch full -> whether its last epoch drafted
        self.ratios: dict[bool, PairedRatio] = {}  # batch full -> drafting's measured gain over plain steps
        self.untried = 0  # epochs decided by measurement since the arm behind was last tried
        self.settling = SETTLING_EPOCHS  # plain epochs still to play before measuring
        self.made = 0  # tokens the verifications made
        self.small_cost = CallCost(min_calls)  # a drafting round: seconds over rows drafting
        self.large_cost = CallCost(min_calls)  # a verification: seconds over positions computed
        self.small_calls = 0
        self.drafts = 0  # drafts sent for verification
        self.kept = 0  # of them kept
        self.rejections = 0  # verifications that dropped a draft

    # --- what the scheduler reports --------------------------------------------------------------

    def drafted(self, rows: int, seconds: float, steps: int = 1) -> None:
        """``steps`` drafting steps starting with ``rows`` rows took ``seconds`` (one step per round
        when sampling, a whole window in one engine call when greedy)."""
        self.small_cost.add(rows, seconds / steps)

    def verified(self, positions: int, seconds: float, calls: int, drafts: int, kept: int, rejections: int,
                 made: int = 0) -> None:
        """A verification computed ``positions`` in ``seconds``; its rows had made ``calls`` small-model
        calls for ``drafts`` drafts, of which ``kept`` were kept and ``rejections`` rows dropped one; the
        rows gained ``made`` tokens."""
        self.large_cost.add(positions, seconds)
        self.made += made
        self.small_calls += calls
        self.drafts += drafts
        self.kept += kept
        self.rejections += rejections

    # --- the choice ------------------------------------------------------------------------------

    def choose(self, rows: int) -> int:
        """The window for a round of ``rows`` rows: ``most`` until the costs are known, then, epoch by
        epoch, the model's best k > 0 or 0, as the measured rates say."""
        full = 2 * rows > self.slots  # at least half the slots busy (else draining)
        self._resume()
        epoch = self._epoch
        if epoch is not None and epoch[0] == full and self.clock() - epoch[2] < EPOCH_SECONDS:
            if epoch[4] or not self._costs_known(rows):  # the fits' epoch ends once they hold: it measures nothing
                return self._window
        self._close_epoch()
        self._window, measured = self._epoch_window(rows)
        self._epoch = (full, self._window > 0, self.clock(), self.made, measured)
        return self._window

    def modelled(self, rows: int) -> int:
        """The model's window: the k in [0, most] with the most expected tokens per second, 0 unless
        drafting is expected to beat plain steps by MARGIN (costs must be known)."""
        return self._modelled(self.rates(rows))

    def _modelled(self, rates: list[float]) -> int:
        window = max(range(self.most + 1), key=rates.__getitem__)
        return window if rates[window] >= MARGIN * rates[0] else 0

    def _costs_known(self, rows: int) -> bool:
        """Whether both fits hold (learnt from the first rounds, or from scripted ones: scripted.calibrate)."""
        return self.small_cost.predict(rows) is not None and self.large_cost.predict(rows) is not None

    def _epoch_window(self, rows: int) -> tuple[int, bool]:
        """The epoch's window, and whether the epoch counts as a measurement of its arm (not while the fits
        learn: those first rounds also take first calls' costs)."""
        if not self._costs_known(rows):
            return self.most, False
        if self.settling:
            self.settling -= 1
            return 0, False
        if self.small_calls:  # the acceptance measured: the model's window
            rates = self.rates(rows)  # all windows in one pass: ~20 us an epoch, against ~100 us window by window
            modelled = self._modelled(rates)
            drafting_window = modelled or max(range(1, self.most + 1), key=rates.__getitem__)
        else:  # costs known from a calibration, no draft judged yet: the configured window
            modelled, drafting_window = 0, self.most
        full = 2 * rows > self.slots
        ratio = self.ratios.get(full, PairedRatio())
        if ratio.samples < FIRST_RATIOS and self.ratios.get(not full, ratio).samples >= FIRST_RATIOS:
            ratio = self.ratios[not full]  # e.g. a batch's short draining tail goes by the full batch's samples
        if ratio.samples < FIRST_RATIOS:  # alternate, plain steps (`large`'s own, the safe arm) first: the fits'
            # rounds drafted already
            play_drafting = not self._last_arm[full] if full in self._last_arm else False
        else:
            drafting_ahead = ratio.drafting_ahead
            lead = ratio.log_gain if drafting_ahead else -ratio.log_gain  # how far the arm played is ahead
            behind = math.expm1(min(max(lead, 0.0), 10.0))  # the other arm (none where it leads, unproven)
            every = EXPLORE_EVERY * max(1.0, behind / EXPLORE_GAP) * (min(1.0, ratio.samples / SETTLED)
                                                                       if drafting_ahead else 1.0)
            # Counted from the last try (not epochs % every: the gap, and so `every`, moves with each sample)
            self.untried += 1
            # A try is a sample only beside the epoch just closed, if that played the arm ahead as full a batch;
            # else it waits (demo pair, batch 8: a try as the batch drained, after a full epoch, paired with nothing)
            pairs = self._previous is not None and self._previous[:2] == (full, drafting_ahead)
            try_behind = pairs and self.untried >= max(1, round(every))
            if try_behind:
                self.untried = 0
            play_drafting = drafting_ahead != try_behind
        self._last_arm[full] = play_drafting
        return (drafting_window if play_drafting else 0), True

    def pause(self) -> None:
        """The scheduler stops (its requests are done): the epoch's clock stops until the next round, so
        that whatever the machine does meanwhile (waiting for records, a benchmark's other methods) is not
        counted. At batch 1 an epoch so spans records shorter than it: closing it at each record's end left
        nothing to pair (demo pair, 200 records of ~17 ms: 3 samples in 400 records, drafting every other)."""
        if self._paused_at is None:
            self._paused_at = self.clock()

    def _resume(self) -> None:
        """A round after a pause: the epoch's start moves on by the time paused."""
        if self._paused_at is not None and self._epoch is not None:
            full, drafting, started, made, measured = self._epoch
            self._epoch = (full, drafting, started + self.clock() - self._paused_at, made, measured)
        self._paused_at = None

    def _close_epoch(self) -> None:
        """The epoch that ends now: its tokens per second over its whole wall time, and with the one before
        it, where that played the other arm with the batch as full, a sample of their ratio."""
        if self._epoch is None:
            return
        full, drafting, started, made, measured = self._epoch
        seconds, tokens = self.clock() - started, self.made - made
        rate = tokens / seconds if seconds > 0 and tokens > 0 and measured else None
        previous, self._epoch = self._previous, None
        self._previous = (full, drafting, rate) if rate is not None else None
        if rate is not None and previous is not None and previous[:2] == (full, not drafting):
            drafting_rate, plain_rate = (rate, previous[2]) if drafting else (previous[2], rate)
            self.ratios.setdefault(full, PairedRatio()).add(math.log(drafting_rate / plain_rate))

    def tokens_per_second(self, k: int, rows: int) -> float:
        """Expected tokens per second of rounds with window ``k`` over ``rows`` rows (costs must be known)."""
        return self.rates(rows)[k]

    def rates(self, rows: int) -> list[float]:
        """Expected tokens per second of rounds with each window 0..``most`` over ``rows`` rows (costs must be
        known), the sums of the module's docstring run once for all windows."""
        c = self.drafts / self.small_calls  # P(a small call drafts)
        a = self.kept / (self.kept + self.rejections) if self.kept + self.rejections else 1.0
        small_seconds = self.small_cost.predict(rows)
        tokens, small_calls, positions = 1.0, 0.0, 1.0  # per row at k = 0: a plain step
        rates = []
        for k in range(self.most + 1):
            if k:
                reaches = 1.0 - (1.0 - c ** (k - 1)) ** rows  # P(some row of the batch drafts at least k - 1 tokens)
                small_calls += reaches
                tokens += (c * a) ** k
                positions += 1.0 - (1.0 - c**k) ** rows  # ... at least k tokens
            seconds = small_calls * small_seconds + self.large_cost.predict(rows * positions)
            rates.append(rows * tokens / seconds if seconds > 0 else 0.0)
        return rates
