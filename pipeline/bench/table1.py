"""`bild-pipeline bench-table1`: the paper's Table 1 on our pair — BLEU and speedup of large, small,
aligned small, BiLD unaligned and BiLD aligned, measured side by side in one run (every sentence
decoded by every method in turn, in a balanced order), greedy, batch size 1.

    bild-pipeline bench-table1 --models models/demo-de-en --source ../shared/data/multi30k/test_2016_flickr.de \\
        --reference ../shared/data/multi30k/test_2016_flickr.en --preset configs/decoding/demo_de_en.yaml
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from transformers import AutoTokenizer

from pipeline.bench.cost import cost_model
from pipeline.bench.harness import bleu_line, interleave, markdown_table
from pipeline.decoding import DecodingConfig, Generator, ModelPair, load_model
from pipeline.decoding.pair_check import check_tokenizers_match
from pipeline.decoding.stats import DecodeStats
from pipeline.jobs.files import read_mapping
from pipeline.metrics.quality import signatures, translation_scores

HEADER = ["method", "BLEU", "speedup vs large", "small-model share", "fallbacks /100 tok", "rollbacks /100 tok",
          "drafts kept"]


def bild_config(preset: Path, max_new_tokens: int) -> DecodingConfig:
    """BiLD with the thresholds (and window, and how it is chosen) of a decoding preset file."""
    chosen = read_mapping(preset, str(preset), "preset file")["decoding"]
    base = DecodingConfig(max_new_tokens=max_new_tokens)
    return dataclasses.replace(base, method="bild", fallback_threshold=chosen["fallback_threshold"],
                               rollback_threshold=chosen["rollback_threshold"],
                               max_draft_tokens=chosen.get("max_draft_tokens", base.max_draft_tokens),
                               adaptive_draft=chosen.get("adaptive_draft", base.adaptive_draft))


def table1_generators(models: Path, bild: DecodingConfig, engine: str, quantize: str = "none") -> dict[str, Generator]:
    """The table's five methods over models/large, small and small-aligned (one tokenizer, the
    large model's, as ModelPair.from_pretrained would pick)."""
    large, small, aligned = (load_model(str(models / name)) for name in ("large", "small", "small-aligned"))
    tokenizer = AutoTokenizer.from_pretrained(str(models / "large"))
    for small_model in ("small", "small-aligned"):
        check_tokenizers_match(str(models / small_model), tokenizer, trust_remote_code=False)
    cpu = torch.device("cpu")
    unaligned_pair = ModelPair(small, large, tokenizer, cpu, engine_request=engine, quantize=quantize)
    aligned_pair = ModelPair(aligned, large, tokenizer, cpu, engine_request=engine, quantize=quantize)
    large_only = DecodingConfig(method="large", max_new_tokens=bild.max_new_tokens)
    small_only = dataclasses.replace(large_only, method="small")
    return {
        "large": Generator(unaligned_pair, large_only),
        "small": Generator(unaligned_pair, small_only),
        "small (aligned)": Generator(aligned_pair, small_only),
        "BiLD (unaligned)": Generator(unaligned_pair, bild),
        "BiLD (aligned)": Generator(aligned_pair, bild),
    }


def run_table1(models: str | Path, source: str | Path, reference: str | Path, preset: str | Path, *,
               limit: int | None = None, max_new_tokens: int = 64, engine: str = "auto", quantize: str = "none") -> dict:
    bild = bild_config(Path(preset), max_new_tokens)
    generators = table1_generators(Path(models), bild, engine, quantize)
    sources = Path(source).read_text(encoding="utf-8").splitlines()[:limit]
    references = Path(reference).read_text(encoding="utf-8").splitlines()[:limit]
    runs = interleave({name: (lambda index, g=generator: g.generate_one(sources[index]))
                       for name, generator in generators.items()}, len(sources), 1, torch.device("cpu"))
    rows = []
    for name, run in runs.items():
        scores = translation_scores([result.prediction or "" for result in run.last], references)
        stats = DecodeStats.total(result.stats for result in run.last)
        rows.append({
            "method": name,
            "bleu": scores.bleu,
            "speedup_vs_large": runs["large"].total_seconds / run.total_seconds,
            "small_token_share": stats.small_token_share,
            "fallbacks_per_100_tokens": stats.fallbacks_per_100_tokens,
            "rollbacks_per_100_tokens": stats.rollbacks_per_100_tokens,
            "draft_acceptance": stats.draft_acceptance,
        })
    cost = cost_model(generators["BiLD (unaligned)"].decoder.pair, sources[0], bild.max_draft_tokens)
    return {"sentences": len(sources), "decoding": bild.to_dict(), "torch_threads": torch.get_num_threads(),
            "bleu_signature": signatures("translation")["bleu"], "rows": rows, "cost": cost}


def render_markdown(report: dict) -> str:
    bild, cost = report["decoding"], report["cost"]
    head = (f"test sentences: {report['sentences']}; thresholds alpha_FB {bild['fallback_threshold']}, "
            f"alpha_RB {bild['rollback_threshold']}, window {bild['max_draft_tokens']}; greedy, batch 1, "
            f"{report['torch_threads']} torch thread(s); large/small decode-step cost ratio "
            f"{cost['cost_ratio_large_over_small']:.1f} (small {1000 * cost['small_step_s']:.2f} ms, "
            f"large {1000 * cost['large_step_s']:.2f} ms)")
    rows = [[row["method"], f"{row['bleu']:.2f}", f"{row['speedup_vs_large']:.2f}x",
             f"{100 * row['small_token_share']:.1f}%", f"{row['fallbacks_per_100_tokens']:.1f}",
             f"{row['rollbacks_per_100_tokens']:.1f}",
             f"{100 * row['draft_acceptance']:.1f}%" if row["draft_acceptance"] is not None else ""]
            for row in report["rows"]]
    return "\n".join([head, "", *markdown_table(HEADER, rows), *bleu_line(report)])
