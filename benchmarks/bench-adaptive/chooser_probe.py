"""Which windows does the adaptive chooser pick on the shipped pair at batch 1, and what does it predict?"""
import collections, time
from pipeline.cli.bench import _bench_inputs
from pipeline.decoding import DecodingConfig, Generator
from pipeline.decoding.draft_length import DraftLength
from pipeline.decoding.scheduler import BatchPolicy, BatchRequest, decode_batch

M = "models/demo-de-en"; S = "../shared/data/multi30k"  # run from the checkout root
pair, texts, _ = _bench_inputs(f"{M}/small-aligned", f"{M}/large", "float32", "cpu", 1, "onnx",
                               f"{S}/test_2016_flickr.de", None, 96, None, quantize="int8")
base = dict(method="bild", fallback_threshold=0.4, rollback_threshold=1.0, max_draft_tokens=10, max_new_tokens=64)
enc = Generator(pair, DecodingConfig(**base))
reqs = [BatchRequest(enc.encode(t)[0][0]) for t in texts]
chosen = collections.Counter()
original = DraftLength.choose
def choose(self, rows):
    k = original(self, rows); chosen[k] += 1; return k
DraftLength.choose = choose
for name, extra in [("large", dict(method="large")), ("bild", {}), ("bild_adaptive", dict(adaptive_draft=True))] * 3:
    config = DecodingConfig(**{**base, **extra})
    decode_batch(pair, config, BatchPolicy(1), reqs[:4])
    chosen.clear()
    t = time.perf_counter(); outs = decode_batch(pair, config, BatchPolicy(1), reqs); t = time.perf_counter() - t
    tokens = sum(len(o.tokens) for o in outs)
    print(f"{name:14s} {tokens / t:7.0f} tok/s  windows {sorted(chosen.items())}", flush=True)
chooser = pair.draft_length(DecodingConfig(**{**base, "adaptive_draft": True}), 1)
print("small per row", chooser.small_cost.predict(1), "large a+b", chooser.large_cost._line(),
      "c", chooser.drafts / chooser.small_calls, "a", chooser.kept / (chooser.kept + chooser.rejections))
print("rates", [round(chooser.tokens_per_second(k, 1)) for k in range(11)])
