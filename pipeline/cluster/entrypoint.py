"""The command the cluster runs inside the uploaded working directory, and how it is shown to people."""

from __future__ import annotations

import shlex

from pipeline.jobs.fingerprint import is_secret_key


def entrypoint_for(job_file: str, overrides: list[str] | tuple = ()) -> str:
    """``python -m pipeline.cli run JOB_FILE [--set ...]``, quoted for a shell."""
    parts = ["python", "-m", "pipeline.cli", "run", job_file]
    for override in overrides:
        parts += ["--set", override]
    return " ".join(shlex.quote(part) for part in parts)


def redact_entrypoint(entrypoint: str) -> str:
    """The entrypoint with the values of secret-looking ``--set`` keys hidden, for printing."""
    try:
        parts = shlex.split(entrypoint)
    except ValueError:
        return "(entrypoint not shown)"
    out = []
    for index, part in enumerate(parts):
        if index and parts[index - 1] == "--set" and "=" in part:
            key, _, _ = part.partition("=")
            if is_secret_key(key):
                part = f"{key}=***"
        out.append(part)
    return " ".join(shlex.quote(part) for part in out)
