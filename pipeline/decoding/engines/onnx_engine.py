"""The onnx engine (``models.engine: onnx``): the native engine's decoder step as one onnxruntime call,
or, from KERNEL_FROM_SLOTS slots on, as onnxruntime calls between which our own attention kernel runs.

On a CPU a decode step of a small model is a chain of one-row matrix products and a couple of
hundred small ops; onnxruntime runs the chain with MLAS (float32, or int8 with ``models.quantize:
int8``) and the small ops without Python between them (onnx_graph.py builds the graph from the
family's ``decoder_layer_graph``). Admission is a second graph, the encoder and every decoder
layer's cross-attention projections (``encoder_layer_graph``), run once per group of newcomers,
in int8 too; the embeddings and the cache bookkeeping stay in torch, with the native engine's
weights (native.py).

The cache is the engine's own torch tensors, handed to onnxruntime without a copy, one input per
layer: keys and values as [L, slots, H, C, dk] each, or [L, slots, C, H, dk] for our kernel (a
layer's block of one slot, or of a span of slots, is one contiguous piece either way). The step
writes the fed positions' keys and values at their places in each layer's cache, in place (the same
memory is bound as the input and as the updated output), and each query attends to its row's
positions up to its own; so nothing is copied per step and a rollback is only a shorter length, as
in the native engine.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from pipeline.decoding.engine import Engine, Feed, place_logits
from pipeline.decoding.engines.native import NativeWeights
from pipeline.decoding.engines import attention_kernel
from pipeline.decoding.engines.onnx_segments import ReadLogits, SegmentedCall, SegmentFrame
from pipeline.decoding.engines.onnx_sessions import OnnxSessions

# Bound steps kept per engine (spans of slots x widths; at batch 32 rows finishing make new spans).
KEPT_CALLS = 64
# int8 products by rows (onnx_graph's ``rows`` kernel) from this many slots on, by blocks below: a
# step of few rows pays for the per-row kernel's extra small ops, a batch gains its faster integer
# product (demo pair, `large`, tokens/s of rows over blocks, order alternating per round: 1.02x at 8
# slots, 1.34x at 16, 1.20x at 32; at 1 and 4 at most 0.87x and 0.89x; BENCHMARKS.md). Chosen per
# engine, never per call, so that every call of a run computes a row alike: bild and speculative stay
# `large`'s tokens at each batch size.
ROWS_KERNEL_FROM_SLOTS = 16
# A step with onnxruntime's attention runs over the span of slots its rows occupy (idle ones along, unread)
# while the span is at most this many times the rows fed; wider, it gathers the rows' caches into copies
# (``_call``). Measured, `bild` at batch 32, order alternating per round: 1 (gather unless contiguous)
# 0.98x of 2, 3 0.97x, never gathering 0.80x. Our kernel reads each row's own slot: its steps run over
# the rows fed, no more, and copy nothing.
SPAN_AT_MOST = 2
# Our attention kernel (attention_kernel.py: decode_attention.c between onnxruntime segments) instead of
# onnxruntime's attention ops from this many slots on. Demo pair, int8, tokens/s of the kernel over
# onnxruntime's ops, order alternating per round, two runs: `large` 0.92x / 1.03x at 1 slot, 1.05x / 1.21x
# at 4, 1.37x / 1.28x at 32; `bild` 0.99x / 0.96x at 1 (a step's 2L + 1 calls cost what they save there),
# 1.02x / 1.00x at 4, 1.06x / 1.06x at 32 (BENCHMARKS.md). Chosen per engine, never per call, like the
# int8 kernel: `bild` and `speculative` stay `large`'s tokens at each batch size.
KERNEL_FROM_SLOTS = 4
# Where a cache [L, slots, ...] keeps its positions: onnxruntime's attention ops read a head's positions
# as one piece ([.., H, C, dk]); our kernel reads a row's positions in order with every head's keys of a
# position side by side ([.., C, H, dk]), so it streams through a row's keys, then its values, once
# (demo pair, int8, `large` at batch 32: the kernel's time 0.80x head-major's, the same tokens;
# BENCHMARKS.md).
POSITION_DIM = {"onnxruntime": 3, "kernel": 2}


class OnnxEngine(Engine):
    """A decoder over ``slots`` rows whose step runs in onnxruntime (float32 or int8, on the CPU): one
    call with onnxruntime's attention ops, or a call per layer's halves with decode_attention.c between
    them (onnx_segments.py)."""

    kind = "onnx"

    def __init__(self, weights: NativeWeights, sessions: OnnxSessions, slots: int, int8_kernel: str | None = None,
                 attention: str | None = None):
        """``int8_kernel``: onnx_graph's kernel for int8 products (None: by ``slots``, as
        ROWS_KERNEL_FROM_SLOTS says). ``attention``: "kernel" (decode_attention.c between onnxruntime
        segments: onnx_segments.py) or "onnxruntime" (its attention ops, the step one call); None:
        the kernel from KERNEL_FROM_SLOTS slots on where it builds."""
        assert weights.device.type == "cpu" and weights.dtype == torch.float32, \
            "config.engine_problem: the onnx engine on the CPU in float32 only"
        super().__init__(slots, weights.device)
        self.weights, self.sessions = weights, sessions
        if int8_kernel is None:
            int8_kernel = "rows" if slots >= ROWS_KERNEL_FROM_SLOTS else "blocks"
        self.int8_kernel = int8_kernel  # (float32: unused)
        if attention is None:
            attention = "kernel" if slots >= KERNEL_FROM_SLOTS and attention_kernel.kernel() else "onnxruntime"
        if attention not in attention_kernel.ATTENTIONS:
            raise ValueError(f"attention {attention!r}: one of {', '.join(attention_kernel.ATTENTIONS)}")
        if attention == "kernel" and attention_kernel.kernel() is None:
            raise ValueError("the decode-attention kernel did not build here (see the log)")
        self.attention = attention
        self.position_dim = POSITION_DIM[attention]
        self.vocab = weights.head.weight.shape[1]  # the logits' width
        self._embedding = weights.decoder_embedding.numpy() if weights.lookup_embedding else None  # [V, d]
        w = weights
        self.capacity, self.sources = 0, 0
        empty = [w.layer_count, slots, w.heads, w.d_kv]
        empty.insert(self.position_dim, 0)
        self.self_k, self.self_v = torch.zeros(empty), torch.zeros(empty)  # [L, slots, H, C, dk] or [.., C, H, dk]
        self.cross_k, self.cross_v = torch.zeros(empty), torch.zeros(empty)  # [L, slots, H, S, dk] or [.., S, H, dk]
        self.source_lengths = np.ones(slots, dtype=np.int32)  # an empty slot attends to one (zero) key: no NaN
        self.table = None  # [Hb, C, C] (native.NativeWeights.self_mask)
        self._calls: dict = {}  # (first slot, end slot, W) -> a _StepCall over that span, or (A, W) -> a
        # SegmentedCall (our kernel); while C and S stay
        self._frames: dict = {}  # (A, W) -> a SegmentFrame (``attention`` "kernel")
        self._reserve(64)

    @property
    def attention_path(self) -> str:
        return self.attention  # "kernel" (decode_attention.c) or "onnxruntime"

    @property
    def int8_scheme(self) -> str | None:
        return self.sessions.int8_scheme(self.int8_kernel)

    # --- memory -----------------------------------------------------------------------------------

    def _reserve(self, positions: int) -> None:
        """Room for ``positions`` decoder positions per slot (doubling, so growing is rare)."""
        if positions <= self.capacity:
            return
        capacity = max(positions, 2 * self.capacity)
        self.self_k = _resized(self.self_k, self.position_dim, capacity)
        self.self_v = _resized(self.self_v, self.position_dim, capacity)
        self.capacity, self.table = capacity, self.weights.self_mask(capacity)
        self._one_token_bias = None  # [C - 1, H, 2, C]: _self_bias of one token at each position
        self._calls = {}  # bound to the old caches

    def _fit_sources(self) -> None:
        """Room for the longest source the slots hold, rounded up to 8 positions. onnxruntime's
        cross-attention reads every key position of the buffer (at batch 32 a 128-wide one cost 6x a
        32-wide one): not more than twice it, so a long record gone leaves no cost behind it. Our
        kernel reads only each row's own keys: its buffer grows by doubling and never shrinks (a
        resize copies every cross cache and unbinds every step)."""
        needed = -(-int(self.source_lengths.max()) // 8) * 8
        if self.attention == "kernel":
            if needed <= self.sources:
                return
            needed = max(needed, 2 * self.sources)
        elif needed <= self.sources <= 2 * needed:
            return
        self.cross_k = _resized(self.cross_k, self.position_dim, needed)
        self.cross_v = _resized(self.cross_v, self.position_dim, needed)
        self.sources = needed
        self._calls = {}

    # --- rows joining -----------------------------------------------------------------------------

    @torch.inference_mode()
    def _admit(self, slots: list[int], input_ids: list[torch.Tensor], encoded: torch.Tensor | None):
        """Run the encoder and every decoder layer's cross-attention projections for the newcomers of
        one length group (Engine.admit), as one right-padded batch in one onnxruntime call (the
        projections alone where their encoder states are given), and store the keys and values in
        their slots.

        Every op of it computes a row the same bit for bit whatever rows are beside it, so a record's
        output does not depend on the records admitted with it (int8 rounding downstream would turn a
        last-bit difference into another token)."""
        lengths = [len(ids) for ids in input_ids]
        admission = self.sessions.admission(projections_only=encoded is not None, int8_kernel=self.int8_kernel)
        if encoded is None:
            width = max(2, *lengths)  # at least 2: MLAS multiplies a single row by another kernel
            padded = torch.zeros((len(slots), width), dtype=torch.long)  # padding: masked keys, unread queries
            for row, ids in enumerate(input_ids):
                padded[row, : len(ids)] = ids.cpu()
            inputs = {"hidden": self.weights.source_embedding(padded).numpy(),
                      "source_lengths": np.asarray(lengths, dtype=np.int32)}
            if self.weights.position_bias:
                inputs["source_bias"] = self.weights.source_bias(width).numpy()
            encoded, projections = admission.run(["encoded", "cross_kv"], inputs)
            encoded = torch.from_numpy(encoded)
        else:
            projections, = admission.run(["cross_kv"], {"encoded": encoded.numpy()})
        w, width = self.weights, encoded.shape[1]
        kv = torch.from_numpy(projections).view(len(slots), width, w.layer_count, 2, w.heads, w.d_kv)
        self.source_lengths[slots] = lengths
        self._fit_sources()
        for row, (slot, length) in enumerate(zip(slots, lengths)):
            for cache, part in ((self.cross_k, 0), (self.cross_v, 1)):
                keys = kv[row, :length, :, part].transpose(0, 1)  # [L, S_j, H, dk]
                if self.position_dim == 3:  # [L, H, S_j, dk]
                    cache[:, slot, :, :length] = keys.transpose(1, 2)
                else:
                    cache[:, slot, :length] = keys
        return encoded

    def release(self, slot: int) -> None:
        super().release(slot)
        self.source_lengths[slot] = 1  # as an empty slot

    # --- the forward pass -------------------------------------------------------------------------

    # (No torch.inference_mode here: the weights and caches need no gradient, and entering the mode cost
    # ~50 us a step on a slow CPU, a tenth of a drafting step's Python.)
    def _forward(self, feed: Feed) -> torch.Tensor:
        rows, width = feed.tokens.shape
        read, where, attended = self._rows_read(feed)
        positions = self._idle_positions(read, attended)  # idle slots of a span run at their own length ...
        self._reserve(max(positions) + width + 1)  # + 1: attention's extra query row (onnx_graph) writes one more
        call = self._call(read, attended, width, max(positions) + width + 1)
        if where == list(range(rows)):
            tokens, counts = feed.tokens, feed.counts
        else:
            tokens, counts = torch.zeros((attended, width), dtype=torch.long), [0] * attended  # ... feeding nothing
            for r, a in enumerate(where):  # (a fed row's length is its position: Engine.forward checks)
                tokens[a], counts[a] = feed.tokens[r], feed.counts[r]
        one_token = attended == 1 and width == 1 and self.weights.lookup_embedding  # a drafting step at batch 1
        if one_token:  # its token's embedding and bias row, looked up without building positions
            steps = None
            call.hidden_array[0] = self._embedding[int(tokens[0, 0])]
        else:
            steps = torch.from_numpy(np.add.outer(positions, np.arange(width + 1)))  # [A, W + 1]
            self.weights.embed(tokens, steps[:, :width], out=call.hidden)
        call.set_rows(feed.slots, positions, counts)
        if not one_token:
            call.reading(sum(feed.reads))[:] = [where[r] * width + i for r, (count, read_) in
                                                enumerate(zip(feed.counts, feed.reads)) for i in range(count - read_, count)]
        else:
            call.reading(1)[0] = 0
        if self.weights.position_bias:
            self._self_bias(steps, call, positions[0])
        started = time.perf_counter()
        logits = call.run()
        self.kernel_seconds += time.perf_counter() - started  # the rest of forward_seconds: this method's Python
        if isinstance(read, list) and self.attention != "kernel":  # gathered copies
            self._write_back(feed, call.caches)
        return place_logits(logits, self._placement(feed), feed)

    def _idle_positions(self, read: slice | list[int], attended: int) -> list[int]:
        """Where each slot the step runs over would feed next, its own length: an idle slot's keys and
        values land past what it holds, where nothing reads them before they are overwritten."""
        if isinstance(read, slice):
            return self.lengths[read.start : read.start + attended]
        return [self.lengths[slot] for slot in read]

    def _rows_read(self, feed: Feed) -> tuple[slice | list[int], list[int], int]:
        """The slots the step runs over, where each fed row sits among them, and how many there are.
        Our kernel reads and writes each row's own slot in place: the rows' slots. onnxruntime's step
        reads the caches bound to it: the span of slots the rows occupy (idle ones run along, unread)
        when it is not much wider than they are, else the rows' own slots, gathered."""
        if self.attention == "kernel":
            return list(feed.slots), list(range(len(feed.slots))), len(feed.slots)
        first, last = min(feed.slots), max(feed.slots)
        if last - first + 1 <= SPAN_AT_MOST * len(feed.slots):
            return slice(first, last + 1), [slot - first for slot in feed.slots], last - first + 1
        return list(feed.slots), list(range(len(feed.slots))), len(feed.slots)

    def _call(self, read: slice | list[int], attended: int, width: int, reach: int) -> "_StepCall | SegmentedCall":
        """The step bound for these slots and W fed positions, that write up to position ``reach``.
        Our kernel's step is bound to the engine's whole caches, which it reads by slot (``set_rows``):
        one per A rows and W positions, kept while the caches keep their storage. onnxruntime's: for a
        span of slots the caches are bound as views of the engine's tensors and the call is kept
        likewise (so a step binds nothing, or only what it reads); other slots are gathered into copies
        of their self-attention caches up to ``reach`` (rounded up to 16, not the whole capacity: at
        batch 32 copying whole caches was a fifth of `bild`'s time), written back after the step
        (``_write_back``)."""
        if self.attention == "kernel":
            return self._kernel_call(attended, width)
        key = (read.start, read.stop, width) if isinstance(read, slice) else None
        if key in self._calls:
            return self._calls[key]
        w = self.weights
        held = self.capacity if key is not None else min(self.capacity, -(-reach // 16) * 16)  # C of the call
        caches = {name: [self._rows(cache, read, held if name.startswith("self") else None).numpy()
                         for cache in getattr(self, name)] for name in ("self_k", "self_v", "cross_k", "cross_v")}
        inputs = {"source_lengths": self.source_lengths[read]}  # a view for a span: admission writes it in place
        if w.position_bias:
            inputs["self_bias"] = np.zeros((attended, w.heads, width + 1, held), dtype=np.float32)
        inputs.update({"hidden": np.zeros((attended, width, w.d_model), dtype=np.float32),
                       "query_seqlens": np.zeros(attended, dtype=np.int32),
                       "seqlens_k": np.zeros(attended, dtype=np.int32),
                       "total_sequence_length": np.array(held, dtype=np.int32)})
        call = _StepCall(self.sessions.step(self.int8_kernel), caches, inputs, self.vocab)
        if key is not None:
            self._keep(key, call)
        return call

    def _kernel_call(self, rows: int, width: int) -> SegmentedCall:
        """Our kernel's step for ``rows`` rows of ``width`` positions, over the engine's caches."""
        key = (rows, width)
        if key not in self._calls:
            caches = {name: [cache.numpy() for cache in getattr(self, name)]
                      for name in ("self_k", "self_v", "cross_k", "cross_v")}  # [slots, C or S, H, dk] per layer
            inputs = {"source_lengths": self.source_lengths}  # by slot; admission writes it in place
            if self.weights.position_bias:
                inputs["self_bias"] = np.zeros((rows, self.weights.heads, width + 1, self.capacity), dtype=np.float32)
            self._keep(key, SegmentedCall(self._frame(rows, width), caches, inputs, attention_kernel.kernel()))
        return self._calls[key]

    def _keep(self, key: tuple, call) -> None:
        if len(self._calls) >= KEPT_CALLS:
            self._calls.pop(next(iter(self._calls)))  # the oldest
        self._calls[key] = call

    def _frame(self, rows: int, width: int) -> SegmentFrame:
        """The onnxruntime side of a kernel-mode step of this shape (kept: it does not depend on the
        caches: once they grow, a step binds only its kernel calls anew)."""
        key = (rows, width)
        if key not in self._frames:
            if len(self._frames) >= KEPT_CALLS:
                self._frames.pop(next(iter(self._frames)))  # the oldest
            pieces, logits, layout = self.sessions.step_pieces(self.int8_kernel)
            self._frames[key] = SegmentFrame(pieces, logits, layout, rows, width, self.weights.d_model, self.vocab)
        return self._frames[key]

    @staticmethod
    def _rows(cache: torch.Tensor, read: slice | list[int], positions: int | None) -> torch.Tensor:
        """The slots ``read`` of a layer's cache [slots, H, C, dk] (onnxruntime's step): a view of one
        contiguous block, or a gathered copy of its first ``positions`` (None: all)."""
        if isinstance(read, slice):
            return cache[read]
        return cache[torch.tensor(read), :, :positions]

    def _self_bias(self, steps: torch.Tensor | None, call: "_StepCall | SegmentedCall", position: int) -> None:
        """The call's ``self_bias`` [A, H, W + 1, C']: what each query at ``steps`` [A, W + 1] adds to its
        score over the key at each of the call's C' cache positions (T5's relative position bias; attention
        is causal by itself). ``steps`` None: one row feeding one token at ``position`` (a step at batch 1),
        whose bias is a precomputed slice, copied in numpy."""
        out = call.inputs["self_bias"]
        held = out.shape[-1]
        if steps is None:
            if self._one_token_bias is None:
                rows = torch.arange(self.capacity - 1)[:, None] + torch.arange(2)  # [C - 1, 2]
                self._one_token_bias = self.table[:, rows].transpose(0, 1).contiguous().numpy()  # [C - 1, H, 2, C]
            out[0] = self._one_token_bias[position, ..., :held]
        else:
            call.self_bias.copy_(self.table[:, steps, :held].transpose(0, 1))

    @staticmethod
    def _placement(feed: Feed) -> torch.Tensor | None:
        """Where the read logits go in [R * max(reads)] (None: every row reads as many)."""
        most = max(feed.reads)
        if min(feed.reads) == most:
            return None
        return torch.tensor([r * most + i for r, read in enumerate(feed.reads) for i in range(read)])

    def _write_back(self, feed: Feed, gathered: dict) -> None:
        """The fed positions' keys and values from the gathered copies (rows in ``feed``'s order) into
        the engine's cache (onnxruntime's step: our kernel writes in place)."""
        rows = torch.arange(len(feed.slots))[:, None]  # [R, 1]
        slots = torch.tensor(feed.slots)[:, None]
        steps = torch.tensor(feed.positions)[:, None] + torch.arange(feed.width)  # [R, W]
        for layer in range(self.weights.layer_count):
            for name in ("self_k", "self_v"):
                getattr(self, name)[layer, slots, :, steps] = torch.from_numpy(gathered[name][layer])[rows, :, steps]


class _StepCall:
    """The step bound once for one shape: the caches (as given), and arrays for the small inputs and
    the logits, which each call fills in place. Binding a value costs more than the rest of a
    step's Python, so a step of a shape seen before binds nothing, or only what it reads (at batch
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

    def set_rows(self, slots: list[int], positions: list[int], counts: list[int]) -> None:
        """(``slots``: unused, the call is bound to its rows' caches.) A fed row attends with its count + 1 queries (the extra one past its last: onnx_graph) up to
        its length + count; an idle one with none, its keys as they are."""
        query, keys = self.inputs["query_seqlens"], self.inputs["seqlens_k"]
        for a, (position, count) in enumerate(zip(positions, counts)):
            query[a], keys[a] = (count + 1, position + count) if count else (0, max(position, 1) - 1)

    def run(self) -> torch.Tensor:
        """The step's logits [n, V], a copy: the next call writes into the same array."""
        self.session.run_with_iobinding(self.binding)
        return torch.from_numpy(self.reads.logits.copy())


def _resized(cache: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``cache`` with its ``dim`` grown or cut to ``size``, the content up to it kept."""
    shape = list(cache.shape)
    kept, shape[dim] = min(shape[dim], size), size
    resized = torch.zeros(shape, dtype=cache.dtype)
    resized.narrow(dim, 0, kept).copy_(cache.narrow(dim, 0, kept))
    return resized
