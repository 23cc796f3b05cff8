"""What one model's forward of k new tokens (a step at k = 1, a verification of k drafts) costs at batch 1
with each int8 kernel of the onnx engine (onnx_graph's ``blocks`` and ``rows``), timed in rotation.

    python benchmarks/bench-t5-inflated/verify_kernels.py SMALL LARGE [small|large]

One thread, int8, 16 cached positions before the k fed ones; medians of 7 rounds. What
onnx_engine.ROWS_KERNEL_FROM_WEIGHTS is set from.
"""
import statistics, sys, torch
from pipeline.bench.cost import _StepTimer
from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.engines.onnx_engine import OnnxEngine
torch.set_num_threads(1)
small, large = sys.argv[1], sys.argv[2]
role = sys.argv[3] if len(sys.argv) > 3 else "large"
pair = ModelPair.from_pretrained(small, large, engine="onnx", quantize="int8", device="cpu")
text = open("/work/shared/data/multi30k/test_2016_flickr.de").read().splitlines()[300]
ids = Generator(pair, DecodingConfig()).encode(text)[0][0]
prefix = pair.decoder_prefix(ids)
base = pair.engine(role, 1)
engines = {k: OnnxEngine(base.weights, base.sessions, 1, int8_kernel=k) for k in ("blocks", "rows")}
ks = [1, 2, 3, 4, 6, 8, 11]
timers = {(kern, k): _StepTimer(e, ids, prefix, k) for kern, e in engines.items() for k in ks}
times = {key: [] for key in timers}
for rep in range(7):
    for key, t in timers.items():
        times[key].append(t.once())
for k in ks:
    b, r = statistics.median(times["blocks", k]), statistics.median(times["rows", k])
    print(f"{role} k={k}: blocks {1e3*b:.2f} ms, rows {1e3*r:.2f} ms, rows/blocks {r/b:.2f}")
