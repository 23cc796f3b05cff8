"""What the adaptive chooser spends on the shipped pair at batch 8, where drafting runs behind plain steps: runs of
`large` and of `bild` with adaptive windows, alternating, and in each adaptive run the time of its drafting and
verifying calls against what plain steps would have taken for the tokens they made. Run from the checkout root."""
import statistics, sys, time
from pipeline.cli.bench import _bench_inputs
from pipeline.decoding import DecodingConfig, Generator
from pipeline.decoding.scheduler import BatchPolicy, BatchRequest, Scheduler, scheduler_for

M = "models/demo-de-en"; S = "../shared/data/multi30k"
PAIRS = int(sys.argv[1]) if len(sys.argv) > 1 else 40
B = int(sys.argv[2]) if len(sys.argv) > 2 else 8  # batch size
pair, texts, _ = _bench_inputs(f"{M}/small-aligned", f"{M}/large", "float32", "cpu", 1, "onnx",
                               f"{S}/test_2016_flickr.de", None, 96, None, quantize="int8")
base = dict(fallback_threshold=0.4, rollback_threshold=1.0, max_draft_tokens=10, max_new_tokens=64)
encoder = Generator(pair, DecodingConfig(method="bild", **base))
requests = [BatchRequest(encoder.encode(t)[0][0]) for t in texts]
spent = {}  # this run: seconds and tokens of the drafting calls, the verifications and BiLD's plain steps


def timed(name, tokens_made):
    original = getattr(Scheduler, name)
    def wrapper(self, *args):
        rows = next(arg for arg in args if isinstance(arg, list))  # _draft(rows, enough), _plain_step(engine, rows)
        before, started = sum(row.length for row in rows), time.perf_counter()
        out = original(self, *args)
        if self.config.method != "large":
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - started
            spent[name + " calls"] = spent.get(name + " calls", 0) + 1
            if tokens_made:
                spent[name + " tokens"] = spent.get(name + " tokens", 0) + sum(row.length for row in rows) - before
        return out
    setattr(Scheduler, name, wrapper)


timed("_draft", False); timed("_verify_group", True); timed("_plain_step", True)


def run(method):
    spent.clear()
    config = DecodingConfig(method="bild", adaptive_draft=True, **base) if method == "adaptive" else \
        DecodingConfig(method="large", **base)
    started = time.perf_counter()
    scheduler_for(pair, config, BatchPolicy(B)).run(requests)
    return time.perf_counter() - started, dict(spent)


for method in ("large", "adaptive") * 2:  # warm-up; the chooser (kept by the pair) learns here
    run(method)
runs = {"large": [], "adaptive": []}
for i in range(PAIRS):
    for method in (("large", "adaptive") if i % 2 == 0 else ("adaptive", "large")):
        runs[method].append(run(method))
pairs = list(zip(runs["adaptive"], runs["large"]))
exploring = [(a, l) for a, l in pairs if a[1].get("_draft calls")]
plain_only = [(a, l) for a, l in pairs if not a[1].get("_draft calls")]
per_token = statistics.median(a[1]["_plain_step"] / a[1]["_plain_step tokens"] for a, _ in plain_only)
print(f"batch {B}, {PAIRS} alternating pairs of runs over {len(requests)} sentences; a plain step costs "
      f"{1e3 * per_token:.3f} ms per row-token (median of the runs without drafting)")
for tag, group in (("all runs", pairs), ("runs that drafted", exploring), ("runs without drafting", plain_only)):
    if group:
        ratio = sum(l[0] for _, l in group) / sum(a[0] for a, _ in group)
        print(f"{tag:22s} {len(group):3d}: adaptive {ratio:.3f}x large (summed times)")
losses = []
for (seconds, parts), (large_seconds, _) in exploring:
    drafting = parts.get("_draft", 0.0) + parts.get("_verify_group", 0.0)
    worth = parts.get("_verify_group tokens", 0) * per_token
    losses.append(drafting - worth)
    print(f"  drafted: {1e3 * drafting:5.1f} ms in {parts['_draft calls']} drafting calls and "
          f"{parts['_verify_group calls']} verifications made {parts.get('_verify_group tokens', 0)} tokens, "
          f"{1e3 * worth:5.1f} ms of plain steps; run {1e3 * seconds:.0f} ms, large {1e3 * large_seconds:.0f} ms")
if losses:
    mean_run = statistics.mean(a[0] for a, _ in pairs)
    print(f"drafting lost {1e3 * statistics.mean(losses):.1f} ms per run that drafted; over all runs "
          f"{100 * sum(losses) / len(pairs) / mean_run:.2f}% of a run")
