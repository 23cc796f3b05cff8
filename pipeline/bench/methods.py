"""`bild-pipeline bench`: BiLD against the large model, HF generate, HF assisted generation and
CTranslate2 (when installed) on the same models.

Every method decodes the same inputs at batch size 1, greedy, with the same max_new_tokens, in
one process, interleaved (harness.interleave), so all ratios come from side-by-side measurements.
The cost model (cost.py) then predicts each of our methods' time from its counted calls.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

import numpy as np
import torch

from pipeline.bench.cost import CostSampler, admission_seconds, projection
from pipeline.bench.engines import compare_engines, render_engines
from pipeline.bench.harness import (
    Measured,
    bleu_line,
    dict_table,
    environment,
    environment_line,
    interleave,
    score_outputs,
)
from pipeline.bench.hf import hf_greedy, same_output
from pipeline.bench.prediction import EngineTime, price_methods, render_prediction
from pipeline.bench.rounds import RoundSampler
from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.stats import DecodeOutput, DecodeStats
from pipeline.metrics.interleaving import order_coverage
from pipeline.metrics.quality import signatures

OURS = ("large", "small", "bild", "speculative")
HF = ("hf_generate", "hf_assisted", "hf_assisted_confidence")
# CTranslate2 on the same checkpoints (pipeline.bench.ct2), in float32 and in int8 (its usual CPU setting).
CT2 = ("ct2_large", "ct2_small", "ct2_large_int8", "ct2_small_int8")

COLUMNS = ["method", "tokens_per_s", "mean_latency_ms", "p90_latency_ms", "bleu", "exact_match_with_large",
           "speedup_vs_large", "speed_vs_ct2_large", "speed_vs_ct2_large_int8", "small_token_share", "fallbacks_per_100_tokens",
           "rollbacks_per_100_tokens", "measured_over_predicted"]


# A drafting method's row name may say how its windows are chosen: `bild` runs the default (measured windows,
# decoding.adaptive_draft on), `bild_fixed` always max_draft_tokens, `bild_adaptive` measured windows whatever
# the default (the name earlier benchmarks used).
FIXED, ADAPTIVE = "_fixed", "_adaptive"


def method_windows(name: str, config: DecodingConfig) -> DecodingConfig:
    """The config a row named ``name`` (a method, perhaps with a FIXED or ADAPTIVE suffix) decodes with."""
    for suffix, adaptive in ((FIXED, False), (ADAPTIVE, True)):
        if name.endswith(suffix):
            return dataclasses.replace(config, method=name.removesuffix(suffix), adaptive_draft=adaptive)
    return dataclasses.replace(config, method=name)


def method_of(name: str) -> str:
    """The decoding method a row named ``name`` runs (its windows' suffix dropped)."""
    return name.removesuffix(FIXED).removesuffix(ADAPTIVE)


def fixed_variants(bild: DecodingConfig) -> dict[str, DecodingConfig]:
    """`bild` and `speculative` with fixed windows (bild_fixed, speculative_fixed): beside the default rows,
    what measured windows change."""
    return {f"{method}{FIXED}": dataclasses.replace(method_windows(f"{method}{FIXED}", bild), do_sample=False)
            for method in ("bild", "speculative")}


def cascade_variants(bild: DecodingConfig, cascades: list[tuple[str, float]]) -> dict[str, DecodingConfig]:
    """Rows named as sweep points name them (`cascade_chow_a0.3`): `method: cascade` with each (rule, α),
    the window and limits of `bild`."""
    return {f"cascade_{rule}_a{alpha:g}": dataclasses.replace(bild, method="cascade", deferral=rule,
                                                              deferral_threshold=alpha, do_sample=False)
            for rule, alpha in cascades}


def our_configs(bild: DecodingConfig, variants: dict[str, DecodingConfig]) -> dict[str, DecodingConfig]:
    """Each of our rows' decoding settings: OURS with ``bild``'s settings, then the variants."""
    return {**{name: dataclasses.replace(bild, method=name, do_sample=False) for name in OURS}, **variants}


def _decoder(pair: ModelPair, name: str, bild: DecodingConfig, ct2: dict | None,
             variants: dict[str, DecodingConfig]) -> Callable[[torch.Tensor], DecodeOutput]:
    """One method as input ids -> DecodeOutput (counters only for ours)."""
    limit = bild.max_new_tokens
    ours = our_configs(bild, variants)
    if name in ours:
        return Generator(pair, ours[name]).decode_ids
    if name in CT2:
        model = ct2[name.removeprefix("ct2_")]
        return lambda ids: DecodeOutput(model.generate([ids[0].tolist()], limit)[0])
    hf_options = {"hf_generate": {}, "hf_assisted": {"assistant": pair.small},
                  "hf_assisted_confidence": {"assistant": pair.small, "confidence": bild.fallback_threshold}}[name]
    return lambda ids: DecodeOutput(hf_greedy(pair, ids, limit, **hf_options))


def run_methods(pair: ModelPair, encoded: list[torch.Tensor], bild: DecodingConfig, repeats: int,
                methods: tuple[str, ...] = OURS + HF,
                between_records: Callable[[], None] | None = None, ct2: dict | None = None,
                variants: dict[str, DecodingConfig] | None = None,
                engine_time: dict[str, EngineTime] | None = None) -> dict[str, Measured]:
    """Every method on every input (``encoded``: [1, S] ids on the pair's device), interleaved;
    ``between_records`` runs after each input's turn. ``ct2`` holds the CTranslate2 models
    ({"small": CT2Model, "large": ...}) the ct2_* methods run; ``variants`` more of our methods
    under their own names (cascade_variants); ``engine_time`` an EngineTime per method to keep its engines'
    seconds."""
    variants = variants or {}
    decoders = {name: _decoder(pair, name, bild, ct2, variants) for name in (*methods, *variants)}
    for name, kept in (engine_time or {}).items():
        decoders[name] = kept.wrap(decoders[name])
    by_index = {name: (lambda index, decode=decode: decode(encoded[index])) for name, decode in decoders.items()}
    return interleave(by_index, len(encoded), repeats, pair.device, between_inputs=between_records)


def summarize_methods(pair: ModelPair, runs: dict[str, Measured], references: list[str] | None) -> list[dict]:
    large, ct2_large, ct2_int8 = runs.get("large"), runs.get("ct2_large"), runs.get("ct2_large_int8")
    rows = []
    for name, run in runs.items():
        tokens = [output.tokens for output in run.last]
        seconds = np.asarray(run.all_seconds)
        output_tokens = sum(len(t) for t in tokens)
        row = {
            "method": name,
            "tokens_per_s": output_tokens * run.repeats / seconds.sum(),
            "mean_latency_ms": 1000 * seconds.mean(),
            "p90_latency_ms": 1000 * float(np.percentile(seconds, 90)),
            "output_tokens": output_tokens,
        }
        if references:
            row["bleu"] = score_outputs(pair.tokenizer, tokens, references).bleu
        if large is not None:
            same = sum(same_output(mine.tokens, theirs.tokens, pair.eos_token_ids)
                       for mine, theirs in zip(run.last, large.last))
            row["exact_match_with_large"] = same / len(tokens)
            row["speedup_vs_large"] = large.total_seconds / run.total_seconds
        if ct2_large is not None:
            row["speed_vs_ct2_large"] = ct2_large.total_seconds / run.total_seconds
        if ct2_int8 is not None:
            row["speed_vs_ct2_large_int8"] = ct2_int8.total_seconds / run.total_seconds
        stats = DecodeStats.total(output.stats for output in run.last)
        if stats.output_tokens and (stats.small_calls or stats.large_calls):  # ours: counted calls
            row.update(small_token_share=stats.small_token_share,
                       fallbacks_per_100_tokens=stats.fallbacks_per_100_tokens,
                       rollbacks_per_100_tokens=stats.rollbacks_per_100_tokens,
                       small_calls=stats.small_calls, large_calls=stats.large_calls)
        rows.append(row)
    return rows


def run_bench(pair: ModelPair, texts: list[str], references: list[str] | None, bild: DecodingConfig,
              repeats: int = 3, with_projection: bool = True, ct2: dict | None = None,
              with_engines: bool = False, variants: dict[str, DecodingConfig] | None = None) -> dict:
    """The whole benchmark; ``ct2`` ({"small": CT2Model, "large": ...}) adds the CTranslate2 rows,
    ``with_engines`` our native engine against Hugging Face's on the same pair (engines.py),
    ``variants`` rows of our methods at other settings (cascade_variants)."""
    variants = variants or {}
    methods = OURS + HF + (CT2 if ct2 else ())
    encoder = Generator(pair, bild)
    encoded = [encoder.encode(text)[0].to(pair.device) for text in texts]  # [1, S] each
    configs = our_configs(bild, variants)
    # The cost model's timings, a few between each input's turn (the same phases of the machine as the runs):
    # engine calls by regime, and scripted records of each method on the real engines (prediction.py).
    steps, rounds = CostSampler(pair, texts[0], bild.max_draft_tokens), RoundSampler(pair, configs, encoded[0][0])
    steps.warm_up()
    rounds.warm_up()

    def between_records() -> None:
        rounds.sample()  # first: its record follows the turn's last method, as each method's record follows another
        steps.sample()

    engine_time = {name: EngineTime(pair) for name in configs}
    runs = run_methods(pair, encoded, bild, repeats, methods, between_records=between_records, ct2=ct2,
                       variants=variants, engine_time=engine_time)
    rows = summarize_methods(pair, runs, references)
    small = pair.engine("small", 1)  # every small-model step of the runs above (and of the cost sampler)
    small_steps = {"calls": small.calls, "runtime_ms": 1000 * small.runtime_seconds / max(small.calls, 1),
                   "python_ms": 1000 * (small.forward_seconds - small.runtime_seconds) / max(small.calls, 1)}
    while any(rounds.parts(config) is None for config in configs.values()):
        rounds.sample()  # a short run: every scripted record once at least
    cost = steps.result()
    stats = {name: DecodeStats.total(output.stats for output in runs[name].last) for name in configs}
    priced = price_methods(pair, configs, {name: runs[name].last for name in configs},
                           {name: runs[name].total_seconds / repeats for name in configs}, engine_time, rounds, cost,
                           {"run": _admissions(pair, encoded), "scripted": _admissions(pair, encoded[:1])},
                           encoded[0][0])
    for row in rows:
        if row["method"] in configs:
            p = priced["methods"][row["method"]]
            row["predicted_s"] = p["predicted_s"]
            row["measured_over_predicted"] = p["measured_s"] / p["predicted_s"]
    report = {"inputs": len(texts), "repeats": repeats, "order": order_coverage(len(runs), len(texts) * repeats),
              "decoding": bild.to_dict(), **environment(pair),
              "ct2": ct2["large"].description if ct2 else None, "methods": rows, "cost_model": cost,
              "small_steps": small_steps, "prediction": priced}
    if references:
        report["bleu_signature"] = signatures("translation")["bleu"]
    if with_engines:
        report["engines"] = compare_engines(pair, texts, bild, repeats)
    if with_projection:
        lengths = [ids.shape[1] for ids in encoded]
        report["projection"] = projection(stats, int(np.median(lengths)), bild.max_draft_tokens, pair.device,
                                          pair.engine_kind, pair.quantize)
    return report


def _admissions(pair: ModelPair, encoded: list[torch.Tensor]) -> dict[str, float]:
    """Mean seconds to admit one of ``encoded``'s records by role: "large", "small" alone, and "small beside
    large" (what admitting the small model adds where the large one was admitted: its cross-attention
    projections alone where it shares the large model's encoder)."""
    seconds = {name: statistics.mean(admission_seconds(pair, ids[0], roles) for ids in encoded)
               for name, roles in (("large", ("large",)), ("small", ("small",)), ("both", ("large", "small")))}
    return {"large": seconds["large"], "small": seconds["small"],
            "small beside large": max(0.0, seconds["both"] - seconds["large"])}


def render_markdown(report: dict) -> str:
    lines = [f"inputs: {report['inputs']}, repetitions: {report['repeats']} (interleaved, {report['order']}), "
             + environment_line(report), f"decoding: {report['decoding']}", ""]
    lines += dict_table(COLUMNS, report["methods"]) + bleu_line(report)
    cost = report["cost_model"]
    lines += ["", f"Cost model: each step timed {cost['samples']} times between the runs' records, in the regime "
              f"the loop runs it (pipeline/bench/cost.py): small step {1000 * cost['small_step_s']:.3f} ms, large "
              f"step {1000 * cost['large_step_s']:.3f} ms (ratio {cost['cost_ratio_large_over_small']:.2f}); large "
              "verification of k tokens after small steps: "
              + ", ".join(f"k={k} {1000 * v:.3f} ms" for k, v in cost["large_verify_s"].items())]
    if "prediction" in report:
        lines += render_prediction(report["prediction"], cost)
    steps = report.get("small_steps")
    if steps and steps["runtime_ms"] > 0:  # an engine with one runtime call per step (onnx)
        lines += ["", f"Small-model steps ({steps['calls']}): {steps['runtime_ms']:.3f} ms in the runtime's call, "
                  f"{steps['python_ms']:.3f} ms of the engine's Python around it "
                  f"({steps['python_ms'] / steps['runtime_ms']:.0%} of the runtime's time)."]
    if "engines" in report:
        lines += ["", render_engines(report["engines"])]
    if "projection" in report:
        p = report["projection"]
        lines += ["", "**Projection** (not a measurement of real models): T5-small/T5-large shapes with random "
                  f"weights timed here (step ratio {p['cost_ratio_large_over_small']:.1f}), combined with the call "
                  "counts measured above: projected speedup over `large`: "
                  + ", ".join(f"{k} {v:.2f}x" for k, v in p["projected_speedup_vs_large"].items())]
    return "\n".join(lines)
