"""`bild-pipeline bench`: BiLD against the large model, HF generate, HF assisted generation and
CTranslate2 (when installed) on the same models.

Every method decodes the same inputs at batch size 1, greedy, with the same max_new_tokens, in
one process, interleaved (harness.interleave), so all ratios come from side-by-side measurements.
The cost model (cost.py) then predicts each of our methods' time from its counted calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch

from pipeline.bench.cost import CostSampler, admission_seconds, predict_seconds, projection
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


ADAPTIVE = "_adaptive"  # a method's row with decoding.adaptive_draft on (bild_adaptive, speculative_adaptive)


def adaptive_variants(bild: DecodingConfig) -> dict[str, DecodingConfig]:
    """`bild` and `speculative` with each round's window chosen from measured costs (draft_length.py)."""
    return {f"{method}{ADAPTIVE}": dataclasses.replace(bild, method=method, adaptive_draft=True, do_sample=False)
            for method in ("bild", "speculative")}


def cascade_variants(bild: DecodingConfig, cascades: list[tuple[str, float]]) -> dict[str, DecodingConfig]:
    """Rows named as sweep points name them (`cascade_chow_a0.3`): `method: cascade` with each (rule, α),
    the window and limits of `bild`."""
    return {f"cascade_{rule}_a{alpha:g}": dataclasses.replace(bild, method="cascade", deferral=rule,
                                                              deferral_threshold=alpha, do_sample=False)
            for rule, alpha in cascades}


def _decoder(pair: ModelPair, name: str, bild: DecodingConfig, ct2: dict | None,
             variants: dict[str, DecodingConfig]) -> Callable[[torch.Tensor], DecodeOutput]:
    """One method as input ids -> DecodeOutput (counters only for ours)."""
    limit = bild.max_new_tokens
    if name in variants:
        return Generator(pair, variants[name]).decode_ids
    if name in OURS:
        return Generator(pair, dataclasses.replace(bild, method=name, do_sample=False)).decode_ids
    if name in CT2:
        model = ct2[name.removeprefix("ct2_")]
        return lambda ids: DecodeOutput(model.generate([ids[0].tolist()], limit)[0])
    hf_options = {"hf_generate": {}, "hf_assisted": {"assistant": pair.small},
                  "hf_assisted_confidence": {"assistant": pair.small, "confidence": bild.fallback_threshold}}[name]
    return lambda ids: DecodeOutput(hf_greedy(pair, ids, limit, **hf_options))


def run_methods(pair: ModelPair, encoded: list[torch.Tensor], bild: DecodingConfig, repeats: int,
                methods: tuple[str, ...] = OURS + HF,
                between_records: Callable[[], None] | None = None, ct2: dict | None = None,
                variants: dict[str, DecodingConfig] | None = None) -> dict[str, Measured]:
    """Every method on every input (``encoded``: [1, S] ids on the pair's device), interleaved;
    ``between_records`` runs after each input's turn. ``ct2`` holds the CTranslate2 models
    ({"small": CT2Model, "large": ...}) the ct2_* methods run; ``variants`` more of our methods
    under their own names (cascade_variants)."""
    variants = variants or {}
    decoders = {name: _decoder(pair, name, bild, ct2, variants) for name in (*methods, *variants)}
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
    sampler = CostSampler(pair, texts[0], bild.max_draft_tokens)
    sampler.warm_up()
    methods = OURS + HF + (CT2 if ct2 else ())
    encoder = Generator(pair, bild)
    encoded = [encoder.encode(text)[0].to(pair.device) for text in texts]  # [1, S] each
    runs = run_methods(pair, encoded, bild, repeats, methods, between_records=sampler.sample, ct2=ct2,
                       variants=variants)
    rows = summarize_methods(pair, runs, references)
    small = pair.engine("small", 1)  # every small-model step of the runs above (and of the cost sampler)
    small_steps = {"calls": small.calls, "runtime_ms": 1000 * small.runtime_seconds / max(small.calls, 1),
                   "python_ms": 1000 * (small.forward_seconds - small.runtime_seconds) / max(small.calls, 1)}
    cost = sampler.result()
    ours = (*OURS, *variants)
    stats = {name: DecodeStats.total(output.stats for output in runs[name].last) for name in ours}
    encoders = {name: sum(admission_seconds(pair, ids[0], roles) for ids in encoded)
                for name, roles in (("large", ("large",)), ("small", ("small",)), ("both", ("large", "small")))}
    for row in rows:
        name = row["method"]
        if name in ours:
            encoder = encoders[name if name in ("large", "small") else "both"]
            row["predicted_s"] = encoder + predict_seconds(stats[name], cost)
            row["measured_over_predicted"] = runs[name].total_seconds / repeats / row["predicted_s"]
    report = {"inputs": len(texts), "repeats": repeats, "order": order_coverage(len(runs), len(texts) * repeats),
              "decoding": bild.to_dict(), **environment(pair),
              "ct2": ct2["large"].description if ct2 else None, "methods": rows, "cost_model": cost,
              "small_steps": small_steps}
    if references:
        report["bleu_signature"] = signatures("translation")["bleu"]
    if with_engines:
        report["engines"] = compare_engines(pair, texts, bild, repeats)
    if with_projection:
        lengths = [ids.shape[1] for ids in encoded]
        report["projection"] = projection(stats, int(np.median(lengths)), bild.max_draft_tokens, pair.device,
                                          pair.engine_kind, pair.quantize)
    return report


def render_markdown(report: dict) -> str:
    lines = [f"inputs: {report['inputs']}, repetitions: {report['repeats']} (interleaved, {report['order']}), "
             + environment_line(report), f"decoding: {report['decoding']}", ""]
    lines += dict_table(COLUMNS, report["methods"]) + bleu_line(report)
    cost = report["cost_model"]
    sampled = f", each step timed {cost['samples']} times between the runs' records" if "samples" in cost else ""
    lines += ["", f"Cost model (median seconds on this hardware{sampled}): "
              f"small step {1000 * cost['small_step_s']:.3f} ms, large step {1000 * cost['large_step_s']:.3f} ms "
              f"(ratio {cost['cost_ratio_large_over_small']:.2f}); large verification of k tokens: "
              + ", ".join(f"k={k} {1000 * v:.3f} ms" for k, v in cost["large_verify_s"].items())]
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
