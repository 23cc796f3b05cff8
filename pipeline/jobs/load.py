"""Reading job files: YAML, its ``presets:`` underneath, ``--set key.path=value`` on top, then validation."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml
from pydantic import ValidationError

from pipeline.jobs.presets import merge_presets
from pipeline.jobs.schema import JobConfig


class JobFileError(ValueError):
    """A job file that cannot be used; the message names the file and the key."""


def parse_override(assignment: str) -> tuple[list[str], object]:
    """``decoding.method=large`` -> (["decoding", "method"], "large"); the value is read as YAML."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise JobFileError(f"--set {assignment!r}: expected KEY.PATH=VALUE, e.g. decoding.method=large")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise JobFileError(f"--set {assignment!r}: the value is not valid YAML ({exc})") from exc
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: Iterable[str]) -> dict:
    for assignment in overrides:
        path, value = parse_override(assignment)
        node = data
        for depth, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(path[: depth + 1])
                raise JobFileError(f"--set {assignment!r}: {where} is not a section")
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
        lines.append(f"  {key}: {message}")
    return "\n".join(lines)


def load_job(path: str | Path, overrides: Iterable[str] = ()) -> JobConfig:
    """Read, override and validate a job file; raise JobFileError naming the key on any problem."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise JobFileError(f"{source}: cannot read the job file ({exc.strerror or exc})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise JobFileError(f"{source}: not valid YAML ({exc})") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise JobFileError(f"{source}: a job file must be a mapping of keys, got {type(data).__name__}")
    data = merge_presets(data, Path(path))  # presets underneath, the job's own keys on top
    data = apply_overrides(data, overrides)
    try:
        return JobConfig.model_validate(data)
    except ValidationError as exc:
        raise JobFileError(_describe(exc, source)) from exc
