"""`bild-pipeline bench-pipeline --decode none`: the pipeline at corpus scale with decoding taken out, against
Ray Data's own `read_parquet -> map_batches(identity) -> write_parquet` on the same files.

What it measures is what the pipeline adds around decoding: listing, the id checks, the resume's "what is
done", the to-do filter, the writes and the closing summary; then `report` on the pipeline's output. Each side runs in a process of its own (a fresh
driver with an embedded Ray, as a user's run starts), the sides alternating, so that each driver's peak RSS
(metrics/memory.py) is its own. The decode stage is replaced by PassThroughStage, which this module alone
names: no job file reaches it.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.io.schema import OUTPUT_SCHEMA
from pipeline.metrics.memory import peak_rss_mib

# Short records, as a sentence-level corpus has them (at most 24 characters each).
TEXTS = ["Ein Hund läuft.", "Zwei Männer spielen.", "Eine Frau liest.", "Kinder bauen Burgen.",
         "Ein Mann fährt Rad.", "Musiker spielen laut."]
ROWS_PER_WRITE = 1_000_000  # the corpus is written in slices of this many rows: bounded memory at any size
ROWS_PER_OUTPUT_FILE = 100_000
RECORDS_PER_CALL = 8_192
SHIPPED_PAIR = ("models/demo-de-en/small-aligned", "models/demo-de-en/large")  # named, never loaded


def write_corpus(folder: Path, records: int, files: int) -> None:
    """`records` synthetic records (id "r000000042": 10 characters, text, ref) in `files` Parquet files."""
    folder.mkdir(parents=True, exist_ok=True)
    per_file = math.ceil(records / files)
    texts = pa.array(TEXTS)
    for number in range(files):
        first, last = number * per_file, min(records, (number + 1) * per_file)
        with pq.ParquetWriter(folder / f"part-{number:05d}.parquet", _corpus_schema()) as writer:
            for start in range(first, last, ROWS_PER_WRITE):
                index = np.arange(start, min(last, start + ROWS_PER_WRITE), dtype=np.int64)
                ids = pc.binary_join_element_wise("r", pc.utf8_lpad(pa.array(index).cast(pa.string()), 9, "0"), "")
                chosen = pc.take(texts, pa.array(index % len(TEXTS)))
                writer.write_table(pa.table({"id": ids, "text": chosen, "ref": chosen}, schema=_corpus_schema()))


def _corpus_schema() -> pa.Schema:
    return pa.schema([("id", pa.string()), ("text", pa.string()), ("ref", pa.string())])


class PassThroughStage:
    """The decode stage with decoding taken out: each record's output row holds its text as the prediction, and
    the quality statistics of that prediction against its reference, as an actor writes them (the report sums
    them; counting them costs an actor 0.3 ms a row, so they are counted once per distinct pair)."""

    def __init__(self, spec, done_points=None):
        self.spec = spec
        self.known: dict[str, list[float]] = {}  # prediction \x1f reference -> statistics

    def __call__(self, batch: pa.Table) -> pa.Table:
        started = time.time()
        count = batch.num_rows
        given = {"id": batch["id"], "prediction": batch["text"], "reference": batch["reference"],
                 "input_file": batch["input_file"], "input_row": batch["input_row"],
                 "method": pa.array(["none"] * count), "job_name": pa.array([self.spec.job_name] * count),
                 "call_started_at": pa.array(np.full(count, started)),
                 "quality_stats": self._quality_stats(batch["text"], batch["reference"]),
                 "call_seconds": pa.array(np.full(count, time.time() - started))}
        return pa.table({field.name: given.get(field.name, pa.nulls(count, field.type)) for field in OUTPUT_SCHEMA},
                        schema=OUTPUT_SCHEMA)

    def _quality_stats(self, predictions, references) -> pa.Array:
        """Each row's statistics, in Arrow: the rows' distinct (prediction, reference) pairs counted once."""
        from pipeline.metrics import quality as q

        keys = pc.binary_join_element_wise(predictions, references, "\x1f")  # null where either is
        new = [key for key in pc.unique(keys).drop_null().to_pylist() if key not in self.known]
        if new:
            pairs = [key.split("\x1f", 1) for key in new]
            matrix = q.stats_matrix("translation", q.row_statistics("translation", *zip(*pairs)))
            self.known.update({key: values.tolist() for key, values in zip(new, matrix)})
        names = list(self.known)
        return pc.take(pa.array([self.known[name] for name in names], pa.list_(pa.float64())),
                       pc.index_in(keys, value_set=pa.array(names, pa.string())))


def _job(corpus: Path, output: Path, limit: int | None = None):
    from pipeline.jobs.schema import JobConfig

    return JobConfig.model_validate({
        "name": "scale",
        "input": {"path": str(corpus), "id_column": "id", "text_column": "text", "reference_column": "ref",
                  "limit": limit},
        "models": {"small": SHIPPED_PAIR[0], "large": SHIPPED_PAIR[1], "device": "cpu"},
        "decoding": {"method": "large"},
        "compute": {"actors": 1, "cpus_per_actor": 1, "records_per_call": RECORDS_PER_CALL},
        "output": {"path": str(output), "mode": "resume", "rows_per_file": ROWS_PER_OUTPUT_FILE},
    })


def ours(corpus: Path, output: Path) -> dict:
    """One run of the pipeline (resuming whatever `output` holds), in this process."""
    from pipeline.jobs.run import run_job

    started = time.time()
    summary = run_job(_job(corpus, output), stage=PassThroughStage)
    return {"wall_s": time.time() - started, "records": summary.decoded_now, "peak_rss_mib": peak_rss_mib(),
            "first_record_s": summary.startup_seconds}


def ray_data(corpus: Path, output: Path, same_rows: bool = False) -> dict:
    """Ray Data's own identity pass over the same files, in this process; with `same_rows`, its map writes the
    pipeline's output rows (PassThroughStage's, as a function fused with the read and the write): the same
    bytes written, so that what remains between the two is what the pipeline adds."""
    import ray

    from pipeline.jobs.run import connect_ray

    started = time.time()
    connect_ray(min_cpus=2)
    files = sorted(str(path) for path in corpus.glob("*.parquet"))
    dataset = ray.data.read_parquet(files).map_batches(_output_rows if same_rows else _identity, batch_format="pyarrow")
    dataset.write_parquet(str(output), min_rows_per_file=ROWS_PER_OUTPUT_FILE)
    records = sum(pq.read_metadata(path).num_rows for path in Path(output).glob("*.parquet"))
    return {"wall_s": time.time() - started, "records": records, "peak_rss_mib": peak_rss_mib(),
            "first_record_s": None}


def _identity(batch: pa.Table) -> pa.Table:
    return batch


def _output_rows(batch: pa.Table) -> pa.Table:
    from pipeline.io.records import normalize_table

    class Spec:
        job_name = "scale"

    records = normalize_table(batch, "id", "text", "ref")
    records = records.append_column("input_file", pa.nulls(batch.num_rows, pa.string()))
    return PassThroughStage(Spec())(records.append_column("input_row", pa.nulls(batch.num_rows, pa.int64())))


def report(corpus: Path, output: Path) -> dict:
    """`bild-pipeline report` on the pipeline's output, in this process: what it costs at this size."""
    from pipeline.jobs.report import build_report, write_report

    started = time.time()
    summary, totals = build_report(str(output))
    write_report(summary, totals, output / "report")
    return {"wall_s": time.time() - started, "records": summary["records"]["total"], "peak_rss_mib": peak_rss_mib(),
            "bleu": summary["quality"].get("bleu")}


def half_done(corpus: Path, output: Path, records: int) -> None:
    """An output holding the first half of the corpus, as a run stopped half way leaves it."""
    from pipeline.jobs.run import run_job

    run_job(_job(corpus, output, limit=records // 2), stage=PassThroughStage)


SIDES = {"ours": ours, "ray_data": ray_data,
         "ray_data_same_rows": lambda corpus, output: ray_data(corpus, output, same_rows=True)}
STEPS = {**SIDES, "report": report}


def run_side(side: str, corpus: Path, output: Path, *, half_of: int | None = None) -> dict:
    """`side` in a process of its own (with `half_of`: on an output first made half done, untimed)."""
    shutil.rmtree(output, ignore_errors=True)
    if half_of:
        _child("half", corpus, output, str(half_of))
    return json.loads(_child(side, corpus, output).strip().splitlines()[-1])


def _child(*args) -> str:
    done = subprocess.run([sys.executable, "-m", "pipeline.bench.scale", *map(str, args)], capture_output=True,
                          text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"bench-pipeline --decode none: {' '.join(map(str, args[:1]))} failed:\n"
                           f"{done.stderr[-3000:]}")
    return done.stdout


def run_scale_bench(sizes: list[int], repeats: int, workdir: Path, resume: bool = True) -> list[dict]:
    """For each corpus size: both sides `repeats` times, alternating (the first side swapping each time), and
    with `resume` the pipeline once more on an output already half done. One row per size, the medians."""
    import statistics

    rows = []
    for size in sizes:
        corpus = workdir / f"corpus-{size}"
        if not corpus.exists():
            write_corpus(corpus, size, files=max(1, size // ROWS_PER_WRITE))
        runs: dict[str, list[dict]] = {side: [] for side in SIDES}
        for repeat in range(repeats):
            for side in (list(SIDES) if repeat % 2 == 0 else list(SIDES)[::-1]):
                runs[side].append(run_side(side, corpus, workdir / f"out-{side}"))
        row = {"records": size, "repeats": repeats}
        for side, found in runs.items():
            assert all(run["records"] == size for run in found), f"{side} wrote {[r['records'] for r in found]}"
            row[f"{side}_wall_s"] = statistics.median(run["wall_s"] for run in found)
            row[f"{side}_records_per_s"] = size / row[f"{side}_wall_s"]
            row[f"{side}_peak_rss_mib"] = max(run["peak_rss_mib"] for run in found)
        row["ours_first_record_s"] = statistics.median(run["first_record_s"] for run in runs["ours"])
        for other in ("ray_data", "ray_data_same_rows"):
            row[f"speed_ours_over_{other}"] = statistics.median(
                r["wall_s"] / o["wall_s"] for o, r in zip(runs["ours"], runs[other]))
        reported = json.loads(_child("report", corpus, workdir / "out-ours").strip().splitlines()[-1])
        assert reported["records"] == size, f"report counted {reported['records']}"
        row.update(report_wall_s=reported["wall_s"], report_peak_rss_mib=reported["peak_rss_mib"])
        if resume:
            resumed = run_side("ours", corpus, workdir / "out-resume", half_of=size)
            row.update(resume_wall_s=resumed["wall_s"], resume_first_record_s=resumed["first_record_s"],
                       resume_peak_rss_mib=resumed["peak_rss_mib"], resume_records=resumed["records"])
        shutil.rmtree(workdir / "out-resume", ignore_errors=True)
        rows.append(row)
    return rows


def render_scale(rows: list[dict]) -> str:
    lines = ["| records | ours: s | Ray Data: s | ours / Ray Data records/s | Ray Data writing our rows: s | ours / it | "
             "ours: first record s | driver peak MiB: ours | Ray Data | report: s | report peak MiB | "
             "resume half done: s | first record s | driver peak MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['records']:,} | {row['ours_wall_s']:.1f} | {row['ray_data_wall_s']:.1f} | "
            f"{row['speed_ours_over_ray_data']:.2f}x | {row['ray_data_same_rows_wall_s']:.1f} | "
            f"{row['speed_ours_over_ray_data_same_rows']:.2f}x | {row['ours_first_record_s']:.1f} | "
            f"{row['ours_peak_rss_mib']:.0f} | {row['ray_data_peak_rss_mib']:.0f} | "
            + (f"{row['report_wall_s']:.1f} | {row['report_peak_rss_mib']:.0f} | " if "report_wall_s" in row else "| | ")
            + (f"{row['resume_wall_s']:.1f} | {row['resume_first_record_s']:.1f} | {row['resume_peak_rss_mib']:.0f} |"
               if "resume_wall_s" in row else "| | |"))
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    side, corpus, output = argv[0], Path(argv[1]), Path(argv[2])
    if side == "half":
        half_done(corpus, output, int(argv[3]))
        return
    print(json.dumps(STEPS[side](corpus, output)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
