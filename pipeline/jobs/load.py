"""Reading job files: YAML, its ``presets:`` underneath, ``--set key.path=value`` on top, then validation."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml
from pydantic import ValidationError

from pipeline.jobs.files import JobFileError, read_mapping
from pipeline.jobs.presets import merge_presets
from pipeline.jobs.schema import JobConfig

__all__ = ["JobFileError", "apply_overrides", "job_data", "load_job", "parse_override"]


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
