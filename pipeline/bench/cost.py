"""The cost model's step costs: each engine call timed on this hardware in the regime the decoding loop
runs it, between the records of a run (prediction.py applies them to a method's counted calls and rounds).

A call's cost depends on what ran just before it (the demo pair on an AVX-512 machine: a `large` step right
after another costs 0.39 ms, right after an admission 0.72 ms), so each is timed where the loop runs it:

- ``small_step_s``: a small-model step after another (a draft window's steps follow each other);
- ``large_step_s``: a large-model step after another (`large`'s loop, a drafting method's plain rounds);
- ``large_verify_s[k]``: a verification of k positions right after small-model steps (a drafting round);
  ``verify_warm_s[k]`` the same after a large step, to show what interleaving two models costs;
- ``cold_extra_s[role]``: what a row's first step after its admission costs over a warm one;
- ``isolated_s[k]``: each step alone after an admission and a prefill, as this model timed them until
  2026-12-07 (kept to show what that missed).

A shared machine's speed drifts by tens of percent over minutes, so CostSampler times a few of each between
the records of a run, in the same phases as the methods it explains.
"""

from __future__ import annotations

import statistics
from functools import partial

import torch

from pipeline.bench.harness import timed
from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.engine import Engine, Feed
from pipeline.decoding.models import build_engine, native_unsupported_reason
from pipeline.decoding.stats import DecodeStats

SMALL_BEFORE_VERIFY = 3  # small-model steps before a timed verification (a window's worth, roughly)


class _StepTimer:
    """Times one engine forward (batch 1) feeding ``width`` new tokens after ``context`` cached ones, right
    after the row's admission and a prefill (an isolated step: ``isolated_s``)."""

    def __init__(self, engine: Engine, input_ids: torch.Tensor, prefix: torch.Tensor, width: int, context: int = 16):
        self.engine, self.input_ids, self.width = engine, input_ids, width
        filler = torch.full((context + width,), 5, dtype=torch.long)
        self.tokens = torch.cat([prefix, filler])[None]  # [1, P + context + width]
        self.cached = len(prefix) + context

    def once(self) -> float:
        engine, cached = self.engine, self.cached
        engine.admit([0], [self.input_ids])
        engine.forward(Feed([0], self.tokens[:, :cached], [0], [cached], [1]))
        step = Feed([0], self.tokens[:, cached:], [cached], [self.width], [self.width])
        _, seconds = timed(engine.device, partial(engine.forward, step))
        engine.release(0)
        return seconds


class _Row:
    """One row held by an engine with ``context`` tokens cached; a step feeds ``width`` tokens after them and
    is rewound, so that every step meets the same cache."""

    def __init__(self, engine: Engine, input_ids: torch.Tensor, prefix: torch.Tensor, most: int, context: int = 16):
        self.engine, self.input_ids, self.prefix = engine, input_ids, prefix
        room = context + max(most, len(prefix))  # a warm call as wide as the first (a decoder-only prompt)
        self.tokens = torch.cat([prefix, torch.full((room,), 5, dtype=torch.long)])[None]
        self.cached = len(prefix) + context
        self.admit()

    def admit(self) -> float:
        """Admit the row afresh and time its first step (the prefix, as a decode's first call); then cache
        the context."""
        engine, start = self.engine, len(self.prefix)
        engine.release(0)
        engine.admit([0], [self.input_ids])
        first = self.tokens[:, :start]
        _, seconds = timed(engine.device, partial(engine.forward, Feed([0], first, [0], [start], [1])))
        rest = self.cached - start
        engine.forward(Feed([0], self.tokens[:, start:self.cached], [start], [rest], [1]))
        return seconds

    def step(self, width: int) -> float:
        engine, cached = self.engine, self.cached
        feed = Feed([0], self.tokens[:, cached:cached + width], [cached], [width], [width])
        _, seconds = timed(engine.device, partial(engine.forward, feed))
        engine.rewind(0, cached)
        return seconds


def time_step(engine: Engine, input_ids: torch.Tensor, prefix: torch.Tensor, width: int, context: int = 16,
              reps: int = 20) -> float:
    """Median seconds of one engine forward feeding ``width`` new tokens after ``context`` cached ones, each
    right after another of the same (warm)."""
    row = _Row(engine, input_ids, prefix, width, context)
    row.step(width)
    times = [row.step(width) for _ in range(reps)]
    engine.release(0)
    return statistics.median(times)


class CostSampler:
    """The cost model's step timings, taken a few at a time between the records of the runs."""

    def __init__(self, pair: ModelPair, text: str, max_width: int):
        input_ids = Generator(pair, DecodingConfig()).encode(text)[0][0]
        prefix = pair.decoder_prefix(input_ids)
        self.widths = range(1, max_width + 2)
        self.rows = {role: _Row(pair.engine(role, 1), input_ids, prefix, max_width + 1) for role in ("small", "large")}
        self.isolated = {k: _StepTimer(pair.engine("large", 1), input_ids, prefix, k) for k in self.widths}
        self.isolated_small = _StepTimer(pair.engine("small", 1), input_ids, prefix, 1)
        self.times: dict = {}

    def _add(self, key, seconds: float) -> None:
        self.times.setdefault(key, []).append(seconds)

    def sample(self) -> None:
        """One timing of every part, each in its regime. The rows are admitted afresh (the runs' records
        take the same slot between samples), which times their first steps."""
        small, large = self.rows["small"], self.rows["large"]
        for role, row in self.rows.items():
            self._add(("cold", role), row.admit())
        small.step(1)
        self._add("small", small.step(1))
        large.step(1)
        self._add("large", large.step(1))
        for k in self.widths:
            large.step(1)
            self._add(("warm", k), large.step(k))
            for _ in range(SMALL_BEFORE_VERIFY):
                small.step(1)
            self._add(("verify", k), large.step(k))
        for role, row in self.rows.items():
            row.step(1)
            self._add(("warm first", role), row.step(len(row.prefix)))
        for k, timer in self.isolated.items():
            self._add(("isolated", k), timer.once())
        self._add("isolated small", self.isolated_small.once())

    def warm_up(self) -> None:
        self.sample()
        self.times = {}

    def result(self) -> dict:
        median = {key: statistics.median(times) for key, times in self.times.items()}
        by_width = lambda kind: {k: median[(kind, k)] for k in self.widths}  # noqa: E731
        cold = {role: max(0.0, median[("cold", role)] - median[("warm first", role)]) for role in self.rows}
        return {"small_step_s": median["small"], "large_step_s": median["large"], "large_verify_s": by_width("verify"),
                "verify_warm_s": by_width("warm"), "isolated_s": by_width("isolated"), "cold_extra_s": cold,
                "isolated_small_s": median["isolated small"],
                "cost_ratio_large_over_small": median["large"] / median["small"], "samples": len(self.times["small"])}


def cost_model(pair: ModelPair, text: str, max_width: int, reps: int = 20) -> dict:
    """The cost model timed now, ``reps`` times per step (see CostSampler to spread it over a run)."""
    sampler = CostSampler(pair, text, max_width)
    sampler.warm_up()
    for _ in range(reps):
        sampler.sample()
    return sampler.result()


def predict_seconds(stats: DecodeStats, cost: dict) -> float:
    """Decoder time a method's counted calls should take at the steps' costs alone (encoders, first steps
    and the scheduler's Python excluded: prediction.py adds them)."""
    verify = cost["large_verify_s"]
    plain = stats.plain_steps if stats.small_calls else stats.large_calls  # `large`: every call a plain step
    verifications = stats.large_calls - plain
    seconds = stats.small_calls * cost["small_step_s"] + plain * cost["large_step_s"]
    if verifications:
        seconds += verifications * interpolate(verify, (stats.draft_tokens + verifications) / verifications)
    return seconds


def interpolate(by_width: dict[int, float], width: float) -> float:
    """``by_width`` (seconds per call of each whole width) at a mean ``width``, clamped to the widths timed."""
    width = min(max(width, min(by_width)), max(by_width))
    low, high = int(width), min(int(width) + 1, max(by_width))
    return by_width[low] + (by_width[high] - by_width[low]) * (width - low)


def admission_seconds(pair: ModelPair, input_ids: torch.Tensor, roles: tuple[str, ...]) -> float:
    """Median seconds to admit one row as the scheduler does: encoder pass(es) and cross-attention
    keys/values of each model in ``roles`` (one encoder pass when the small model shares it)."""
    def admit():
        encoded = None
        for role in roles:
            encoded = pair.engine(role, 1).admit([0], [input_ids], encoded if pair.shares_encoder else None)

    times = [timed(pair.device, admit)[1] for _ in range(5)]
    for role in roles:
        pair.engine(role, 1).release(0)
    return statistics.median(times)


PAPER_SHAPES = {  # T5 v1.0 shapes (architecture only, random weights)
    "t5-small": dict(d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8, d_kv=64),
    "t5-large": dict(d_model=1024, d_ff=4096, num_layers=24, num_decoder_layers=24, num_heads=16, d_kv=64),
}


def projection(stats: dict[str, DecodeStats], text_len: int, max_width: int, device: torch.device,
               engine: str = "native", quantize: str = "none") -> dict:
    """Time T5-small/T5-large-shaped steps here (on the same kind of engine as the pair, int8 where
    it is) and apply each method's counted calls (``stats``, method -> summed counters) to them."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    engines = {}
    for name, shape in PAPER_SHAPES.items():
        model = T5ForConditionalGeneration(T5Config(vocab_size=32128, decoder_start_token_id=0, pad_token_id=0,
                                                    eos_token_id=1, **shape)).eval().to(device)
        kind = engine if native_unsupported_reason(model) is None else "hf"
        engines[name] = build_engine(model, kind, 1, quantize=quantize if kind != "hf" else "none")
    input_ids = torch.randint(3, 32000, (text_len,))
    prefix = torch.zeros((1,), dtype=torch.long)
    cost = {
        "small_step_s": time_step(engines["t5-small"], input_ids, prefix, 1, reps=5),
        "large_step_s": time_step(engines["t5-large"], input_ids, prefix, 1, reps=5),
        "large_verify_s": {k: time_step(engines["t5-large"], input_ids, prefix, k, reps=5)
                           for k in range(1, max_width + 2)},
    }
    predicted = {name: predict_seconds(counted, cost) for name, counted in stats.items() if counted.output_tokens}
    large = predicted.get("large")
    return {
        "cost": cost,
        "cost_ratio_large_over_small": cost["large_step_s"] / cost["small_step_s"],
        "predicted_decoder_seconds": predicted,
        "projected_speedup_vs_large": {name: large / value for name, value in predicted.items() if large and value},
    }
