"""Benchmark commands: ``bench`` (methods and engines side by side at batch 1), ``bench-batch`` (throughput
at several batch sizes), ``bench-loop`` (loop overhead) and ``bench-pipeline`` (Ray's overhead)."""

from __future__ import annotations

import contextlib
import json

import click

from pipeline.cli.models import load_pair
from pipeline.cli.options import cascade_grid, engine_option, options, override_option, quantize_option, renamed
from pipeline.decoding.config import DTYPE_NAMES, DecodingConfig, ModelSpec


@click.command("bench-loop")
@click.option("--small", default=None, help="Small model (default: a tiny random T5 pair built in memory).")
@click.option("--large", default=None, help="Large model.")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(DTYPE_NAMES))
@click.option("--device", default="auto", show_default=True)
@renamed("--limit", "--inputs", dest="num_inputs", type=int, default=8, show_default=True,
         help="How many inputs to decode.")
@click.option("--repeats", type=int, default=5, show_default=True, help="Interleaved repetitions.")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--fallback-threshold", type=float, default=0.4, show_default=True)
@click.option("--rollback-threshold", type=float, default=3.0, show_default=True)
@click.option("--threads", type=int, default=None, help="torch CPU threads (default: torch's own choice).")
@engine_option
def bench_loop(small, large, dtype, device, num_inputs, repeats, max_new_tokens, fallback_threshold,
               rollback_threshold, threads, engine):
    """Loop overhead: our `large` loop vs HF generate(), and BiLD bookkeeping vs model time."""
    import torch

    from pipeline.bench.loop import run_loop_bench

    if (small is None) != (large is None):
        raise click.UsageError("give both --small and --large, or neither")
    pair = _bench_pair(small, large, dtype, device, threads, engine)
    described = (f"small={small} large={large}" if small is not None
                 else "tiny random T5 pair (noisy small copy), built in memory")
    texts = list(_BENCH_TEXTS)[:num_inputs]
    config = DecodingConfig(method="bild", max_new_tokens=max_new_tokens, fallback_threshold=fallback_threshold,
                            rollback_threshold=rollback_threshold)
    result = run_loop_bench(pair, texts, config, repeats=repeats)
    click.echo(f"pair: {described}; device: {pair.device}; torch threads: {torch.get_num_threads()}")
    click.echo(result.to_markdown())


_bench_input_options = options(
    click.option("--small", default=None, help="Small model (default: a tiny random T5 pair built in memory)."),
    click.option("--large", default=None),
    click.option("--source", type=click.Path(exists=True, dir_okay=False), default=None,
                 help="Inputs, one per line (e.g. test_2016_flickr.de)."),
    click.option("--reference", type=click.Path(exists=True, dir_okay=False), default=None,
                 help="References, one per line, parallel to --source (adds BLEU)."),
    click.option("--prompt", default=None, help='Template around each input, e.g. "summarize: {text}".'),
)
_bench_decoding_options = options(
    click.option("--max-new-tokens", type=int, default=64, show_default=True),
    click.option("--fallback-threshold", type=float, default=0.4, show_default=True),
    click.option("--rollback-threshold", type=float, default=3.0, show_default=True),
    click.option("--max-draft-tokens", type=int, default=10, show_default=True),
    click.option("--device", default="cpu", show_default=True),
    click.option("--dtype", default="float32", show_default=True, type=click.Choice(DTYPE_NAMES)),
    click.option("--threads", type=int, default=None, help="torch CPU threads."),
    engine_option,
    quantize_option,
    click.option("--ct2/--no-ct2", "with_ct2", default=None,
                 help="Add CTranslate2 rows: the same checkpoints converted by CTranslate2's own converter "
                      "(default: when ctranslate2 is installed, pip install -e .[bench])."),
)


@click.command()
@_bench_input_options
@click.option("--limit", type=int, default=100, show_default=True)
@click.option("--repeats", type=int, default=2, show_default=True)
@_bench_decoding_options
@click.option("--projection/--no-projection", default=True, show_default=True,
              help="Also project the speedup at T5-small/T5-large shapes (random weights, timed here).")
@click.option("--compare-engines", is_flag=True, default=False,
              help="Also decode with `large` on our native engine and Hugging Face's in turn: speed per step, same tokens.")
@click.option("--cascade", "cascades", multiple=True, metavar="RULE=ALPHAS",
              help="Also speculative-cascade rows (method cascade), e.g. chow=0.3 or diff=0,0.1 (repeatable; rows "
                   "cascade_<rule>_a<alpha>, named as sweep points are), with --max-draft-tokens' window.")
@click.option("--out", "out_dir", default=None, help="Write bench.md and bench.json here.")
def bench(small, large, source, reference, prompt, limit, repeats, max_new_tokens, fallback_threshold,
          rollback_threshold, max_draft_tokens, device, dtype, threads, engine, quantize, with_ct2, projection,
          compare_engines, cascades, out_dir):
    """BiLD vs large, small, speculative (and speculative cascades), HF generate, HF assisted generation
    and CTranslate2, side by side (batch 1)."""

    from pipeline.bench.methods import cascade_variants, fixed_variants, render_markdown, run_bench

    pair, texts, references = _bench_inputs(small, large, dtype, device, threads, engine, source, reference, limit,
                                            prompt, quantize)
    config = DecodingConfig(method="bild", max_new_tokens=max_new_tokens, fallback_threshold=fallback_threshold,
                            rollback_threshold=rollback_threshold, max_draft_tokens=max_draft_tokens)
    try:
        variants = fixed_variants(config) | cascade_variants(
            config, [(rule, alpha) for rule, alphas in cascade_grid(cascades).items() for alpha in alphas])
    except ValueError as exc:  # an alpha outside its rule's range
        raise click.BadParameter(str(exc), param_hint="--cascade") from exc
    with _ct2_models(pair, with_ct2) as ct2:
        report = run_bench(pair, texts, references, config, repeats=repeats, with_projection=projection, ct2=ct2,
                           with_engines=compare_engines, variants=variants)
    _show_report(render_markdown(report), report, out_dir, "bench")


@contextlib.contextmanager
def _ct2_models(pair, wanted: bool | None):
    """The pair converted for CTranslate2 in a temporary folder, or None (not wanted, not installed)."""
    import tempfile

    import torch

    from pipeline.bench import ct2 as bench_ct2

    if wanted is False or (wanted is None and not bench_ct2.available()):
        yield None
        return
    if not bench_ct2.available():
        raise click.UsageError("--ct2 needs the ctranslate2 package: pip install -e .[bench]")
    if not pair.is_encoder_decoder or pair.device.type != "cpu" or pair.large.dtype != torch.float32:
        if wanted:
            raise click.UsageError("--ct2 compares encoder-decoder pairs in float32 on the CPU")
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="bild-ct2-") as work:
        try:
            models = bench_ct2.convert_pair(pair, work, threads=torch.get_num_threads())
        except ValueError as exc:
            raise click.UsageError(str(exc)) from exc
        yield models


def _show_report(markdown: str, report: dict, out_dir: str | None, stem: str) -> None:
    """Print a benchmark's Markdown; with out_dir also write it and its JSON as <stem>.md/.json."""
    from pathlib import Path

    click.echo(markdown)
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / f"{stem}.md").write_text(markdown + "\n")
        (Path(out_dir) / f"{stem}.json").write_text(json.dumps(report, indent=2, default=str))


def _bench_pair(small, large, dtype, device, threads, engine, quantize="none"):
    """The named pair, or (either name missing) a tiny random T5 pair built in memory; ``threads``
    sets torch's CPU threads first."""
    import torch

    from pipeline.decoding import ModelPair

    if threads:
        torch.set_num_threads(threads)
    if small is None or large is None:
        from pipeline.pairs.tiny import build_pair

        small_model, large_model, tokenizer = build_pair("t5", small="noisy")
        return ModelPair(small_model, large_model, tokenizer, torch.device("cpu"), engine_request=engine,
                         quantize=quantize)
    return load_pair(ModelSpec(small, large, dtype=dtype, device=device, engine=engine, quantize=quantize))


def _bench_inputs(small, large, dtype, device, threads, engine, source, reference, limit, prompt, quantize="none"):
    """(pair, texts, references) for a benchmark: the named pair (or a tiny random T5 pair built in
    memory) and the first ``limit`` lines of ``source``/``reference`` (or built-in sentences)."""
    from pathlib import Path

    pair = _bench_pair(small, large, dtype, device, threads, engine, quantize)
    texts = (Path(source).read_text(encoding="utf-8").splitlines() if source else list(_BENCH_TEXTS))[:limit]
    references = Path(reference).read_text(encoding="utf-8").splitlines()[:limit] if reference else None
    if prompt:
        texts = [prompt.format(text=text) for text in texts]
    return pair, texts, references


@click.command("bench-pipeline")
@click.option("--small", default=None, help="Small model folder (default: a tiny random T5 pair saved to a temp dir).")
@click.option("--large", default=None)
@renamed("--limit", "--records", dest="records", type=int, default=512, show_default=True,
         help="How many records the job decodes.")
@click.option("--repeats", type=int, default=2, show_default=True)
@click.option("--job", "job_file", default=None, type=click.Path(exists=True),
              help="A models.engine ct2 job (e.g. jobs/nightly_ct2.yaml): its busy-time tokens/s through the "
                   "pipeline against CTranslate2 in-process on its records, alternating.")
@override_option
@click.option("--decode", type=click.Choice(["model", "none"]), default="model", show_default=True,
              help="none: decoding taken out (each record passed through), --limit synthetic short records, the "
                   "pipeline against Ray Data's own read_parquet -> map_batches(identity) -> write_parquet (and the "
                   "same writing the pipeline's output rows), each in a driver process of its own: wall time, "
                   "records/s, driver peak RSS; report on the output; and a resume half done.")
@click.option("--workdir", default=None, type=click.Path(file_okay=False),
              help="--decode none: where the synthetic corpus is written (and kept: a later run reuses it) and the "
                   "runs write (default: a temporary folder).")
@click.option("--out", "out_dir", default=None, help="--decode none: write scale.md and scale.json there.")
def bench_pipeline(small, large, records, repeats, job_file, overrides, decode, workdir, out_dir):
    """Pipeline overhead: the same records in-process vs through Ray (one actor), ratio printed; with --decode
    none, the pipeline around decoding at corpus scale against Ray Data's own identity pass."""
    import tempfile
    from pathlib import Path

    from pipeline.bench.pipeline_job import run_ct2_job_bench, run_pipeline_bench

    if decode == "none":
        _scale_bench(records, repeats, workdir, out_dir)
        return

    if job_file:
        from pipeline.cli.jobs import load_job_or_exit

        job = load_job_or_exit(job_file, overrides)
        try:
            result = run_ct2_job_bench(job, repeats)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from exc
        rows = zip(result["pipeline_busy_tokens_per_s"], result["in_process_tokens_per_s"], result["ratios"])
        click.echo(f"records: {result['records']}, repetitions: {result['repeats']} (alternating), CTranslate2 "
                   f"{result['ct2']}\n| repetition | job: busy-time tokens/s | in-process tokens/s | ratio |\n|---|---|---|---|")
        for number, (job_rate, own_rate, ratio) in enumerate(rows, start=1):
            click.echo(f"| {number} | {job_rate:.0f} | {own_rate:.0f} | {ratio:.2f}x |")
        click.echo(f"median ratio: {result['ratio_median']:.2f}x; outputs identical on {result['identical_outputs']}"
                   f"/{result['records']} records")
        return

    with tempfile.TemporaryDirectory() as tmp:
        if small is None or large is None:
            from pipeline.pairs.tiny import save_pair

            small, large = (str(p) for p in save_pair(Path(tmp) / "pair", "t5", small="noisy"))
        result = run_pipeline_bench(small, large, _BENCH_TEXTS, Path(tmp), records=records, repeats=repeats)
    click.echo(
        f"records: {result['records']}, repetitions: {result['repeats']} (alternating)\n"
        f"in-process: {result['in_process_s']:.2f} s ({result['in_process_records_per_s']:.1f} records/s)\n"
        f"pipeline:   {result['pipeline_s']:.2f} s ({result['pipeline_records_per_s']:.1f} records/s)\n"
        f"ratio pipeline / in-process: {result['ratio_pipeline_over_in_process']:.2f}x"
    )


def _scale_bench(records: int, repeats: int, workdir: str | None, out_dir: str | None) -> None:
    import json
    import tempfile
    from pathlib import Path

    from pipeline.bench.scale import render_scale, run_scale_bench

    with tempfile.TemporaryDirectory() as tmp:
        rows = run_scale_bench([records], repeats, Path(workdir or tmp))
    markdown = render_scale(rows)
    click.echo(markdown)
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "scale.md").write_text(markdown + "\n")
        (Path(out_dir) / "scale.json").write_text(json.dumps(rows, indent=2))


@click.command("bench-batch")
@_bench_input_options
@click.option("--limit", type=int, default=128, show_default=True)
@click.option("--repeats", type=int, default=2, show_default=True)
@click.option("--methods", default="large,bild,bild_fixed,speculative", show_default=True,
              help="Comma-separated: large, small, bild, speculative (measured windows, the default; a _fixed suffix: "
                   "decoding.adaptive_draft off, always --max-draft-tokens; _adaptive: on), ct2_large, "
                   "ct2_large_int8 ...")
@click.option("--batch-sizes", default="1,4,16,32", show_default=True)
@click.option("--verify-shares", default="0.5", show_default=True,
              help="Comma-separated verify_share values to run for bild/speculative at batch sizes > 1.")
@_bench_decoding_options
@click.option("--out", "out_dir", default=None, help="Write bench_batch.md and bench_batch.json here.")
def bench_batch(small, large, source, reference, prompt, limit, repeats, methods, batch_sizes, verify_shares,
                max_new_tokens, fallback_threshold, rollback_threshold, max_draft_tokens, device, dtype, threads,
                engine, quantize, with_ct2, out_dir):
    """Batched decoding throughput: tokens/s at several batch sizes, ratios measured in one run."""

    from pipeline.bench.batch import render_markdown, run_batch_bench

    pair, texts, references = _bench_inputs(small, large, dtype, device, threads, engine, source, reference, limit,
                                            prompt, quantize)
    config = DecodingConfig(method="bild", max_new_tokens=max_new_tokens, fallback_threshold=fallback_threshold,
                            rollback_threshold=rollback_threshold, max_draft_tokens=max_draft_tokens)
    with _ct2_models(pair, with_ct2) as ct2:
        report = run_batch_bench(
            pair, texts, references, config,
            methods=tuple(m.strip() for m in methods.split(",")),
            batch_sizes=tuple(int(b) for b in batch_sizes.split(",")),
            verify_shares=tuple(float(v) for v in verify_shares.split(",")),
            repeats=repeats, ct2=ct2,
        )
    _show_report(render_markdown(report), report, out_dir, "bench_batch")



@click.command("bench-table1")
@click.option("--models", required=True, type=click.Path(exists=True, file_okay=False),
              help="Folder with large/, small/, small-aligned/.")
@click.option("--source", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--reference", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--preset", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Decoding preset with the chosen thresholds.")
@click.option("--limit", type=int, default=None)
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--threads", type=int, default=1, show_default=True)
@engine_option
@quantize_option
@click.option("--out", "out_dir", default=None, help="Write table.md and table.json here.")
def bench_table1(models, source, reference, preset, limit, max_new_tokens, threads, engine, quantize, out_dir):
    """The paper's Table 1 on our pair: BLEU and speedup of large, small, aligned small and BiLD (unaligned,
    aligned), side by side (batch 1)."""
    import torch

    from pipeline.bench.table1 import render_markdown, run_table1

    torch.set_num_threads(threads)
    report = run_table1(models, source, reference, preset, limit=limit, max_new_tokens=max_new_tokens, engine=engine,
                        quantize=quantize)
    _show_report(render_markdown(report), report, out_dir, "table")


_BENCH_TEXTS = [
    "Ein Hund läuft über die Wiese.",
    "Zwei Männer spielen Fußball im Park.",
    "Eine Frau mit rotem Hut liest ein Buch.",
    "Kinder bauen eine Sandburg am Strand.",
    "Ein Mann fährt mit dem Fahrrad durch die Stadt.",
    "Eine Gruppe von Menschen steht vor einem Gebäude.",
    "Ein kleines Mädchen klettert auf einen Baum.",
    "Zwei Hunde spielen im Schnee.",
    "Ein Arbeiter repariert eine Straße.",
    "Eine ältere Frau sitzt auf einer Bank im Park.",
    "Ein Junge springt in einen See.",
    "Musiker spielen auf einer Bühne vor Publikum.",
]
