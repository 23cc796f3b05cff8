"""Probe (not shipped code): A/B of decode_attention.c variants in one process: `large` at batch 32 over
the first 200 test_2016_flickr sentences, order alternating, the kernel calls timed inside.

    .venv/bin/python docs/bench-batch32/ab_kernel.py A.c B.c
"""
import ctypes, subprocess, sys, tempfile, time, statistics
from kernel_timing import demo_requests, time_kernel_calls
from pipeline.decoding.engines import attention_kernel
from pipeline.decoding.scheduler import BatchPolicy, scheduler_for
spent = time_kernel_calls()
variants = sys.argv[1:]
kernels = {}
for path in variants:
    lib = tempfile.mktemp(suffix=".so")
    subprocess.run(["cc", *attention_kernel.FLAGS, "-o", lib, path, "-lm"], check=True)
    kernels[path] = attention_kernel.DecodeAttention(ctypes.CDLL(lib))
pair, config, reqs = demo_requests("large")
eng = pair.engine("large", 32)
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
