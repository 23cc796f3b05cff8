"""Commands on model pairs: ``generate`` (decode a few texts), ``align`` (fine-tune the small model on the
large one's outputs) and ``tiny-pair`` (random pairs for trying things out)."""

from __future__ import annotations

import dataclasses
import json
import sys

import click

from pipeline.cli.options import decoding_config, decoding_options, model_option_group, override_option
from pipeline.decoding.config import DecodingConfig, ModelSpec


def load_pair(spec: ModelSpec):
    """The ModelPair, or exit 2 when the models cannot be loaded or do not fit together."""
    from pipeline.decoding import IncompatiblePairError, ModelPair

    try:
        return ModelPair.from_spec(spec)
    except IncompatiblePairError as exc:
        raise click.UsageError(f"incompatible model pair: {exc}") from exc
    except OSError as exc:
        raise click.UsageError(f"cannot load the model pair: {exc}") from exc


def _check_prompt_or_exit(prompt: str) -> None:
    """The job files' rule for a prompt template (exit 2 saying what is wrong)."""
    from pipeline.jobs.schema import check_prompt

    try:
        check_prompt(prompt)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


def _given(ctx: click.Context, names) -> dict:
    """Those of the command's options in `names` that were given on its command line, with their values."""
    return {name: ctx.params[name] for name in names
            if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE}


def _generate_settings(ctx: click.Context, job_file, overrides):
    """(ModelSpec, DecodingConfig, prompt, BatchPolicy, the language to split sentences in or None): a job
    file's (its presets and --set included) with what the command line gives on top, or the command
    line's alone."""
    from pipeline.cli.jobs import load_job_or_exit
    from pipeline.decoding import BatchPolicy

    params = ctx.params
    model_keys = [field for field in ModelSpec.__dataclass_fields__ if field in params]
    decoding_keys = [field for field in DecodingConfig.__dataclass_fields__ if field in params]
    if job_file is None:
        if not (params["small"] and params["large"]):
            raise click.UsageError("give --small and --large, or --job FILE (a job file's models and settings)")
        spec = ModelSpec(**{key: params[key] for key in model_keys})
        return spec, decoding_config(params), params["prompt"], BatchPolicy(batch_size=1), None
    job = load_job_or_exit(job_file, overrides)
    spec = dataclasses.replace(job.models.to_spec(), **_given(ctx, model_keys))
    config = decoding_config({**job.decoding.model_dump(), **_given(ctx, decoding_keys)})
    batch = job.compute.batch_policy()
    language = job.input.language if job.input.segment == "sentence" else None
    return spec, config, params["prompt"] or job.prompt, batch, language


def _generator(spec: ModelSpec, config: DecodingConfig):
    """A Generator over the loaded pair, or over a whole decoder's (engine ct2; exit 2 where it cannot run)."""
    from pipeline.decoding import Generator
    from pipeline.decoding.decoders import open_generator
    from pipeline.decoding.engines.registry import entry

    if entry(spec.engine).pair:
        return Generator(load_pair(spec), config)
    try:
        return open_generator(spec, config)
    except (ValueError, ImportError) as exc:
        raise click.UsageError(str(exc)) from exc


@click.command()
@click.option("--job", "job_file", type=click.Path(), default=None,
              help="Decode as this job file does (its presets and --set included): its models, engine, quantize, "
                   "decoding settings, prompt and batch size; options given here override them.")
@override_option
@model_option_group(required=False, ct2=True)
@decoding_options
@click.option("--prompt", default=None, help='Template around each text, e.g. "summarize: {text}".')
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per text instead of a table.")
@click.argument("texts", nargs=-1, required=True)
@click.pass_context
def generate(ctx, job_file, overrides, as_json, texts, **_):
    """Decode TEXTS with a small/large pair and print each output with its statistics (errors on stderr)."""
    from pipeline.io.records import apply_prompt
    from pipeline.io.segments import decode_records, split_sentences
    from pipeline.jobs.preflight import models_problems

    spec, config, prompt, batch, language = _generate_settings(ctx, job_file, overrides)
    if prompt is not None:
        _check_prompt_or_exit(prompt)
    roles = ("small", "large") if config.method not in ("small", "large") else (config.method,)
    problems = models_problems(spec, roles, pair=False)
    if problems:
        raise click.UsageError("\n".join(problems))
    generator = _generator(spec, config)
    generator.generate(["warm up"], batch=batch)  # first-call set-up (allocation, kernels) outside latency_ms
    items = list(texts) if language is None else [split_sentences(text, language) for text in texts]  # input.segment
    results = decode_records(lambda units: generator.generate([apply_prompt(prompt, unit.text) for unit in units],
                                                              batch=batch), items, config.method)
    failed = False
    for text, result in zip(texts, results):
        record = {"input": text, **result.to_record()}
        failed |= result.error is not None
        if as_json:
            click.echo(json.dumps(record, ensure_ascii=False))
            continue
        click.echo(f"input:      {text}")
        if result.error:
            click.echo(f"error:      {result.error}", err=True)
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


@click.command()
@click.option("--small", required=True, help="Small model to align (hub id or local folder).")
@click.option("--large", required=True, help="Large model whose greedy outputs are the targets.")
@click.option("--data", "data", required=True, type=click.Path(exists=True),
              help="Calibration inputs: a text file with one input per line, or a folder with train.<--src-lang>.")
@click.option("--src-lang", default="de", show_default=True, help="With a folder: which train.* file to read.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Work folder; the aligned model ends up in OUT/small-aligned-best.")
@click.option("--prompt", default=None,
              help='Template around each input, as in job files, e.g. "translate German to English: {text}".')
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
    if prompt is not None and "{text}" not in prompt:  # the old meaning, a prefix: kept for one release
        click.echo(f"align --prompt is a template now, as everywhere: reading {prompt!r} as {prompt + '{text}'!r}",
                   err=True)
        prompt += "{text}"
    if prompt is not None:
        _check_prompt_or_exit(prompt)
    aligned = align_small_model(small, large, texts, out_dir, prompt=prompt, epochs=epochs, lr=lr, seed=seed,
                                device=device, threads=threads, distill=loss == "distill")
    click.echo(f"aligned small model: {aligned}")


@click.command("tiny-pair")
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
        from pipeline.pairs.random_shapes import save_shaped_pair

        small, large = save_shaped_pair(out_dir, shape, seed=seed)
        click.echo(f"small: {small}\nlarge: {large}")
        return
    from pipeline.pairs.tiny import save_pair

    small, large = save_pair(out_dir, family, small=small_kind, seed=seed)
    click.echo(f"small: {small}\nlarge: {large}")


@click.command("inflate-pair")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--small", default="models/demo-de-en/small-aligned", show_default=True,
              help="Small T5 model to inflate (local folder or hub id).")
@click.option("--large", default="models/demo-de-en/large", show_default=True, help="Large T5 model to inflate.")
@click.option("--shapes", default="t5", show_default=True,
              help="Target shapes: t5 (T5-small/T5-large) or t5-base (T5-small/T5-base).")
@click.option("--set", "overrides", multiple=True, metavar="ROLE.KEY=N",
              help="Another size for one role, e.g. large.num_decoder_layers=12 (keys: d_model, d_ff, num_heads, "
                   "num_layers, num_decoder_layers).")
def inflate_pair(out_dir, small, large, shapes, overrides):
    """Grow a trained T5 pair to real checkpoints' shapes without changing what it computes (OUT_DIR/small,
    OUT_DIR/large): real acceptance at real step costs, for benchmarks (docs/benchmarking.md)."""
    from pipeline.pairs.inflate import InflationError, SHAPE_KEYS, inflate_pair as inflate

    sizes: dict[str, dict[str, int]] = {}
    for item in overrides:
        name, _, value = item.partition("=")
        role, _, key = name.partition(".")
        if role not in ("small", "large") or key not in SHAPE_KEYS or not value.isdigit():
            raise click.UsageError(f"--set {item}: ROLE.KEY=N with ROLE small or large and KEY one of "
                                   f"{', '.join(SHAPE_KEYS)}")
        sizes.setdefault(role, {})[key] = int(value)
    try:
        written = inflate(small, large, out_dir, shapes, sizes)
    except InflationError as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(f"small: {written[0]}\nlarge: {written[1]}")
