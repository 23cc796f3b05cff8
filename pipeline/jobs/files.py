"""Reading job and preset files: the one YAML reader of the job layer, and its error type."""

from __future__ import annotations

from pathlib import Path

import yaml


class JobFileError(ValueError):
    """A job file that cannot be used; the message names the file and the key."""


def read_mapping(path: Path, where: str, what: str) -> dict:
    """The YAML mapping in ``path`` ({} for an empty file); JobFileError naming ``where`` otherwise.
    ``what`` names the kind of file in messages ("job file", "preset file")."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise JobFileError(f"{where}: cannot read the {what} {path} ({exc.strerror or exc})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise JobFileError(f"{where}: the {what} is not valid YAML ({exc})") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise JobFileError(f"{where}: a {what} must be a mapping of job keys, got {type(data).__name__}")
    return data
