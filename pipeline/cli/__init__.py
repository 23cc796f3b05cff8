"""The ``bild-pipeline`` command line: the ``main`` group, with one module per command group."""

from __future__ import annotations

import click

from pipeline.cli import bench, cluster, jobs, models


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="bild-pipeline")
def main() -> None:
    """Batch translation and summarization with Big Little Decoder (BiLD) speculative decoding."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading bars would bury the results


for _command in (
    jobs.validate, jobs.run, jobs.report, jobs.sweep, jobs.tune,
    models.generate, models.align, models.tiny_pair, models.inflate_pair,
    bench.bench_loop, bench.bench, bench.bench_pipeline, bench.bench_batch, bench.bench_table1,
    cluster.submit, cluster.status, cluster.logs, cluster.stop,
):
    main.add_command(_command)

