"""What one admission (the encoder and every cross-attention projection) of a 14-token source costs the
`large` of a pair with each int8 kernel, and how far its output moves from the blocks kernel's.

    python docs/bench-t5-inflated/admission_kernels.py SMALL LARGE

One thread; medians of 5 runs of the admission session; the rows kernel with 7-bit and with 8-bit
activations (levels, zero point).
"""
import statistics, sys, time, torch
from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.engines import onnx_graph
torch.set_num_threads(1)
small, large = sys.argv[1], sys.argv[2]
pair = ModelPair.from_pretrained(small, large, engine="onnx", quantize="int8", device="cpu")
texts = open("../shared/data/multi30k/test_2016_flickr.de").read().splitlines()[300:312]
ids = Generator(pair, DecodingConfig()).encode(texts[0])[0][0]
sessions = pair.engine("large", 1).sessions
import numpy as np
w = sessions.weights
def timed(kernel, levels, reps=5):
    onnx_graph.ROW_LEVELS, onnx_graph.ROW_ZERO = levels
    sessions._sessions.pop(("admission", False, kernel), None)
    adm = sessions.admission(int8_kernel=kernel)
    width = len(ids)
    from pipeline.decoding.engines.cache_rows import padded_ids
    inputs = {"hidden": w.source_embedding(padded_ids([ids], width)).numpy(), "source_lengths": np.asarray([width], dtype=np.int32)}
    if w.position_bias: inputs["source_bias"] = w.source_bias(width).numpy()
    out = adm.run(["encoded"], inputs)[0]
    times = []
    for _ in range(reps):
        t = time.perf_counter(); adm.run(["encoded", "cross_kv"], inputs); times.append(time.perf_counter() - t)
    return statistics.median(times), out
step = pair.engine("large", 1)
base = None
for kernel, levels in (("blocks", (63, 64)), ("rows", (63, 64)), ("rows", (127, 128)), ("blocks", (63, 64))):
    t, out = timed(kernel, levels)
    if base is None: base = out
    print(kernel, levels, f"{1e3*t:.1f} ms", "max rel diff vs blocks", float(np.abs(out - base).max() / np.abs(base).max()), len(ids), "tokens")
