"""The paper's Table 1, on our pair: BLEU and speedup of large, small, aligned small, BiLD unaligned
and BiLD aligned, measured side by side in one run (every sentence decoded by every method in turn,
in a rotating order), greedy, batch size 1.

    python scripts/demo_table.py --models models/demo-de-en --source ../shared/data/multi30k/test_2016_flickr.de \
        --reference ../shared/data/multi30k/test_2016_flickr.en --preset configs/decoding/demo_de_en.yaml
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import sacrebleu
import torch
import yaml

from pipeline.bench.cost import cost_model
from pipeline.decoding import DecodingConfig, Generator, ModelPair, load_model
from pipeline.decoding.stats import DecodeStats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", required=True, help="Folder with large/, small/, small-aligned/")
    parser.add_argument("--source", required=True)
    parser.add_argument("--reference", required=True)
    parser.add_argument("--preset", required=True, help="Decoding preset with the chosen thresholds.")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--engine", default="auto", choices=["auto", "native", "hf"])
    parser.add_argument("--out", default=None, help="Write table.md and table.json here.")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    models = Path(args.models)
    large = load_model(str(models / "large"))
    small = load_model(str(models / "small"))
    aligned = load_model(str(models / "small-aligned"))
    tokenizer = ModelPair.from_pretrained(str(models / "small"), str(models / "large"), device="cpu").tokenizer
    unaligned_pair = ModelPair(small, large, tokenizer, torch.device("cpu"), engine_request=args.engine)
    aligned_pair = ModelPair(aligned, large, tokenizer, torch.device("cpu"), engine_request=args.engine)
    preset = yaml.safe_load(Path(args.preset).read_text())["decoding"]
    base = DecodingConfig(max_new_tokens=args.max_new_tokens)
    bild = dataclasses.replace(base, method="bild", fallback_threshold=preset["fallback_threshold"],
                               rollback_threshold=preset["rollback_threshold"],
                               max_draft_tokens=preset.get("max_draft_tokens", base.max_draft_tokens))
    methods = {
        "large": Generator(unaligned_pair, dataclasses.replace(base, method="large")),
        "small": Generator(unaligned_pair, dataclasses.replace(base, method="small")),
        "small (aligned)": Generator(aligned_pair, dataclasses.replace(base, method="small")),
        "BiLD (unaligned)": Generator(unaligned_pair, bild),
        "BiLD (aligned)": Generator(aligned_pair, bild),
    }
    sources = Path(args.source).read_text(encoding="utf-8").splitlines()[: args.limit]
    references = Path(args.reference).read_text(encoding="utf-8").splitlines()[: args.limit]
    names = list(methods)
    outputs = {name: [""] * len(sources) for name in names}
    seconds = dict.fromkeys(names, 0.0)
    stats = {name: DecodeStats() for name in names}
    for generator in methods.values():
        generator.generate_one("Ein Hund.")  # warm-up
    for index, text in enumerate(sources):
        for name in names[index % len(names):] + names[: index % len(names)]:
            start = time.perf_counter()
            result = methods[name].generate_one(text)
            seconds[name] += time.perf_counter() - start
            outputs[name][index] = result.prediction or ""
            for key, value in result.stats.to_dict().items():
                setattr(stats[name], key, getattr(stats[name], key) + value)

    rows = []
    for name in names:
        s = stats[name]
        rows.append({
            "method": name,
            "bleu": sacrebleu.corpus_bleu(outputs[name], [references]).score,
            "speedup_vs_large": seconds["large"] / seconds[name],
            "small_token_share": s.small_tokens / s.output_tokens,
            "fallbacks_per_100_tokens": 100 * s.fallbacks / s.output_tokens,
            "rollbacks_per_100_tokens": 100 * s.rollbacks / s.output_tokens,
            "draft_acceptance": s.small_tokens / s.draft_tokens if s.draft_tokens else None,
        })
    cost = cost_model(unaligned_pair, sources[0], bild.max_draft_tokens)
    lines = [f"test sentences: {len(sources)}; thresholds alpha_FB {bild.fallback_threshold}, "
             f"alpha_RB {bild.rollback_threshold}, window {bild.max_draft_tokens}; greedy, batch 1, "
             f"{args.threads} torch thread(s); large/small decode-step cost ratio "
             f"{cost['cost_ratio_large_over_small']:.1f} (small {1000 * cost['small_step_s']:.2f} ms, "
             f"large {1000 * cost['large_step_s']:.2f} ms)", "",
             "| method | BLEU | speedup vs large | small-model share | fallbacks /100 tok | rollbacks /100 tok "
             "| drafts kept |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        kept = f"{100 * row['draft_acceptance']:.1f}%" if row["draft_acceptance"] is not None else ""
        lines.append(f"| {row['method']} | {row['bleu']:.2f} | {row['speedup_vs_large']:.2f}x | "
                     f"{100 * row['small_token_share']:.1f}% | {row['fallbacks_per_100_tokens']:.1f} | "
                     f"{row['rollbacks_per_100_tokens']:.1f} | {kept} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "table.md").write_text(table + "\n")
        (Path(args.out) / "table.json").write_text(json.dumps({"rows": rows, "cost": cost}, indent=2, default=str))


if __name__ == "__main__":
    main()
