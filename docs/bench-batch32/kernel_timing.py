"""Shared by the probes in this folder (not shipped code): the demo pair on the onnx engine in int8 with
the first 200 test_2016_flickr sentences as requests, and a timer around every attention-kernel call."""
import time

import torch

from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.config import ModelSpec
from pipeline.decoding.engines import onnx_segments
from pipeline.decoding.scheduler import BatchRequest

torch.set_num_threads(1)


def demo_requests(method: str = "large"):
    """(pair, config, requests): greedy, 64 new tokens, `bild` with the shipped thresholds."""
    pair = ModelPair.from_spec(ModelSpec("models/demo-de-en/small-aligned", "models/demo-de-en/large", None,
                                         "float32", "cpu", False, "onnx", "int8"))
    thresholds = {"fallback_threshold": 0.4, "rollback_threshold": 1.0} if method == "bild" else {}
    config = DecodingConfig(method=method, max_new_tokens=64, **thresholds)
    texts = [line.strip() for line in open("../shared/data/multi30k/test_2016_flickr.de")][:200]
    encoder = Generator(pair, config)
    return pair, config, [BatchRequest(encoder.encode(text)[0][0]) for text in texts]


def time_kernel_calls() -> list[float]:
    """From now on every kernel call of a new SegmentedCall adds its seconds to the returned [total]."""
    spent = [0.0]
    init = onnx_segments.SegmentedCall.__init__

    def traced(self, frame, caches, inputs, kernel):
        init(self, frame, caches, inputs, kernel)

        def timed(call):
            def run():
                started = time.perf_counter()
                call()
                spent[0] += time.perf_counter() - started
            return run
        self.plan = [timed(call) if isinstance(piece, onnx_segments.Attention) else call
                     for piece, call in zip(frame.pieces, self.plan)]
    onnx_segments.SegmentedCall.__init__ = traced
    return spent
