"""Probe (not shipped code): where `bild` at batch 1 (the record-by-record loop) spends its time, from the engines'
own counters: each model's onnxruntime time and its engine's Python per call, the admissions, and the rest (the
scheduler's and the generator's Python). Demo pair, onnx int8, 200 test sentences, three runs after a warm-up.

    .venv/bin/python docs/bench-batch32/b1_python_split.py
"""
import time, torch
from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding.config import ModelSpec
torch.set_num_threads(1)
pair = ModelPair.from_spec(ModelSpec("models/demo-de-en/small-aligned", "models/demo-de-en/large", None, "float32", "cpu", False, "onnx", "int8"))
config = DecodingConfig(method="bild", max_new_tokens=64, fallback_threshold=0.4, rollback_threshold=1.0)
texts = [l.strip() for l in open("../shared/data/multi30k/test_2016_flickr.de")][:200]
g = Generator(pair, config)
g.generate(texts)
for rnd in range(3):
    engines = [pair.engine("small", 1), pair.engine("large", 1)]
    before = [(e.calls, e.forward_seconds, e.runtime_seconds, e.admit_seconds) for e in engines]
    t = time.perf_counter(); g.generate(texts); wall = time.perf_counter() - t
    parts = []
    for e, b in zip(engines, before):
        calls, fwd, ker, adm = e.calls - b[0], e.forward_seconds - b[1], e.runtime_seconds - b[2], e.admit_seconds - b[3]
        parts.append(f"{calls} calls, runtime {ker/calls*1e6:.0f} us, python {(fwd-ker)/calls*1e6:.0f} us/call, admit {adm:.2f}s")
    rest = wall - sum((e.forward_seconds - b[1]) + (e.admit_seconds - b[3]) for e, b in zip(engines, before))
    print(f"wall {wall:.2f}s | small: {parts[0]} | large: {parts[1]} | rest {rest:.2f}s")
