"""Job files: the pydantic schema and its loader (YAML + --set overrides)."""

from pipeline.jobs.load import JobFileError, apply_overrides, load_job
from pipeline.jobs.fingerprint import redact
from pipeline.jobs.schema import JobConfig

__all__ = ["JobConfig", "JobFileError", "apply_overrides", "load_job", "redact"]
