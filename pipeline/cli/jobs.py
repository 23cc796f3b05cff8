"""Commands on job files: ``validate``, ``run``, ``report`` on a finished run, ``sweep`` over the thresholds
and ``tune`` (pick a sweep point as a decoding preset)."""

from __future__ import annotations

import json
import sys

import click

from pipeline.cli.options import cascade_grid, floats, override_option, renamed
from pipeline.decoding.config import METHODS

verbose_option = click.option("--verbose", is_flag=True, help="Show Ray's own output.")


@click.command()
@click.argument("job_files", nargs=-1, required=True, type=click.Path())
@override_option
@click.option("--schema-only", is_flag=True,
              help="Check the files' keys and values only, not the paths and models they name (e.g. a job for a "
                   "cluster, checked on a laptop).")
def validate(job_files, overrides, schema_only):
    """Check job files without running them (exit code 2 if any is invalid): their keys and values, then
    (unless --schema-only) that the local input holds the columns named and the models exist and pair."""
    from pipeline.jobs import JobFileError, load_job
    from pipeline.jobs.preflight import PreflightError, check_job

    bad = 0
    for path in job_files:
        try:
            job = load_job(path, overrides)
            if not schema_only:
                check_job(job)
        except JobFileError as exc:
            click.echo(str(exc), err=True)
            bad += 1
        except PreflightError as exc:
            click.echo("\n".join(f"{path}: {line}" for line in str(exc).splitlines()), err=True)
            bad += 1
        else:
            click.echo(f"{path}: ok (job {job.name!r}, method {job.decoding.method}, config {job.config_hash()})")
    sys.exit(2 if bad else 0)


def load_job_or_exit(job_file: str, overrides):
    """The validated job, or its problems on stderr and exit code 2."""
    from pipeline.jobs import JobFileError, load_job

    try:
        return load_job(job_file, overrides)
    except JobFileError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)


def _exit_2_on_bad_input(job_file: str, func, *args, **kwargs):
    """Run func; input that cannot be used at all (duplicate ids, existing output, a small and large model
    that do not fit together, a resume under other settings, an output another run holds, a job larger
    than the cluster) exits with code 2; an output file that cannot be read (and is not a torn write)
    stops the job with its message and code 1; a run whose lease another run took over stops with code 3."""
    from pipeline.decoding import IncompatiblePairError
    from pipeline.io.lease import EXIT_LEASE_LOST, OutputLeaseError, OutputLeaseLost, OutputStoreError
    from pipeline.io.storage import InputError, OutputReadError
    from pipeline.jobs.cluster_fit import ClusterTooSmallError
    from pipeline.jobs.fingerprint import ResumeMismatchError
    from pipeline.jobs.preflight import PreflightError
    from pipeline.jobs.run import EngineError, OutputExistsError

    try:
        return func(*args, **kwargs)
    except (InputError, OutputExistsError, IncompatiblePairError, EngineError, ResumeMismatchError,
            OutputLeaseError, ClusterTooSmallError, PreflightError) as exc:
        click.echo("\n".join(f"{job_file}: {line}" for line in str(exc).splitlines()), err=True)
        sys.exit(2)
    except (OutputReadError, OutputStoreError) as exc:
        click.echo(f"{job_file}: {exc}", err=True)
        sys.exit(1)
    except OutputLeaseLost as exc:
        click.echo(f"{job_file}: {exc}", err=True)
        sys.exit(EXIT_LEASE_LOST)


@click.command()
@click.argument("job_file", type=click.Path())
@override_option
@renamed("--ray-address", "--address", dest="address", default=None,
         help="Ray cluster to join, host:port (default: RAY_ADDRESS if set, else an embedded local Ray).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--verbose", is_flag=True, help="Show Ray's own output (workers' logs, Ray Data's operator tables).")
@click.option("--retry-errors", is_flag=True,
              help="Decode again the records whose rows hold an error (output.retry_errors: true).")
def run(job_file, overrides, address, as_json, verbose, retry_errors):
    """Run JOB_FILE: decode its input on Ray and write one output row per input id."""
    from pipeline.jobs.run import run_job

    job = load_job_or_exit(job_file, (*overrides, "output.retry_errors=true") if retry_errors else overrides)
    summary = _exit_2_on_bad_input(job_file, run_job, job, address=address, verbose=verbose, progress=not as_json)
    click.echo(json.dumps(summary.to_dict()) if as_json else summary.to_text())


@click.command()
@click.argument("run_path")
@renamed("--baseline-run", "--baseline", dest="baseline", default=None,
         help="The output folder of another run of the same inputs (e.g. one with method large) to compare with.")
@click.option("--out", "out_dir", default=None, help="Where to write summary.json, report.md and plots "
              "(default: RUN_PATH/report for a local run, else ./report).")
@click.option("--task", type=click.Choice(["translation", "summarization"]), default=None,
              help="Metric family (default: the run's job task).")
@click.option("--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
              help="fsspec option for reading the runs (credentials may also come from the environment).")
# Accepted and ignored (hidden), so that commands written for earlier versions still run: a report starts no Ray.
@click.option("--address", hidden=True, default=None)
@click.option("--verbose", hidden=True, is_flag=True)
def report(run_path, baseline, out_dir, task, storage_options, address, verbose):
    """Score a finished run: throughput, latency, quality against references, BiLD behaviour, errors.

    Reads the run's Parquet files directly (local or any fsspec URL); no cluster is needed."""
    from pathlib import Path

    from pipeline.jobs.load import JobFileError, parse_override
    from pipeline.jobs.report import build_report, result_line, write_report

    options = {}
    for item in storage_options:
        try:
            path, value = parse_override(item, flag="--storage-option", secret=True,
                                         example="endpoint_url=http://...")
        except JobFileError as exc:
            raise click.UsageError(str(exc)) from exc
        options[".".join(path)] = value
    if out_dir is None:
        out_dir = str(Path(run_path) / "report") if "://" not in run_path else "report"
    try:
        summary, totals = build_report(run_path, baseline=baseline, task=task, storage_options=options)
    except FileNotFoundError as exc:
        raise click.UsageError(str(exc)) from exc
    for path in write_report(summary, totals, out_dir):
        click.echo(f"wrote {path}")
    click.echo(result_line(summary))


def _positive_ints(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"expected whole numbers separated by commas, got {text!r}",
                                 param_hint=option) from exc
    if not values or min(values) < 1:
        raise click.BadParameter(f"expected whole numbers >= 1, got {text!r}", param_hint=option)
    return values


@click.command()
@click.argument("job_file", type=click.Path())
@renamed("--fallback-threshold", "--fallback", dest="fallback", default="0.2,0.4,0.6", show_default=True,
         help="alpha_FB values (decoding.fallback_threshold), comma-separated.")
@renamed("--rollback-threshold", "--rollback", dest="rollback", default="2,3,5", show_default=True,
         help="alpha_RB values (decoding.rollback_threshold), comma-separated.")
@renamed("--max-draft-tokens", "--window", dest="window", default=None,
         help="decoding.max_draft_tokens values, comma-separated: a third grid axis (points then end in _w<N>; "
              "default: the job's only).")
@click.option("--cascade", "cascades", multiple=True, metavar="RULE=ALPHAS",
              help="Speculative-cascade points: a deferral rule and its alpha values, e.g. chow=0.1,0.3,0.5 "
                   "(repeat for more rules; points cascade_<rule>_a<alpha>).")
@click.option("--lenience", "leniences", default=None,
              help="Speculative points at these lambda values, comma-separated (0: lossless; points speculative_l<lambda>).")
@override_option
@click.option("--out", "out_dir", default=None, help="Where to write sweep.json/.md/.png (default: OUTPUT/sweep "
              "for a local output, else ./sweep).")
@renamed("--ray-address", "--address", dest="address", default=None,
         help="Ray cluster to join, host:port (default: RAY_ADDRESS or a local Ray).")
@verbose_option
def sweep(job_file, fallback, rollback, window, cascades, leniences, overrides, out_dir, address, verbose):
    """Run JOB_FILE over a fallback x rollback (x window) grid plus `large` and `small` (and cascade and lossy
    speculative points); map latency vs quality."""
    from pathlib import Path

    from pipeline.jobs.sweep import run_sweep, write_sweep

    windows = _positive_ints(window, "--max-draft-tokens") if window is not None else None
    cascades_by_rule = cascade_grid(cascades)
    lenience_grid = floats(leniences) if leniences is not None else None
    job = load_job_or_exit(job_file, overrides)
    summary, table = _exit_2_on_bad_input(job_file, run_sweep, job, floats(fallback), floats(rollback),
                                          address=address, windows=windows, verbose=verbose, progress=True,
                                          cascades=cascades_by_rule, leniences=lenience_grid)
    if out_dir is None:
        out_dir = str(Path(job.output.path) / "sweep") if "://" not in job.output.path else "sweep"
    for path in write_sweep(table, job.task, out_dir, job.name):
        click.echo(f"wrote {path}")
    click.echo(summary.to_text())


@click.command()
@click.argument("sweep_json", type=click.Path(exists=True, dir_okay=False))
@click.option("--max-drop", type=float, default=0.5, show_default=True,
              help="Quality budget: at most this far below `large` on the sweep's metric.")
@click.option("--metric", default=None, help="Metric to budget (default: the sweep's, bleu or rougeL).")
@click.option("--method", default=None, type=click.Choice(METHODS),
              help="Pick among this method's points only (default: any, `large` included).")
@click.option("--out", "out_file", required=True, type=click.Path(dir_okay=False),
              help="Decoding preset to write, e.g. configs/decoding/demo_tuned.yaml.")
def tune(sweep_json, max_drop, metric, method, out_file):
    """Pick the fastest sweep point within a quality budget and write it as a decoding preset."""
    from pathlib import Path

    from pipeline.jobs.sweep import pick_point, preset_yaml

    data = json.loads(Path(sweep_json).read_text())
    metric = metric or data["metric"]
    try:
        point = pick_point(data["points"], metric, max_drop, method)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    Path(out_file).parent.mkdir(parents=True, exist_ok=True)
    Path(out_file).write_text(preset_yaml(point, metric, max_drop, sweep_json))
    click.echo(f"{point['point']}: {metric} {point[metric]:.2f}, speedup {point.get('speedup_vs_large') or 0:.2f}x "
               f"-> {out_file}")

