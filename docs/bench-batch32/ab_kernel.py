"""Probe (not shipped code): A/B of decode_attention.c variants in one process: `large` at batch 32 over
the first 200 test_2016_flickr sentences, order alternating, the kernel calls timed inside.

    .venv/bin/python docs/bench-batch32/ab_kernel.py A.c B.c
"""
import ctypes, subprocess, sys, tempfile, time, statistics, torch
torch.set_num_threads(1)
from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.config import ModelSpec
from pipeline.decoding.engines import attention_kernel
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
variants = sys.argv[1:]
kernels = {}
for path in variants:
    lib = tempfile.mktemp(suffix=".so")
    subprocess.run(["cc", *attention_kernel.FLAGS, "-o", lib, path, "-lm"], check=True)
    kernels[path] = attention_kernel.DecodeAttention(ctypes.CDLL(lib))
pair = ModelPair.from_spec(ModelSpec("models/demo-de-en/small-aligned", "models/demo-de-en/large", None, "float32", "cpu", False, "onnx", "int8"))
config = DecodingConfig(method="large", max_new_tokens=64)
texts = [l.strip() for l in open("../shared/data/multi30k/test_2016_flickr.de")][:200]
g = Generator(pair, config)
reqs = [BatchRequest(g.encode(t)[0][0]) for t in texts]
eng = pair.engine("large", 32)
kern = attention_kernel.kernel
times = {v: [] for v in variants}; outs = {}; kt = {v: [] for v in variants}
rounds = 6
for r in range(rounds + 1):
    for v in (variants if r % 2 == 0 else variants[::-1]):
        attention_kernel.kernel = lambda v=v: kernels[v]
        eng._calls = {}
        spent[0] = 0.0
        t = time.perf_counter()
        out = scheduler_for(pair, config, BatchPolicy(batch_size=32)).run(reqs)
        if r: times[v].append(time.perf_counter() - t); kt[v].append(spent[0])
        outs[v] = [o.tokens for o in out]
base = statistics.median(times[variants[0]])
for v in variants:
    m = statistics.median(times[v])
    same = sum(a == b for a, b in zip(outs[v], outs[variants[0]]))
    print(f"{v}: kernel {statistics.median(kt[v])*1e3:.0f} ms, ratio per round " + " ".join(f"{a/b:.2f}" for a, b in zip(kt[variants[0]], kt[v])))
    print(f"{v}: {m*1e3:.0f} ms (median of {rounds}), speed vs first {base/m:.3f}x, same outputs {same}/200, per-round ratios " +
          " ".join(f"{a/b:.2f}" for a, b in zip(times[variants[0]], times[v])))
