"""`bild-pipeline bench`: BiLD against the large model, HF generate, HF assisted generation and
CTranslate2 (when installed) on the same models.

Every method decodes the same inputs at batch size 1, greedy, with the same max_new_tokens, in
one process; for each input the methods run back to back in a rotating order, and repetitions
repeat that, so all ratios come from side-by-side measurements. A cost model then times single
model steps on this hardware and predicts each method's time from its counted calls.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import sacrebleu
import torch

from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.engine import Engine, Feed
from pipeline.decoding.models import build_engine, native_unsupported_reason
from pipeline.decoding.stats import DecodeStats

OURS = ("large", "small", "bild", "speculative")
HF = ("hf_generate", "hf_assisted", "hf_assisted_confidence")
CT2 = ("ct2_large", "ct2_small")  # CTranslate2 on the same checkpoints (pipeline.bench.ct2)


@dataclass
class MethodRun:
    name: str
    seconds: list[float] = field(default_factory=list)  # per record, all repetitions
    tokens: dict[int, list[int]] = field(default_factory=dict)  # input index -> generated ids
    stats: DecodeStats = field(default_factory=DecodeStats)  # summed over the last repetition

    def add_stats(self, stats: DecodeStats) -> None:
        for key, value in stats.to_dict().items():
            setattr(self.stats, key, getattr(self.stats, key) + value)


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def _hf_cache_workaround(*models):
    """transformers sizes a T5 decoder cache by the *encoder* depth (num_layers), which breaks
    generate() for pairs whose decoder depth differs; for HF's own runs, let it see the decoder's."""
    saved = []
    for model in models:
        config = model.config
        if getattr(config, "num_decoder_layers", None) not in (None, getattr(config, "num_layers", None)):
            saved.append((config, config.num_layers))
            config.num_layers = config.num_decoder_layers
    try:
        yield
    finally:
        for config, layers in saved:
            config.num_layers = layers


def hf_greedy(pair: ModelPair, input_ids: torch.Tensor, max_new_tokens: int, assistant=None,
            confidence: float | None = None) -> list[int]:
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                  attention_mask=torch.ones_like(input_ids))
    if assistant is not None:
        kwargs["assistant_model"] = assistant
        if confidence is not None:
            kwargs["assistant_confidence_threshold"] = confidence
    with torch.inference_mode(), _hf_cache_workaround(pair.large, pair.small):
        out = pair.large.generate(input_ids, **kwargs)
    start = len(pair.decoder_prefix(input_ids[0]))  # the start token (and a forced first token), or the prompt
    return out[0, start:].tolist()


def run_methods(pair: ModelPair, texts: list[str], bild: DecodingConfig, repeats: int,
                methods: tuple[str, ...] = OURS + HF,
                between_records: Callable[[], None] | None = None, ct2: dict | None = None) -> dict[str, MethodRun]:
    """Every method on every input, interleaved; ``between_records`` runs after each input's turn.
    ``ct2`` holds the CTranslate2 models ({"small": CT2Model, "large": ...}) the ct2_* methods run."""
    generators = {name: Generator(pair, dataclasses.replace(bild, method=name, do_sample=False))
                  for name in OURS if name in methods}
    encoded = [Generator(pair, bild).encode(text)[0].to(pair.device) for text in texts]
    runs = {name: MethodRun(name) for name in methods}
    for name, generator in generators.items():  # warm-up outside the measurements
        generator.decode_ids(encoded[0])
    for repeat in range(repeats):
        last = repeat == repeats - 1
        for index, input_ids in enumerate(encoded):
            order = methods[index % len(methods):] + methods[: index % len(methods)]  # rotate
            for name in order:
                sync_device(pair.device)
                start = time.perf_counter()
                if name in generators:
                    output = generators[name].decode_ids(input_ids)
                    tokens = output.tokens
                elif name == "hf_generate":
                    tokens = hf_greedy(pair, input_ids, bild.max_new_tokens)
                elif name in CT2:
                    tokens = ct2[name.removeprefix("ct2_")].generate([input_ids[0].tolist()], bild.max_new_tokens)[0]
                elif name == "hf_assisted":
                    tokens = hf_greedy(pair, input_ids, bild.max_new_tokens, assistant=pair.small)
                else:
                    tokens = hf_greedy(pair, input_ids, bild.max_new_tokens, assistant=pair.small,
                                     confidence=bild.fallback_threshold)
                sync_device(pair.device)
                runs[name].seconds.append(time.perf_counter() - start)
                if last:
                    runs[name].tokens[index] = tokens
                    if name in generators:
                        runs[name].add_stats(output.stats)
            if between_records is not None:
                between_records()
    return runs


def summarize_methods(pair: ModelPair, runs: dict[str, MethodRun], references: list[str] | None) -> list[dict]:
    large, ct2_large = runs.get("large"), runs.get("ct2_large")
    rows = []
    for name, run in runs.items():
        tokens = sum(len(t) for t in run.tokens.values())
        per_rep_tokens = tokens
        seconds = np.asarray(run.seconds)
        repeats = len(seconds) // max(len(run.tokens), 1)
        texts = [pair.tokenizer.decode(run.tokens[i], skip_special_tokens=True) for i in sorted(run.tokens)]
        row = {
            "method": name,
            "tokens_per_s": per_rep_tokens * repeats / seconds.sum(),
            "mean_latency_ms": 1000 * seconds.mean(),
            "p90_latency_ms": 1000 * float(np.percentile(seconds, 90)),
            "output_tokens": tokens,
        }
        if references:
            row["bleu"] = sacrebleu.corpus_bleu(texts, [references[: len(texts)]]).score
        if large is not None:
            same = sum(_same_output(run.tokens[i], large.tokens[i], pair.eos_token_ids) for i in run.tokens)
            row["exact_match_with_large"] = same / len(run.tokens)
            row["speedup_vs_large"] = float(np.sum(large.seconds) / seconds.sum())
        if ct2_large is not None:
            row["speed_vs_ct2_large"] = float(np.sum(ct2_large.seconds) / seconds.sum())
        if name in OURS and run.stats.output_tokens:
            s = run.stats
            row.update(small_token_share=s.small_tokens / s.output_tokens,
                       fallbacks_per_100_tokens=100 * s.fallbacks / s.output_tokens,
                       rollbacks_per_100_tokens=100 * s.rollbacks / s.output_tokens,
                       small_calls=s.small_calls, large_calls=s.large_calls)
        rows.append(row)
    return rows


def _same_output(a: list[int], b: list[int], eos: frozenset[int]) -> bool:
    """Equal token ids, ignoring what HF pads after EOS."""
    def cut(tokens):
        for i, t in enumerate(tokens):
            if t in eos:
                return tokens[: i + 1]
        return tokens
    return cut(a) == cut(b)


# --- cost model --------------------------------------------------------------------------------------


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
        sync_device(engine.device)
        start = time.perf_counter()
        engine.forward(Feed([0], self.tokens[:, cached:], [cached], [self.width], [self.width]))
        sync_device(engine.device)
        elapsed = time.perf_counter() - start
        engine.release(0)
        return elapsed


def time_step(engine: Engine, input_ids: torch.Tensor, prefix: torch.Tensor, width: int, context: int = 16,
              reps: int = 20) -> float:
    """Median seconds of one engine forward feeding `width` new tokens after `context` cached ones."""
    timer = _StepTimer(engine, input_ids, prefix, width, context)
    return statistics.median(timer.once() for _ in range(reps))


class CostSampler:
    """The cost model's step timings, taken a few at a time between the records of the runs.

    A shared machine's speed drifts by tens of percent over minutes; timing the steps in the same
    phases as the runs keeps measured/predicted about the decode loop, not about the drift.
    """

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
    times = []
    for _ in range(5):
        sync_device(pair.device)
        start = time.perf_counter()
        encoded = None
        for role in roles:
            encoded = pair.engine(role, 1).admit([0], [input_ids], encoded if pair.shares_encoder else None)
        sync_device(pair.device)
        times.append(time.perf_counter() - start)
    for role in roles:
        pair.engine(role, 1).release(0)
    return statistics.median(times)


# --- the engines side by side ---------------------------------------------------------------------------


def compare_engines(pair: ModelPair, texts: list[str], config: DecodingConfig, repeats: int = 1) -> dict:
    """Our `large` on the native and on the Hugging Face engine, record by record in turn (rotating),
    with each engine's steps (a small step, a large step, a 5-draft verification) timed between the
    records; the tokens of both must be identical."""
    pairs = {kind: dataclasses.replace(pair, engine_request=kind) for kind in ("native", "hf")}
    if pairs["native"].engine_kind != "native":
        return {"skipped": "no native engine for this pair"}
    large = dataclasses.replace(config, method="large", do_sample=False)
    generators = {kind: Generator(each, large) for kind, each in pairs.items()}
    samplers = {kind: CostSampler(each, texts[0], 4) for kind, each in pairs.items()}
    encoded = [generators["native"].encode(text)[0].to(pair.device) for text in texts]
    for kind in pairs:  # warm-up outside the measurements
        generators[kind].decode_ids(encoded[0])
        samplers[kind].warm_up()
    seconds, tokens = dict.fromkeys(pairs, 0.0), {kind: [] for kind in pairs}
    for repeat in range(repeats):
        for index, input_ids in enumerate(encoded):
            for kind in (("native", "hf") if index % 2 == 0 else ("hf", "native")):
                sync_device(pair.device)
                start = time.perf_counter()
                output = generators[kind].decode_ids(input_ids)
                sync_device(pair.device)
                seconds[kind] += time.perf_counter() - start
                if repeat == repeats - 1:
                    tokens[kind].append(output.tokens)
                samplers[kind].sample()
    steps = {kind: sampler.result() for kind, sampler in samplers.items()}
    step_ms = {kind: {"small": 1000 * s["small_step_s"], "large": 1000 * s["large_step_s"],
                      "verify_5": 1000 * s["large_verify_s"][5]} for kind, s in steps.items()}
    return {
        "records": len(texts), "repeats": repeats,
        "identical_records": sum(a == b for a, b in zip(tokens["native"], tokens["hf"])),
        "large_seconds": seconds, "large_speed_native_over_hf": seconds["hf"] / seconds["native"],
        "step_ms": step_ms,
        "step_speed_native_over_hf": {step: step_ms["hf"][step] / step_ms["native"][step] for step in step_ms["hf"]},
    }


# --- the whole benchmark ------------------------------------------------------------------------------


PAPER_SHAPES = {  # T5 v1.0 shapes (architecture only, random weights)
    "t5-small": dict(d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8, d_kv=64),
    "t5-large": dict(d_model=1024, d_ff=4096, num_layers=24, num_decoder_layers=24, num_heads=16, d_kv=64),
}


def projection(runs: dict[str, MethodRun], text_len: int, max_width: int, device: torch.device,
               engine: str = "native") -> dict:
    """Time T5-small/T5-large-shaped steps here (on the same kind of engine as the pair) and apply the
    demo pair's call counts to them."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    engines = {}
    for name, shape in PAPER_SHAPES.items():
        model = T5ForConditionalGeneration(T5Config(vocab_size=32128, decoder_start_token_id=0, pad_token_id=0,
                                                    eos_token_id=1, **shape)).eval().to(device)
        engines[name] = build_engine(model, engine if native_unsupported_reason(model) is None else "hf", 1)
    input_ids = torch.randint(3, 32000, (text_len,))
    prefix = torch.zeros((1,), dtype=torch.long)
    cost = {
        "small_step_s": time_step(engines["t5-small"], input_ids, prefix, 1, reps=5),
        "large_step_s": time_step(engines["t5-large"], input_ids, prefix, 1, reps=5),
        "large_verify_s": {k: time_step(engines["t5-large"], input_ids, prefix, k, reps=5)
                           for k in range(1, max_width + 2)},
    }
    predicted = {name: predict_seconds(run.stats, cost) for name, run in runs.items() if run.stats.output_tokens}
    large = predicted.get("large")
    return {
        "cost": cost,
        "cost_ratio_large_over_small": cost["large_step_s"] / cost["small_step_s"],
        "predicted_decoder_seconds": predicted,
        "projected_speedup_vs_large": {name: large / value for name, value in predicted.items() if large and value},
    }


def run_bench(pair: ModelPair, texts: list[str], references: list[str] | None, bild: DecodingConfig,
              repeats: int = 3, with_projection: bool = True, ct2: dict | None = None,
              with_engines: bool = False) -> dict:
    """The whole benchmark; ``ct2`` ({"small": CT2Model, "large": ...}) adds the CTranslate2 rows,
    ``with_engines`` our native engine against Hugging Face's on the same pair (compare_engines)."""
    sampler = CostSampler(pair, texts[0], bild.max_draft_tokens)
    sampler.warm_up()
    methods = OURS + HF + (CT2 if ct2 else ())
    runs = run_methods(pair, texts, bild, repeats, methods, between_records=sampler.sample, ct2=ct2)
    rows = summarize_methods(pair, runs, references)
    cost = sampler.result()
    encoded = [Generator(pair, bild).encode(t)[0][0] for t in texts]
    encoders = {name: sum(admission_seconds(pair, ids, roles) for ids in encoded)
                for name, roles in (("large", ("large",)), ("small", ("small",)), ("both", ("large", "small")))}
    for row in rows:
        run = runs[row["method"]]
        if row["method"] in OURS:
            measured = float(np.sum(run.seconds)) / repeats
            enc = encoders["both" if row["method"] in ("bild", "speculative") else row["method"]]
            row["predicted_s"] = enc + predict_seconds(run.stats, cost)
            row["measured_over_predicted"] = measured / row["predicted_s"]
    report = {"inputs": len(texts), "repeats": repeats, "decoding": bild.to_dict(), "device": str(pair.device),
              "engine": pair.engine_kind, "ct2": ct2["large"].description if ct2 else None,
              "dtype": pair.dtype_name, "torch_threads": torch.get_num_threads(), "methods": rows,
              "cost_model": cost}
    if with_engines:
        report["engines"] = compare_engines(pair, texts, bild, repeats)
    if with_projection:
        lengths = [Generator(pair, bild).encode(t)[0].shape[1] for t in texts]
        report["projection"] = projection(runs, int(np.median(lengths)), bild.max_draft_tokens, pair.device,
                                          pair.engine_kind)
    return report


def render_markdown(report: dict) -> str:
    def cell(value):
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
        return "" if value is None else str(value)

    columns = ["method", "tokens_per_s", "mean_latency_ms", "p90_latency_ms", "bleu", "exact_match_with_large",
               "speedup_vs_large", "speed_vs_ct2_large", "small_token_share", "fallbacks_per_100_tokens", "rollbacks_per_100_tokens",
               "measured_over_predicted"]
    lines = [f"inputs: {report['inputs']}, repetitions: {report['repeats']} (interleaved, rotating order), "
             f"device {report['device']}, {report['dtype']}, torch threads {report['torch_threads']}, "
             f"engine {report.get('engine')}" + (f", CTranslate2 {report['ct2']}" if report.get("ct2") else ""),
             f"decoding: {report['decoding']}", "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in report["methods"]:
        lines.append("| " + " | ".join(cell(row.get(c)) for c in columns) + " |")
    cost = report["cost_model"]
    sampled = f", each step timed {cost['samples']} times between the runs' records" if "samples" in cost else ""
    lines += ["", f"Cost model (median seconds on this hardware{sampled}): "
              f"small step {1000 * cost['small_step_s']:.3f} ms, large step {1000 * cost['large_step_s']:.3f} ms "
              f"(ratio {cost['cost_ratio_large_over_small']:.2f}); large verification of k tokens: "
              + ", ".join(f"k={k} {1000 * v:.3f} ms" for k, v in cost["large_verify_s"].items())]
    if "engines" in report:
        lines += ["", render_engines(report["engines"])]
    if "projection" in report:
        p = report["projection"]
        lines += ["", "**Projection** (not a measurement of real models): T5-small/T5-large shapes with random "
                  f"weights timed here (step ratio {p['cost_ratio_large_over_small']:.1f}), combined with the call "
                  "counts measured above: projected speedup over `large`: "
                  + ", ".join(f"{k} {v:.2f}x" for k, v in p["projected_speedup_vs_large"].items())]
    return "\n".join(lines)


def render_engines(engines: dict) -> str:
    """The native-vs-Hugging-Face section of a bench report."""
    if "skipped" in engines:
        return f"**Engines**: {engines['skipped']}."
    ms, speed = engines["step_ms"], engines["step_speed_native_over_hf"]
    lines = [f"**Engines** (our `large` on each, record by record in turn; steps timed between the records): "
             f"native {engines['large_speed_native_over_hf']:.2f}x the speed of hf, "
             f"identical tokens in {engines['identical_records']} of {engines['records']} records", "",
             "| step | native ms | hf ms | native speed vs hf |", "|---|---|---|---|"]
    for step in ("small", "large", "verify_5"):
        lines.append(f"| {step} | {ms['native'][step]:.3f} | {ms['hf'][step]:.3f} | {speed[step]:.2f}x |")
    return "\n".join(lines)
