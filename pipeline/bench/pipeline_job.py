"""`bild-pipeline bench-pipeline`: the same records decoded in-process and through the Ray pipeline.

Both sides use one model pair, one torch thread and the same decoding settings; repetitions
alternate (harness.interleave, the order rotating each time) and the ratio is taken per pair.
The pipeline side is timed from the start of `run_job` to its end (read, decode, write, summary),
with Ray already running, so the ratio shows what Ray Data adds per record.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipeline.bench.harness import interleave
from pipeline.decoding import Generator, ModelPair
from pipeline.jobs.run import connect_ray, run_job
from pipeline.jobs.schema import JobConfig


def write_records(path: Path, texts: list[str], count: int, shards: int = 8) -> None:
    path.mkdir(parents=True, exist_ok=True)
    per_shard = -(-count // shards)
    for shard in range(shards):
        ids = list(range(shard * per_shard, min(count, (shard + 1) * per_shard)))
        table = pa.table({"id": [f"r{i}" for i in ids], "text": [texts[i % len(texts)] for i in ids]})
        pq.write_table(table, path / f"part-{shard:03d}.parquet")


def run_pipeline_bench(small: str, large: str, texts: list[str], workdir: Path, *, records: int = 512,
                       repeats: int = 2, batch_size: int = 16, max_new_tokens: int = 24) -> dict:
    torch.set_num_threads(1)
    write_records(workdir / "input", texts, records)
    job = JobConfig.model_validate({
        "name": "bench-pipeline",
        "input": {"path": str(workdir / "input"), "format": "parquet"},
        "models": {"small": small, "large": large, "device": "cpu"},
        "decoding": {"method": "bild", "max_new_tokens": max_new_tokens},
        "compute": {"actors": 1, "cpus_per_actor": 1, "batch_size": batch_size},
        "output": {"path": str(workdir / "output"), "mode": "overwrite"},
    })
    pair = ModelPair.from_spec(job.models.to_spec())  # the pair the pipeline's actor loads
    generator = Generator(pair, job.decoding.to_config())
    inputs = [texts[i % len(texts)] for i in range(records)]
    generator.generate_one("warm up")
    connect_ray()

    runs = interleave({"in_process": lambda _: generator.generate(inputs), "pipeline": lambda _: run_job(job)},
                      1, repeats, torch.device("cpu"), warm_up=False)
    for (results,), (summary,) in zip(runs["in_process"].results, runs["pipeline"].results):  # one input each
        assert summary.records_in_output == records and not any(r.error for r in results)
    in_process, pipeline = runs["in_process"].repetition_seconds(), runs["pipeline"].repetition_seconds()
    ratios = [p / i for p, i in zip(pipeline, in_process)]
    return {
        "records": records,
        "repeats": repeats,
        "in_process_s": statistics.median(in_process),
        "pipeline_s": statistics.median(pipeline),
        "ratio_pipeline_over_in_process": statistics.median(ratios),
        "in_process_records_per_s": records / statistics.median(in_process),
        "pipeline_records_per_s": records / statistics.median(pipeline),
    }
