"""Options that several commands share, and the one helper that applies a group of them."""

from __future__ import annotations

import dataclasses
import typing

import click

from pipeline.decoding.config import DEFERRALS, ENGINES, DecodingConfig, ModelSpec
from pipeline.decoding.engines.registry import PAIR_ENGINES, engines_help
from pipeline.decoding.settings import choices_of, help_of, types_of


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

def setting_option(settings: type, name: str, **changes):
    """The click option of one field of a settings dataclass (decoding/config.py): --its-name, its type or
    choices, default and help from the field; ``changes``: click.option's arguments where they differ."""
    field = next(field for field in dataclasses.fields(settings) if field.name == name)
    hint, flag = types_of(settings)[name], field.metadata.get("flag")
    arguments = {"help": help_of(field) or None, "show_default": True}
    if field.default is dataclasses.MISSING:
        arguments["required"] = True
    else:
        arguments["default"] = field.default
    choices = choices_of(hint)
    if hint is bool:
        flags = flag or f"--{name.replace('_', '-')}/--no-{name.replace('_', '-')}"
        if "/" not in flags:  # a flag that only turns the setting on
            arguments["is_flag"] = True
    else:
        flags = f"--{name.replace('_', '-')}"
        if choices is not None:
            arguments["type"] = click.Choice(choices)
        else:  # int | TokenBudget: a number on the command line
            arguments["type"] = next(t for t in (int, float, str) if t is hint or t in typing.get_args(hint))
    return click.option(flags, name, **{**arguments, **changes})


def settings_options(settings: type, **changes: dict):
    """One option per field of ``settings`` that has one, in its order (``changes``: per field name)."""
    return options(*(setting_option(settings, field.name, **changes.get(field.name, {}))
                     for field in dataclasses.fields(settings) if field.metadata.get("option", True)))


engine_option = setting_option(ModelSpec, "engine", type=click.Choice(PAIR_ENGINES), help=engines_help(PAIR_ENGINES))
quantize_option = setting_option(ModelSpec, "quantize")


def model_option_group(required: bool = True, ct2: bool = False):
    """ModelSpec's options; `required`: whether --small and --large must be given; `ct2`: whether --engine
    offers CTranslate2 (a whole decoder)."""
    optional = {} if required else {"required": False, "default": None}
    engines = ENGINES if ct2 else PAIR_ENGINES
    return settings_options(ModelSpec, small=optional, large=optional,
                            engine={"type": click.Choice(engines), "help": engines_help(engines)})


model_options = model_option_group(required=True)

# One option per DecodingConfig field, with the job file's names; decoding_config() reads them back.
decoding_options = settings_options(DecodingConfig)


def decoding_config(values: dict) -> DecodingConfig:
    """The DecodingConfig from a command's option values (the others are ignored); bad settings exit 2."""
    fields = DecodingConfig.__dataclass_fields__
    try:
        return DecodingConfig(**{key: value for key, value in values.items() if key in fields})
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
