"""The onnx engine (``models.engine: onnx``): the native engine's decoder step as one onnxruntime call,
or, from KERNEL_FROM_SLOTS slots on, as onnxruntime calls between which our own attention kernel runs.

On a CPU a decode step of a small model is a chain of one-row matrix products and a couple of
hundred small ops; onnxruntime runs the chain with MLAS (float32, or int8 with ``models.quantize:
int8``) and the small ops without Python between them (onnx_graph.py builds the graph from the
family's ``decoder_layer``, the one the native engine runs). Admission is a second graph, the encoder
and every decoder layer's cross-attention projections (``encoder_layer``), run once per group of
newcomers, in int8 too; the embeddings and the cache bookkeeping stay in torch, with the native engine's
weights (native.py).

The cache is the engine's own torch tensors, handed to onnxruntime without a copy, one input per
layer: keys and values as [L, slots, H, C, dk] each, or [L, slots, C, H, dk] for our kernel (a
layer's block of one slot, or of a span of slots, is one contiguous piece either way). The step
writes the fed positions' keys and values at their places in each layer's cache, in place (the same
memory is bound as the input and as the updated output), and each query attends to its row's
positions up to its own; so nothing is copied per step and a rollback is only a shorter length, as
in the native engine. Which slots a step runs over and how its call is bound is the step's attention
strategy's (onnx_attention.py: onnxruntime's ops, or our kernel).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from pipeline.decoding.engine import Engine, Feed, logit_places, place_logits
from pipeline.decoding.engines.cache_rows import grown, padded_ids, resized
from pipeline.decoding.engines.native import NativeWeights
from pipeline.decoding.engines import attention_kernel, native_pair, onnx_sessions
from pipeline.decoding.engines.onnx_attention import STRATEGIES
from pipeline.decoding.engines.onnx_sessions import OnnxSessions

# int8 products by rows (onnx_graph's ``rows`` kernel) from this many slots on, by blocks below: a
# step of few rows pays for the per-row kernel's extra small ops, a batch gains its faster integer
# product (demo pair, `large`, tokens/s of rows over blocks, order alternating per round: 1.02x at 8
# slots, 1.34x at 16, 1.20x at 32; at 1 and 4 at most 0.87x and 0.89x; BENCHMARKS.md). Chosen per
# engine, never per call, so that every call of a run computes a row alike: bild and speculative stay
# `large`'s tokens at each batch size.
ROWS_KERNEL_FROM_SLOTS = 16
# ... and at any number of slots for a model whose step multiplies by this many weights or more: its
# step is bound by reading them, which both kernels do alike, and the integer product makes a
# k-token verification cost little more than one step. One thread, AVX-512 VNNI machine, step at
# batch 1 (k = 1) and a verification of 11 tokens, rows over blocks: T5-large shapes (358M weights
# a step) 0.98x and 0.45x; T5-base (104M) 0.99x and 0.50x; T5-small (25M) 1.29x and 0.51x; the demo's
# `large` (9M) 1.17x and 0.74x (benchmarks/bench-t5-inflated/verify_kernels.md).
ROWS_KERNEL_FROM_WEIGHTS = 64_000_000
# Our attention kernel (attention_kernel.py: decode_attention.c between onnxruntime segments) instead of
# onnxruntime's attention ops from this many slots on. Demo pair, int8, tokens/s of the kernel over
# onnxruntime's ops, order alternating per round, two runs: `large` 0.92x / 1.03x at 1 slot, 1.05x / 1.21x
# at 4, 1.37x / 1.28x at 32; `bild` 0.99x / 0.96x at 1 (a step's 2L + 1 calls cost what they save there),
# 1.02x / 1.00x at 4, 1.06x / 1.06x at 32 (BENCHMARKS.md). Chosen per engine, never per call, like the
# int8 kernel: `bild` and `speculative` stay `large`'s tokens at each batch size.
KERNEL_FROM_SLOTS = 4
# Admissions (the encoder and the cross-attention projections) multiply a whole source at once, tens
# of rows, where the ``rows`` kernel's integer product is the faster whatever the engine's steps use.
# (T5 shapes, a 14-token source: 28 ms against 79 ms by blocks on an AVX-512 VNNI machine.)
ADMISSION_INT8_KERNEL = "rows"


class OnnxEngine(Engine):
    """A decoder over ``slots`` rows whose step runs in onnxruntime (float32 or int8, on the CPU): one
    call with onnxruntime's attention ops, or a call per layer's halves with decode_attention.c between
    them (onnx_segments.py)."""

    kind = "onnx"

    def __init__(self, weights: NativeWeights, sessions: OnnxSessions, slots: int, int8_kernel: str | None = None,
                 attention: str | None = None):
        """``int8_kernel``: onnx_graph's kernel for int8 products (None: by ``slots`` and the model's
        size, as ROWS_KERNEL_FROM_SLOTS and ROWS_KERNEL_FROM_WEIGHTS say). ``attention``: "kernel" (decode_attention.c between onnxruntime
        segments: onnx_segments.py) or "onnxruntime" (its attention ops, the step one call); None:
        the kernel from KERNEL_FROM_SLOTS slots on where it builds."""
        assert weights.device.type == "cpu" and weights.dtype == torch.float32, \
            "rules.engine_problem: the onnx engine on the CPU in float32 only"
        super().__init__(slots, weights.device)
        self.weights, self.sessions = weights, sessions
        if int8_kernel is None:
            weight_bound = weights.step_weights() >= ROWS_KERNEL_FROM_WEIGHTS
            int8_kernel = "rows" if slots >= ROWS_KERNEL_FROM_SLOTS or weight_bound else "blocks"
        self.int8_kernel = int8_kernel  # (float32: unused)
        if attention is None:
            attention = "kernel" if slots >= KERNEL_FROM_SLOTS and attention_kernel.kernel() else "onnxruntime"
        if attention not in attention_kernel.ATTENTIONS:
            raise ValueError(f"attention {attention!r}: one of {', '.join(attention_kernel.ATTENTIONS)}")
        if attention == "kernel" and attention_kernel.kernel() is None:
            raise ValueError("the decode-attention kernel did not build here (see the log)")
        self.attention = attention
        self.steps = STRATEGIES[attention](self)  # which slots a step runs over, and its bound call
        self.position_dim = self.steps.position_dim
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
        capacity = grown(positions, self.capacity)
        self.self_k = resized(self.self_k, self.position_dim, capacity)
        self.self_v = resized(self.self_v, self.position_dim, capacity)
        self.capacity, self.table = capacity, self.weights.self_mask(capacity)
        self._one_token_bias = None  # [C - 1, H, 2, C]: _self_bias of one token at each position
        self.steps.forget()  # its calls are bound to the old caches

    def _fit_sources(self) -> None:
        """Room for the longest source the slots hold, rounded up to 8 positions, sized as the step's
        attention reads it (StepAttention.source_size)."""
        needed = -(-int(self.source_lengths.max()) // 8) * 8
        size = self.steps.source_size(needed, self.sources)
        if size == self.sources:
            return
        self.cross_k = resized(self.cross_k, self.position_dim, size)
        self.cross_v = resized(self.cross_v, self.position_dim, size)
        self.sources = size
        self.steps.forget()

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
        admission = self.sessions.admission(projections_only=encoded is not None, int8_kernel=ADMISSION_INT8_KERNEL)
        if encoded is None:
            width = max(2, *lengths)  # at least 2: MLAS multiplies a single row by another kernel
            inputs = {"hidden": self.weights.source_embedding(padded_ids(input_ids, width)).numpy(),
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
        read, where, attended = self.steps.rows_read(feed)
        positions = self._idle_positions(read, attended)  # idle slots of a span run at their own length ...
        self._reserve(max(positions) + width + 1)  # + 1: attention's extra query row (onnx_graph) writes one more
        if where == list(range(rows)):
            tokens, counts = feed.tokens, feed.counts
        else:
            tokens, counts = torch.zeros((attended, width), dtype=torch.long), [0] * attended  # ... feeding nothing
            for r, a in enumerate(where):  # (a fed row's length is its position: Engine.forward checks)
                tokens[a], counts[a] = feed.tokens[r], feed.counts[r]
        call = self.steps.bind(read, positions, counts, width)
        one_token = attended == 1 and width == 1 and self.weights.lookup_embedding  # a drafting step at batch 1
        if one_token:  # its token's embedding and bias row, looked up without building positions
            steps = None
            call.hidden_array[0] = self._embedding[int(tokens[0, 0])]
            call.reading(1)[0] = 0
        else:
            steps = torch.from_numpy(np.add.outer(positions, np.arange(width + 1)))  # [A, W + 1]
            self.weights.embed(tokens, steps[:, :width], out=call.hidden)
            call.reading(sum(feed.reads))[:] = [where[r] * width + i for r, (count, read_) in
                                                enumerate(zip(feed.counts, feed.reads)) for i in range(count - read_, count)]
        if self.weights.position_bias:
            self._self_bias(steps, call, positions[0])
        started = time.perf_counter()
        logits = call.run()
        self.runtime_seconds += time.perf_counter() - started  # the rest of forward_seconds: this method's Python
        self.steps.after(feed, read, call)
        return place_logits(logits, logit_places(feed), feed)

    def _idle_positions(self, read: slice | list[int], attended: int) -> list[int]:
        """Where each slot the step runs over would feed next, its own length: an idle slot's keys and
        values land past what it holds, where nothing reads them before they are overwritten."""
        if isinstance(read, slice):
            return self.lengths[read.start : read.start + attended]
        return [self.lengths[slot] for slot in read]

    def _self_bias(self, steps: torch.Tensor | None, call, position: int) -> None:
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


# --- as the registry sees it (registry.py) ---------------------------------------------------------------------

def unsupported_reason(model) -> str | None:
    """Why the onnx engine cannot run ``model`` (None when it can): it runs the native engine's weights."""
    family = native_pair.family_of(model)
    if family is None:
        return native_pair.unsupported_reason(model)
    return onnx_sessions.unsupported_reason(family.head_size(model.config))


def prepare(model, quantize: str = "none") -> tuple[NativeWeights, OnnxSessions]:
    """The native engine's float weights, and the sessions of its step (which quantize their own)."""
    weights = native_pair.native_weights(model)
    return weights, OnnxSessions(weights, quantize)


def build(model, prepared: tuple[NativeWeights, OnnxSessions], slots: int) -> OnnxEngine:
    return OnnxEngine(*prepared, slots)
