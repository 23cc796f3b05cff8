"""Probe (not shipped code): where a batch-32 run of the demo pair's `large` (onnx engine, int8, our
attention kernel) spends its time, beside CTranslate2 int8 on the same inputs in the same process.

Wraps the engine's pieces with timers: each onnxruntime segment of a step, the attention kernel's
self- and cross-attention calls, the admission's onnxruntime call and its Python; the rest of a step
is the engine's Python, the rest of the run the scheduler's. CTranslate2 runs the same 200 inputs at
max_batch_size 32, and once more with max_decoding_length 1 (its encoder, and one step, per batch).
Rounds alternate the order.

    .venv/bin/python docs/bench-batch32/split_probe.py [rounds] [limit]
"""
import collections
import statistics
import sys
import tempfile
import time

import torch

from pipeline.bench.ct2 import convert_pair
from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.config import ModelSpec
from pipeline.decoding.engines import onnx_engine, onnx_segments
from pipeline.decoding.scheduler import BatchPolicy, BatchRequest, scheduler_for

torch.set_num_threads(1)
SMALL, LARGE = "models/demo-de-en/small-aligned", "models/demo-de-en/large"
SOURCE = "../shared/data/multi30k/test_2016_flickr.de"
spent = collections.defaultdict(float)


def timed(name, call):
    def wrapped(*args, **kwargs):
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - started
    return wrapped


def instrument():
    init = onnx_segments.SegmentedCall.__init__

    def traced_init(self, frame, caches, inputs, kernel):
        init(self, frame, caches, inputs, kernel)
        self.plan = [timed(f"kernel {piece.kind}" if isinstance(piece, onnx_segments.Attention) else "segments", call)
                     for piece, call in zip(frame.pieces, self.plan)]
    onnx_segments.SegmentedCall.__init__ = traced_init
    engine = onnx_engine.OnnxEngine
    engine._forward = timed("forward", engine._forward)
    engine._admit = timed("admit", engine._admit)
    engine.sessions_admission = None
    sessions = onnx_engine.OnnxSessions
    admission = sessions.admission

    def traced_admission(self, *args, **kwargs):
        session = admission(self, *args, **kwargs)
        return _Timed(session)
    sessions.admission = traced_admission


class _Timed:
    def __init__(self, session):
        self.session = session

    def run(self, *args):
        started = time.perf_counter()
        try:
            return self.session.run(*args)
        finally:
            spent["admit onnxruntime"] += time.perf_counter() - started


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    pair = ModelPair.from_spec(ModelSpec(SMALL, LARGE, None, "float32", "cpu", False, "onnx", "int8"))
    config = DecodingConfig(method="large", max_new_tokens=64)
    texts = [line.strip() for line in open(SOURCE)][:limit]
    encoder = Generator(pair, config)
    requests = [BatchRequest(encoder.encode(text)[0][0]) for text in texts]
    inputs = [r.input_ids.tolist() for r in requests]
    instrument()
    with tempfile.TemporaryDirectory() as work:
        ct2 = convert_pair(pair, work)["large_int8"]

        def ours():
            return [o.tokens for o in scheduler_for(pair, config, BatchPolicy(batch_size=32)).run(requests)]

        cells = {"ours B=32": ours,
                 "ct2 int8 B=32": lambda: ct2.generate(inputs, 64, max_batch_size=32),
                 "ct2 int8 B=32, 1 token": lambda: ct2.generate(inputs, 1, max_batch_size=32)}
        for cell in cells.values():
            cell()
        walls, splits, tokens = collections.defaultdict(list), [], {}
        for round_ in range(rounds):
            order = list(cells) if round_ % 2 == 0 else list(cells)[::-1]
            for name in order:
                spent.clear()
                started = time.perf_counter()
                out = cells[name]()
                walls[name].append(time.perf_counter() - started)
                tokens[name] = sum(len(t) for t in out)
                if name == "ours B=32":
                    splits.append({**spent, "wall": walls[name][-1]})
    print(f"{limit} inputs, one thread, int8, greedy; medians of {rounds} rounds (order alternating)")
    print("| cell | wall (ms) | tokens | tokens/s |\n|---|---|---|---|")
    for name, values in walls.items():
        wall = statistics.median(values)
        print(f"| {name} | {wall * 1e3:.0f} | {tokens[name]} | {tokens[name] / wall:.0f} |")
    median = {key: statistics.median(split.get(key, 0.0) for split in splits) for key in splits[0]}
    wall = median["wall"]
    rows = {
        "onnxruntime segments": median["segments"],
        "kernel self-attention": median.get("kernel self", 0.0),
        "kernel cross-attention": median.get("kernel cross", 0.0),
        "step Python (forward - pieces)": median["forward"] - median["segments"] - median.get("kernel self", 0.0)
        - median.get("kernel cross", 0.0),
        "admission onnxruntime": median["admit onnxruntime"],
        "admission Python": median["admit"] - median["admit onnxruntime"],
        "scheduler (rest)": wall - median["forward"] - median["admit"],
    }
    print("\nours B=32, where the wall time went\n| part | ms | share |\n|---|---|---|")
    for name, seconds in rows.items():
        print(f"| {name} | {seconds * 1e3:.0f} | {seconds / wall:.0%} |")


if __name__ == "__main__":
    main()
