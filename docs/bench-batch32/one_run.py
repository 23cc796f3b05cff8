"""Probe (not shipped code), one process of docs/bench-batch32/ab_proc.sh: warm up, then N timed runs of a
method at a batch size over the first 200 test_2016_flickr sentences; prints ms per run, the kernel calls ms,
and a hash of the tokens. Arguments: N [method] [batch]."""
import sys, time, hashlib, torch
torch.set_num_threads(1)
import pipeline
from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.config import ModelSpec
from pipeline.decoding.scheduler import BatchPolicy, BatchRequest, scheduler_for
from pipeline.decoding.engines import onnx_segments
spent = [0.0]
_init = onnx_segments.SegmentedCall.__init__
def _traced(self, frame, caches, inputs, kernel):
    _init(self, frame, caches, inputs, kernel)
    def timed(call):
        def run():
            t = time.perf_counter(); call(); spent[0] += time.perf_counter() - t
        return run
    self.plan = [timed(c) if isinstance(p, onnx_segments.Attention) else c for p, c in zip(frame.pieces, self.plan)]
onnx_segments.SegmentedCall.__init__ = _traced
method = sys.argv[2] if len(sys.argv) > 2 else "large"
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 32
pair = ModelPair.from_spec(ModelSpec("models/demo-de-en/small-aligned", "models/demo-de-en/large", None, "float32", "cpu", False, "onnx", "int8"))
config = DecodingConfig(method=method, max_new_tokens=64, fallback_threshold=0.4, rollback_threshold=1.0) if method == "bild" else DecodingConfig(method=method, max_new_tokens=64)
texts = [l.strip() for l in open("../shared/data/multi30k/test_2016_flickr.de")][:200]
g = Generator(pair, config)
reqs = [BatchRequest(g.encode(t)[0][0]) for t in texts]
scheduler_for(pair, config, BatchPolicy(batch_size=batch)).run(reqs[:64])
out = []; kern = []
for _ in range(int(sys.argv[1])):
    spent[0] = 0.0
    t = time.perf_counter(); res = scheduler_for(pair, config, BatchPolicy(batch_size=batch)).run(reqs); out.append(time.perf_counter() - t); kern.append(spent[0])
h = hashlib.md5(str([r.tokens for r in res]).encode()).hexdigest()[:8]
print(pipeline.__file__.split("/pipeline/")[0], " ".join(f"{x*1e3:.0f}" for x in out), "kernel", " ".join(f"{x*1e3:.0f}" for x in kern), h)
