"""Probe (not shipped code), one process of docs/bench-batch32/ab_proc.sh: warm up, then N timed runs of a
method at a batch size over the first 200 test_2016_flickr sentences; prints ms per run, the kernel calls ms,
and a hash of the tokens. Arguments: N [method] [batch]."""
import sys, time, hashlib
import pipeline
from kernel_timing import demo_requests, time_kernel_calls
from pipeline.decoding.scheduler import BatchPolicy, scheduler_for
spent = time_kernel_calls()
method = sys.argv[2] if len(sys.argv) > 2 else "large"
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 32
pair, config, reqs = demo_requests(method)
scheduler_for(pair, config, BatchPolicy(batch_size=batch)).run(reqs[:64])
out = []; kern = []
for _ in range(int(sys.argv[1])):
    spent[0] = 0.0
    t = time.perf_counter(); res = scheduler_for(pair, config, BatchPolicy(batch_size=batch)).run(reqs); out.append(time.perf_counter() - t); kern.append(spent[0])
h = hashlib.md5(str([r.tokens for r in res]).encode()).hexdigest()[:8]
print(pipeline.__file__.split("/pipeline/")[0], " ".join(f"{x*1e3:.0f}" for x in out), "kernel", " ".join(f"{x*1e3:.0f}" for x in kern), h)
