"""Running a job: read -> (resume filter) -> decode in an actor pool -> write, plus run.json.

Resume is done by hand (see docs/jobs.md): the output directory itself is the checkpoint. Before
decoding, the input rows already present in readable output files are skipped (todo.py); a file cut
off by a crash is unreadable, so it is removed and its records are decoded again. Each output file is
written whole by one write task; a write task Ray retried can leave a second row for a record, which
the resume, the summary and the report skip and count. One run at a time holds an output (its
lease), and a resume under settings that would change the rows is refused (fingerprint.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import math
import os
import platform
import posixpath
import time
from importlib import metadata

import pyarrow as pa

from pipeline.io.lease import LEASE, OutputLease
from pipeline.io.storage import (
    arrow_filesystem,
    data_path,
    drop_superseded_rows,
    input_files,
    output_filesystem,
    output_files,
    read_manifest,
    write_manifest,
)
from pipeline.decoding.config import DecodingConfig
from pipeline.jobs.cluster_fit import check_cluster_fits
from pipeline.jobs.console import Progress, quiet_ray
from pipeline.jobs.fingerprint import check_resume, decisive_settings, models_content
from pipeline.jobs.preflight import check_job
from pipeline.jobs.run_summary import RunSummary, summarize
from pipeline.jobs.schema import JobConfig
from pipeline.jobs.todo import Todo, first_ids, input_fragments, plan_todo
from pipeline.stage.in_flight import in_flight_registry
from pipeline.io.language import LanguageCheck
from pipeline.stage import DecodeStage, DecodeStageSpec, PairedBaseline

log = logging.getLogger(__name__)

class OutputExistsError(ValueError):
    """output.mode is "error" and the output path already holds results."""


class EngineError(ValueError):
    """The job names an engine that cannot run it here (a package missing, a method it lacks)."""


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
    from pipeline.decoding.rules import ct2_method_problem

    wanted = [key for key, engine in (("models.engine", job.models.engine),
                                      ("report.baseline_engine", job.report.baseline_engine)) if engine == "ct2"]
    if not wanted:
        return
    from pipeline.decoding.engines.ct2_engine import available  # imports transformers: 3 s a job without ct2 saves

    if not available():
        raise EngineError(f"{wanted[0]} ct2 needs the ctranslate2 package: pip install 'bild-pipeline[ct2]'")
    if job.models.engine == "ct2":
        problem = ct2_method_problem([config.method for _, config in points], key="the sweep's points' method")
        if problem:
            raise EngineError(f"{problem} (sweep on the native or onnx engine)")


Points = tuple[tuple[str, DecodingConfig], ...]


def _stage_spec(job: JobConfig, points: Points, sweep: bool, first: pa.Array, in_flight: str) -> DecodeStageSpec:
    """The actors' spec; a job with report.baseline also decodes its first baseline_records records
    with that method (never a sweep: its grid holds `large` and `small` already); `first`: their ids."""
    baseline = None if sweep or job.report.baseline is None else PairedBaseline(
        config=dataclasses.replace(job.decoding.to_config(), method=job.report.baseline),
        models=dataclasses.replace(job.models.to_spec(), engine=job.report.baseline_engine or job.models.engine),
        ids=frozenset(first.to_pylist()))
    return DecodeStageSpec(
        models=job.models.to_spec(),
        points=points,
        prompt=job.prompt,
        job_name=job.name,
        config_hash=job.config_hash(),
        torch_threads=max(1, int(job.compute.cpus_per_actor)),
        sweep=sweep,
        batch=job.compute.batch_policy(),
        baseline=baseline,
        task=job.task,
        in_flight_registry=in_flight,
        segment=job.input.segment,
        markup=job.input.markup,
        language=job.input.language,
        language_check=None if job.input.language_check == "off" else LanguageCheck(
            job.input.language_check, job.input.language, job.input.target_language),
    )


def decode_dataset(records, job: JobConfig, spec: DecodeStageSpec, done_points: dict | None = None,
                   stage=DecodeStage):
    """The decode stage over a dataset of normal-form records (lazy)."""
    import ray.data

    compute = job.compute
    return records.map_batches(
        stage,
        fn_constructor_args=(spec, done_points),
        batch_size=compute.records_per_actor_call(),
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=compute.actors),
        num_cpus=compute.cpus_per_actor,
        num_gpus=compute.gpus_per_actor,
        # Ray Data's defaults already restart a dead actor and retry its tasks on the successor.
    )


def run_job(job: JobConfig, address: str | None = None, *, points: Points | None = None, verbose: bool = False,
            progress: bool = False, stage=DecodeStage) -> RunSummary:
    """Run a job; with ``points`` (name, DecodingConfig) it is a sweep: every record is decoded
    under every point by the same actor and the output rows carry a ``point`` column. ``progress``
    prints one progress line while it decodes; ``verbose`` lets Ray's own output through. ``stage``: the
    class Ray Data runs on the actors (bench-pipeline --decode none takes decoding out; no job file can).

    The run holds the output's lease (io/lease.py) from before it reads the output until it is done."""
    job_started = time.time()  # Unix seconds, as the rows' call_started_at
    sweep = points is not None
    points = points or ((job.decoding.method, job.decoding.to_config()),)
    _check_engines(job, points)
    # Before anything is removed or started: the input's files and columns, the model folders, the pair.
    listing = input_files(job.input)  # one listing: the records checked are those decoded
    check_job(job, listing)
    out_fs, out_path = output_filesystem(job.output.path, job.output.storage_options)
    with OutputLease(out_fs, out_path, url=job.output.path) as lease:
        try:
            return _run_holding_the_lease(job, address, points, sweep, lease, listing, stage,
                                          verbose=verbose, progress=progress, job_started=job_started)
        except KeyboardInterrupt:
            if lease.lost is not None:  # the lease thread interrupted us: another run holds the output now
                raise lease.lost_error() from None
            raise


def _run_holding_the_lease(job: JobConfig, address, points: Points, sweep: bool, lease: OutputLease, listing,
                           stage, *, verbose: bool, progress: bool, job_started: float) -> RunSummary:
    out_fs, out_path = lease.fs, lease.output_path
    if job.output.mode == "error" and output_files(out_fs, out_path):
        raise OutputExistsError(f"output.path {job.output.path!r} already holds results and output.mode is 'error'")
    resume = job.output.mode == "resume"
    previous = read_manifest(out_fs, out_path) if resume else None
    manifest = {
        "job": job.redacted(),
        "config_hash": job.config_hash(),
        "decisive_settings": decisive_settings(job),
        "models_content": models_content(job),
    }
    if resume:
        check_resume(previous or {}, manifest, job.output.path, job)  # before Ray starts or any torn file is removed

    import ray

    embedded = not ray.is_initialized() and not (address or os.environ.get("RAY_ADDRESS"))
    connect_ray(address, min_cpus=math.ceil(job.compute.actors * job.compute.cpus_per_actor) + 1, verbose=verbose)
    check_cluster_fits(job.compute, wait_seconds=0 if embedded else None)  # no autoscaler grows an embedded Ray
    in_fs = listing[0]
    fragments = input_fragments(job.input, listing)  # its ids checked on the workers, before anything is removed
    if job.output.mode == "overwrite":
        _clear_output(out_fs, out_path)
    todo = plan_todo(in_fs, job.input, fragments, out_fs, out_path, resume=resume,
                     point_names=[name for name, _ in points] if sweep else None, retry_errors=job.output.retry_errors)

    attempt = {"started_at": dt.datetime.fromtimestamp(job_started, dt.timezone.utc).isoformat(),  # the job's start
               "to_decode": todo.to_decode}
    manifest.update(status="running", versions=_versions(), cluster=_cluster_info(),
                    attempts=[*(previous or {}).get("attempts", []), attempt])
    if sweep:
        manifest["sweep_points"] = {name: config.to_dict() for name, config in points}
    write_manifest(out_fs, out_path, manifest)

    before = frozenset(output_files(out_fs, out_path))  # what the summary does not count as this run's
    try:
        if todo.to_decode:
            first = first_ids(in_fs, job.input, fragments, job.report.baseline_records) if job.report.baseline else None
            _decode_and_write(job, points, sweep, todo, in_fs, (out_fs, out_path), first, stage, progress)
    except BaseException as exc:
        if lease.lost is not None:  # the output is another run's now: leave its manifest alone
            raise
        attempt.update(finished_at=dt.datetime.now(dt.timezone.utc).isoformat(), error=f"{type(exc).__name__}")
        manifest["status"] = "failed"
        write_manifest(out_fs, out_path, manifest)
        raise

    finished = time.time()
    lease.check_held()  # rows written between two renewals after a takeover: no manifest over the other run's
    if job.output.retry_errors:  # the error rows decoded again give way to their new rows
        drop_superseded_rows(out_fs, out_path, ["id", "point"] if sweep else ["id"])
    # What the output held before the run, unless its error rows were decoded again: their old rows are gone now.
    previous = None if job.output.retry_errors else todo.done
    summary = summarize(job, records_in_input=todo.records_in_input, decoded=todo.to_decode, before=before,
                        previous=previous, sweep=sweep, job_started=job_started, finished=finished)
    attempt.update(finished_at=dt.datetime.now(dt.timezone.utc).isoformat(), summary=summary.to_dict())
    manifest["status"] = "succeeded"
    write_manifest(out_fs, out_path, manifest)
    return summary


def _decode_and_write(job: JobConfig, points: Points, sweep: bool, todo: Todo, in_fs, output, first: pa.Array | None,
                      stage, progress: bool) -> None:
    """The records to decode, through the actors, into the output's files; `first`: report.baseline's records' ids."""
    out_fs, out_path = output
    # Small blocks spread the work over every actor and flush output regularly; a block never exceeds
    # output.rows_per_file.
    block_rows = max(1, min(job.output.rows_per_file, math.ceil(todo.to_decode / (4 * job.compute.actors))))
    records = todo.dataset(in_fs, job.input, block_rows)
    watch = Progress(out_fs, out_path, todo.to_decode * len(points)) if progress else contextlib.nullcontext()
    with in_flight_registry() as registry, watch:
        spec = _stage_spec(job, points, sweep, first, registry)
        decode_dataset(records, job, spec, todo.partial, stage).write_parquet(
            data_path(out_path), filesystem=arrow_filesystem(out_fs), min_rows_per_file=block_rows
        )


def _clear_output(fs, path: str) -> None:
    """output.mode overwrite: remove what the output folder holds, except the lease this run holds (and its
    takeover claim)."""
    if not fs.exists(path):
        return
    for entry in fs.ls(path, detail=False):
        if not posixpath.basename(entry.rstrip("/")).startswith(LEASE):
            fs.rm(entry, recursive=True)
