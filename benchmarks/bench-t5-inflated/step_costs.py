"""What a step, a k-token verification and an admission cost for a pair on this machine, and the windows
the adaptive chooser (pipeline/decoding/draft_length.py) would then pick at the pair's measured acceptance.

    python benchmarks/bench-t5-inflated/step_costs.py SMALL LARGE [--quantize int8] [--reps 5]

One thread, batch 1, the onnx engine; medians of ``reps`` timings taken in rotation (bench's cost model,
pipeline/bench/cost.py). Acceptance: a `bild` run (the demo preset, alpha_FB 0.4, alpha_RB 1) over 12
held-out test sentences on the same pair.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pipeline.bench.cost import cost_model
from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.draft_length import DraftLength
from pipeline.decoding.stats import DecodeStats

parser = argparse.ArgumentParser()
parser.add_argument("small")
parser.add_argument("large")
parser.add_argument("--quantize", default="int8")
parser.add_argument("--reps", type=int, default=5)
args = parser.parse_args()
torch.set_num_threads(1)
pair = ModelPair.from_pretrained(args.small, args.large, engine="onnx", quantize=args.quantize, device="cpu")
texts = open("../shared/data/multi30k/test_2016_flickr.de").read().splitlines()[300:312]
cost = cost_model(pair, texts[0], 10, reps=args.reps)
large = pair.engine("large", 1)
ids = Generator(pair, DecodingConfig()).encode(texts[0])[0][0]
admissions = []
for _ in range(args.reps):
    started = time.perf_counter()
    large.admit([0], [ids])
    admissions.append(time.perf_counter() - started)
    large.release(0)
step = cost["large_step_s"]
print(f"small step {1e3 * cost['small_step_s']:.2f} ms, large step {1e3 * step:.2f} ms "
      f"(ratio {cost['small_step_s'] / step:.3f}); admission of a {len(ids)}-token source to `large` "
      f"{1e3 * statistics.median(admissions):.1f} ms ({statistics.median(admissions) / step:.1f} steps)")
print("verification of k tokens, in large steps: "
      + ", ".join(f"k={k} {seconds / step:.2f}" for k, seconds in cost["large_verify_s"].items()))

config = DecodingConfig(method="bild", fallback_threshold=0.4, rollback_threshold=1.0, max_new_tokens=64)
outputs = Generator(pair, config).generate(texts)
stats = DecodeStats.total(result.stats for result in outputs)
chooser = DraftLength(10, min_calls=1)
chooser.drafted(1, cost["small_step_s"])
for k, seconds in cost["large_verify_s"].items():
    chooser.verified(k, seconds, calls=0, drafts=0, kept=0, rejections=0)
chooser.verified(1, step, calls=stats.small_calls, drafts=stats.draft_tokens, kept=stats.small_tokens,
                 rejections=stats.rollbacks)
rates = {k: chooser.tokens_per_second(k, 1) for k in range(11)}
print(f"bild on 12 sentences: {stats.draft_tokens} drafts from {stats.small_calls} small calls, "
      f"{stats.small_tokens} kept, {stats.rollbacks} rollbacks; expected speed over a plain large step: "
      + ", ".join(f"k={k} {rate / rates[0]:.2f}x" for k, rate in rates.items())
      + f"; chosen k={chooser.choose(1)}")
