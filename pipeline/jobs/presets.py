"""Presets: reusable YAML fragments that a job file pulls in with a top-level ``presets:`` list.

A job file may start with

    presets:
      - ../configs/decoding/cnn_dm_unaligned_quality.yaml   # relative to this job file

Each preset is a mapping with the same keys as a job file (usually just a ``decoding:`` section).
The presets are deep-merged in list order (a later preset wins over an earlier one), then the job
file's own keys are merged on top (the job file wins), and ``--set`` overrides come after that.
Mappings merge key by key; any other value (a list, a string, a number, null) replaces the one
below it whole. Presets do not nest: a preset may not have a ``presets:`` key of its own.

Every problem raises JobFileError with a message that names the job file and the ``presets`` key.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from pipeline.jobs.files import JobFileError, read_mapping
from pipeline.jobs.schema import JobConfig

PRESETS_KEY = "presets"


def deep_merge(base: dict, override: dict) -> dict:
    """A new dict: ``base`` with ``override`` merged on top (mappings key by key, other values replaced)."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _read_preset(index: int, entry: Any, job_path: Path) -> dict:
    where = f"{job_path}: {PRESETS_KEY}[{index}]"
    if not isinstance(entry, str) or not entry.strip():
        raise JobFileError(f"{where}: expected the path of a preset file (a string), got {entry!r}")
    path = Path(entry).expanduser()
    if not path.is_absolute():
        path = Path(os.path.normpath(job_path.parent / path))  # "jobs/../configs/x.yaml" -> "configs/x.yaml"
    data = read_mapping(path, f"{where} {entry!r}", "preset file")
    if PRESETS_KEY in data:
        raise JobFileError(
            f"{where} {entry!r}: presets cannot include other presets (remove its {PRESETS_KEY!r} key)"
        )
    unknown = sorted(str(key) for key in data if key not in JobConfig.model_fields)
    if unknown:
        raise JobFileError(
            f"{where} {entry!r}: unknown key(s) {', '.join(unknown)} (a preset holds job-file sections, "
            f"e.g. decoding:)"
        )
    return data


def merge_presets(data: dict, job_path: str | Path) -> dict:
    """The job's data with its ``presets`` merged underneath it and the ``presets`` key removed.

    ``job_path`` is the job file; relative preset paths are resolved from its folder. ``data`` is
    not modified. A job without ``presets`` comes back unchanged (as a copy).
    """
    job_path = Path(job_path)
    if PRESETS_KEY not in data:
        return copy.deepcopy(data)
    entries = data[PRESETS_KEY]
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise JobFileError(
            f"{job_path}: {PRESETS_KEY}: expected a list of preset file paths, got {type(entries).__name__}"
        )
    merged: dict = {}
    for index, entry in enumerate(entries):
        merged = deep_merge(merged, _read_preset(index, entry, job_path))
    own = {key: value for key, value in data.items() if key != PRESETS_KEY}
    return deep_merge(merged, own)
