"""Probe (not shipped code): int8 admissions by rows (onnx_graph's ``rows`` kernel) against by blocks (what an
engine of fewer than 16 slots uses), batch 1 (the record-by-record loop), greedy, one thread. Speed in-process,
rounds alternating the order; or BLEU on all of Multi30k val.

    .venv/bin/python docs/bench-batch32/ab_admission_kernel.py demo [rounds]  # 200 test sentences, 64 tokens
    .venv/bin/python docs/bench-batch32/ab_admission_kernel.py t5 [rounds]    # runs/t5shape, 6 sentences, 24 tokens
    .venv/bin/python docs/bench-batch32/ab_admission_kernel.py val            # the demo pair's BLEU on val
"""
import hashlib
import statistics
import sys
import time

import sacrebleu
import torch

from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.config import ModelSpec
from pipeline.decoding.engines.onnx_sessions import OnnxSessions

torch.set_num_threads(1)
DATA = "../shared/data/multi30k"
PAIRS = {"demo": ("models/demo-de-en/small-aligned", "models/demo-de-en/large", 200, 64, ("large", "bild")),
         "t5": ("runs/t5shape/small", "runs/t5shape/large", 6, 24, ("large",))}
admission_kernel = ["blocks"]  # what every admission multiplies by, whatever the engine asks
admission = OnnxSessions.admission
OnnxSessions.admission = lambda self, projections_only=False, int8_kernel="blocks": admission(
    self, projections_only, admission_kernel[0])


def generators(small, large, new_tokens, methods):
    pair = ModelPair.from_spec(ModelSpec(small, large, None, "float32", "cpu", False, "onnx", "int8"))
    config = {"max_new_tokens": new_tokens, "fallback_threshold": 0.4, "rollback_threshold": 1.0}
    return {method: Generator(pair, DecodingConfig(method=method, **config)) for method in methods}


def val_bleu():
    decoders = generators(*PAIRS["demo"][:2], 64, ("large", "bild"))
    sources, references = ([line.strip() for line in open(f"{DATA}/val.{side}")] for side in ("de", "en"))
    for method, generator in decoders.items():
        for kernel in ("blocks", "rows"):
            admission_kernel[0] = kernel
            predictions = [result.prediction or "" for result in generator.generate(sources)]
            print(f"{method}, admissions by {kernel}: BLEU {sacrebleu.corpus_bleu(predictions, [references]).score:.2f}")


def speed(which: str, rounds: int):
    small, large, limit, new_tokens, methods = PAIRS[which]
    decoders = generators(small, large, new_tokens, methods)
    texts = [line.strip() for line in open(f"{DATA}/test_2016_flickr.de")][:limit]
    cells = [(method, kernel) for method in methods for kernel in ("blocks", "rows")]
    walls, tokens, hashes = {cell: [] for cell in cells}, {}, {}
    for round_ in range(rounds + 1):  # round 0 warms every session up
        for method, kernel in (cells if round_ % 2 else cells[::-1]):
            admission_kernel[0] = kernel
            started = time.perf_counter()
            out = decoders[method].generate(texts)
            if round_:
                walls[method, kernel].append(time.perf_counter() - started)
            tokens[method, kernel] = sum(len(r.token_ids) for r in out)
            hashes[method, kernel] = hashlib.sha1(str([r.token_ids for r in out]).encode()).hexdigest()[:8]
    print({f"{method} {kernel}": [round(wall, 2) for wall in walls[method, kernel]] for method, kernel in cells})
    print(f"{limit} inputs, batch 1, int8, one thread; median of {rounds} rounds (order alternating)")
    print("| method | admissions by | wall (s) | tokens | tokens/s | rows over blocks | outputs |\n|---|---|---|---|---|---|---|")
    for method, kernel in cells:
        wall = statistics.median(walls[method, kernel])
        rate = tokens[method, kernel] / wall
        base = tokens[method, "blocks"] / statistics.median(walls[method, "blocks"])
        print(f"| {method} | {kernel} | {wall:.2f} | {tokens[method, kernel]} | {rate:.0f} | {rate / base:.2f}x "
              f"| {hashes[method, kernel]} |")


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "demo"
    val_bleu() if which == "val" else speed(which, int(sys.argv[2]) if len(sys.argv) > 2 else 3)
