"""Probe (not shipped code): what a drafting step of the demo pair's small model costs on the onnx
engine in int8 at batch 1, run alone (steps back to back) and between `large` verifications of 5
positions (as in `bild`, where a verification follows every ~4.6 drafts). Times the small engine's
forward and, of it, onnxruntime's call; interleaved rounds, one thread.

    .venv/bin/python docs/bench-drafter/drafter_probe.py [rounds]
"""
import statistics
import sys
import time

import torch

from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.config import ModelSpec
from pipeline.decoding.engine import Feed

torch.set_num_threads(1)
SMALL, LARGE = "models/demo-de-en/small-aligned", "models/demo-de-en/large"


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    pair = ModelPair.from_spec(ModelSpec(SMALL, LARGE, None, "float32", "cpu", False, "onnx", "int8"))
    source = open("../shared/data/multi30k/test_2016_flickr.de").readline().strip()
    ids = Generator(pair, DecodingConfig(method="bild")).encode(source)[0][0]
    small, large = pair.engine("small", 1), pair.engine("large", 1)
    small.admit([0], [ids], large.admit([0], [ids]))

    def step(engine, count):
        engine.lengths[0] = 10  # each call re-feeds the same positions: a rollback is only a length
        engine.forward(Feed([0], torch.full((1, count), 5), [10], [count], [count]))

    times = {"alone": ([], []), "between verifications": ([], [])}
    for round_ in range(rounds):
        order = list(times) if round_ % 2 == 0 else list(times)[::-1]
        for mode in order:
            walls, kernels = times[mode]
            for _ in range(200):
                before = small.runtime_seconds
                started = time.perf_counter()
                step(small, 1)
                walls.append(time.perf_counter() - started)
                kernels.append(small.runtime_seconds - before)
                if mode != "alone":
                    step(large, 5)
    print(f"small step at batch 1, int8, onnx engine; medians over {rounds} interleaved rounds of 200 steps")
    print("| drafting step | forward (ms) | of it, onnxruntime's call (ms) | the engine's Python (ms) |")
    print("|---|---|---|---|")
    for mode, (walls, kernels) in times.items():
        wall, kernel = statistics.median(walls) * 1e3, statistics.median(kernels) * 1e3
        print(f"| {mode} | {wall:.3f} | {kernel:.3f} | {wall - kernel:.3f} |")


if __name__ == "__main__":
    main()
