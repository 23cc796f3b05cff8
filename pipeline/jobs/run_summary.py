"""A run's closing summary: what this run decoded, how fast, and how BiLD behaved, from the output's rows."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.decoding.stats import DecodeStats

from pipeline.io.done import DoneRows, done_rows
from pipeline.io.schema import STATS_COLUMNS
from pipeline.io.storage import kept_rows, output_files, output_filesystem, output_tables
from pipeline.jobs.schema import JobConfig
from pipeline.metrics.memory import peak_rss_mib
from pipeline.metrics.summary import busy_seconds, decoding_rate
from pipeline.metrics.totals import actor_calls, decode_totals

# What the job's closing summary reads.
SUMMARY_COLUMNS = ["id", "point", "error", "engine", "quantize", "worker", "call_started_at", "call_seconds",
                   *STATS_COLUMNS]


@dataclass
class RunSummary:
    job_name: str
    output_path: str
    records_in_input: int
    records_in_output: int
    decoded_now: int
    skipped_existing: int
    errors_now: int
    output_tokens_now: int
    # End to end, on one clock (Unix seconds, as the rows' call_started_at): from the job's start (Ray,
    # reading the input, loading the models included) until its output was written. Start-up is its
    # first part: until the first actor call began decoding, so startup_seconds <= wall_seconds.
    wall_seconds: float
    small_share: float
    fallbacks_per_100_tokens: float
    rollbacks_per_100_tokens: float
    engines: list[str]  # what ran the models this run ("native", "hf"); from the output's engine column
    quantized: list[str] = dataclasses.field(default_factory=list)  # "int8" where models.quantize was
    # Decoding alone: this run's output tokens per second of each actor's busy time (the union of its
    # calls), summed over the actors, and their mean busy seconds.
    decoding_tokens_per_second: float = 0.0
    actors_busy_seconds: float = 0.0
    actors: int = 0
    end_to_end_seconds: float = 0.0  # wall_seconds, by its other name
    startup_seconds: float | None = None  # None when nothing was decoded
    # Cascade runs: the share of drafted positions whose deferral rule deferred (None without any).
    deferral_share: float | None = None
    plain_step_share: float = 0.0  # of the large model's calls, made without drafting (decoding.adaptive_draft)
    duplicate_rows_skipped: int = 0  # later rows of an id already in the output (a retried writer's), not counted
    driver_peak_rss_mib: float = 0.0  # the driver process's peak resident memory over the run, summary included

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens_now / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def to_text(self) -> str:
        return "\n".join(
            [
                f"job {self.job_name}: {self.records_in_output}/{self.records_in_input} records in {self.output_path}",
                f"  this run: {self.decoded_now} decoded ({self.errors_now} errors), "
                f"{self.skipped_existing} already done and skipped, {self.wall_seconds:.1f} s",
                f"  throughput: decoding {self.decoding_tokens_per_second:.1f} output tokens/s on {self.actors} "
                f"actor(s) (busy {self.actors_busy_seconds:.1f} s each on average); end to end "
                f"{self._per_second(self.output_tokens_now):.1f} output tokens/s, "
                f"{self._per_second(self.decoded_now):.2f} records/s ({self.end_to_end_seconds:.1f} s"
                + (f", of which {self.startup_seconds:.1f} s start-up" if self.startup_seconds is not None else "")
                + ")",
                f"  BiLD: {100 * self.small_share:.1f}% of tokens from the small model, "
                f"{self.fallbacks_per_100_tokens:.1f} fallbacks and {self.rollbacks_per_100_tokens:.1f} "
                f"rollbacks per 100 tokens"
                + (f"; {100 * self.deferral_share:.1f}% of drafted positions deferred" if self.deferral_share else "")
                + (f"; {100 * self.plain_step_share:.1f}% of large-model steps without drafting"
                   if self.plain_step_share else ""),
                f"  engine: {', '.join(self.engines) or 'none'}"
                + (f", weights {', '.join(self.quantized)}" if self.quantized else ""),
                f"  driver: peak memory {self.driver_peak_rss_mib:.0f} MiB",
            ] + ([f"  {self.duplicate_rows_skipped} duplicate row(s) of ids already in the output skipped"]
                 if self.duplicate_rows_skipped else [])
        )

    def _per_second(self, count: int) -> float:
        return count / self.end_to_end_seconds if self.end_to_end_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens_per_second": self.tokens_per_second}


def summarize(job: JobConfig, *, records_in_input: int, decoded: int, before: frozenset[str] = frozenset(),
              previous: DoneRows | None = None, sweep: bool = False, job_started: float,
              finished: float | None = None) -> RunSummary:
    """The run's summary: `decoded` records were to be decoded, into the output files not in `before` (those
    that were there when it began). ``job_started`` and ``finished`` (default: now) are Unix seconds
    (time.time(), the clock of the rows' call_started_at): when the job started and its output was written.

    The output's position columns are read first (io/done.py): only this run's files' where `previous` says what
    the others held (todo.py read it before the run), every file's otherwise. Where no input row was written
    twice, every row counts and only this run's files are read again, their columns summed file by file. A
    sweep's rows, or an output with a repeated row, go by their keys instead: which row of each id (and point)
    counts."""
    fs, path = output_filesystem(job.output.path, job.output.storage_options)
    files = output_files(fs, path)
    new = [file for file in files if file not in before]
    if sweep:
        done = None
    elif previous is not None:
        added = done_rows(fs, path, files=new)
        done = None if added is None else previous.joined(added)
    else:
        done = done_rows(fs, path)
    files = output_files(fs, path)
    if done is not None and not done.repeated:
        counted, in_output, now = _sums(fs, new, None), done.rows, None
    else:
        keys = pa.concat_tables(output_tables(fs, files, ["id", "point", "error"])) if files else None
        kept = np.zeros(keys.num_rows if keys else 0, dtype=bool)
        if keys is not None and keys.num_rows:
            kept[kept_rows(keys.select(["id", "point"]), keys["error"]).to_numpy()] = True
        is_new = np.concatenate([np.full(size, file not in before) for file, size in
                                 zip(files, _row_counts(fs, files))]) if files else kept
        mask = kept & is_new
        counted = _sums(fs, files, mask)
        ids = keys["id"] if keys is not None else pa.array([], pa.string())
        in_output = pc.count_distinct(ids.filter(pa.array(kept))).as_py() if kept.any() else 0
        now = pc.count_distinct(ids.filter(pa.array(mask))).as_py() if mask.any() else 0
    return _summary(job, counted, records_in_input=records_in_input, records_in_output=in_output,
                    decoded_now=counted.records if now is None else now, skipped=records_in_input - decoded,
                    repeated=done.repeated if done is not None else int((~kept).sum()),
                    job_started=job_started, finished=finished)


@dataclass
class _Counted:
    """What the summary sums over a run's rows, file by file."""
    sums: Counter = dataclasses.field(default_factory=Counter)
    calls: dict = dataclasses.field(default_factory=lambda: defaultdict(list))
    engines: set = dataclasses.field(default_factory=set)
    quantized: set = dataclasses.field(default_factory=set)
    errors: int = 0
    records: int = 0
    first_call: float | None = None


def _row_counts(fs, files: list[str]) -> list[int]:
    import pyarrow.parquet as pq

    counts = []
    for file in files:
        with fs.open(file, "rb") as handle:
            counts.append(pq.ParquetFile(handle).metadata.num_rows)
    return counts


def _sums(fs, files: list[str], mask: np.ndarray | None) -> _Counted:
    """The summary's sums over `files`' rows (those `mask` keeps, when given: one flag per row of the files in turn)."""
    counted, start = _Counted(), 0
    for table in output_tables(fs, files, SUMMARY_COLUMNS):
        if mask is not None:
            table, start = table.filter(pa.array(mask[start:start + table.num_rows])), start + table.num_rows
        if not table.num_rows:
            continue
        counted.records += table.num_rows
        counted.sums.update(decode_totals(table).to_dict())
        for worker, found in actor_calls(table).items():
            counted.calls[worker].extend(found)  # a call's rows in two files: busy_seconds takes the union
        counted.engines |= {engine for engine in pc.unique(table["engine"]).to_pylist() if engine}
        counted.quantized |= {q for q in pc.unique(table["quantize"]).to_pylist() if q and q != "none"}
        counted.errors += int(pc.sum(pc.is_valid(table["error"])).as_py() or 0)
        earliest = pc.min(table["call_started_at"]).as_py()
        if earliest is not None and (counted.first_call is None or earliest < counted.first_call):
            counted.first_call = earliest
    return counted


def _summary(job: JobConfig, counted: _Counted, *, records_in_input: int, records_in_output: int, decoded_now: int,
             skipped: int, repeated: int, job_started: float, finished: float | None) -> RunSummary:
    totals = DecodeStats.from_sums(counted.sums)
    calls = counted.calls
    busy = {worker: busy_seconds(found) for worker, found in calls.items()}
    wall_seconds = max(0.0, (time.time() if finished is None else finished) - job_started)
    # Start-up is part of the wall time; the bounds only guard against an actor's host clock that runs
    # apart from the driver's (call_started_at is taken there).
    first_call = counted.first_call
    startup = min(wall_seconds, max(0.0, first_call - job_started)) if first_call is not None else None
    return RunSummary(
        job_name=job.name,
        output_path=job.output.path,
        records_in_input=records_in_input,
        records_in_output=records_in_output,
        decoded_now=decoded_now,
        skipped_existing=skipped,
        errors_now=counted.errors,
        output_tokens_now=totals.output_tokens,
        wall_seconds=wall_seconds,
        small_share=totals.small_token_share,
        fallbacks_per_100_tokens=totals.fallbacks_per_100_tokens,
        rollbacks_per_100_tokens=totals.rollbacks_per_100_tokens,
        engines=sorted(counted.engines),
        decoding_tokens_per_second=decoding_rate({worker: sorted(found) for worker, found in calls.items()}),
        actors_busy_seconds=sum(busy.values()) / len(busy) if busy else 0.0,
        actors=len(busy),
        end_to_end_seconds=wall_seconds,
        startup_seconds=startup,
        driver_peak_rss_mib=peak_rss_mib(),
        quantized=sorted(counted.quantized),
        deferral_share=totals.deferral_share if totals.deferrals else None,
        plain_step_share=totals.plain_step_share,
        duplicate_rows_skipped=repeated,
    )
