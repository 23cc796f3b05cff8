"""`bild-pipeline bench-pipeline`: the same records decoded in-process and through the Ray pipeline.

Both sides use one model pair, one torch thread and the same decoding settings; repetitions
alternate (harness.interleave, the order swapping each time) and the ratio is taken per pair.
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


def run_ct2_job_bench(job: JobConfig, repeats: int = 3) -> dict:
    """A `models.engine: ct2` job through the pipeline against CTranslate2 in-process on the same
    records, `bench-batch`'s CTranslate2 cell (one `translate_batch` over them all, max_batch_size =
    compute.batch_size, same threads), alternating in one process: the job's decoding tokens/s over its
    actors' busy time against in-process tokens/s, per repetition, and whether the texts agree."""
    from pipeline.decoding.engines.ct2_engine import load_checkpoint
    from pipeline.decoding.generator import encode_text
    from pipeline.io.fragments import read_fragment
    from pipeline.io.storage import input_files, read_output_table
    from pipeline.jobs.todo import input_fragments

    if job.models.engine != "ct2":
        raise ValueError(f"bench-pipeline --job compares a models.engine ct2 job; this one's is {job.models.engine}")
    spec, config = job.models.to_spec(), job.decoding.to_config()
    threads = max(1, int(job.compute.cpus_per_actor))
    model = load_checkpoint(getattr(spec, config.method), spec, threads)  # converts into the cache the actors read
    connect_ray(min_cpus=job.compute.actors * threads + 1)
    listing = input_files(job.input)
    records = [read_fragment(listing[0], job.input, fragment) for fragment in input_fragments(job.input, listing)]
    ids = [i for table in records for i in table["id"].to_pylist()]
    texts = {i: text for table in records for i, text in zip(table["id"].to_pylist(), table["text"].to_pylist())}
    inputs = [encode_text(model.tokenizer, texts[i], config.max_input_tokens)[0][0].tolist() for i in ids]

    def in_process(_):
        return model.generate(inputs, config.max_new_tokens, max_batch_size=job.compute.batch_size)

    in_process(0)  # warm-up; each run_job starts its actors afresh, as a job does
    runs = interleave({"in_process": in_process, "pipeline": lambda _: run_job(job)}, 1, repeats,
                      torch.device("cpu"), warm_up=False)
    outputs = runs["in_process"].results[-1][0]
    tokens = sum(len(tokens) for tokens in outputs)
    in_process_rates = [tokens / seconds for seconds in runs["in_process"].repetition_seconds()]
    pipeline_rates = [summary.decoding_tokens_per_second for (summary,) in runs["pipeline"].results]
    written = read_output_table(job.output.path, job.output.storage_options, columns=["id", "prediction"])
    predicted = dict(zip(written["id"].to_pylist(), written["prediction"].to_pylist()))
    same = sum(predicted.get(i) == model.tokenizer.decode(out, skip_special_tokens=True) for i, out in zip(ids, outputs))
    return {
        "records": len(ids),
        "repeats": repeats,
        "ct2": model.description,
        "in_process_tokens_per_s": in_process_rates,
        "pipeline_busy_tokens_per_s": pipeline_rates,
        "ratios": [p / i for p, i in zip(pipeline_rates, in_process_rates)],
        "ratio_median": statistics.median(p / i for p, i in zip(pipeline_rates, in_process_rates)),
        "identical_outputs": same,
    }
