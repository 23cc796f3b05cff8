"""The onnx engine (``models.engine: onnx``): the native engine's decoder step as one onnxruntime call.

On a CPU a decode step of a small model is a chain of one-row matrix products and a couple of
hundred small ops; onnxruntime runs the chain with MLAS (float32, or int8 with ``models.quantize:
int8``) and the small ops without Python between them (onnx_graph.py builds the graph from the
family's ``decoder_layer_graph``). Admission is a second graph, the encoder and every decoder
layer's cross-attention projections (``encoder_layer_graph``), run once per group of newcomers,
in int8 too; the embeddings and the cache bookkeeping stay in torch, with the native engine's
weights (native.py).

The cache is the engine's own torch tensors, handed to onnxruntime without a copy, one input per
layer: keys and values as [L, slots, H, C, dk] each (a layer's block of one slot, or of a span of
slots, is one contiguous piece). The step writes the fed positions' keys and values at their places
in each layer's cache, in place (the same memory is bound as the input and as the updated output),
and each query attends to its row's positions up to its own; so nothing is copied per step and a
rollback is only a shorter length, as in the native engine.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import torch

from pipeline.decoding.engine import Engine, Feed, place_logits
from pipeline.decoding.native import NativeWeights

MISSING = "models.engine onnx needs onnxruntime and onnx: pip install onnxruntime onnx"
PROTOBUF_LIMIT = 1 << 30  # weights up to 1 GiB travel inside the serialized graph, larger ones in a file


def unsupported_reason(head_size: int) -> str | None:
    """Why the onnx engine cannot run a model with heads this wide, or None when it can."""
    if head_size % 8:
        return f"its attention heads are {head_size} wide, not a multiple of 8 (onnxruntime's GroupQueryAttention)"
    return None


def _session(graph, model):
    """An onnxruntime session on the CPU for ``model`` (built by ``graph``), run on as many threads as
    torch uses here (one per actor CPU in a job)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only
    if sum(value.nbytes for value in graph.initializers.values()) < PROTOBUF_LIMIT:
        return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    import onnx  # a protobuf message holds at most 2 GiB: the weights go beside the graph, in files

    with tempfile.TemporaryDirectory(prefix="bild-onnx-") as folder:
        path = os.path.join(folder, f"{model.graph.name}.onnx")
        onnx.save_model(model, path, save_as_external_data=True, location="weights")
        return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _graphs():
    """onnx_graph's builders; imported here: a machine without onnx and onnxruntime (the GPU check's)
    runs every other engine."""
    try:
        import onnxruntime  # noqa: F401

        from pipeline.decoding import onnx_graph
    except ImportError as error:
        raise ImportError(f"{MISSING} ({error})") from error
    return onnx_graph


class OnnxSessions:
    """One model's onnxruntime sessions, shared by its engines of any number of slots: the decoder
    step, and the admission of new rows (the encoder and every decoder layer's cross-attention
    projections; or the projections alone, for states an identical encoder computed), each built when
    first used."""

    def __init__(self, weights: NativeWeights, quantize: str = "none"):
        self.weights, self.quantize = weights, quantize
        self._sessions: dict = {}

    @property
    def step(self):
        if "step" not in self._sessions:
            w, graphs = self.weights, _graphs()
            graph = graphs.StepGraph(d_model=w.d_model, layers=w.layer_count, heads=w.heads, d_kv=w.d_kv,
                                     self_bias=w.position_bias, quantize=self.quantize)
            hidden = "hidden"
            for index in range(w.layer_count):
                hidden = w.decoder_layer_graph(graph, hidden, index)
            self._sessions["step"] = _session(graph, graph.model(w.logits_graph(graph, graph.read(hidden))))
        return self._sessions["step"]

    def admission(self, projections_only: bool = False):
        if projections_only not in self._sessions:
            w, graphs = self.weights, _graphs()
            graph = graphs.EncoderGraph(d_model=w.d_model, heads=w.encoder_heads, d_kv=w.d_kv,
                                        source_bias=w.position_bias, projections_only=projections_only,
                                        quantize=self.quantize)
            encoded = "encoded" if projections_only else "hidden"
            if not projections_only:
                for index in range(len(w.encoder_layers)):
                    encoded = w.encoder_layer_graph(graph, encoded, index)
                encoded = w.encoder_output_graph(graph, encoded)
            self._sessions[projections_only] = _session(graph, graph.model(encoded, w.cross_kv_graph(graph, encoded)))
        return self._sessions[projections_only]


class OnnxEngine(Engine):
    """A decoder over ``slots`` rows whose step is one onnxruntime call (float32, on the CPU)."""

    kind = "onnx"

    def __init__(self, weights: NativeWeights, sessions: OnnxSessions, slots: int):
        if weights.device.type != "cpu" or weights.dtype != torch.float32:
            raise ValueError("models.engine onnx runs on the CPU in float32 (models.quantize int8 for int8)")
        super().__init__(slots, weights.device)
        self.weights, self.sessions = weights, sessions
        self.vocab = weights.head.weight.shape[1]  # the logits' width
        from onnxruntime import OrtValue  # here, not at the top: a machine without onnxruntime runs the other engines

        self._ort_value = OrtValue
        w = weights
        self.capacity, self.sources = 0, 0
        empty = (w.layer_count, slots, w.heads, 0, w.d_kv)
        self.self_k, self.self_v = torch.zeros(empty), torch.zeros(empty)  # [L, slots, H, C, dk] each
        self.cross_k, self.cross_v = torch.zeros(empty), torch.zeros(empty)  # [L, slots, H, S, dk] each
        self.source_lengths = np.ones(slots, dtype=np.int32)  # an empty slot attends to one (zero) key: no NaN
        self.table = None  # [Hb, C, C] (native.NativeWeights.self_mask)
        self._bindings: dict = {}  # (first slot, end slot, C, S) -> the step's bound inputs (_binding)
        self._bindings_storage = None  # the (C, S) those bindings were made at
        self._reserve(64)

    # --- memory -----------------------------------------------------------------------------------

    def _reserve(self, positions: int) -> None:
        """Room for ``positions`` decoder positions per slot (doubling, so growing is rare)."""
        if positions <= self.capacity:
            return
        capacity = max(positions, 2 * self.capacity)
        self.self_k = _grown(self.self_k, -2, capacity)
        self.self_v = _grown(self.self_v, -2, capacity)
        self.capacity, self.table = capacity, self.weights.self_mask(capacity)
        self._one_token_bias = None  # [C, Hb, 2, C]: _self_bias of one token at each position

    def _reserve_sources(self, length: int) -> None:
        if length <= self.sources:
            return
        sources = max(length, 2 * self.sources)
        self.cross_k = _grown(self.cross_k, -2, sources)
        self.cross_v = _grown(self.cross_v, -2, sources)
        self.sources = sources

    # --- rows joining -----------------------------------------------------------------------------

    @torch.inference_mode()
    def _admit(self, slots: list[int], input_ids: list[torch.Tensor], encoded: torch.Tensor | None):
        """Run the encoder and every decoder layer's cross-attention projections for the newcomers, as
        one right-padded batch in one onnxruntime call (the projections alone where their encoder
        states are given), and store the keys and values in their slots.

        Every op of it computes a row the same bit for bit whatever rows are beside it, so a record's
        output does not depend on the records admitted with it (int8 rounding downstream would turn a
        last-bit difference into another token)."""
        lengths = [len(ids) for ids in input_ids]
        if encoded is None:
            width = max(2, *lengths)  # at least 2: MLAS multiplies a single row by another kernel
            padded = torch.zeros((len(slots), width), dtype=torch.long)  # padding: masked keys, unread queries
            for row, ids in enumerate(input_ids):
                padded[row, : len(ids)] = ids.cpu()
            inputs = {"hidden": self.weights.source_embedding(padded).numpy(),
                      "source_lengths": np.asarray(lengths, dtype=np.int32)}
            if self.weights.position_bias:
                inputs["source_bias"] = self.weights.source_bias(width).numpy()
            encoded, projections = self.sessions.admission().run(["encoded", "cross_kv"], inputs)
            encoded = torch.from_numpy(encoded)
        else:
            projections, = self.sessions.admission(projections_only=True).run(["cross_kv"], {"encoded": encoded.numpy()})
        w, width = self.weights, encoded.shape[1]
        kv = torch.from_numpy(projections).view(len(slots), width, w.layer_count, 2, w.heads, w.d_kv)
        self._reserve_sources(width)
        for row, (slot, length) in enumerate(zip(slots, lengths)):
            self.cross_k[:, slot, :, :length] = kv[row, :length, :, 0].permute(1, 2, 0, 3)  # [L, H, S_j, dk]
            self.cross_v[:, slot, :, :length] = kv[row, :length, :, 1].permute(1, 2, 0, 3)
            self.source_lengths[slot] = length
        return encoded

    # --- the forward pass -------------------------------------------------------------------------

    @torch.inference_mode()
    def _forward(self, feed: Feed) -> torch.Tensor:
        rows, width = feed.tokens.shape
        read, where, attended = self._rows_read(feed)
        positions = self._idle_positions(read, attended)  # idle slots of a span run at their own length ...
        counts = np.zeros(attended, dtype=np.int32)  # ... feeding nothing
        counts[where] = feed.counts
        if where == list(range(rows)):
            tokens = feed.tokens
        else:
            tokens = torch.zeros((attended, width), dtype=torch.long)
            for r, a in enumerate(where):  # (a fed row's length is its position: Engine.forward checks)
                tokens[a] = feed.tokens[r]
        self._reserve(max(positions) + width + 1)  # + 1: attention's extra query row (onnx_graph) writes one more
        steps = np.add.outer(np.asarray(positions, dtype=np.int64), np.arange(width + 1))  # [A, W + 1]
        hidden = self.weights.embed(tokens, torch.from_numpy(steps[:, :width])).view(attended, width, -1)
        binding = self._binding(read)
        lengths = np.asarray(positions, dtype=np.int32)
        small_inputs = {
            "hidden": hidden.numpy(),
            # A fed row attends to its count + 1 queries (the extra one past its last: onnx_graph),
            # an idle one to none; each row's keys end at seqlens_k.
            "query_seqlens": np.where(counts > 0, counts + 1, 0).astype(np.int32),
            "seqlens_k": np.where(counts > 0, lengths + counts, np.maximum(lengths, 1) - 1).astype(np.int32),
            "total_sequence_length": np.array(self.capacity, dtype=np.int32),
            "source_lengths": self.source_lengths[read],
            "read": self._read_index(feed, where),
        }
        if self.weights.position_bias:
            small_inputs["self_bias"] = self._self_bias(steps).numpy()
        for name, array in small_inputs.items():
            binding.bind_cpu_input(name, array)
        logits = np.empty((len(small_inputs["read"]), self.vocab), dtype=np.float32)  # new each call: returned
        binding.bind_ortvalue_output("logits", self._ort_value.ortvalue_from_numpy(logits))
        self.sessions.step.run_with_iobinding(binding)
        logits = torch.from_numpy(logits)
        if not isinstance(read, slice):
            self._write_back(feed, binding.caches)
        return place_logits(logits, self._placement(feed), feed)

    def _idle_positions(self, read: slice | list[int], attended: int) -> list[int]:
        """Where each slot the step runs over would feed next, its own length: an idle slot's keys and
        values land past what it holds, where nothing reads them before they are overwritten."""
        if isinstance(read, slice):
            return self.lengths[read.start : read.start + attended]
        return [self.lengths[slot] for slot in read]

    def _rows_read(self, feed: Feed) -> tuple[slice | list[int], list[int], int]:
        """The slots the step runs over, where each fed row sits among them, and how many there are:
        the span of slots the rows occupy (idle ones run along, unread) when it is not much wider
        than they are, else the rows' own slots, gathered."""
        first, last = min(feed.slots), max(feed.slots)
        if last - first + 1 <= 2 * len(feed.slots):
            return slice(first, last + 1), [slot - first for slot in feed.slots], last - first + 1
        return list(feed.slots), list(range(len(feed.slots))), len(feed.slots)

    def _binding(self, read: slice | list[int]):
        """An onnxruntime IOBinding with every layer's cache of the slots ``read`` bound as the step's
        inputs and, for the self-attention caches, as the outputs they are updated into: the same
        memory, so the step writes the fed positions in place (onnx_graph: ``_scattered``). For a span
        of slots the caches are bound as views of the engine's tensors, and the binding is kept while
        they keep their storage (so a step at batch 1 binds only its small inputs and its logits);
        other slots are gathered into copies, written back after the step (``_write_back``)."""
        key = (read.start, read.stop, self.capacity, self.sources) if isinstance(read, slice) else None
        if key is not None and key in self._bindings:
            return self._bindings[key]
        from pipeline.decoding.onnx_graph import StepGraph

        binding = self.sessions.step.io_binding()
        caches = {}  # name -> the arrays the bound values point into: kept alive with the binding
        for name in ("self_k", "self_v", "cross_k", "cross_v"):
            caches[name] = [self._rows(cache, read).numpy() for cache in getattr(self, name)]
            for layer, array in enumerate(caches[name]):
                value = self._ort_value.ortvalue_from_numpy(array)
                binding.bind_ortvalue_input(f"{name}.{layer}", value)
                if name in ("self_k", "self_v"):
                    binding.bind_ortvalue_output(StepGraph.updated(f"{name}.{layer}"), value)
        binding.caches = caches
        if key is not None:
            if key[2:] != self._bindings_storage:  # the caches grew: bindings to the old ones are stale
                self._bindings, self._bindings_storage = {}, key[2:]
            self._bindings[key] = binding
        return binding

    @staticmethod
    def _rows(cache: torch.Tensor, read: slice | list[int]) -> torch.Tensor:
        """The slots ``read`` of a cache: a view of one contiguous block, or a gathered copy."""
        return cache[read] if isinstance(read, slice) else cache[torch.tensor(read)]

    def _self_bias(self, steps: np.ndarray) -> torch.Tensor:
        """[A, H, W + 1, C]: what each query at ``steps`` [A, W + 1] adds to its score over the key at
        each cache position (T5's relative position bias; attention is causal by itself)."""
        if steps.shape == (1, 2):  # one row, one token (a step at batch 1): a precomputed slice
            if self._one_token_bias is None:
                rows = torch.arange(self.capacity - 1)[:, None] + torch.arange(2)  # [C - 1, 2]
                self._one_token_bias = self.table[:, rows].transpose(0, 1).contiguous()  # [C - 1, H, 2, C]
            return self._one_token_bias[int(steps[0, 0])][None]  # [1, H, 2, C]
        return self.table[:, torch.from_numpy(steps)].transpose(0, 1).contiguous()  # [A, H, W + 1, C]

    @staticmethod
    def _read_index(feed: Feed, where: list[int]) -> np.ndarray:
        """[n]: the flat positions a * W + i whose logits are read, row by row, last ones of each row."""
        width = feed.width
        return np.array([where[r] * width + i for r, (count, read) in enumerate(zip(feed.counts, feed.reads))
                         for i in range(count - read, count)], dtype=np.int64)

    @staticmethod
    def _placement(feed: Feed) -> torch.Tensor | None:
        """Where the read logits go in [R * max(reads)] (None: every row reads as many)."""
        most = max(feed.reads)
        if min(feed.reads) == most:
            return None
        return torch.tensor([r * most + i for r, read in enumerate(feed.reads) for i in range(read)])

    def _write_back(self, feed: Feed, gathered: dict) -> None:
        """The fed positions' keys and values from the gathered copies (rows in ``feed``'s order) into
        the engine's cache."""
        rows = torch.arange(len(feed.slots))[:, None]  # [R, 1]
        slots = torch.tensor(feed.slots)[:, None]
        steps = torch.tensor(feed.positions)[:, None] + torch.arange(feed.width)  # [R, W]
        for layer in range(self.weights.layer_count):
            for name in ("self_k", "self_v"):
                getattr(self, name)[layer, slots, :, steps] = torch.from_numpy(gathered[name][layer])[rows, :, steps]


def _grown(cache: torch.Tensor, dim: int, size: int, fill: float = 0.0) -> torch.Tensor:
    """``cache`` with its ``dim`` grown to ``size``, the old content kept at the start."""
    shape = list(cache.shape)
    old, shape[dim] = shape[dim], size
    grown = torch.full(shape, fill, dtype=cache.dtype)
    grown.narrow(dim, 0, old).copy_(cache)
    return grown
