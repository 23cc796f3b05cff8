"""How many tokens to draft before the next verification: the window that buys the most tokens per second,
from what the scheduler measures (DESIGN.md §1, "How many drafts").

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
Until both fits hold, the configured window is used (it is how the fits learn).

Whatever the window, every invariant holds: greedy speculative and BiLD with alpha_RB = 0 return the
large model's tokens, sampling keeps its distribution. Only lossy settings (BiLD's rollback threshold,
a cascade, lenience) and a sampled row's random draws depend on the windows chosen, and so on measured
speed: so it is asked for (``decoding.adaptive_draft: true``), and the configured window stays the default.
"""

from __future__ import annotations

from pipeline.decoding.engine import CallCost


# Drafting is chosen only where the model expects it to beat plain steps by this factor: its fits are of
# noisy whole rounds, and a misjudged window costs more than a missed one (demo pair, batch 32: windows of 1
# predicted 1-5% ahead ran behind plain steps).
MARGIN = 1.05
# The choice is worked out anew every this many rounds (or when the batch changes size): it costs ~0.1 ms of
# Python, a fiftieth of a demo `large` step, and the rates it reads move slowly.
CHOOSE_EVERY = 8


class DraftLength:
    """Chooses each round's window in [0, ``most``] from measured costs and the running acceptance."""

    def __init__(self, most: int, min_calls: int = 16):
        self.most = most
        self._last = (0, 0, most)  # (rows, rounds left, window) of the last choice
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

    def verified(self, positions: int, seconds: float, calls: int, drafts: int, kept: int, rejections: int) -> None:
        """A verification computed ``positions`` in ``seconds``; its rows had made ``calls`` small-model
        calls for ``drafts`` drafts, of which ``kept`` were kept and ``rejections`` rows dropped one."""
        self.large_cost.add(positions, seconds)
        self.small_calls += calls
        self.drafts += drafts
        self.kept += kept
        self.rejections += rejections

    # --- the choice ------------------------------------------------------------------------------

    def choose(self, rows: int) -> int:
        """The window for a round of ``rows`` rows: ``most`` until the costs are known, then the k in
        [0, most] with the most expected tokens per second."""
        last_rows, left, window = self._last
        if rows == last_rows and left > 0:
            self._last = (rows, left - 1, window)
            return window
        small = self.small_cost.predict(rows)
        if small is None or self.large_cost.predict(rows) is None or not self.small_calls:
            return self.most
        rates = [self.tokens_per_second(k, rows) for k in range(self.most + 1)]
        window = max(range(self.most + 1), key=rates.__getitem__)
        if rates[window] < MARGIN * rates[0]:
            window = 0
        self._last = (rows, CHOOSE_EVERY - 1, window)
        return window

    def tokens_per_second(self, k: int, rows: int) -> float:
        """Expected tokens per second of rounds with window ``k`` over ``rows`` rows (costs must be known)."""
        c = self.drafts / self.small_calls  # P(a small call drafts)
        a = self.kept / (self.kept + self.rejections) if self.kept + self.rejections else 1.0
        tokens = 1.0 + sum((c * a) ** i for i in range(1, k + 1))

        def longest_reaches(i: int) -> float:  # P(some row of the batch drafts at least i tokens)
            return 1.0 - (1.0 - c**i) ** rows

        small_calls = sum(longest_reaches(i) for i in range(k))
        positions = rows * (1.0 + sum(longest_reaches(i) for i in range(1, k + 1)))
        seconds = small_calls * self.small_cost.predict(rows) + self.large_cost.predict(positions)
        return rows * tokens / seconds if seconds > 0 else 0.0
