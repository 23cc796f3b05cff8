"""Hashes of the native engine's greedy tokens and counters (small tokens, large calls) for `large` and `bild`
at batch 1 and 8: the shipped pair in float32 and int8 (64 test sentences), `tiny-pair --shape t5` random
weights (runs/t5shape, 4 sentences, 12 tokens).

    PYTHONPATH=<a checkout> .venv/bin/python benchmarks/bench-verbs/same_tokens.py   # run in the repository root
"""
import hashlib, sys, torch
from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.config import BatchPolicy
torch.set_num_threads(1)
texts = open("/work/shared/data/multi30k/test_2016_flickr.de").read().splitlines()
out = []
for small, large, q, n, new in (("models/demo-de-en/small-aligned", "models/demo-de-en/large", "none", 64, 64),
                                ("models/demo-de-en/small-aligned", "models/demo-de-en/large", "int8", 64, 64),
                                ("runs/t5shape/small", "runs/t5shape/large", "none", 4, 12)):
    pair = ModelPair.from_pretrained(small, large, engine="native", quantize=q, device="cpu")
    for method in ("large", "bild"):
        for b in (1, 8):
            res = Generator(pair, DecodingConfig(method=method, max_new_tokens=new)).generate(texts[:n], batch=BatchPolicy(batch_size=b))
            out.append(f"{large.split('/')[-2]} {q} {method} B={b}: " + hashlib.sha1(str([r.token_ids for r in res]).encode()).hexdigest()[:10]
                       + " " + hashlib.sha1(str([(r.stats.small_tokens, r.stats.large_calls) for r in res]).encode()).hexdigest()[:8])
print("\n".join(out))
