"""The job summary's throughput: decoding over the actors' busy time, beside end to end with its start-up."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io.schema import OUTPUT_SCHEMA, STATS_COLUMNS
from pipeline.io.storage import data_path
from pipeline.jobs.run_summary import summarize
from pipeline.jobs.schema import JobConfig
from pipeline.metrics.summary import decoding_rate
from pipeline.metrics.totals import actor_calls


def row(record_id: str, worker: str, start: float, seconds: float, tokens: int, error=None) -> dict:
    empty = {name: None for name in OUTPUT_SCHEMA.names}
    counters = {name: 0 for name in STATS_COLUMNS} | {"output_tokens": tokens, "small_tokens": tokens}
    return empty | counters | {"id": record_id, "worker": worker, "call_started_at": start, "call_seconds": seconds,
                               "error": error, "engine": "native", "quantize": "none"}


def rows(t: float) -> list[dict]:
    """Actor a: two calls of 2 s from t (4 s busy, 80 tokens); actor b: one of 5 s (50 tokens, and an error row)."""
    return [row("1", "a", t, 2.0, 30), row("2", "a", t, 2.0, 10), row("3", "a", t + 3, 2.0, 40),
            row("4", "b", t + 1, 5.0, 50), row("5", "b", t + 1, 5.0, 99, error="boom")]


def test_decoding_rate_is_each_actors_tokens_over_its_busy_time_summed():
    calls = actor_calls(pa.Table.from_pylist(rows(100.0), schema=OUTPUT_SCHEMA))
    assert decoding_rate(calls) == 80 / 4 + 50 / 5  # an error row's tokens do not count


def written_run(tmp_path, first_call: float) -> JobConfig:
    """A job whose output folder holds rows(first_call)."""
    folder = tmp_path / "run"
    Path(data_path(str(folder))).mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows(first_call), schema=OUTPUT_SCHEMA),
                   Path(data_path(str(folder))) / "part.parquet")
    return JobConfig.model_validate({"name": "t", "input": {"path": "in"}, "models": {"small": "s", "large": "l"},
                                     "output": {"path": str(folder)}})


def test_the_summary_gives_decoding_and_end_to_end_throughput_with_start_up(tmp_path):
    job_started = time.time() - 50.0  # the first call began 20 s after the job started
    job = written_run(tmp_path, first_call=job_started + 20.0)
    summary = summarize(job, records_in_input=5, decoded=5, job_started=job_started)
    assert summary.decoding_tokens_per_second == 30.0 and summary.actors == 2
    assert summary.actors_busy_seconds == (4.0 + 5.0) / 2
    assert abs(summary.startup_seconds - 20.0) < 1e-3  # until the first call began
    assert 50.0 <= summary.end_to_end_seconds < 60.0
    # One clock: start-up is the first part of the wall time, which is the end-to-end time.
    assert summary.startup_seconds <= summary.wall_seconds == summary.end_to_end_seconds
    line = summary.to_text().splitlines()[2]
    assert line.startswith("  throughput: decoding 30.0 output tokens/s on 2 actor(s) (busy 4.5 s each on average); "
                           "end to end ") and "of which" in line


def test_start_up_is_part_of_the_wall_time_on_one_clock(tmp_path):
    """The run's wall time runs from the job's start to its output written; a first call seen after that
    (an actor's host clock ahead of the driver's) cannot make start-up exceed it."""
    job_started = 1_000_000.0
    job = written_run(tmp_path, first_call=job_started + 20.0)
    decoded = 5
    summary = summarize(job, records_in_input=5, decoded=decoded, job_started=job_started, finished=job_started + 30.0)
    assert (summary.startup_seconds, summary.wall_seconds, summary.end_to_end_seconds) == (20.0, 30.0, 30.0)
    skewed = summarize(job, records_in_input=5, decoded=decoded, job_started=job_started, finished=job_started + 15.0)
    assert skewed.startup_seconds == skewed.wall_seconds == 15.0


def test_the_summary_gives_the_drivers_peak_memory_of_this_program(tmp_path):
    """VmHWM, this program's own peak: a child forked from a larger parent does not inherit the parent's."""
    import subprocess
    import sys

    job = written_run(tmp_path, first_call=time.time())
    summary = summarize(job, records_in_input=5, decoded=1, job_started=time.time())
    assert summary.driver_peak_rss_mib > 50 and "driver: peak memory" in summary.to_text()
    ballast = b"\1" * (400 << 20)  # written, so resident: this process is now 400 MiB above any child it starts
    child = subprocess.run([sys.executable, "-c", "from pipeline.metrics.memory import peak_rss_mib; "
                            "print(peak_rss_mib())"], capture_output=True, text=True, check=True)
    assert float(child.stdout) < 200, f"the parent's peak leaked into the child's: {child.stdout}"
    del ballast
