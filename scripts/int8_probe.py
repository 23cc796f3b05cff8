"""Does int8 pay on this CPU? Our native engine with int8 matrices (pipeline/decoding/int8.py) against
float32, and CTranslate2's int8 against its float32, on the demo pair, side by side in one run.

    python scripts/int8_probe.py --source ../shared/data/multi30k/test_2016_flickr.de \
        --reference ../shared/data/multi30k/test_2016_flickr.en --limit 200

Every sentence is decoded by every variant in turn (batch 1, one thread, greedy, max 64 new tokens);
prints seconds, speed against our float32 `large`, and BLEU.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import sacrebleu
import torch

from pipeline.bench_ct2 import convert_pair
from pipeline.decoding import DecodingConfig, Generator, ModelPair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="models/demo-de-en")
    parser.add_argument("--source", required=True)
    parser.add_argument("--reference", required=True)
    parser.add_argument("--limit", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    small, large = str(Path(args.models) / "small-aligned"), str(Path(args.models) / "large")
    sources = Path(args.source).read_text(encoding="utf-8").splitlines()[: args.limit]
    references = Path(args.reference).read_text(encoding="utf-8").splitlines()[: args.limit]
    pairs = {dtype: ModelPair.from_pretrained(small, large, device="cpu", dtype=dtype) for dtype in ("float32", "int8")}
    variants = {}
    for dtype, pair in pairs.items():
        for method in ("large", "bild"):
            generator = Generator(pair, DecodingConfig(method=method, max_new_tokens=64, fallback_threshold=0.4,
                                                       rollback_threshold=1.0))
            variants[f"ours {method} {dtype}"] = lambda text, g=generator: g.generate_one(text).token_ids
    with tempfile.TemporaryDirectory() as work:
        for compute_type in ("float32", "int8"):
            ct2 = convert_pair(pairs["float32"], Path(work) / compute_type, compute_type=compute_type)["large"]
            encode = Generator(pairs["float32"], DecodingConfig()).encode
            variants[f"CTranslate2 large {compute_type}"] = (
                lambda text, m=ct2: m.generate([encode(text)[0][0].tolist()], 64)[0])
        for run in variants.values():  # warm-up
            run(sources[0])
        seconds, outputs = dict.fromkeys(variants, 0.0), {name: [] for name in variants}
        for index, text in enumerate(sources):
            names = list(variants)
            for name in names[index % len(names):] + names[: index % len(names)]:
                start = time.perf_counter()
                tokens = variants[name](text)
                seconds[name] += time.perf_counter() - start
                outputs[name].append(pairs["float32"].tokenizer.decode(tokens, skip_special_tokens=True))
    base = seconds["ours large float32"]
    print("| variant | seconds | speed vs our float32 large | BLEU |\n|---|---|---|---|")
    for name in variants:
        bleu = sacrebleu.corpus_bleu(outputs[name], [references]).score
        print(f"| {name} | {seconds[name]:.2f} | {base / seconds[name]:.2f}x | {bleu:.2f} |")


if __name__ == "__main__":
    main()
