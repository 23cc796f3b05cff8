"""What makes a run one configuration: the settings that decide a row's tokens (schema.decisive_settings),
and the models' content.

An output folder holds the rows of one configuration. Its manifest (run.json) records both halves
below; a resume compares them with the job it is handed and refuses (exit 2) where they differ,
naming each key, so that no report ever scores rows of two configurations as one.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from pipeline.jobs.schema import JobConfig, decisive_settings, settings_hash

__all__ = ["ResumeMismatchError", "check_resume", "decisive_settings", "differences", "model_fingerprint",
           "models_content", "settings_hash"]

_WHOLE_FILE_BYTES = 1 << 20  # files up to 1 MiB are hashed whole; larger ones by their first and last MiB


def model_fingerprint(name: str) -> str:
    """A hash of a local model folder's content (each file's name and size, small files whole, large ones by
    their first and last MiB: cheap on multi-GB checkpoints yet changed by any retraining); "name:ID" for a
    hub id or anything that is not a local folder."""
    if not os.path.isdir(name):
        return f"name:{name}"
    digest = hashlib.sha256()
    for folder, subfolders, files in sorted(os.walk(name)):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
        for file in sorted(f for f in files if not f.startswith(".")):
            path = os.path.join(folder, file)
            size = os.path.getsize(path)
            digest.update(f"{os.path.relpath(path, name)}\0{size}\0".encode())
            with open(path, "rb") as handle:
                if size <= _WHOLE_FILE_BYTES:
                    digest.update(handle.read())
                else:
                    digest.update(handle.read(_WHOLE_FILE_BYTES))
                    handle.seek(size - _WHOLE_FILE_BYTES)
                    digest.update(handle.read())
    return digest.hexdigest()[:16]


def models_content(job: JobConfig) -> dict[str, str]:
    """{"models.small": fingerprint, "models.large": ..., "models.tokenizer": ...}, as run.json records it."""
    models = job.models
    named = {"models.small": models.small, "models.large": models.large, "models.tokenizer": models.tokenizer}
    return {key: model_fingerprint(value) for key, value in named.items() if value}


class ResumeMismatchError(ValueError):
    """output.mode resume on an output written under another configuration."""


def differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """"key: old -> new" for every key whose value differs (a key only one side has included)."""
    missing = object()
    found = []
    for key in sorted(set(before) | set(now)):
        old, new = before.get(key, missing), now.get(key, missing)
        if old != new:
            shown = ["(absent)" if value is missing else repr(value) for value in (old, new)]
            found.append(f"{key}: {shown[0]} -> {shown[1]}")
    return found


def check_resume(previous: dict | None, current: dict, output_path: str) -> None:
    """Refuse to resume `output_path`, whose manifest is `previous`, under the configuration `current`
    (the manifest about to be written) where any decisive setting or model content differs. A manifest
    from before these were recorded (or none: a fresh output) is accepted."""
    if not previous or "decisive_settings" not in previous:
        return
    changed = differences(previous["decisive_settings"], current["decisive_settings"])
    changed += [f"{line} (the model's files changed)" for line in
                differences(previous.get("models_content", {}), current["models_content"])]
    if changed:
        raise ResumeMismatchError(
            f"output.path {output_path!r} holds rows of another configuration; resuming would mix two in one "
            f"run. Changed: {'; '.join(changed)}. Put the changed settings back, or write to a new output.path "
            f"(or set output.mode: overwrite to discard the rows there).")
