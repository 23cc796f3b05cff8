"""The cost model: single model steps timed on this hardware, and the time a method's counted
calls should take at those costs (measured/predicted then says how much the decode loop adds).

A shared machine's speed drifts by tens of percent over minutes, so CostSampler times the steps a
few at a time between the records of a run, in the same phases as the methods it explains.
"""

from __future__ import annotations

import statistics
from functools import partial

import numpy as np
import torch

from pipeline.bench.harness import timed
from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.engine import Engine, Feed
from pipeline.decoding.models import build_engine, native_unsupported_reason
from pipeline.decoding.stats import DecodeStats


class _StepTimer:
    """Times one engine forward (batch 1) feeding ``width`` new tokens after ``context`` cached ones."""

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


def time_step(engine: Engine, input_ids: torch.Tensor, prefix: torch.Tensor, width: int, context: int = 16,
              reps: int = 20) -> float:
    """Median seconds of one engine forward feeding `width` new tokens after `context` cached ones."""
    timer = _StepTimer(engine, input_ids, prefix, width, context)
    return statistics.median(timer.once() for _ in range(reps))


class CostSampler:
    """The cost model's step timings, taken a few at a time between the records of the runs."""

    def __init__(self, pair: ModelPair, text: str, max_width: int):
        input_ids = Generator(pair, DecodingConfig()).encode(text)[0][0]
        prefix = pair.decoder_prefix(input_ids)
        small, large = pair.engine("small", 1), pair.engine("large", 1)
        # A large-model step is its verification of one token (k=1): timed once, read as both.
        self.timers = {"small": _StepTimer(small, input_ids, prefix, 1)}
        self.timers.update({k: _StepTimer(large, input_ids, prefix, k) for k in range(1, max_width + 2)})
        self.times: dict = {key: [] for key in self.timers}

    def sample(self) -> None:
        for key, timer in self.timers.items():
            self.times[key].append(timer.once())

    def warm_up(self) -> None:
        self.sample()
        self.times = {key: [] for key in self.timers}

    def result(self) -> dict:
        median = {key: statistics.median(times) for key, times in self.times.items()}
        verify = {key: value for key, value in median.items() if isinstance(key, int)}
        return {"small_step_s": median["small"], "large_step_s": verify[1], "large_verify_s": verify,
                "cost_ratio_large_over_small": verify[1] / median["small"], "samples": len(self.times["small"])}


def cost_model(pair: ModelPair, text: str, max_width: int, reps: int = 20) -> dict:
    """The cost model timed now, ``reps`` times per step (see CostSampler to spread it over a run)."""
    sampler = CostSampler(pair, text, max_width)
    for _ in range(reps):
        sampler.sample()
    return sampler.result()


def predict_seconds(stats: DecodeStats, cost: dict) -> float:
    """Decoder time a method's counted calls should take (encoders excluded)."""
    verify = cost["large_verify_s"]
    if stats.large_calls:
        width = (stats.draft_tokens + stats.large_tokens) / stats.large_calls  # tokens fed per large call
        low, high = int(np.floor(width)), int(np.ceil(width))
        low, high = min(max(low, 1), max(verify)), min(max(high, 1), max(verify))
        per_call = verify[low] + (verify[high] - verify[low]) * (width - low)
    else:
        per_call = 0.0
    return stats.small_calls * cost["small_step_s"] + stats.large_calls * per_call


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
