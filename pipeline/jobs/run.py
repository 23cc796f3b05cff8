"""Running a job: read -> (resume filter) -> decode in an actor pool -> write, plus run.json.

Resume is done by hand (see docs/jobs.md): the output directory itself is the checkpoint. Before
decoding, the ids already present in readable output files are skipped; a file cut off by a
crash is unreadable, so it is removed and its records are decoded again. Each output file is
written whole by one write task, so every id ends up exactly once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from importlib import metadata

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.io.schema import STATS_COLUMNS
from pipeline.io.storage import (
    arrow_filesystem,
    data_path,
    existing_rows,
    input_files,
    output_filesystem,
    output_files,
    read_manifest,
    read_output_table,
    read_ids,
    read_records,
    write_manifest,
)
from pipeline.decoding.config import DecodingConfig
from pipeline.jobs.console import Progress, quiet_ray
from pipeline.jobs.schema import JobConfig
from pipeline.metrics.summary import actor_calls, busy_seconds, decode_totals, decoding_rate
from pipeline.stage import DecodeStage, DecodeStageSpec

log = logging.getLogger(__name__)

# What the job's closing summary reads.
SUMMARY_COLUMNS = ["id", "error", "engine", "quantize", "worker", "call_started_at", "call_seconds", *STATS_COLUMNS]


class OutputExistsError(ValueError):
    """output.mode is "error" and the output path already holds results."""


class EngineError(ValueError):
    """The job names an engine that cannot run it here (a package missing, a method it lacks)."""


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
    # End to end, from the job's start (Ray, reading the input, loading the models included); start-up
    # is the time until the first actor call began decoding.
    end_to_end_seconds: float = 0.0
    startup_seconds: float | None = None
    # Cascade runs: the share of drafted positions whose deferral rule deferred (None without any).
    deferral_share: float | None = None
    plain_step_share: float = 0.0  # of the large model's calls, made without drafting (decoding.adaptive_draft)

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
            ]
        )

    def _per_second(self, count: int) -> float:
        return count / self.end_to_end_seconds if self.end_to_end_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens_per_second": self.tokens_per_second}


def _versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in ("bild-pipeline", "torch", "transformers", "ray", "pyarrow", "fsspec", "s3fs"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return found


def _cluster_info() -> dict:
    import ray

    resources = ray.cluster_resources()
    return {
        "nodes": len([n for n in ray.nodes() if n.get("Alive")]),
        "cpus": resources.get("CPU", 0),
        "gpus": resources.get("GPU", 0),
        "accelerators": sorted(k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")),
        "driver_host": platform.node(),
    }


def connect_ray(address: str | None = None, min_cpus: int = 1, verbose: bool = False) -> None:
    """Join the cluster at `address` (or RAY_ADDRESS, set inside a submitted job), else start an
    embedded local Ray. Never joins some other cluster on this machine by accident.

    An embedded Ray gets at least `min_cpus` logical CPUs: the decode actors hold theirs for the
    whole job, and the read and write tasks need one more, or they would wait forever. Unless
    `verbose`, the workers' output and Ray Data's INFO logs stay in Ray's log files (console.py)."""
    import ray

    quiet_ray(verbose)
    if ray.is_initialized():
        return
    target = address or os.environ.get("RAY_ADDRESS")
    if target:
        ray.init(address=target, logging_level=logging.WARNING, log_to_driver=verbose)
    else:
        # No dashboard: nothing reads an embedded Ray's, and on a small machine its processes take CPU
        # from the actors (and a second off the start-up).
        ray.init(address="local", num_cpus=max(os.cpu_count() or 1, min_cpus), include_dashboard=False,
                 logging_level=logging.WARNING, log_to_driver=verbose)


def _check_engines(job: JobConfig, points: "Points") -> None:
    """Engine ct2 (models.engine or report.baseline_engine) needs the ctranslate2 package and runs the
    plain methods only: a sweep's grid points decode with both models."""
    from pipeline.decoding.config import PLAIN_METHODS
    from pipeline.decoding.engines.ct2_engine import available

    wanted = [key for key, engine in (("models.engine", job.models.engine),
                                      ("report.baseline_engine", job.report.baseline_engine)) if engine == "ct2"]
    if wanted and not available():
        raise EngineError(f"{wanted[0]} ct2 needs the ctranslate2 package: pip install 'bild-pipeline[ct2]'")
    drafting = sorted({config.method for _, config in points if config.method not in PLAIN_METHODS})
    if job.models.engine == "ct2" and drafting:
        raise EngineError(f"models.engine ct2 runs methods large and small only; these points use "
                          f"{', '.join(drafting)} (sweep on the native or onnx engine)")


def _check_pair_early(job: JobConfig) -> None:
    """An incompatible pair of local folders stops the job before Ray starts (IncompatiblePairError),
    from the two configs and tokenizers alone. Hub ids, and folders the driver cannot read, are left to
    the actors, which make the same check before loading any weights (the driver would otherwise wait
    on the hub too)."""
    from pathlib import Path

    from pipeline.decoding import IncompatiblePairError, check_pair

    spec = job.models.to_spec()
    if spec.engine == "ct2" or not all(Path(name).is_dir() for name in (spec.small, spec.large)):
        return  # CTranslate2 runs one model alone (perhaps a converted folder, with no pair to check)
    try:
        check_pair(spec.small, spec.large, spec.tokenizer, spec.trust_remote_code)
    except IncompatiblePairError:
        raise
    except (OSError, ValueError) as exc:  # not here, or not readable without the actors' setup
        log.info("the pair is checked on the actors: the driver cannot read its configs (%s)", exc)


Points = tuple[tuple[str, DecodingConfig], ...]


def _stage_spec(job: JobConfig, points: Points, sweep: bool, ids: pa.Array) -> DecodeStageSpec:
    """The actors' spec; a job with report.baseline also decodes its first baseline_records records
    with that method (never a sweep: its grid holds `large` and `small` already)."""
    baseline = None if sweep or job.report.baseline is None else (
        dataclasses.replace(job.decoding.to_config(), method=job.report.baseline))
    return DecodeStageSpec(
        models=job.models.to_spec(),
        points=points,
        prompt=job.prompt,
        job_name=job.name,
        config_hash=job.config_hash(),
        torch_threads=max(1, int(job.compute.cpus_per_actor)),
        sweep=sweep,
        batch_size=job.compute.batch_size,
        verify_share=job.compute.verify_share,
        baseline=baseline,
        baseline_ids=frozenset(ids[: job.report.baseline_records].to_pylist()) if baseline else frozenset(),
        baseline_engine=job.report.baseline_engine if baseline else None,
        task=job.task,
    )


def _keep_ids(dataset, wanted: pa.Array):
    def keep(batch: pa.Table) -> pa.Table:
        return batch.filter(pc.is_in(batch["id"], value_set=wanted))

    return dataset.map_batches(keep, batch_format="pyarrow")


def decode_dataset(records, job: JobConfig, spec: DecodeStageSpec, done_points: dict | None = None):
    """The decode stage over a dataset of normal-form records (lazy)."""
    import ray.data

    compute = job.compute
    return records.map_batches(
        DecodeStage,
        fn_constructor_args=(spec, done_points),
        batch_size=compute.records_per_actor_call(),
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=compute.actors),
        num_cpus=compute.cpus_per_actor,
        num_gpus=compute.gpus_per_actor,
        # Ray Data's defaults already restart a dead actor and retry its tasks on the successor.
    )


def _resume_state(fs, path: str, ids: pa.Array, point_names: list[str] | None):
    """(ids still to decode, {id: points already done} for partly done ids).

    A job's record is done when its id is in the output; a sweep's when every point of it is."""
    if point_names is None:
        done = existing_rows(fs, path, ["id"])["id"]
        return pc.filter(ids, pc.invert(pc.is_in(ids, value_set=done.unique()))), {}
    pairs = existing_rows(fs, path, ["id", "point"]).to_pylist()
    by_id: dict[str, set[str]] = {}
    for pair in pairs:
        if pair["point"] in point_names:
            by_id.setdefault(pair["id"], set()).add(pair["point"])
    complete = pa.array([i for i, done in by_id.items() if len(done) == len(point_names)], pa.string())
    todo = pc.filter(ids, pc.invert(pc.is_in(ids, value_set=complete)))
    partial = {i: sorted(done) for i, done in by_id.items() if len(done) < len(point_names)}
    return todo, partial


def run_job(job: JobConfig, address: str | None = None, *, points: Points | None = None, verbose: bool = False,
            progress: bool = False) -> RunSummary:
    """Run a job; with ``points`` (name, DecodingConfig) it is a sweep: every record is decoded
    under every point by the same actor and the output rows carry a ``point`` column. ``progress``
    prints one progress line while it decodes; ``verbose`` lets Ray's own output through."""
    job_started = time.time()  # Unix seconds, as the rows' call_started_at
    sweep = points is not None
    points = points or ((job.decoding.method, job.decoding.to_config()),)
    _check_engines(job, points)
    _check_pair_early(job)  # before anything is read, removed or started
    out_fs, out_path = output_filesystem(job.output.path, job.output.storage_options)
    if job.output.mode == "error" and output_files(out_fs, out_path):
        raise OutputExistsError(f"output.path {job.output.path!r} already holds results and output.mode is 'error'")
    if job.output.mode == "overwrite" and out_fs.exists(out_path):
        out_fs.rm(out_path, recursive=True)

    connect_ray(address, min_cpus=math.ceil(job.compute.actors * job.compute.cpus_per_actor) + 1, verbose=verbose)
    listing = input_files(job.input)  # one listing: the ids are those of the records decoded
    records = read_records(job.input, listing)  # lazy: Ray Data reads it while the actors decode
    all_ids = read_ids(job.input, listing)
    ids = all_ids[: job.input.limit] if job.input.limit is not None else all_ids
    if job.output.mode == "resume":
        todo, partial = _resume_state(out_fs, out_path, ids, [name for name, _ in points] if sweep else None)
    else:
        todo, partial = ids, {}

    previous = read_manifest(out_fs, out_path) or {}
    attempt = {"started_at": dt.datetime.now(dt.timezone.utc).isoformat(), "to_decode": len(todo)}
    manifest = {
        "job": job.redacted(),
        "config_hash": job.config_hash(),
        "status": "running",
        "versions": _versions(),
        "cluster": _cluster_info(),
        "attempts": [*previous.get("attempts", []), attempt],
    }
    if sweep:
        manifest["sweep_points"] = {name: config.to_dict() for name, config in points}
    write_manifest(out_fs, out_path, manifest)

    started = time.perf_counter()
    try:
        if len(todo):
            selected = records if len(todo) == len(all_ids) else _keep_ids(records, todo)
            # Small blocks spread the work over every actor (readers merge small files into one
            # block) and flush output regularly; a block never exceeds output.rows_per_file.
            block_rows = max(1, min(job.output.rows_per_file, math.ceil(len(todo) / (4 * job.compute.actors))))
            selected = selected.repartition(target_num_rows_per_block=block_rows)
            spec = _stage_spec(job, points, sweep, ids)
            watch = Progress(out_fs, out_path, len(todo) * len(points)) if progress else contextlib.nullcontext()
            with watch:
                decode_dataset(selected, job, spec, partial).write_parquet(
                    data_path(out_path), filesystem=arrow_filesystem(out_fs), min_rows_per_file=block_rows
                )
    except BaseException as exc:
        attempt.update(finished_at=dt.datetime.now(dt.timezone.utc).isoformat(), error=f"{type(exc).__name__}")
        manifest["status"] = "failed"
        write_manifest(out_fs, out_path, manifest)
        raise
    wall = time.perf_counter() - started

    summary = summarize(job, records_in_input=len(ids), decoded=todo, wall_seconds=wall, job_started=job_started)
    attempt.update(finished_at=dt.datetime.now(dt.timezone.utc).isoformat(), summary=summary.to_dict())
    manifest["status"] = "succeeded"
    write_manifest(out_fs, out_path, manifest)
    return summary


def summarize(job: JobConfig, *, records_in_input: int, decoded: pa.Array, wall_seconds: float,
              job_started: float | None = None) -> RunSummary:
    table = read_output_table(job.output.path, job.output.storage_options, columns=SUMMARY_COLUMNS)
    now = table.filter(pc.is_in(table["id"], value_set=decoded)) if table.num_rows else table
    totals = decode_totals(now)
    calls = actor_calls(now) if now.num_rows else {}
    busy = {worker: busy_seconds(found) for worker, found in calls.items()}
    first_call = pc.min(now["call_started_at"]).as_py() if now.num_rows else None
    job_started = job_started if job_started is not None else time.time() - wall_seconds
    return RunSummary(
        job_name=job.name,
        output_path=job.output.path,
        records_in_input=records_in_input,
        records_in_output=pc.count_distinct(table["id"]).as_py() if table.num_rows else 0,
        decoded_now=pc.count_distinct(now["id"]).as_py() if now.num_rows else 0,
        skipped_existing=records_in_input - len(decoded),
        errors_now=int(pc.sum(pc.is_valid(now["error"])).as_py() or 0) if now.num_rows else 0,
        output_tokens_now=totals.output_tokens,
        wall_seconds=wall_seconds,
        small_share=totals.small_token_share,
        fallbacks_per_100_tokens=totals.fallbacks_per_100_tokens,
        rollbacks_per_100_tokens=totals.rollbacks_per_100_tokens,
        engines=sorted({e for e in now["engine"].to_pylist() if e}) if now.num_rows else [],
        decoding_tokens_per_second=decoding_rate(calls),
        actors_busy_seconds=sum(busy.values()) / len(busy) if busy else 0.0,
        actors=len(busy),
        end_to_end_seconds=time.time() - job_started,
        startup_seconds=max(0.0, first_call - job_started) if first_call is not None else None,
        quantized=sorted({q for q in now["quantize"].to_pylist() if q and q != "none"}) if now.num_rows else [],
        deferral_share=totals.deferral_share if totals.deferrals else None,
        plain_step_share=totals.plain_step_share,
    )
