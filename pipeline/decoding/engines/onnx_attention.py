"""How an onnx engine's step attends: two strategies behind one narrow interface.

- ``RuntimeAttention`` ("onnxruntime"): the step is one onnxruntime call with its attention ops, bound to
  the caches it reads: a span of slots as views of the engine's tensors, or the rows' own slots gathered
  into copies (written back after the step). Its bound calls are keyed by (first slot, end slot, W).
- ``KernelAttention`` ("kernel"): the step is onnxruntime segments with decode_attention.c between them
  (onnx_segments.py), bound to the engine's whole caches, which the kernel reads and writes by slot in
  place. Its bound calls are keyed by (rows, W).

The engine (onnx_engine.py) owns the caches and their growth; a strategy says how the caches are laid
out (``position_dim``), how the cross-attention buffer is sized, which slots a step runs over, and
binds the step's call for them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch

from pipeline.decoding.engine import Feed
from pipeline.decoding.engines import attention_kernel
from pipeline.decoding.engines.cache_rows import grown, span_of
from pipeline.decoding.engines.onnx_segments import ReadLogits, SegmentedCall, SegmentFrame

# Bound steps kept per engine (spans of slots x widths; at batch 32 rows finishing make new spans).
KEPT_CALLS = 64
CACHES = ("self_k", "self_v", "cross_k", "cross_v")


class StepAttention(ABC):
    """Which slots a step runs over and the onnxruntime call bound for them (kept per key while the
    engine's caches keep their storage: ``forget`` when they move)."""

    name: str
    # Where a cache [L, slots, ...] keeps its positions: onnxruntime's attention ops read a head's
    # positions as one piece ([.., H, C, dk]); our kernel reads a row's positions in order with every
    # head's keys of a position side by side ([.., C, H, dk]), so it streams through a row's keys, then
    # its values, once (demo pair, int8, `large` at batch 32: the kernel's time 0.80x head-major's, the
    # same tokens; BENCHMARKS.md).
    position_dim: int

    def __init__(self, engine):
        self.engine = engine  # the OnnxEngine whose caches it reads (onnx_engine imports this module)
        self._calls: dict = {}

    def forget(self) -> None:
        """The caches moved (grown): every bound call points at the old ones."""
        self._calls = {}


    @abstractmethod
    def source_size(self, needed: int, held: int) -> int:
        """The cross-attention buffer's positions for sources of up to ``needed`` (``held`` now)."""

    @abstractmethod
    def rows_read(self, feed: Feed) -> tuple[slice | list[int], list[int], int]:
        """The slots the step runs over, where each fed row sits among them, and how many there are."""

    @abstractmethod
    def bind(self, read: slice | list[int], positions: list[int], counts: list[int], width: int):
        """The call for a step over ``read`` (each at ``positions``, feeding ``counts`` of ``width``),
        its rows set."""

    def after(self, feed: Feed, read: slice | list[int], call) -> None:
        """Anything the step leaves to do once it ran (nothing, unless caches were copied)."""


class RuntimeAttention(StepAttention):
    name, position_dim = "onnxruntime", 3

    def source_size(self, needed: int, held: int) -> int:
        # onnxruntime's cross-attention reads every key position of the buffer (at batch 32 a 128-wide
        # one cost 6x a 32-wide one): not more than twice the longest source, so a long record gone
        # leaves no cost behind it.
        return held if needed <= held <= 2 * needed else needed

    def rows_read(self, feed: Feed) -> tuple[slice | list[int], list[int], int]:
        """The span of slots the rows occupy (idle ones run along, unread) when it is not much wider than
        they are (cache_rows.span_of), else the rows' own slots, gathered."""
        span = span_of(feed.slots)
        if span is not None:
            return span, [slot - span.start for slot in feed.slots], span.stop - span.start
        return list(feed.slots), list(range(len(feed.slots))), len(feed.slots)

    def bind(self, read: slice | list[int], positions: list[int], counts: list[int], width: int) -> _StepCall:
        """For a span of slots the caches are bound as views of the engine's tensors and the call is kept
        (so a step binds nothing, or only what it reads); other slots are gathered into copies of their
        self-attention caches up to the positions the step writes (rounded up to 16, not the whole
        capacity: at batch 32 copying whole caches was a fifth of `bild`'s time), written back after the
        step (``after``)."""
        engine, w = self.engine, self.engine.weights
        key = (read.start, read.stop, width) if isinstance(read, slice) else None
        call = self._calls.get(key) if key is not None else None
        if call is None:
            reach = max(positions) + width + 1
            held = engine.capacity if key is not None else min(engine.capacity, -(-reach // 16) * 16)  # C of the call
            caches = {name: [_rows(cache, read, held if name.startswith("self") else None).numpy()
                             for cache in getattr(engine, name)] for name in CACHES}
            rows = len(positions)
            inputs = {"source_lengths": engine.source_lengths[read]}  # a view for a span: admission writes it in place
            if w.position_bias:
                inputs["self_bias"] = np.zeros((rows, w.heads, width + 1, held), dtype=np.float32)
            inputs.update({"hidden": np.zeros((rows, width, w.d_model), dtype=np.float32),
                           "query_seqlens": np.zeros(rows, dtype=np.int32),
                           "seqlens_k": np.zeros(rows, dtype=np.int32),
                           "total_sequence_length": np.array(held, dtype=np.int32)})
            call = _StepCall(engine.sessions.step(engine.int8_kernel), caches, inputs, engine.vocab)
            if key is not None:
                _keep(self._calls, key, call)
        call.set_rows(positions, counts)
        return call

    def after(self, feed: Feed, read: slice | list[int], call: _StepCall) -> None:
        """The fed positions' keys and values from gathered copies (rows in ``feed``'s order) into the
        engine's cache."""
        if isinstance(read, slice):
            return
        engine = self.engine
        rows = torch.arange(len(feed.slots))[:, None]  # [R, 1]
        slots = torch.tensor(feed.slots)[:, None]
        steps = torch.tensor(feed.positions)[:, None] + torch.arange(feed.width)  # [R, W]
        for layer in range(engine.weights.layer_count):
            for name in ("self_k", "self_v"):
                getattr(engine, name)[layer, slots, :, steps] = torch.from_numpy(call.caches[name][layer])[rows, :, steps]


class KernelAttention(StepAttention):
    name, position_dim = "kernel", 2

    def __init__(self, engine):
        super().__init__(engine)
        self._frames: dict = {}  # (A, W) -> a SegmentFrame: it does not depend on the caches

    def source_size(self, needed: int, held: int) -> int:
        # Our kernel reads only each row's own keys: the buffer grows by doubling and never shrinks (a
        # resize copies every cross cache and unbinds every step).
        return held if needed <= held else grown(needed, held)

    def rows_read(self, feed: Feed) -> tuple[list[int], list[int], int]:
        """The rows' own slots: the kernel reads and writes each in place."""
        return list(feed.slots), list(range(len(feed.slots))), len(feed.slots)

    def bind(self, read: list[int], positions: list[int], counts: list[int], width: int) -> SegmentedCall:
        """The step for len(read) rows of ``width`` positions over the engine's whole caches, which it
        reads by slot."""
        engine, rows = self.engine, len(read)
        key = (rows, width)
        call = self._calls.get(key)
        if call is None:
            caches = {name: [cache.numpy() for cache in getattr(engine, name)] for name in CACHES}  # [slots, C or S, H, dk]
            inputs = {"source_lengths": engine.source_lengths}  # by slot; admission writes it in place
            if engine.weights.position_bias:
                inputs["self_bias"] = np.zeros((rows, engine.weights.heads, width + 1, engine.capacity), dtype=np.float32)
            call = SegmentedCall(self._frame(rows, width), caches, inputs, attention_kernel.kernel())
            _keep(self._calls, key, call)
        call.set_rows(read, positions, counts)
        return call

    def _frame(self, rows: int, width: int) -> SegmentFrame:
        """The onnxruntime side of a step of this shape (kept across cache growth: once the caches grow, a
        step binds only its kernel calls anew)."""
        key, engine = (rows, width), self.engine
        if key not in self._frames:
            pieces, logits, layout = engine.sessions.step_pieces(engine.int8_kernel)
            _keep(self._frames, key, SegmentFrame(pieces, logits, layout, rows, width, engine.weights.d_model, engine.vocab))
        return self._frames[key]


STRATEGIES = {strategy.name: strategy for strategy in (RuntimeAttention, KernelAttention)}
assert tuple(STRATEGIES) == attention_kernel.ATTENTIONS


def _keep(kept: dict, key: tuple, value) -> None:
    """Keep ``value`` under ``key``, dropping the oldest beyond KEPT_CALLS."""
    if len(kept) >= KEPT_CALLS:
        kept.pop(next(iter(kept)))
    kept[key] = value


def _rows(cache: torch.Tensor, read: slice | list[int], positions: int | None) -> torch.Tensor:
    """The slots ``read`` of a layer's cache [slots, H, C, dk]: a view of one contiguous block, or a
    gathered copy of its first ``positions`` (None: all)."""
    if isinstance(read, slice):
        return cache[read]
    return cache[torch.tensor(read), :, :positions]


class _StepCall:
    """onnxruntime's step bound once for one shape: the caches (as given), and arrays for the small
    inputs and the logits, which each call fills in place. Binding a value costs more than the rest of
    a step's Python, so a step of a shape seen before binds nothing, or only what it reads (at batch
    32 the number of rows read changes as rows finish)."""

    def __init__(self, session, caches: dict[str, list[np.ndarray]], inputs: dict[str, np.ndarray], vocab: int):
        from onnxruntime import OrtValue  # here: a machine without onnxruntime runs the other engines

        from pipeline.decoding.engines.onnx_graph import StepGraph

        self.session = session
        self.binding = session.io_binding()
        self.caches, self.inputs = caches, inputs  # kept alive with the binding, which points into them
        for name, arrays in caches.items():
            for layer, array in enumerate(arrays):
                value = OrtValue.ortvalue_from_numpy(array)
                self.binding.bind_ortvalue_input(f"{name}.{layer}", value)
                if name.startswith("self"):  # updated in place: the same memory as the input
                    self.binding.bind_ortvalue_output(StepGraph.updated(f"{name}.{layer}"), value)
        for name, array in inputs.items():
            self.binding.bind_cpu_input(name, array)
        self.hidden_array = inputs["hidden"].reshape(-1, inputs["hidden"].shape[-1])  # [A * W, d], a view
        self.hidden = torch.from_numpy(self.hidden_array)
        self.self_bias = torch.from_numpy(inputs["self_bias"]) if "self_bias" in inputs else None
        self.reads = ReadLogits(self.binding, "logits", vocab)
        self.reading = self.reads.reading

    def set_rows(self, positions: list[int], counts: list[int]) -> None:
        """A fed row attends with its count + 1 queries (the extra one past its last: onnx_graph) up to
        its length + count; an idle one with none, its keys as they are."""
        query, keys = self.inputs["query_seqlens"], self.inputs["seqlens_k"]
        for a, (position, count) in enumerate(zip(positions, counts)):
            query[a], keys[a] = (count + 1, position + count) if count else (0, max(position, 1) - 1)

    def run(self) -> torch.Tensor:
        """The step's logits [n, V], a copy: the next call writes into the same array."""
        self.session.run_with_iobinding(self.binding)
        return torch.from_numpy(self.reads.logits.copy())
