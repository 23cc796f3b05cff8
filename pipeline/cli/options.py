"""Options that several commands share, and the one helper that applies a group of them."""

from __future__ import annotations

import click

from pipeline.decoding.config import (DEFERRALS, DRAFT_WINDOWS, DTYPE_NAMES, ENGINES, METHODS, PAIR_ENGINES,
                                     QUANTIZE_NAMES, DecodingConfig)


def options(*specs):
    """One decorator applying several click options, listed in the order ``--help`` shows them."""
    def apply(function):
        for option in reversed(specs):
            function = option(function)
        return function
    return apply


class _WithOldNames(click.Option):
    """An option renamed for one name per idea across commands: its old spellings (contracts users' scripts
    rely on) still work for a release, and --help shows the new name only."""

    def __init__(self, *args, old_names: tuple[str, ...] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.old_names = old_names

    def get_help_record(self, ctx):
        shown, self.opts = self.opts, [name for name in self.opts if name not in self.old_names]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = shown


def renamed(name: str, *old_names: str, dest: str | None = None, **kwargs):
    """click.option(name, ...) that also answers to `old_names` (hidden from --help)."""
    return click.option(name, *old_names, *([dest] if dest else []), cls=_WithOldNames, old_names=old_names,
                        **kwargs)


def floats(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"expected numbers separated by commas, got {text!r}") from exc


def cascade_grid(values: tuple[str, ...]) -> dict[str, list[float]]:
    """--cascade RULE=ALPHAS options -> {rule: [alpha, ...]}."""
    grid: dict[str, list[float]] = {}
    for value in values:
        rule, _, alphas = value.partition("=")
        if rule not in DEFERRALS or not alphas:
            raise click.BadParameter(f"expected RULE=ALPHAS with RULE one of {', '.join(DEFERRALS)}, got {value!r}",
                                     param_hint="--cascade")
        grid.setdefault(rule, []).extend(floats(alphas))
    return grid


override_option = click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
                               help="Override a job key.")

_ENGINE_HELP = ("auto/native: our own forward pass where the architecture has one (T5 and BART families), else "
                "Hugging Face's modules (logged); hf: always Hugging Face's; onnx: the native engine's decoder step "
                "as one onnxruntime call (CPU, float32 or --quantize int8; the fastest on a CPU)")
engine_option = click.option("--engine", type=click.Choice(PAIR_ENGINES), default="auto", show_default=True,
                             help=_ENGINE_HELP + ".")
# Where one model may decode alone (methods large and small), CTranslate2 too.
any_engine_option = click.option("--engine", type=click.Choice(ENGINES), default="auto", show_default=True,
                                 help=_ENGINE_HELP + "; ct2: CTranslate2 (--method large or small).")

quantize_option = click.option(
    "--quantize", type=click.Choice(QUANTIZE_NAMES), default="none", show_default=True,
    help="int8: both models' linear layers and output heads in int8 (the native engine where it pays, the onnx "
         "engine everywhere; on a CPU, float32; the job key models.quantize).")

_MODEL_SETTINGS = (
    click.option("--tokenizer", default=None, help="Tokenizer (default: the large model's)."),
    click.option("--dtype", default="float32", show_default=True,
                 type=click.Choice(DTYPE_NAMES)),
    click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:1 ..."),
    click.option("--trust-remote-code", is_flag=True, default=False, help="Allow model code from the hub."),
)


def model_option_group(required: bool = True, ct2: bool = False):
    """--small, --large and how to run them; `required`: whether --small and --large must be given; `ct2`:
    whether --engine offers CTranslate2."""
    return options(
        click.option("--small", required=required, help="Small (drafting) model: hub id or local folder."),
        click.option("--large", required=required, help="Large (verifying) model: hub id or local folder."),
        *_MODEL_SETTINGS, any_engine_option if ct2 else engine_option, quantize_option)


model_options = model_option_group(required=True)

_defaults = DecodingConfig()

# One option per DecodingConfig field, with the job file's names; decoding_config() reads them back.
decoding_options = options(
    click.option("--method", type=click.Choice(METHODS), default=_defaults.method, show_default=True),
    click.option("--fallback-threshold", type=float, default=_defaults.fallback_threshold, show_default=True,
                 help="alpha_FB: the small model falls back when its top probability is below this."),
    click.option("--rollback-threshold", type=float, default=_defaults.rollback_threshold, show_default=True,
                 help="alpha_RB: a draft with -log pL above this (and not the large model's choice) rolls back."),
    click.option("--max-draft-tokens", type=int, default=_defaults.max_draft_tokens, show_default=True),
    click.option("--draft-window", type=click.Choice(DRAFT_WINDOWS), default=_defaults.draft_window,
                 show_default=True, help="speculative and cascade: fixed k, or BiLD's fallback window."),
    click.option("--adaptive-draft/--no-adaptive-draft", default=_defaults.adaptive_draft, show_default=True,
                 help="Each round's window (0 included) from measured costs, or always --max-draft-tokens."),
    click.option("--deferral", type=click.Choice(DEFERRALS), default=_defaults.deferral, show_default=True,
                 help="cascade: the rule that defers a drafted position to the large model."),
    click.option("--deferral-threshold", type=float, default=_defaults.deferral_threshold, show_default=True,
                 help="cascade: the rule's alpha (higher: fewer deferrals)."),
    click.option("--lenience", type=float, default=_defaults.lenience, show_default=True,
                 help="speculative: lossy speculative sampling's lambda in [0, 1) (0: lossless)."),
    click.option("--max-input-tokens", type=int, default=_defaults.max_input_tokens, show_default=True),
    click.option("--max-new-tokens", type=int, default=_defaults.max_new_tokens, show_default=True),
    click.option("--do-sample/--greedy", default=_defaults.do_sample, show_default=True),
    click.option("--temperature", type=float, default=_defaults.temperature, show_default=True),
    click.option("--top-p", type=float, default=_defaults.top_p, show_default=True),
    click.option("--seed", type=int, default=_defaults.seed, show_default=True),
)


def decoding_config(values: dict) -> DecodingConfig:
    """The DecodingConfig from a command's option values (the others are ignored); bad settings exit 2."""
    fields = DecodingConfig.__dataclass_fields__
    try:
        return DecodingConfig(**{key: value for key, value in values.items() if key in fields})
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
