"""How long `bild-pipeline report` takes, and how much memory, on a generated run of many rows.

    python scripts/bench_report.py --rows 1000000            # one million rows, with references
    python scripts/bench_report.py --rows 1000000 --no-references
    python scripts/bench_report.py --rows 1000000 --no-row-stats    # an older run: texts scored by the report

The run is made up but shaped like a real one: Multi30k val sentences as predictions and
references (4,096 random pairings of them, so BLEU is low but every n-gram is counted), each row's
quality_stats as an actor writes them, token counts, latencies, 2 actors' calls of 32 rows, 1% error
rows, written as Parquet files of 50,000 rows with a run.json, as a job writes them. The report runs as its own process (as a user runs it); its wall
time and peak resident memory (its worker processes included, sampled every 50 ms) are printed.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.io.schema import OUTPUT_SCHEMA  # noqa: E402
from pipeline.metrics import quality as q  # noqa: E402

SENTENCES = ROOT.parent / "shared" / "data" / "multi30k" / "val.en"
FILE_ROWS = 50_000


def made_up_run(out: Path, rows: int, references: bool, row_stats: bool = True, seed: int = 0) -> None:
    """A run folder of `rows` output rows under `out` (data/*.parquet and run.json)."""
    random = np.random.default_rng(seed)
    if SENTENCES.exists():
        sentences = np.array(SENTENCES.read_text().splitlines(), dtype=object)
    else:  # without the shared data: sentences of random words
        words = np.array("a dog man woman runs on the grass in red two playing with ball street".split(), dtype=object)
        sentences = np.array([" ".join(random.choice(words, 10)) for _ in range(1000)], dtype=object)
    pairings = random.choice(sentences, (4096, 2))  # (prediction, reference)
    stats = q.stats_matrix("translation", q.row_statistics("translation", list(pairings[:, 0]), list(pairings[:, 1])))
    width = stats.shape[1]
    (out / "data").mkdir(parents=True)
    start = time.time()
    for first in range(0, rows, FILE_ROWS):
        n = min(FILE_ROWS, rows - first)
        failed = random.random(n) < 0.01
        tokens = random.integers(5, 40, n)
        small = (tokens * random.uniform(0.6, 0.95, n)).astype(int)
        calls = (first + np.arange(n)) // 32
        pairing = random.integers(0, len(pairings), n)
        scored = ~failed & references & row_stats
        columns = {
            "id": pa.array([str(first + i) for i in range(n)]),
            "prediction": pa.array(np.where(failed, None, pairings[pairing, 0])),
            "reference": pa.array(pairings[pairing, 1] if references else [None] * n, pa.string()),
            "quality_stats": pa.ListArray.from_arrays(pa.array(np.arange(n + 1) * width, pa.int32()),
                                                      pa.array(stats[pairing].ravel()), mask=pa.array(~scored)),
            "error": pa.array(np.where(failed, "RuntimeError: made up", None), pa.string()),
            "method": pa.array(["bild"] * n), "input_tokens": pa.array(tokens, pa.int32()),
            "output_tokens": pa.array(np.where(failed, 0, tokens), pa.int32()),
            "small_tokens": pa.array(small, pa.int32()), "large_tokens": pa.array(tokens - small, pa.int32()),
            "fallbacks": pa.array(random.integers(0, 4, n), pa.int32()),
            "rollbacks": pa.array(random.integers(0, 2, n), pa.int32()),
            "latency_ms": pa.array(tokens * random.uniform(4, 9, n)),
            "worker": pa.array(np.where(calls % 2 == 0, "host:1", "host:2")),
            "call_started_at": pa.array(start + calls * 0.2), "call_seconds": pa.array(np.full(n, 0.19)),
        }
        table = pa.table({name: columns.get(name, pa.nulls(n, OUTPUT_SCHEMA.field(name).type))
                          for name in OUTPUT_SCHEMA.names}, schema=OUTPUT_SCHEMA)
        pq.write_table(table, out / "data" / f"part-{first // FILE_ROWS:05d}.parquet")
    manifest = {"job": {"name": "made-up", "task": "translation", "decoding": {"method": "bild"}},
                "config_hash": "made-up", "attempts": [{"summary": {"wall_seconds": rows / 500}}]}
    (out / "run.json").write_text(json.dumps(manifest))


def _tree_rss(root: int) -> int:
    """Resident bytes of process `root` and all its descendants now (Linux /proc)."""
    parents, rss = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while the folder was read
            continue
        pid = int(stat.parent.name)
        parents[pid], rss[pid] = int(fields[1]), int(fields[21]) * resource.getpagesize()
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += [child for child, parent in parents.items() if parent == pid]
    return total


def peak_tree_memory(process: subprocess.Popen, every: float = 0.05) -> int:
    """Wait for `process`; the most resident memory (bytes) it and its children held at once."""
    peak = 0
    while process.poll() is None:
        peak = max(peak, _tree_rss(process.pid))
        time.sleep(every)
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--no-references", dest="references", action="store_false")
    parser.add_argument("--no-row-stats", dest="row_stats", action="store_false",
                        help="rows without quality_stats (a run written before they existed)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        made = time.perf_counter()
        made_up_run(run, args.rows, args.references, args.row_stats)
        print(f"made a run of {args.rows:,} rows ({sum(f.stat().st_size for f in run.rglob('*')) / 2**20:.0f} MiB) "
              f"in {time.perf_counter() - made:.1f} s")
        started = time.perf_counter()
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            report = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "report", str(run), "--out",
                                       str(run / "report")], stdout=out, stderr=err, text=True, cwd=ROOT)
            peak_mib = peak_tree_memory(report) / 2**20
            seconds = time.perf_counter() - started
            out.seek(0), err.seek(0)
            if report.returncode:
                sys.exit(f"report failed:\n{err.read()[-3000:]}")
            print(out.read().strip().splitlines()[-1])
        kind = ("with references" + ("" if args.row_stats else ", without quality_stats")) if args.references \
            else "without references"
        print(f"report: {seconds:.1f} s wall, {peak_mib:.0f} MiB peak resident memory ({kind})")


if __name__ == "__main__":
    main()
