"""The onnx engine's drafting step at batch 1: the runtime's call against the engine's Python around it.

    python docs/bench-adaptive/small_step_split.py [SLOTS]

The demo's small model (int8, onnx engine, one thread): 2,000 one-token steps of one row (rewound every 30
positions), then the engine's own counters: forward_seconds (the whole step) and runtime_seconds (inside
onnxruntime's call); then a cProfile of 1,000 more steps.
"""
import time, torch, cProfile, pstats, sys
from pipeline.decoding import ModelPair
from pipeline.decoding.engine import Feed
torch.set_num_threads(1)
pair = ModelPair.from_pretrained("models/demo-de-en/small-aligned", "models/demo-de-en/large", engine="onnx", quantize="int8", device="cpu")
slots = int(sys.argv[1]) if len(sys.argv) > 1 else 1
e = pair.engine("small", slots)
ids = torch.tensor([100, 200, 300, 400, 500, 1])
e.admit(list(range(slots)), [ids]*slots)
def loop(n):
    for i in range(n):
        pos = [e.lengths[s] for s in range(slots)]
        e.forward(Feed(list(range(slots)), torch.full((slots, 1), 5), pos, [1]*slots, [1]*slots))
        if e.lengths[0] > 30:
            for s in range(slots): e.rewind(s, 1)
loop(200)
f0, k0, c0 = e.forward_seconds, e.runtime_seconds, e.calls
t = time.perf_counter(); loop(2000); wall = time.perf_counter() - t
f, k, c = e.forward_seconds - f0, e.runtime_seconds - k0, e.calls - c0
print(f"per step: wall {1e3*wall/c:.3f} ms, forward {1e3*f/c:.3f}, runtime {1e3*k/c:.3f}, engine python {1e3*(f-k)/c:.3f} ({(f-k)/k:.0%} of runtime)")
p = cProfile.Profile(); p.enable(); loop(1000); p.disable()
pstats.Stats(p).sort_stats("tottime").print_stats(22)
