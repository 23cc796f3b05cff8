"""Probe (not shipped code): what a batch-32 run of `large` (onnx engine, int8) admits and what that costs.

Counts each admission's rows, its length groups and the positions they encode against one padded batch
and against the tokens; times the admission's onnxruntime calls and the steps (split_probe.py's timers).
Two runs, the second after the sessions are built.

    .venv/bin/python docs/bench-batch32/admission_probe.py t5     # runs/t5shape (tiny-pair --shape t5), 32 inputs, 24 tokens
    .venv/bin/python docs/bench-batch32/admission_probe.py demo   # the demo pair, 200 inputs, 64 tokens
"""
import sys
import time

import split_probe
from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.decoding import engine as engine_module
from pipeline.decoding.config import ModelSpec
from pipeline.decoding.scheduler import BatchPolicy, BatchRequest, scheduler_for

PAIRS = {"t5": ("runs/t5shape/small", "runs/t5shape/large", 32, 24),
         "demo": ("models/demo-de-en/small-aligned", "models/demo-de-en/large", 200, 64)}


def main():
    small, large, limit, new_tokens = PAIRS[sys.argv[1] if len(sys.argv) > 1 else "t5"]
    pair = ModelPair.from_spec(ModelSpec(small, large, None, "float32", "cpu", False, "onnx", "int8"))
    config = DecodingConfig(method="large", max_new_tokens=new_tokens)
    texts = [line.strip() for line in open(split_probe.SOURCE)][:limit]
    encoder = Generator(pair, config)
    requests = [BatchRequest(encoder.encode(text)[0][0]) for text in texts]
    split_probe.instrument()
    admissions = []
    grouped = engine_module.length_groups

    def counted(lengths, padding):
        groups = grouped(lengths, padding)
        admissions.append({"rows": len(lengths), "groups": [(len(g), lengths[g[0]]) for g in groups],
                           "grouped": sum(len(g) * lengths[g[0]] for g in groups),
                           "one_batch": len(lengths) * max(lengths), "tokens": sum(lengths)})
        return groups
    engine_module.length_groups = counted
    for run in (1, 2):
        split_probe.spent.clear()
        admissions.clear()
        started = time.perf_counter()
        scheduler_for(pair, config, BatchPolicy(batch_size=32)).run(requests)
        wall = time.perf_counter() - started
        spent = {name: round(seconds, 2) for name, seconds in split_probe.spent.items()}
        print(f"run {run}: wall {wall:.2f} s; {spent}")
    print(f"{len(admissions)} admissions, {sum(len(a['groups']) > 1 for a in admissions)} in more than one group; "
          f"positions encoded {sum(a['grouped'] for a in admissions)}, as single batches "
          f"{sum(a['one_batch'] for a in admissions)}, tokens {sum(a['tokens'] for a in admissions)}")
    print("first admission's groups (rows, width):", admissions[0]["groups"])


if __name__ == "__main__":
    main()
