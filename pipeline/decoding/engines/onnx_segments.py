"""The onnx engine's step with its own attention: a kernel-mode StepGraph (onnx_graph.py) cut at its
attention nodes into onnxruntime graphs (segments), with decode_attention.c run between them.

A step is then 2L + 1 onnxruntime calls and 2L kernel calls for L layers: the products, norms and head
stay onnxruntime's (MLAS, int8 or float32), the attention is ours (attention_kernel.py). Between the
pieces the tensors a later piece reads (the residual stream, the packed q | k | v, a query, an attention's
output) are arrays the engine binds once per call shape.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    import onnx

    from pipeline.decoding.engines.onnx_graph import StepGraph

# (onnx is imported where a graph is cut: the engine imports this module on machines without it.)


@dataclass(frozen=True)
class Segment:
    """An onnxruntime graph: reads ``inputs`` (the step's own, or earlier pieces' tensors), writes
    ``outputs`` (those later pieces read, and the logits)."""

    model: onnx.ModelProto
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class Attention:
    """Decode attention the engine runs: ``kind`` "self" (``input``: the packed q | k | v; writes the
    fed keys and values into ``layer``'s cache) or "cross" (``input``: the query)."""

    kind: str
    layer: int
    scale: float
    input: str
    output: str


def segments(graph: StepGraph, logits: str) -> list[Segment | Attention]:
    """The step built in ``graph`` (kernel mode), ending in ``logits``, as pieces to run in order."""
    from onnx import helper

    from pipeline.decoding.engines.onnx_graph import KERNEL

    if graph.attention != "kernel":
        raise ValueError("segments() cuts a step built with attention='kernel'")
    pieces: list[list[onnx.NodeProto] | Attention] = [[]]
    for node in graph.nodes:
        if node.domain != KERNEL:
            pieces[-1].append(node)
            continue
        attributes = {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}
        kind = node.op_type.removesuffix("Attention").lower()
        pieces += [Attention(kind, attributes["layer"], attributes["scale"], node.input[0], node.output[0]), []]
    # Walk back from the logits: what each piece must hand on is what some later piece reads.
    needed, ordered = {logits}, []
    for piece in reversed(pieces):
        if isinstance(piece, Attention):
            needed = (needed - {piece.output}) | {piece.input}
            ordered.append(piece)
            continue
        made = {output for node in piece for output in node.output if output}
        read = {name for node in piece for name in node.input if name} - made - set(graph.initializers)
        outputs = tuple(sorted(made & needed))
        needed = (needed - made) | read
        ordered.append(_segment(graph, piece, tuple(sorted(read)), outputs))
    return ordered[::-1]


def _segment(graph: StepGraph, nodes: list[onnx.NodeProto], inputs: tuple[str, ...],
             outputs: tuple[str, ...]) -> Segment:
    import onnx
    from onnx import TensorProto, helper

    from pipeline.decoding.engines.onnx_graph import MICROSOFT, OPSET

    integer_inputs = {"read": TensorProto.INT64}  # the step's inputs that are not float32
    used = {name for node in nodes for name in node.input}
    initializers = [onnx.numpy_helper.from_array(value, key) for key, value in graph.initializers.items()
                    if key in used]
    body = helper.make_graph(
        nodes, "step_segment",
        [helper.make_tensor_value_info(name, integer_inputs.get(name, TensorProto.FLOAT), None) for name in inputs],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs], initializers)
    model = helper.make_model(body, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MICROSOFT, 1)])
    return Segment(model, inputs, outputs)



def buffers(pieces: list, d_model: int, inner: int) -> tuple[dict[str, int], list[int]]:
    """Where each tensor the pieces hand on lives: name -> buffer, and each buffer's width (all are
    [A, W, width]). A buffer is reused once the tensor in it has been read for the last time, never
    by a piece that still reads it: a step's working memory is a few [A, W, width] arrays, not one per
    tensor. Widths come from one run of the pieces on a row of zeros; ``pieces`` as
    OnnxSessions.step_pieces gives them."""
    values = {"hidden": np.zeros((1, 1, d_model), dtype=np.float32), "read": np.zeros(1, dtype=np.int64)}
    last_read = {}  # tensor -> the last piece that reads it
    for index, piece in enumerate(pieces):
        if isinstance(piece, Attention):
            values[piece.output] = np.zeros((1, 1, inner), dtype=np.float32)
            last_read[piece.input] = index
            continue
        segment, session = piece
        values.update(zip(segment.outputs, session.run(list(segment.outputs),
                                                        {name: values[name] for name in segment.inputs})))
        last_read.update((name, index) for name in segment.inputs)
    where, widths, free = {}, [], []  # free: (buffer, the piece after which it is free)
    for index, piece in enumerate(pieces):
        made = [piece.output] if isinstance(piece, Attention) else list(piece[0].outputs)
        for name in made:
            if name not in last_read:  # the logits: the engine's own array
                continue
            width = values[name].shape[-1]
            reusable = [entry for entry in free if widths[entry[0]] == width and entry[1] < index]
            if reusable:
                free.remove(reusable[0])
                where[name] = reusable[0][0]
            else:
                where[name] = len(widths)
                widths.append(width)
            free.append((where[name], last_read[name]))
    return where, widths


class ReadLogits:
    """A step's read positions [n] and their logits [n, V], bound to the onnxruntime binding that reads
    and writes them: anew only where a call reads another number of logits than the last."""

    def __init__(self, binding, logits: str, vocab: int):
        """``logits``: the name of the logits' output in the binding's graph."""
        from onnxruntime import OrtValue  # here: a machine without onnxruntime runs the other engines

        self._ort_value, self.binding, self.name, self.vocab = OrtValue, binding, logits, vocab
        self.read = self.logits = None

    def reading(self, reads: int) -> np.ndarray:
        """The read positions [n] to fill for a call that reads ``reads`` logits."""
        if self.read is None or len(self.read) != reads:
            self.read, self.logits = np.zeros(reads, dtype=np.int64), np.empty((reads, self.vocab), dtype=np.float32)
            self.binding.bind_cpu_input("read", self.read)
            self.binding.bind_ortvalue_output(self.name, self._ort_value.ortvalue_from_numpy(self.logits))
        return self.read


class SegmentFrame:
    """The onnxruntime side of a step bound once for A rows of W positions: the arrays of the hidden
    states, of the rows' positions and counts and of every tensor handed on between pieces, and each
    segment's session bound to them. Shared by every call of that shape (the caches are the calls')."""

    def __init__(self, pieces: list, logits: str, layout: tuple[dict[str, int], list[int]], rows: int, width: int,
                 d_model: int, vocab: int):
        from onnxruntime import OrtValue  # here: a machine without onnxruntime runs the other engines

        self.pieces = pieces
        where, widths = layout
        memory = [np.zeros((rows, width, size), dtype=np.float32) for size in widths]
        self.arrays = {name: memory[index] for name, index in where.items()}
        self.arrays["hidden"] = np.zeros((rows, width, d_model), dtype=np.float32)
        self.slots, self.positions, self.counts = (np.zeros(rows, dtype=np.int32) for _ in range(3))
        self.runs, self.reads = [], None  # per piece: a segment's run, or None; the last segment's ReadLogits
        for piece in pieces:
            if isinstance(piece, Attention):
                self.runs.append(None)
                continue
            segment, session = piece
            binding = session.io_binding()
            for name in segment.inputs:
                if name != "read":
                    binding.bind_cpu_input(name, self.arrays[name])
            for name in segment.outputs:
                if name == logits:
                    self.reads = ReadLogits(binding, logits, vocab)
                else:
                    binding.bind_ortvalue_output(name, OrtValue.ortvalue_from_numpy(self.arrays[name]))
            self.runs.append(functools.partial(session.run_with_iobinding, binding))


class SegmentedCall:
    """A step over given caches: a frame's segment runs with a kernel call per attention in between.
    A step fills ``hidden``, the rows (``set_rows``: each row's slot among the caches, its position and
    count), T5's ``self_bias`` and the read positions, then ``run``s the pieces in order."""

    def __init__(self, frame: SegmentFrame, caches: dict[str, list[np.ndarray]], inputs: dict[str, np.ndarray],
                 kernel):
        """``caches``: each layer's self- and cross-attention keys and values [slots, C or S, H, dk];
        ``inputs``: source_lengths [slots] (and T5's self_bias [A, H, W + 1, C]); ``kernel``:
        attention_kernel's."""
        self.frame, self.caches, self.inputs = frame, caches, inputs  # kept alive: the calls point into them
        self.hidden_array = frame.arrays["hidden"].reshape(-1, frame.arrays["hidden"].shape[-1])  # [A * W, d], a view
        self.hidden = torch.from_numpy(self.hidden_array)
        self.self_bias = torch.from_numpy(inputs["self_bias"]) if "self_bias" in inputs else None
        self.plan = [run or self._attention(kernel, piece) for piece, run in zip(frame.pieces, frame.runs)]
        self.reading = frame.reads.reading

    def _attention(self, kernel, piece: Attention):
        frame, layer = self.frame, piece.layer
        query, out = frame.arrays[piece.input], frame.arrays[piece.output]
        if piece.kind == "self":
            return kernel.self_attention(query, self.caches["self_k"][layer], self.caches["self_v"][layer], frame.slots,
                                         frame.positions, frame.counts, self.inputs.get("self_bias"), piece.scale, out)
        return kernel.cross_attention(query, self.caches["cross_k"][layer], self.caches["cross_v"][layer], frame.slots,
                                      self.inputs["source_lengths"], frame.counts, piece.scale, out)

    def set_rows(self, slots: list[int], positions: list[int], counts: list[int]) -> None:
        """Each row's slot, its first fed position and how many it feeds. The kernel refuses a slot or
        position outside the caches; a slot given twice (which it cannot see) is refused here."""
        if min(slots) < 0 or max(slots) >= len(self.caches["self_k"][0]) or len(set(slots)) != len(slots):
            raise ValueError(f"a step's rows take distinct slots among {len(self.caches['self_k'][0])}, got {slots}")
        frame = self.frame
        frame.slots[:], frame.positions[:], frame.counts[:] = slots, positions, counts

    def run(self) -> torch.Tensor:
        """The step's logits [n, V], a copy: the next call writes into the same array."""
        for call in self.plan:
            call()
        return torch.from_numpy(self.frame.reads.logits.copy())
