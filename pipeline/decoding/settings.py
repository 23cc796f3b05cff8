"""How a setting is written once: a field of a frozen dataclass (config.py's ModelSpec, DecodingConfig,
BatchPolicy, TokenBudget) made with ``setting()``, which carries the setting's help text and bounds.

The job schema's sections (jobs/schema.py) and the CLI's options (cli/options.py) are derived from these
fields, and ``setting_problems`` is the one check of their choices and bounds, run when a dataclass is made:
a job file, a command-line option and the Python API are refused in the same words. Which settings go
together is rules.py's."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import MISSING, dataclass


@dataclass(frozen=True)
class Bounds:
    """Where a number may lie: ge/gt a lower bound (inclusive/exclusive), le/lt an upper one."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def admits(self, value: float) -> bool:
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))

    def __str__(self) -> str:
        low = "[" if self.ge is not None else "(" if self.gt is not None else None
        high = "]" if self.le is not None else ")" if self.lt is not None else None
        lower = self.ge if self.ge is not None else self.gt
        upper = self.le if self.le is not None else self.lt
        if low and high:
            return f"in {low}{lower:g}, {upper:g}{high}"
        if low:
            return f"{'>=' if low == '[' else '>'} {lower:g}"
        return f"{'<=' if high == ']' else '<'} {upper:g}"


def setting(default=MISSING, help: str = "", *, ge=None, gt=None, le=None, lt=None, flag: str | None = None,
            option: bool = True, default_factory=MISSING):
    """A dataclass field that is a user's setting: its ``help`` (the job schema's description and the option's
    help), its bounds, and how the command line spells it (``flag``: a boolean's "--on/--off" where it is not
    "--name/--no-name"; ``option=False``: no command-line option)."""
    bounds = Bounds(ge, gt, le, lt) if (ge, gt, le, lt) != (None,) * 4 else None
    metadata = {"help": help, "bounds": bounds, "flag": flag, "option": option}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def help_of(field: dataclasses.Field) -> str:
    return field.metadata.get("help", "")


def bounds_of(field: dataclasses.Field) -> Bounds | None:
    return field.metadata.get("bounds")


@functools.cache
def types_of(cls: type) -> dict[str, typing.Any]:
    """Each field's resolved type (the dataclasses are written with ``from __future__ import annotations``)."""
    return typing.get_type_hints(cls)


def choices_of(hint) -> tuple | None:
    """The values a Literal type (or an optional one) admits; None for any other type."""
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        for member in typing.get_args(hint):
            if typing.get_origin(member) is typing.Literal:
                return typing.get_args(member)
    return None


def bound_problem(field: dataclasses.Field, value) -> str | None:
    """Why ``value`` is outside the field's bounds (None: inside, or not a number)."""
    bounds = bounds_of(field)
    if bounds is None or isinstance(value, bool) or not isinstance(value, (int, float)) or bounds.admits(value):
        return None
    return f"{field.name} must be {bounds}, got {value}"


def setting_problems(instance) -> list[str]:
    """What is wrong with each of a settings dataclass's fields on its own: a value outside its choices or
    its bounds."""
    problems = []
    hints = types_of(type(instance))
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        choices = choices_of(hints[field.name])
        optional = type(None) in typing.get_args(hints[field.name])
        if choices is not None and value not in choices and not (value is None and optional):
            problems.append(f"{field.name} must be one of {', '.join(map(str, choices))}, got {value!r}")
        problem = bound_problem(field, value)
        if problem:
            problems.append(problem)
    return problems


def check_settings(instance, *more: str) -> None:
    """ValueError listing ``setting_problems`` and ``more`` (a dataclass's own rules), if any."""
    problems = setting_problems(instance) + [problem for problem in more if problem]
    if problems:
        raise ValueError("; ".join(problems))
