"""`bild-pipeline bench-loop`: per-token overhead of the decode loops, measured side by side.

Two ratios, each from interleaved repetitions on the same inputs:
- our plain ``large`` loop against ``model.generate()`` greedy on the same model (>= 1 means
  ours is at least as fast); both are timed with the encoder, which generate() runs inside;
- the ``bild`` scheduler's own bookkeeping (everything but the engines' forward passes and
  encoders) as a share of that model time (the target is < 10%).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from pipeline.bench.harness import interleave, markdown_table
from pipeline.bench.hf import hf_greedy, same_output
from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.stats import DecodeStats
from pipeline.metrics.interleaving import order_coverage


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
    order: str  # how fully the turns covered balanced_orders' cycle (interleaving.order_coverage)

    @property
    def speed_vs_generate(self) -> float:
        return self.hf_ms_per_token / self.ours_ms_per_token

    @property
    def bookkeeping_share(self) -> float:
        return (self.bild_loop_ms - self.bild_forward_ms) / self.bild_forward_ms

    def to_markdown(self) -> str:
        rows = [
            ("our `large` loop, ms/token (median)", f"{self.ours_ms_per_token:.3f}"),
            ("HF `generate()` greedy, ms/token (median)", f"{self.hf_ms_per_token:.3f}"),
            ("**speed ratio generate/ours** (>= 1: ours is as fast or faster)", f"**{self.speed_vs_generate:.2f}x**"),
            ("identical token ids", str(self.identical_outputs)),
            ("`bild` loop time, ms (median)", f"{self.bild_loop_ms:.1f}"),
            ("`bild` model forward time, ms (median)", f"{self.bild_forward_ms:.1f}"),
            ("**`bild` bookkeeping / forward time** (target < 10%)", f"**{100 * self.bookkeeping_share:.1f}%**"),
            ("share of `bild` output tokens from the small model", f"{100 * self.bild_small_share:.1f}%"),
        ]
        head = (f"inputs: {self.inputs}, repetitions: {self.repeats} (interleaved, {self.order}), "
                f"tokens per repetition: {self.tokens}")
        return "\n".join([head, "", *markdown_table(["measure", "value"], rows)])


def run_loop_bench(pair: ModelPair, texts: list[str], bild: DecodingConfig, repeats: int = 3) -> LoopBenchResult:
    large_loop = Generator(pair, DecodingConfig(method="large", max_new_tokens=bild.max_new_tokens))
    bild_loop = Generator(pair, bild)
    encoded = [large_loop.encode(text)[0].to(pair.device) for text in texts]
    engines = (pair.engine("small", 1), pair.engine("large", 1))

    def model_seconds() -> float:
        return sum(engine.forward_seconds + engine.admit_seconds for engine in engines)

    def bild_with_model_time(index: int):  # (output, seconds the engines spent on it)
        before = model_seconds()
        output = bild_loop.decode_ids(encoded[index])
        return output, model_seconds() - before

    runs = interleave({"ours": lambda index: large_loop.decode_ids(encoded[index]),
                       "hf": lambda index: hf_greedy(pair, encoded[index], bild.max_new_tokens),
                       "bild": bild_with_model_time}, len(encoded), repeats, pair.device)
    ours, hf, bild_runs = runs["ours"], runs["hf"], runs["bild"]
    tokens = sum(len(output.tokens) for output in ours.last)  # the same in every repetition (greedy)
    forward = [sum(seconds for _, seconds in repetition) for repetition in bild_runs.results]
    return LoopBenchResult(
        inputs=len(texts),
        repeats=repeats,
        tokens=tokens,
        ours_ms_per_token=statistics.median(1000 * s / tokens for s in ours.repetition_seconds()),
        hf_ms_per_token=statistics.median(1000 * s / tokens for s in hf.repetition_seconds()),
        identical_outputs=all(same_output(mine.tokens, theirs, pair.eos_token_ids)
                              for mine, theirs in zip(ours.last, hf.last)),
        bild_loop_ms=statistics.median(1000 * s for s in bild_runs.repetition_seconds()),
        bild_forward_ms=statistics.median(1000 * s for s in forward),
        bild_small_share=DecodeStats.total(output.stats for output, _ in bild_runs.last).small_token_share,
        order=order_coverage(len(runs), len(texts) * repeats),
    )
