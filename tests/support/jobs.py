"""End-to-end jobs for the pipeline tests: a job over a tiny pair and what its output must hold (its input
shards: support/shards.py)."""

from __future__ import annotations

import pyarrow as pa

from pipeline.io.storage import read_output_table
from pipeline.jobs import JobConfig

__all__ = ["ENGINES", "assert_one_row_per_id", "engine_job", "make_job", "output_rows"]


def make_job(pair, input_path, output_path, fmt="parquet", **sections) -> JobConfig:
    small, large = pair
    data = {
        "name": "test",
        "input": {"path": str(input_path), "format": fmt, "id_column": "id", "text_column": "text",
                  "reference_column": "ref"},
        "models": {"small": small, "large": large, "device": "cpu"},
        "decoding": {"method": "bild", "max_new_tokens": 8},
        "compute": {"actors": 1, "batch_size": 4},
        "output": {"path": str(output_path), "mode": "overwrite"},
    }
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    return JobConfig.model_validate(data)


# Where the decoding-layer invariants do not reach: the same jobs with CTranslate2 running `large`
# (models.engine ct2: converted once into the session's cache) as with our own engine running `bild`.
ENGINES = ["native", "ct2"]


def engine_job(engine: str, cache: str, pair, input_path, output_path, fmt="parquet", **sections) -> JobConfig:
    """make_job, with models.engine ct2 and method large where ``engine`` is ct2."""
    if engine == "ct2":
        sections["models"] = {**sections.get("models", {}), "engine": "ct2", "ct2_cache": cache}
        sections["decoding"] = {**sections.get("decoding", {}), "method": "large"}
    return make_job(pair, input_path, output_path, fmt, **sections)


def output_rows(job: JobConfig) -> pa.Table:
    return read_output_table(job.output.path, job.output.storage_options)


def assert_one_row_per_id(table: pa.Table, ids: list[str]):
    got = table.column("id").to_pylist()
    assert sorted(got) == sorted(ids), "every input id exactly once"
