"""The job schema's sections derived from the settings dataclasses (decoding/config.py): one pydantic field per
dataclass field, with its type, default and help; its bounds checked by settings.bound_problem, the same check
the dataclass runs, so that an error names its key (``decoding.top_p: ...``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from pipeline.decoding.settings import bound_problem, help_of, types_of


class Section(BaseModel):
    """A job file's section: unknown keys are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def settings_section(settings: type, name: str, *, types: dict[str, Any] | None = None) -> type[Section]:
    """A Section with ``settings``' fields (``types``: a field's type as the job file writes it, where it differs)
    and ``to_settings()``, the dataclass it describes."""
    hints = {**types_of(settings), **(types or {})}
    fields = {}
    for field in dataclasses.fields(settings):
        default = ... if field.default is dataclasses.MISSING else field.default
        fields[field.name] = (hints[field.name], Field(default=default, description=help_of(field) or None))
    bounded = [field.name for field in dataclasses.fields(settings) if field.metadata.get("bounds")]
    by_name = {field.name: field for field in dataclasses.fields(settings)}

    def within_bounds(cls, value, info):
        problem = bound_problem(by_name[info.field_name], value)
        if problem:
            raise ValueError(problem)
        return value

    validators = {"_within_bounds": field_validator(*bounded)(within_bounds)} if bounded else {}

    def to_settings(self):
        """The settings dataclass this section describes (its own checks and rules run again there)."""
        return settings(**self.model_dump())

    model = create_model(name, __base__=Section, __validators__=validators, **fields)
    model.to_settings = to_settings
    model.__doc__ = f"The job file's view of {settings.__module__}.{settings.__name__} (one field each)."
    return model
