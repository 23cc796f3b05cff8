"""Reading job files: YAML, its ``presets:`` underneath, ``--set key.path=value`` on top, then validation."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import yaml
from pydantic import ValidationError

from pipeline.jobs.files import JobFileError, read_mapping
from pipeline.jobs.presets import merge_presets
from pipeline.jobs.fingerprint import REDACTED, is_secret_key
from pipeline.jobs.schema import JobConfig

__all__ = ["JobFileError", "apply_overrides", "job_data", "load_job", "parse_override"]

_KEY_PATH = re.compile(r"[\w.-]*")  # what --set KEY.PATH=... names, up to the first other character


def _hides_value(path: list[str], raw: str = "") -> bool:
    """Whether an override's value must not be echoed in an error: it sits under a secret-looking key
    (the manifest's rule, ``is_secret_key``) or under ``storage_options``, whose values go to fsspec as
    they are. A value that did not parse cannot be redacted key by key as the manifest does, so the
    words of ``raw`` that could be keys (``{storage_options: {secret: ...``) count as well."""
    return any(part == "storage_options" or is_secret_key(part) for part in [*path, *re.findall(r"\w+", raw)])


def _shown(path: list[str], raw: str, flag: str = "--set", secret: bool = False) -> str:
    """``--set 'KEY.PATH=VALUE'`` as an error message may show it: the value only unless ``_hides_value``."""
    value = REDACTED if secret or _hides_value(path, raw) else raw
    return f"{flag} {'.'.join(path) + '=' + value!r}"


def parse_override(assignment: str, flag: str = "--set", secret: bool = False,
                   example: str = "decoding.method=large") -> tuple[list[str], object]:
    """``decoding.method=large`` -> (["decoding", "method"], "large"); the value is read as YAML.

    Errors name the option (``flag``) and the key path but never echo a value that may be a secret (see
    ``_hides_value``; every value where ``secret``, as for storage options)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        # Show the key path it starts with ("input.storage_options.secret" of "...secret:x"), and the rest
        # only where it cannot be a secret (not after "=", nothing that _hides_value).
        named = _KEY_PATH.match(assignment.strip()).group()
        shown = assignment
        if (sep or secret or _hides_value(named.split("."), assignment)) and named != assignment.strip():
            shown = f"{named}..."
        raise JobFileError(f"{flag} {shown!r}: expected KEY.PATH=VALUE, e.g. {example}")
    path = key.strip().split(".")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        detail = "not shown: it may hold a secret" if secret or _hides_value(path, raw) else str(exc)
        raise JobFileError(f"{_shown(path, raw, flag, secret)}: the value is not valid YAML ({detail})") from exc
    return path, value


def apply_overrides(data: dict, overrides: Iterable[str]) -> dict:
    for assignment in overrides:
        path, value = parse_override(assignment)
        node = data
        for depth, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(path[: depth + 1])
                raw = assignment.partition("=")[2]
                raise JobFileError(f"{_shown(path, raw)}: {where} is not a section")
            node = child
        node[path[-1]] = value
    return data


def _describe(error: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid job file"]
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown key (not part of the job schema; check its spelling)"
        elif item["type"] == "value_error":  # our own validators' words, without pydantic's "Value error, "
            message = str(item["ctx"]["error"]) if "error" in item.get("ctx", {}) else message
        lines.append(f"  {key}: {message}")
    return "\n".join(lines)


def job_data(path: str | Path) -> dict:
    """A job file's keys with its presets merged underneath (before --set overrides and validation)."""
    return merge_presets(read_mapping(Path(path), str(path), "job file"), Path(path))


def load_job(path: str | Path, overrides: Iterable[str] = ()) -> JobConfig:
    """Read, override and validate a job file; raise JobFileError naming the key on any problem."""
    source = str(path)
    data = apply_overrides(job_data(path), overrides)  # presets underneath, the job's keys, then --set
    try:
        return JobConfig.model_validate(data)
    except ValidationError as exc:
        raise JobFileError(_describe(exc, source)) from exc
