"""The ``bild-pipeline`` command line."""

from __future__ import annotations

import contextlib
import json
import sys

import click

from pipeline.decoding.config import DRAFT_WINDOWS, ENGINES, METHODS, DecodingConfig


def _decoding_options(func):
    """The decoding settings, one option per DecodingConfig field (same names as the job file)."""
    defaults = DecodingConfig()
    options = [
        click.option("--method", type=click.Choice(METHODS), default=defaults.method, show_default=True),
        click.option("--fallback-threshold", type=float, default=defaults.fallback_threshold, show_default=True,
                     help="alpha_FB: the small model falls back when its top probability is below this."),
        click.option("--rollback-threshold", type=float, default=defaults.rollback_threshold, show_default=True,
                     help="alpha_RB: a draft with -log pL above this (and not the large model's choice) rolls back."),
        click.option("--max-draft-tokens", type=int, default=defaults.max_draft_tokens, show_default=True),
        click.option("--draft-window", type=click.Choice(DRAFT_WINDOWS), default=defaults.draft_window,
                     show_default=True, help="speculative only: fixed k, or BiLD's fallback window."),
        click.option("--max-input-tokens", type=int, default=defaults.max_input_tokens, show_default=True),
        click.option("--max-new-tokens", type=int, default=defaults.max_new_tokens, show_default=True),
        click.option("--do-sample/--greedy", default=defaults.do_sample, show_default=True),
        click.option("--temperature", type=float, default=defaults.temperature, show_default=True),
        click.option("--top-p", type=float, default=defaults.top_p, show_default=True),
        click.option("--seed", type=int, default=defaults.seed, show_default=True),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _decoding_config(options: dict) -> DecodingConfig:
    fields = DecodingConfig.__dataclass_fields__
    try:
        return DecodingConfig(**{key: value for key, value in options.items() if key in fields})
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


def _load_pair(small: str, large: str, tokenizer: str | None, dtype: str, device: str, trust_remote_code: bool,
               engine: str = "auto"):
    from pipeline.decoding import IncompatiblePairError, ModelPair

    try:
        return ModelPair.from_pretrained(
            small, large, tokenizer=tokenizer, dtype=dtype, device=device, trust_remote_code=trust_remote_code,
            engine=engine,
        )
    except IncompatiblePairError as exc:
        raise click.UsageError(f"incompatible model pair: {exc}") from exc
    except OSError as exc:
        raise click.UsageError(f"cannot load the model pair: {exc}") from exc


_ENGINE_OPTION = click.option(
    "--engine", type=click.Choice(ENGINES), default="auto", show_default=True,
    help="auto/native: our own forward pass where the architecture has one (T5 family), else Hugging Face's "
         "modules (logged); hf: always Hugging Face's.")


def _model_options(func):
    options = [
        click.option("--small", required=True, help="Small (drafting) model: hub id or local folder."),
        click.option("--large", required=True, help="Large (verifying) model: hub id or local folder."),
        click.option("--tokenizer", default=None, help="Tokenizer (default: the large model's)."),
        click.option("--dtype", default="float32", show_default=True,
                     type=click.Choice(["auto", "float32", "bfloat16", "float16", "float64"])),
        click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:1 ..."),
        click.option("--trust-remote-code", is_flag=True, default=False, help="Allow model code from the hub."),
        _ENGINE_OPTION,
    ]
    for option in reversed(options):
        func = option(func)
    return func


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="bild-pipeline")
def main() -> None:
    """Batch translation and summarization with Big Little Decoder (BiLD) speculative decoding."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading bars would bury the results


@main.command()
@_model_options
@_decoding_options
@click.option("--prompt", default=None, help='Template around each text, e.g. "summarize: {text}".')
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per text instead of a table.")
@click.argument("texts", nargs=-1, required=True)
def generate(small, large, tokenizer, dtype, device, trust_remote_code, engine, prompt, as_json, texts, **options):
    """Decode TEXTS with a small/large pair and print each output with its statistics."""
    from pipeline.decoding import Generator

    config = _decoding_config(options)
    pair = _load_pair(small, large, tokenizer, dtype, device, trust_remote_code, engine)
    inputs = [prompt.format(text=text) if prompt else text for text in texts]
    results = Generator(pair, config).generate(inputs)
    failed = False
    for text, result in zip(texts, results):
        record = {"input": text, **result.to_record()}
        failed |= result.error is not None
        if as_json:
            click.echo(json.dumps(record, ensure_ascii=False))
            continue
        click.echo(f"input:      {text}")
        if result.error:
            click.echo(f"error:      {result.error}")
        else:
            click.echo(f"prediction: {result.prediction}")
        stats = result.stats
        click.echo(
            f"stats:      method={result.method} input_tokens={result.input_tokens} truncated={result.truncated} "
            f"output_tokens={stats.output_tokens} small_tokens={stats.small_tokens} ({stats.small_token_share:.0%}) "
            f"large_tokens={stats.large_tokens} fallbacks={stats.fallbacks} rollbacks={stats.rollbacks} "
            f"small_calls={stats.small_calls} large_calls={stats.large_calls} latency_ms={result.latency_ms:.1f}"
        )
    sys.exit(1 if failed else 0)


@main.command()
@click.argument("job_files", nargs=-1, required=True, type=click.Path())
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a job key.")
def validate(job_files, overrides):
    """Check job files without running them (exit code 2 if any is invalid)."""
    from pipeline.jobs import JobFileError, load_job

    bad = 0
    for path in job_files:
        try:
            job = load_job(path, overrides)
        except JobFileError as exc:
            click.echo(str(exc), err=True)
            bad += 1
        else:
            click.echo(f"{path}: ok (job {job.name!r}, method {job.decoding.method}, config {job.config_hash()})")
    sys.exit(2 if bad else 0)


def _load_job_or_exit(job_file: str, overrides):
    """The validated job, or its problems on stderr and exit code 2."""
    from pipeline.jobs import JobFileError, load_job

    try:
        return load_job(job_file, overrides)
    except JobFileError as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)


def _exit_2_on_bad_input(job_file: str, func, *args, **kwargs):
    """Run func; input that cannot be used at all (duplicate ids, existing output) exits with code 2."""
    from pipeline.io.storage import InputError
    from pipeline.jobs.run import OutputExistsError

    try:
        return func(*args, **kwargs)
    except (InputError, OutputExistsError) as exc:
        click.echo(f"{job_file}: {exc}", err=True)
        sys.exit(2)


@main.command()
@click.argument("job_file", type=click.Path())
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a job key.")
@click.option("--address", default=None,
              help="Ray cluster to join (default: RAY_ADDRESS if set, else an embedded local Ray).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--verbose", is_flag=True, help="Show Ray's own output (workers' logs, Ray Data's operator tables).")
def run(job_file, overrides, address, as_json, verbose):
    """Run JOB_FILE: decode its input on Ray and write one output row per input id."""
    from pipeline.jobs.run import run_job

    job = _load_job_or_exit(job_file, overrides)
    summary = _exit_2_on_bad_input(job_file, run_job, job, address=address, verbose=verbose, progress=not as_json)
    click.echo(json.dumps(summary.to_dict()) if as_json else summary.to_text())


@main.command()
@click.argument("run_path")
@click.option("--baseline", default=None, help="Another run of the same inputs (e.g. method: large) to compare with.")
@click.option("--out", "out_dir", default=None, help="Where to write summary.json, report.md and plots "
              "(default: RUN_PATH/report for a local run, else ./report).")
@click.option("--task", type=click.Choice(["translation", "summarization"]), default=None,
              help="Metric family (default: the run's job task).")
@click.option("--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
              help="fsspec option for reading the runs (credentials may also come from the environment).")
@click.option("--address", default=None, help="Ray cluster to compute on (default: RAY_ADDRESS or a local Ray).")
@click.option("--verbose", is_flag=True, help="Show Ray's own output.")
def report(run_path, baseline, out_dir, task, storage_options, address, verbose):
    """Score a finished run: throughput, latency, quality against references, BiLD behaviour, errors."""
    from pathlib import Path

    from pipeline.jobs.load import parse_override
    from pipeline.jobs.report import build_report, result_line, write_report
    from pipeline.jobs.run import connect_ray

    options = {}
    for item in storage_options:
        path, value = parse_override(item)
        options[".".join(path)] = value
    if out_dir is None:
        out_dir = str(Path(run_path) / "report") if "://" not in run_path else "report"
    connect_ray(address, verbose=verbose)
    try:
        summary, numeric = build_report(run_path, baseline=baseline, task=task, storage_options=options)
    except FileNotFoundError as exc:
        raise click.UsageError(str(exc)) from exc
    for path in write_report(summary, numeric, out_dir):
        click.echo(f"wrote {path}")
    click.echo(result_line(summary))


def _floats(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"expected numbers separated by commas, got {text!r}") from exc


def _positive_ints(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"expected whole numbers separated by commas, got {text!r}",
                                 param_hint=option) from exc
    if not values or min(values) < 1:
        raise click.BadParameter(f"expected whole numbers >= 1, got {text!r}", param_hint=option)
    return values


@main.command()
@click.argument("job_file", type=click.Path())
@click.option("--fallback", default="0.2,0.4,0.6", show_default=True, help="alpha_FB values, comma-separated.")
@click.option("--rollback", default="2,3,5", show_default=True, help="alpha_RB values, comma-separated.")
@click.option("--window", default=None, help="max_draft_tokens values, comma-separated: a third grid axis "
              "(points then end in _w<N>; default: the job's window only).")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a job key.")
@click.option("--out", "out_dir", default=None, help="Where to write sweep.json/.md/.png (default: OUTPUT/sweep "
              "for a local output, else ./sweep).")
@click.option("--address", default=None, help="Ray cluster to join (default: RAY_ADDRESS or a local Ray).")
@click.option("--verbose", is_flag=True, help="Show Ray's own output.")
def sweep(job_file, fallback, rollback, window, overrides, out_dir, address, verbose):
    """Run JOB_FILE over a fallback x rollback (x window) grid plus `large` and `small`; map latency vs quality."""
    from pathlib import Path

    from pipeline.jobs.sweep import run_sweep, write_sweep

    windows = _positive_ints(window, "--window") if window is not None else None
    job = _load_job_or_exit(job_file, overrides)
    summary, table = _exit_2_on_bad_input(job_file, run_sweep, job, _floats(fallback), _floats(rollback),
                                          address=address, windows=windows, verbose=verbose, progress=True)
    if out_dir is None:
        out_dir = str(Path(job.output.path) / "sweep") if "://" not in job.output.path else "sweep"
    for path in write_sweep(table, job.task, out_dir, job.name):
        click.echo(f"wrote {path}")
    click.echo(summary.to_text())


@main.command()
@click.argument("sweep_json", type=click.Path(exists=True, dir_okay=False))
@click.option("--max-drop", type=float, default=0.5, show_default=True,
              help="Quality budget: at most this far below `large` on the sweep's metric.")
@click.option("--metric", default=None, help="Metric to budget (default: the sweep's, bleu or rougeL).")
@click.option("--out", "out_file", required=True, type=click.Path(dir_okay=False),
              help="Decoding preset to write, e.g. configs/decoding/demo_tuned.yaml.")
def tune(sweep_json, max_drop, metric, out_file):
    """Pick the fastest sweep point within a quality budget and write it as a decoding preset."""
    from pathlib import Path

    from pipeline.jobs.sweep import pick_point, preset_yaml

    data = json.loads(Path(sweep_json).read_text())
    metric = metric or data["metric"]
    try:
        point = pick_point(data["points"], metric, max_drop)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    Path(out_file).parent.mkdir(parents=True, exist_ok=True)
    Path(out_file).write_text(preset_yaml(point, metric, max_drop, sweep_json))
    click.echo(f"{point['point']}: {metric} {point[metric]:.2f}, speedup {point.get('speedup_vs_large') or 0:.2f}x "
               f"-> {out_file}")


@main.command()
@click.option("--small", required=True, help="Small model to align (hub id or local folder).")
@click.option("--large", required=True, help="Large model whose greedy outputs are the targets.")
@click.option("--data", "data", required=True, type=click.Path(exists=True),
              help="Calibration inputs: a text file with one input per line, or a folder with train.<--src-lang>.")
@click.option("--src-lang", default="de", show_default=True, help="With a folder: which train.* file to read.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Work folder; the aligned model ends up in OUT/small-aligned-best.")
@click.option("--prompt", default=None, help='Prefix for every input, e.g. "translate German to English: ".')
@click.option("--limit", type=int, default=None, help="Use only the first N inputs.")
@click.option("--epochs", type=float, default=2.0, show_default=True)
@click.option("--lr", type=float, default=5e-3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="auto", show_default=True)
@click.option("--threads", type=int, default=1, show_default=True)
@click.option("--loss", type=click.Choice(["labels", "distill"]), default="labels", show_default=True,
              help="labels: LARGE's output tokens; distill: LARGE's whole next-token distribution at each "
                   "of them (KL; also aligns the small model's confidence, which fallback reads).")
def align(small, large, data, src_lang, out_dir, prompt, limit, epochs, lr, seed, device, threads, loss):
    """BiLD prediction alignment (paper section 3.4): fine-tune SMALL on LARGE's greedy outputs."""
    from pathlib import Path

    from pipeline.training.align import align_small_model

    path = Path(data)
    source = path / f"train.{src_lang}" if path.is_dir() else path
    if not source.is_file():
        raise click.UsageError(f"--data {data}: no {source.name} there")
    texts = [line for line in source.read_text(encoding="utf-8").splitlines() if line.strip()][:limit]
    aligned = align_small_model(small, large, texts, out_dir, prompt=prompt, epochs=epochs, lr=lr, seed=seed,
                                device=device, threads=threads, distill=loss == "distill")
    click.echo(f"aligned small model: {aligned}")


@main.command("tiny-pair")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--shape", type=click.Choice(["t5", "opus-mt", "bart-opus-mt", "nllb"]), default=None,
              help="Instead of a tiny pair: random weights at real checkpoints' shapes, for speed checks "
                   "(t5: T5-small/T5-large; opus-mt: Marian 6+6, d 512 and a 1-layer-decoder drafter; "
                   "nllb: NLLB-200 600M/3.3B).")
@click.option("--family", type=click.Choice(["t5", "bart", "mbart", "marian", "nllb", "gpt2", "llama"]), default="t5",
              show_default=True, help="nllb: NLLB's architecture (M2M100).")
@click.option("--small-kind", type=click.Choice(["noisy", "independent"]), default="noisy", show_default=True,
              help="noisy: a noisy copy of the large model (agrees often); independent: another random model.")
@click.option("--seed", type=int, default=0, show_default=True)
def tiny_pair(out_dir, shape, family, small_kind, seed):
    """Build a tiny random pair (offline) into OUT_DIR/small and OUT_DIR/large, for trying things out."""
    if shape is not None:
        from pipeline.random_pairs import save_shaped_pair

        small, large = save_shaped_pair(out_dir, shape, seed=seed)
        click.echo(f"small: {small}\nlarge: {large}")
        return
    from pipeline.tiny import save_pair

    small, large = save_pair(out_dir, family, small=small_kind, seed=seed)
    click.echo(f"small: {small}\nlarge: {large}")


@main.command("bench-loop")
@click.option("--small", default=None, help="Small model (default: a tiny random T5 pair built in memory).")
@click.option("--large", default=None, help="Large model.")
@click.option("--dtype", default="float32", show_default=True)
@click.option("--device", default="auto", show_default=True)
@click.option("--inputs", "num_inputs", type=int, default=8, show_default=True, help="Number of inputs.")
@click.option("--repeats", type=int, default=5, show_default=True, help="Interleaved repetitions.")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--fallback-threshold", type=float, default=0.4, show_default=True)
@click.option("--rollback-threshold", type=float, default=3.0, show_default=True)
@click.option("--threads", type=int, default=None, help="torch CPU threads (default: torch's own choice).")
@_ENGINE_OPTION
def bench_loop(small, large, dtype, device, num_inputs, repeats, max_new_tokens, fallback_threshold,
               rollback_threshold, threads, engine):
    """Loop overhead: our `large` loop vs HF generate(), and BiLD bookkeeping vs model time."""
    import torch

    from pipeline.bench.loop import run_loop_bench
    from pipeline.decoding import ModelPair

    if threads:
        torch.set_num_threads(threads)
    if (small is None) != (large is None):
        raise click.UsageError("give both --small and --large, or neither")
    if small is None:
        from pipeline.tiny import build_pair

        small_model, large_model, tokenizer = build_pair("t5", small="noisy")
        pair = ModelPair(small_model, large_model, tokenizer, torch.device("cpu"), engine_request=engine)
        described = "tiny random T5 pair (noisy small copy), built in memory"
    else:
        pair = _load_pair(small, large, None, dtype, device, False, engine)
        described = f"small={small} large={large}"
    texts = [line for line in _BENCH_TEXTS][:num_inputs]
    config = DecodingConfig(method="bild", max_new_tokens=max_new_tokens, fallback_threshold=fallback_threshold,
                            rollback_threshold=rollback_threshold)
    result = run_loop_bench(pair, texts, config, repeats=repeats)
    click.echo(f"pair: {described}; device: {pair.device}; torch threads: {torch.get_num_threads()}")
    click.echo(result.to_markdown())


def _options(*options):
    """One decorator applying several click options (shared by the benchmark commands)."""
    def apply(function):
        for option in reversed(options):
            function = option(function)
        return function
    return apply


_bench_input_options = _options(
    click.option("--small", default=None, help="Small model (default: a tiny random T5 pair built in memory)."),
    click.option("--large", default=None),
    click.option("--source", type=click.Path(exists=True, dir_okay=False), default=None,
                 help="Inputs, one per line (e.g. test_2016_flickr.de)."),
    click.option("--reference", type=click.Path(exists=True, dir_okay=False), default=None,
                 help="References, one per line, parallel to --source (adds BLEU)."),
    click.option("--prompt", default=None, help='Template around each input, e.g. "summarize: {text}".'),
)
_bench_decoding_options = _options(
    click.option("--max-new-tokens", type=int, default=64, show_default=True),
    click.option("--fallback-threshold", type=float, default=0.4, show_default=True),
    click.option("--rollback-threshold", type=float, default=3.0, show_default=True),
    click.option("--max-draft-tokens", type=int, default=10, show_default=True),
    click.option("--device", default="cpu", show_default=True),
    click.option("--dtype", default="float32", show_default=True),
    click.option("--threads", type=int, default=None, help="torch CPU threads."),
    _ENGINE_OPTION,
    click.option("--ct2/--no-ct2", "with_ct2", default=None,
                 help="Add CTranslate2 rows: the same checkpoints converted by CTranslate2's own converter "
                      "(default: when ctranslate2 is installed, pip install -e .[bench])."),
)


@main.command()
@_bench_input_options
@click.option("--limit", type=int, default=100, show_default=True)
@click.option("--repeats", type=int, default=2, show_default=True)
@_bench_decoding_options
@click.option("--projection/--no-projection", default=True, show_default=True,
              help="Also project the speedup at T5-small/T5-large shapes (random weights, timed here).")
@click.option("--compare-engines", is_flag=True, default=False,
              help="Also decode with `large` on our native engine and Hugging Face's in turn: speed per step, same tokens.")
@click.option("--out", "out_dir", default=None, help="Write bench.md and bench.json here.")
def bench(small, large, source, reference, prompt, limit, repeats, max_new_tokens, fallback_threshold,
          rollback_threshold, max_draft_tokens, device, dtype, threads, engine, with_ct2, projection, compare_engines,
          out_dir):
    """BiLD vs large, small, speculative, HF generate, HF assisted generation and CTranslate2, side by
    side (batch 1)."""

    from pipeline.bench.methods import render_markdown, run_bench

    pair, texts, references = _bench_inputs(small, large, dtype, device, threads, engine, source, reference, limit,
                                            prompt)
    config = DecodingConfig(method="bild", max_new_tokens=max_new_tokens, fallback_threshold=fallback_threshold,
                            rollback_threshold=rollback_threshold, max_draft_tokens=max_draft_tokens)
    with _ct2_models(pair, with_ct2) as ct2:
        report = run_bench(pair, texts, references, config, repeats=repeats, with_projection=projection, ct2=ct2,
                           with_engines=compare_engines)
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


def _bench_inputs(small, large, dtype, device, threads, engine, source, reference, limit, prompt):
    """(pair, texts, references) for a benchmark: the named pair (or a tiny random T5 pair built in
    memory) and the first ``limit`` lines of ``source``/``reference`` (or built-in sentences)."""
    from pathlib import Path

    import torch

    from pipeline.decoding import ModelPair

    if threads:
        torch.set_num_threads(threads)
    if small is None or large is None:
        from pipeline.tiny import build_pair

        small_model, large_model, tokenizer = build_pair("t5", small="noisy")
        pair = ModelPair(small_model, large_model, tokenizer, torch.device("cpu"), engine_request=engine)
    else:
        pair = _load_pair(small, large, None, dtype, device, False, engine)
    texts = (Path(source).read_text(encoding="utf-8").splitlines() if source else list(_BENCH_TEXTS))[:limit]
    references = Path(reference).read_text(encoding="utf-8").splitlines()[:limit] if reference else None
    if prompt:
        texts = [prompt.format(text=text) for text in texts]
    return pair, texts, references


@main.command("bench-pipeline")
@click.option("--small", default=None, help="Small model folder (default: a tiny random T5 pair saved to a temp dir).")
@click.option("--large", default=None)
@click.option("--records", type=int, default=512, show_default=True)
@click.option("--repeats", type=int, default=2, show_default=True)
def bench_pipeline(small, large, records, repeats):
    """Pipeline overhead: the same records in-process vs through Ray (one actor), ratio printed."""
    import tempfile
    from pathlib import Path

    from pipeline.bench.pipeline_job import run_pipeline_bench

    with tempfile.TemporaryDirectory() as tmp:
        if small is None or large is None:
            from pipeline.tiny import save_pair

            small, large = (str(p) for p in save_pair(Path(tmp) / "pair", "t5", small="noisy"))
        result = run_pipeline_bench(small, large, _BENCH_TEXTS, Path(tmp), records=records, repeats=repeats)
    click.echo(
        f"records: {result['records']}, repetitions: {result['repeats']} (alternating)\n"
        f"in-process: {result['in_process_s']:.2f} s ({result['in_process_records_per_s']:.1f} records/s)\n"
        f"pipeline:   {result['pipeline_s']:.2f} s ({result['pipeline_records_per_s']:.1f} records/s)\n"
        f"ratio pipeline / in-process: {result['ratio_pipeline_over_in_process']:.2f}x"
    )


@main.command("bench-batch")
@_bench_input_options
@click.option("--limit", type=int, default=128, show_default=True)
@click.option("--repeats", type=int, default=2, show_default=True)
@click.option("--methods", default="large,bild,speculative", show_default=True)
@click.option("--batch-sizes", default="1,4,16,32", show_default=True)
@click.option("--verify-shares", default="0.5", show_default=True,
              help="Comma-separated verify_share values to run for bild/speculative at batch sizes > 1.")
@_bench_decoding_options
@click.option("--out", "out_dir", default=None, help="Write bench_batch.md and bench_batch.json here.")
def bench_batch(small, large, source, reference, prompt, limit, repeats, methods, batch_sizes, verify_shares,
                max_new_tokens, fallback_threshold, rollback_threshold, max_draft_tokens, device, dtype, threads,
                engine, with_ct2, out_dir):
    """Batched decoding throughput: tokens/s at several batch sizes, ratios measured in one run."""

    from pipeline.bench.batch import render_markdown, run_batch_bench

    pair, texts, references = _bench_inputs(small, large, dtype, device, threads, engine, source, reference, limit,
                                            prompt)
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


@main.command("bench-table1")
@click.option("--models", required=True, type=click.Path(exists=True, file_okay=False),
              help="Folder with large/, small/, small-aligned/.")
@click.option("--source", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--reference", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--preset", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Decoding preset with the chosen thresholds.")
@click.option("--limit", type=int, default=None)
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--threads", type=int, default=1, show_default=True)
@_ENGINE_OPTION
@click.option("--out", "out_dir", default=None, help="Write table.md and table.json here.")
def bench_table1(models, source, reference, preset, limit, max_new_tokens, threads, engine, out_dir):
    """The paper's Table 1 on our pair: BLEU and speedup of large, small, aligned small and BiLD (unaligned,
    aligned), side by side (batch 1)."""
    import torch

    from pipeline.bench.table1 import render_markdown, run_table1

    torch.set_num_threads(threads)
    report = run_table1(models, source, reference, preset, limit=limit, max_new_tokens=max_new_tokens, engine=engine)
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


def _register_cluster_commands() -> None:
    from pipeline.submit import logs, status, stop, submit

    for command in (submit, status, logs, stop):
        main.add_command(command)


_register_cluster_commands()


if __name__ == "__main__":
    main()
