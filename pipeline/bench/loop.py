"""Per-token overhead of the decode loops, measured side by side in one run.

Two ratios, each from interleaved repetitions on the same inputs:
- our plain ``large`` loop against ``model.generate()`` greedy on the same model (>= 1 means
  ours is at least as fast);
- the ``bild`` scheduler's own bookkeeping (everything but the engines' forward passes and
  encoders) as a share of that model time (the target is < 10%).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from pipeline.bench.methods import hf_greedy, sync_device
from pipeline.decoding import DecodingConfig, Generator, ModelPair


@dataclass
class LoopBenchResult:
    inputs: int
    repeats: int
    tokens: int  # tokens generated per repetition by the large loop
    ours_ms_per_token: float
    hf_ms_per_token: float
    identical_outputs: bool
    bild_loop_ms: float
    bild_forward_ms: float
    bild_small_share: float

    @property
    def speed_vs_generate(self) -> float:
        return self.hf_ms_per_token / self.ours_ms_per_token

    @property
    def bookkeeping_share(self) -> float:
        return (self.bild_loop_ms - self.bild_forward_ms) / self.bild_forward_ms

    def to_markdown(self) -> str:
        lines = [
            f"inputs: {self.inputs}, repetitions: {self.repeats} (interleaved), tokens per repetition: {self.tokens}",
            "",
            "| measure | value |",
            "|---|---|",
            f"| our `large` loop, ms/token (median) | {self.ours_ms_per_token:.3f} |",
            f"| HF `generate()` greedy, ms/token (median) | {self.hf_ms_per_token:.3f} |",
            f"| **speed ratio generate/ours** (>= 1: ours is as fast or faster) | **{self.speed_vs_generate:.2f}x** |",
            f"| identical token ids | {self.identical_outputs} |",
            f"| `bild` loop time, ms (median) | {self.bild_loop_ms:.1f} |",
            f"| `bild` model forward time, ms (median) | {self.bild_forward_ms:.1f} |",
            f"| **`bild` bookkeeping / forward time** (target < 10%) | **{100 * self.bookkeeping_share:.1f}%** |",
            f"| share of `bild` output tokens from the small model | {100 * self.bild_small_share:.1f}% |",
        ]
        return "\n".join(lines)


def run_loop_bench(pair: ModelPair, texts: list[str], bild: DecodingConfig, repeats: int = 3) -> LoopBenchResult:
    large_config = DecodingConfig(method="large", max_new_tokens=bild.max_new_tokens)
    large_loop, bild_loop = Generator(pair, large_config), Generator(pair, bild)
    encoded = [large_loop.encode(text)[0].to(pair.device) for text in texts]
    engines = (pair.engine("small", 1), pair.engine("large", 1))
    ours_ms, hf_ms, loop_ms, forward_ms = [], [], [], []
    identical, tokens, small_tokens, bild_tokens = True, 0, 0, 0
    for _ in range(repeats):
        ours = hf = loop = forward = 0.0
        tokens = 0
        for input_ids in encoded:  # interleave A and B on every input
            sync_device(pair.device)
            t0 = time.perf_counter()  # generate() runs the encoder inside, so ours is timed with it too
            out = large_loop.decode_ids(input_ids)
            sync_device(pair.device)
            t1 = time.perf_counter()
            reference = hf_greedy(pair, input_ids, bild.max_new_tokens)
            sync_device(pair.device)
            t2 = time.perf_counter()
            ours += t1 - t0
            hf += t2 - t1
            tokens += len(out.tokens)
            identical &= out.tokens == reference[: len(out.tokens)]

            model_before = sum(e.forward_seconds + e.admit_seconds for e in engines)
            sync_device(pair.device)
            t3 = time.perf_counter()
            result = bild_loop.decode_ids(input_ids)
            sync_device(pair.device)
            loop += time.perf_counter() - t3
            forward += sum(e.forward_seconds + e.admit_seconds for e in engines) - model_before
            small_tokens += result.stats.small_tokens
            bild_tokens += result.stats.output_tokens
        ours_ms.append(1000 * ours / tokens)
        hf_ms.append(1000 * hf / tokens)
        loop_ms.append(1000 * loop)
        forward_ms.append(1000 * forward)
    return LoopBenchResult(
        inputs=len(texts),
        repeats=repeats,
        tokens=tokens,
        ours_ms_per_token=statistics.median(ours_ms),
        hf_ms_per_token=statistics.median(hf_ms),
        identical_outputs=identical,
        bild_loop_ms=statistics.median(loop_ms),
        bild_forward_ms=statistics.median(forward_ms),
        bild_small_share=small_tokens / max(bild_tokens, 1),
    )

