"""Probe (not shipped code): the onnx engine with our attention kernel against onnxruntime's attention
ops, both in one process, on the demo pair's first 200 test_2016_flickr sentences: the engines of both
models at batch B built once per attention, each round running one then the other (order alternating
per round). Prints tokens/s per round, the ratio's median, and how many outputs differ between them.

    .venv/bin/python docs/bench-attention/abba_attention.py METHOD ROUNDS BATCH [QUANTIZE]
"""
import statistics
import sys
import time

import torch

from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.config import ModelSpec
from pipeline.decoding.engines.onnx_engine import OnnxEngine
from pipeline.decoding.scheduler import BatchPolicy, BatchRequest, scheduler_for

torch.set_num_threads(1)
ROLES, KINDS = ("small", "large"), ("onnxruntime", "kernel")


def main():
    method, rounds, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    quantize = sys.argv[4] if len(sys.argv) > 4 else "int8"
    root = "models/demo-de-en/"
    pair = ModelPair.from_spec(ModelSpec(root + "small-aligned", root + "large", None, "float32", "cpu", False, "onnx",
                                         quantize))
    texts = open("../shared/data/multi30k/test_2016_flickr.de").read().splitlines()[:200]
    config = DecodingConfig(method=method, fallback_threshold=0.4, rollback_threshold=1.0, max_new_tokens=64)
    generator = Generator(pair, config)
    requests = [BatchRequest(generator.encode(text)[0][0]) for text in texts]
    policy = BatchPolicy(batch_size=batch, verify_share=1.0 if method == "large" else 0.5)
    built = {role: pair.engine(role, batch) for role in ROLES}
    engines = {kind: {role: OnnxEngine(built[role].weights, built[role].sessions, batch, attention=kind)
                      for role in ROLES} for kind in KINDS}

    def run(kind):
        for role in ROLES:
            pair._engines[(role, batch)] = engines[kind][role]  # the scheduler takes the pair's engines
        started = time.perf_counter()
        outputs = scheduler_for(pair, config, policy).run(requests)
        return [output.tokens for output in outputs], sum(len(o.tokens) for o in outputs) / (time.perf_counter() - started)

    first = {kind: run(kind)[0] for kind in KINDS}  # (and warm-up)
    differ = sum(a != b for a, b in zip(*first.values()))
    ratios = []
    for round_ in range(rounds):
        speed = {kind: run(kind)[1] for kind in (KINDS if round_ % 2 == 0 else KINDS[::-1])}
        ratios.append(speed["kernel"] / speed["onnxruntime"])
        print(f"round {round_}: onnxruntime {speed['onnxruntime']:.0f}, kernel {speed['kernel']:.0f} tokens/s, "
              f"ratio {ratios[-1]:.3f}", flush=True)
    print(f"{method} at batch {batch} ({quantize}): kernel over onnxruntime's attention, median "
          f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}); outputs differing: "
          f"{differ}/{len(requests)}")


if __name__ == "__main__":
    main()
