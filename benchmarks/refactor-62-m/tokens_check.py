"""Tokens and counters of several settings on one tree (PYTHONPATH picks it): JSON to stdout (tokens.md).
Usage, from the repository root: PYTHONPATH=TREE python tokens_check.py SMALL LARGE LIMIT > TREE.json"""
import json, sys
import pyarrow.parquet as pq
import torch
torch.set_num_threads(1)
from pipeline.decoding import DecodingConfig, Generator, ModelPair, ModelSpec
from pipeline.decoding.config import BatchPolicy

small, large, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
texts = pq.read_table("data/multi30k_sample/test_2016_flickr.parquet").column("de").to_pylist()[:limit]  # repository root
out = {}
for engine, quantize in (("onnx", "int8"), ("native", "none")):
    pair = ModelPair.from_spec(ModelSpec(small, large, device="cpu", engine=engine, quantize=quantize))
    for name, config in {
        "bild": DecodingConfig(method="bild", max_new_tokens=64, fallback_threshold=0.5, rollback_threshold=3.0, adaptive_draft=False),
        "speculative": DecodingConfig(method="speculative", max_new_tokens=64, adaptive_draft=False),
        "cascade": DecodingConfig(method="cascade", max_new_tokens=64, adaptive_draft=False),
        "large": DecodingConfig(method="large", max_new_tokens=64),
        "bild_sampled": DecodingConfig(method="bild", max_new_tokens=64, do_sample=True, temperature=0.8, seed=3, adaptive_draft=False),
    }.items():
        for size in (1, 32):
            results = Generator(pair, config).generate(texts, batch=BatchPolicy(batch_size=size))
            out[f"{engine}-{quantize}-{name}-b{size}"] = [(r.token_ids, r.stats.to_dict() if r.stats else None, r.error) for r in results]
json.dump(out, sys.stdout)
