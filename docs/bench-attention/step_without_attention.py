"""Probe (not shipped code): the onnx engine's int8 step of the demo pair's `large` model with its
attention and without it (each attention op, with the extra query row padded around it, replaced by a
slice of its input; the products, norms and head unchanged), at A rows of one token with ``keys``
cached positions and ``source`` source positions per row; caches bound in place as the engine binds
them. Interleaved rounds, one thread: what a free attention would leave of the step.

    .venv/bin/python docs/bench-attention/step_without_attention.py ROWS KEYS SOURCE
"""
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort
import torch

from pipeline.decoding import ModelPair
from pipeline.decoding.config import ModelSpec
from pipeline.decoding.engines import onnx_graph
from pipeline.decoding.engines.onnx_engine import ROWS_KERNEL_FROM_SLOTS
from pipeline.decoding.engines.onnx_sessions import OnnxSessions

torch.set_num_threads(1)
CAPACITY = 64  # cache positions reserved per row, as the engine's first reservation


def attention_free():
    """Patch StepGraph so that attention is a slice of its input and the caches are not outputs."""
    graph = onnx_graph.StepGraph
    finished_model = graph.model

    def self_attention(self, layer, hidden, matrix, bias=None, scale=1.0):
        qkv = self.matmul(hidden, matrix, bias)
        return self.op("Slice", qkv, self.constant([0], np.int64, name="start"),
                       self.constant([self.heads * self.d_kv], np.int64, name="end"),
                       self.constant([2], np.int64, name="axis"))

    def model(self, logits):
        built = finished_model(self, logits)
        kept = [output for output in built.graph.output if not output.name.endswith(".updated")]
        del built.graph.output[:]
        built.graph.output.extend(kept)
        return built

    graph.self_attention, graph.cross_attention, graph.model = self_attention, lambda self, layer, q, scale=1.0: q, model


def bound(session, feeds):
    """An io binding of ``feeds``; self-attention caches bound in place (input and output alike)."""
    binding, outputs = session.io_binding(), {output.name for output in session.get_outputs()}
    values = []
    for name, array in feeds.items():
        if f"{name}.updated" in outputs:
            value = ort.OrtValue.ortvalue_from_numpy(array)
            values.append(value)
            binding.bind_ortvalue_input(name, value)
            binding.bind_ortvalue_output(f"{name}.updated", value)
        else:
            binding.bind_cpu_input(name, array)
    binding.bind_output("logits")
    return binding, values


def main():
    rows, keys, source = (int(value) for value in sys.argv[1:4])
    kernel = "rows" if rows >= ROWS_KERNEL_FROM_SLOTS else "blocks"
    root = "models/demo-de-en/"
    pair = ModelPair.from_spec(ModelSpec(root + "small-aligned", root + "large", None, "float32", "cpu", False,
                                         "onnx", "int8"))
    weights = pair.engine("large", rows).weights
    sessions = {"with attention": OnnxSessions(weights, "int8").step(kernel)}
    attention_free()
    sessions["without attention"] = OnnxSessions(weights, "int8").step(kernel)
    rng = np.random.default_rng(0)
    heads, d_kv = weights.heads, weights.d_kv
    feeds = {"hidden": rng.standard_normal((rows, 1, weights.d_model), dtype=np.float32),
             "seqlens_k": np.full(rows, keys, np.int32), "query_seqlens": np.full(rows, 2, np.int32),
             "total_sequence_length": np.array(CAPACITY, np.int32), "source_lengths": np.full(rows, source, np.int32),
             "read": np.arange(rows, dtype=np.int64),
             "self_bias": rng.standard_normal((rows, heads, 2, CAPACITY), dtype=np.float32)}
    for name, positions in (("self_k", CAPACITY), ("self_v", CAPACITY), ("cross_k", source), ("cross_v", source)):
        for layer in range(weights.layer_count):
            feeds[f"{name}.{layer}"] = rng.standard_normal((rows, heads, positions, d_kv), dtype=np.float32)
    runs = {}
    for name, session in sessions.items():
        wanted = {value.name for value in session.get_inputs()}
        binding, values = bound(session, {key: value for key, value in feeds.items() if key in wanted})
        runs[name] = (session, binding, values)
    times = {name: [] for name in runs}
    for round_ in range(7):
        for name in (list(runs) if round_ % 2 == 0 else list(runs)[::-1]):
            session, binding, _ = runs[name]
            for _ in range(3):
                session.run_with_iobinding(binding)
            started = time.perf_counter()
            for _ in range(20):
                session.run_with_iobinding(binding)
            times[name].append((time.perf_counter() - started) / 20 * 1e3)
    full, bare = (statistics.median(times[name]) for name in ("with attention", "without attention"))
    print(f"| {rows} | {keys} | {source} | {kernel} | {full:.2f} | {bare:.2f} | {100 * (full - bare) / full:.0f}% |")


if __name__ == "__main__":
    main()
