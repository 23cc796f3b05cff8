"""The seam between the scheduler and a model: one decoder over a pool of row slots.

In the spirit of gpt-fast's ``setup_caches`` + ``forward(idx, input_pos)``, an engine owns one
model's key/value cache for ``slots`` rows and offers four verbs:

- ``admit(slots, input_ids)``: new rows take these slots; an encoder-decoder model runs its
  encoder once for them (a decoder-only prompt is simply the row's first tokens to feed);
- ``forward(feed)``: each row's new tokens are written into its cache at its positions, and the
  logits of only the positions the scheduler reads come back;
- ``rewind(slot, length)``: forget everything past ``length`` (a rollback: a length change,
  nothing is copied or recomputed);
- ``release(slot)``: the row left; the slot is free for the next one.

An engine knows no decoding policy: what to draft is drafting.py's, what to keep policies.py's.

``HFEngine`` (engines/hf_engine.py) runs any Hugging Face model and is the reference in tests; the native
engines (engines/t5_engine.py, one file per model family) run their own forward pass over a preallocated
cache. models.resolve_engine decides which one a pair gets (engines/registry.py).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch




@dataclass(frozen=True)
class Feed:
    """One forward pass over some rows: what each feeds and which predictions it reads.

    Row r feeds ``tokens[r, :counts[r]]`` at positions ``positions[r] ...`` (its slot's cached
    length: nothing is skipped, nothing read twice) and wants the logits of its last ``reads[r]``
    fed tokens (1 for a drafting step, k + 1 for the verification of k drafts). Columns past
    ``counts[r]`` are padding; their keys and values land past the row's length, where nothing
    reads them before they are overwritten.
    """

    slots: list[int]  # [R]
    tokens: torch.Tensor  # [R, W] long, on the CPU
    positions: list[int]  # [R]
    counts: list[int]  # [R], 1 <= counts[r] <= W
    reads: list[int]  # [R], 1 <= reads[r] <= counts[r]

    @property
    def width(self) -> int:
        return self.tokens.shape[1]


class CallCost:
    """A running least-squares fit of one model's forward time: seconds = a + b * positions.

    ``a / b`` is what one more call costs, in positions: the scheduler weighs it against the
    padding that splitting a pass would save. On a GPU ``b`` is tiny and calls are rarely split;
    on a CPU, where time grows with every position, padding matters.
    """

    def __init__(self, min_calls: int = 16):
        self.min_calls = min_calls
        self.n = 0
        self.sums = [0.0] * 4  # over calls, x = positions and y = seconds: sum x, y, xx, xy

    def add(self, positions: int, seconds: float) -> None:
        self.n += 1
        x, y = float(positions), seconds
        for i, value in enumerate((x, y, x * x, x * y)):
            self.sums[i] += value

    def _line(self) -> tuple[float, float] | None:
        """(a, b), or None until enough calls of different sizes were timed (or the fit is absurd)."""
        if self.n < self.min_calls:
            return None
        sx, sy, sxx, sxy = self.sums
        spread = self.n * sxx - sx * sx
        if spread <= 0:
            return None
        slope = (self.n * sxy - sx * sy) / spread
        intercept = (sy - slope * sx) / self.n
        if slope <= 0 or intercept <= 0:
            return None
        return intercept, slope

    def overhead_in_positions(self) -> float | None:
        """a / b, or None until the fit holds."""
        line = self._line()
        return None if line is None else line[0] / line[1]

    def predict(self, positions: float) -> float | None:
        """Seconds of a call over ``positions``: the fitted line, or where calls were all alike (batch 1's
        drafting steps) or the line is absurd, the mean seconds per position times ``positions``; None
        before ``min_calls`` calls."""
        if self.n < self.min_calls:
            return None
        line = self._line()
        if line is None:
            return self.sums[1] / self.sums[0] * positions
        return line[0] + line[1] * positions


# On the CPU newcomers are encoded in groups of similar length, each padded to its longest source with
# at most this share of its positions padding: an encoder's work is rows x the longest source, and 32
# flickr sentences under T5's tokenizer (35 to 159 tokens) padded to one batch were 2.2x their tokens.
# On a GPU padded positions run in parallel and a call costs more than they do (as CallCost finds for
# verifications): one call there (not measured yet).
ADMISSION_PADDING = 0.125


def length_groups(lengths: Sequence[int], padding: float = ADMISSION_PADDING) -> list[list[int]]:
    """The indices of ``lengths`` in groups, longest first: a group padded to its first (longest)
    length has at most ``padding`` of its positions padding. A group is one encoder call, so the
    calls stay few where lengths are alike."""
    groups: list[list[int]] = []
    tokens = 0  # in the last group
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        fits = groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] * (1 - padding) <= tokens + lengths[index]
        if fits:
            groups[-1].append(index)
            tokens += lengths[index]
        else:
            groups.append([index])
            tokens = lengths[index]
    return groups


def padding_groups(tails: Sequence[int], overhead: float) -> list[list[int]]:
    """The indices of ``tails`` (tokens each row feeds) sorted by tail and cut into the groups, one pass
    each padded to its longest, that cost the fewest positions when a pass costs ``overhead`` more (a
    shortest path over the cut points). One group when every row feeds alike."""
    if min(tails) == max(tails):
        return [list(range(len(tails)))]
    order = sorted(range(len(tails)), key=tails.__getitem__)
    ranked = [tails[i] for i in order]
    # cost[j]: the cheapest way to verify the j shortest rows; a group (i, j] is padded to ranked[j-1].
    cost, cut = [0.0] + [float("inf")] * len(tails), [0] * (len(tails) + 1)
    for j in range(1, len(tails) + 1):
        for i in range(j):
            candidate = cost[i] + overhead + (j - i) * ranked[j - 1]
            if candidate < cost[j]:
                cost[j], cut[j] = candidate, i
    groups, j = [], len(tails)
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def _in_input_order(parts: list[tuple[list[int], torch.Tensor | None]], rows: int) -> torch.Tensor | None:
    """The groups' encoder states as one batch [rows, S, d] in the order the rows came, each padded
    with zeros to the longest (None for decoder-only models)."""
    first = parts[0][1] if parts else None
    if first is None:
        return None
    merged = first.new_zeros((rows, first.shape[1], first.shape[2]))  # the first group holds the longest
    for group, states in parts:
        merged[torch.tensor(group, device=first.device), : states.shape[1]] = states
    return merged


class Engine(ABC):
    """One model's decoder over ``slots`` rows, each with its own cached length.

    Subclasses implement ``_admit`` and ``_forward``; the bookkeeping every engine shares
    (lengths, counters, the cost fit) lives here.
    """

    kind = "abstract"  # "native", "onnx" or "hf": what the run manifest records

    def __init__(self, slots: int, device: torch.device | str = "cpu"):
        self.slots = slots
        self.device = torch.device(device)
        self.lengths = [0] * slots  # positions cached per slot
        self.calls = 0
        self.tokens_fed = 0  # real tokens fed, padding excluded ...
        self.positions_computed = 0  # ... and included
        self.forward_seconds = 0.0
        self.admit_seconds = 0.0  # encoder passes and cross-attention projections
        self.runtime_seconds = 0.0  # of forward_seconds: inside the runtime's one call (onnxruntime's), if any
        self.call_cost = CallCost()

    @property
    def attention_path(self) -> str:
        """Which attention computes this engine's steps (the output's ``attention`` column): "model", the
        model's own as the engine runs it; the onnx engine says "kernel" (decode_attention.c) or
        "onnxruntime" (its attention ops)."""
        return "model"

    @property
    def int8_scheme(self) -> str | None:
        """How this engine multiplies in int8 (the output's ``int8_scheme`` column), None where it does not."""
        return None

    # --- the four verbs ---------------------------------------------------------------------------

    def admit(self, slots: Sequence[int], input_ids: Sequence[torch.Tensor], encoded: torch.Tensor | None = None):
        """New rows take ``slots``. Encoder-decoder engines run the encoder on ``input_ids`` (one [S]
        tensor per row), batched in groups of similar length on the CPU (``length_groups``), and return its
        states [rows, S, d]; ``encoded`` passes the states of an identical encoder instead (a small
        model that shares the large model's encoder)."""
        for slot in slots:
            self.lengths[slot] = 0
        started = time.perf_counter()
        lengths = [len(ids) for ids in input_ids]
        parts = []  # (group, its encoder states [G, S_g, d] or None)
        for group in length_groups(lengths, ADMISSION_PADDING if self.device.type == "cpu" else 1.0):
            given = None if encoded is None else encoded[group, : lengths[group[0]]]
            parts.append((group, self._admit([slots[i] for i in group], [input_ids[i] for i in group], given)))
        self.admit_seconds += time.perf_counter() - started
        return _in_input_order(parts, len(slots))

    def forward(self, feed: Feed) -> torch.Tensor:
        """Logits [R, max(reads), V]; row r's fill [r, :reads[r]]. Writes the fed keys/values in place."""
        for slot, position, count, read in zip(feed.slots, feed.positions, feed.counts, feed.reads):
            if position != self.lengths[slot]:
                raise ValueError(f"slot {slot}: feeding at position {position}, but {self.lengths[slot]} are cached")
            if not 1 <= read <= count <= feed.width:
                raise ValueError(f"slot {slot}: feeds {count} tokens of {feed.width} and reads {read} of them")
        started = time.perf_counter()
        logits = self._forward(feed)
        elapsed = time.perf_counter() - started
        computed = len(feed.slots) * feed.width
        self.calls += 1
        self.tokens_fed += sum(feed.counts)
        self.positions_computed += computed
        self.forward_seconds += elapsed
        self.call_cost.add(computed, elapsed)
        for slot, position, count in zip(feed.slots, feed.positions, feed.counts):
            self.lengths[slot] = position + count
        return logits

    def rewind(self, slot: int, length: int) -> None:
        """Keep only the first ``length`` cached positions of ``slot`` (a no-op where fewer)."""
        if length < self.lengths[slot]:
            self.lengths[slot] = length

    def release(self, slot: int) -> None:
        self.lengths[slot] = 0

    # --- what each engine implements ------------------------------------------------------------

    @abstractmethod
    def _admit(self, slots: list[int], input_ids: list[torch.Tensor], encoded: torch.Tensor | None): ...

    @abstractmethod
    def _forward(self, feed: Feed) -> torch.Tensor: ...


def read_positions(hidden: torch.Tensor, feed: Feed) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The rows of ``hidden`` [R * W, d] whose logits are read, and where they go.

    Returns (selected [N, d], index) where the caller scatters the N logits into [R, max(reads), V]
    at ``index`` (flat positions); index is None when every row reads the same number of its last
    positions and needs no scatter (the common drafting and single-row cases).
    """
    rows, width = len(feed.slots), feed.width
    first = min(feed.reads)
    if first == max(feed.reads) and all(count == width for count in feed.counts):
        return hidden.view(rows, width, -1)[:, width - first :].reshape(rows * first, -1), None
    source = [r * width + i for r, (count, read) in enumerate(zip(feed.counts, feed.reads))
              for i in range(count - read, count)]
    index = logit_places(feed)
    return hidden[torch.tensor(source, device=hidden.device)], None if index is None else index.to(hidden.device)


def logit_places(feed: Feed) -> torch.Tensor | None:
    """Where each read position's logits go in [R * max(reads)], rows in ``feed``'s order; None when
    every row reads as many (the logits are then in place already)."""
    most = max(feed.reads)
    if min(feed.reads) == most:
        return None
    return torch.tensor([r * most + i for r, read in enumerate(feed.reads) for i in range(read)])


def place_logits(logits: torch.Tensor, index: torch.Tensor | None, feed: Feed) -> torch.Tensor:
    """[N, V] logits of the read positions -> [R, max(reads), V] (zeros where a row reads fewer)."""
    rows, most = len(feed.slots), max(feed.reads)
    if index is None:
        return logits.view(rows, most, -1)
    out = logits.new_zeros((rows * most, logits.shape[-1]))
    out[index] = logits
    return out.view(rows, most, -1)
