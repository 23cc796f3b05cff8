"""The job file: a pydantic model that maps one to one onto the YAML users write.

Unknown keys are errors (a typo must not be silently ignored), and every error names the key.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator

from pipeline.decoding import rules
from pipeline.decoding.config import ENGINES, METHODS, BatchPolicy, DecodingConfig, ModelSpec, TokenBudget
from pipeline.io.language import LANGUAGE_CHECKS, base_code
from pipeline.io.markup import MARKUPS
from pipeline.io.segments import SEGMENTS
from pipeline.jobs import fingerprint
from pipeline.jobs.sections import Section as _Section, settings_section


class InputSection(_Section):
    path: str = Field(description="A file, or a directory/prefix of shards; any fsspec URL (s3://, hf://, ...).")
    format: Literal["parquet", "jsonl", "csv"] = "parquet"
    id_column: str = "id"
    text_column: str = "text"
    reference_column: str | None = None
    limit: int | None = Field(default=None, ge=1, description="Decode only the first N records (after resume).")
    storage_options: dict[str, Any] = Field(default_factory=dict, description="Passed to fsspec as they are.")
    segment: Literal[SEGMENTS] = Field(
        default="none",
        description="sentence: each record's text is split into sentences (paragraph breaks and the whitespace "
                    "between sentences kept), the sentences of all records are decoded as units batched together, "
                    "and each record's row puts their translations back in place (its counters the sums, "
                    "`segments` how many); none: each record is one sequence for the models (docs/segments.md).")
    language: str = Field(
        default="en", pattern=r"^[A-Za-z]{2,3}([_-][A-Za-z0-9]+)*$",
        description="The input texts' language code (ISO 639, e.g. de): the sentence splitter's abbreviation "
                    "rules for input.segment: sentence, and what input.language_check expects.")
    markup: Literal[MARKUPS] = Field(
        default="none",
        description="html, xml or markdown: each record is a page; its tags, attributes, entities, comments, "
                    "scripts, styles, code and translate=\"no\" elements (Markdown: its markers, link targets, code "
                    "spans and blocks) are kept byte for byte, its text is translated (by input.segment inside each "
                    "block of text) and inline tags are put back around the words they covered; a page that does not "
                    "parse gets an error naming the line and column (docs/jobs.md).")
    language_check: Literal[LANGUAGE_CHECKS] = Field(
        default="off",
        description="flag: each record's language is detected (the detected_language and language_confidence "
                    "columns) and the report counts and lists the records confidently in another language than "
                    "input.language; skip: those records are not decoded, their row holds their text untranslated "
                    "with skipped: language (not an error) (docs/jobs.md).")
    target_language: str | None = Field(
        default=None, pattern=r"^[A-Za-z]{2,3}([_-][A-Za-z0-9]+)*$",
        description="With input.language_check: the language the job writes; the report counts the records "
                    "already in it.")

    @field_validator("language_check", mode="before")
    @classmethod
    def _off_as_yaml_writes_it(cls, value):
        """YAML reads a bare `off` as false: the job file's `language_check: off` is meant."""
        return "off" if value is False else value

    @model_validator(mode="after")
    def _check_compares_codes(self):
        problem = rules.language_check_problem(self.language_check, self.language, base_code(self.language))
        if problem:
            raise ValueError(problem)
        return self


class ModelsSection(settings_section(ModelSpec, "ModelsSection")):
    @model_validator(mode="after")
    def _engine_runs_where_it_can(self):
        problem = rules.engine_problem(self.engine, self.quantize, self.device, self.dtype)
        if problem:
            raise ValueError(problem)
        return self

    def to_spec(self) -> ModelSpec:
        return self.to_settings()


TokenBudgetSection = settings_section(TokenBudget, "TokenBudgetSection")
_WHOLE_NUMBER = TypeAdapter(int)


def _said(item: dict) -> str:
    """A pydantic error item in our words (a validator's own message without "Value error, ")."""
    if item["type"] == "extra_forbidden":
        return "unknown key"
    return str(item.get("ctx", {}).get("error", item["msg"]))


class DecodingSection(settings_section(DecodingConfig, "DecodingSection",
                                       types={"max_new_tokens": int | TokenBudgetSection})):
    @field_validator("max_new_tokens", mode="before")
    @classmethod
    def _one_budget_form(cls, value):
        """One message for either form (not pydantic's one per member of the union)."""
        form = TokenBudgetSection if isinstance(value, dict) else _WHOLE_NUMBER
        try:
            return form.model_validate(value) if form is TokenBudgetSection else form.validate_python(value)
        except ValidationError as exc:
            problems = [f"{'.'.join(map(str, item['loc']))}: {_said(item)}" if item["loc"] else _said(item)
                        for item in exc.errors()]
            hint = "" if form is TokenBudgetSection else " (a number, or {ratio: R, extra: E, cap: C})"
            raise ValueError("; ".join(problems) + hint) from None

    @model_validator(mode="after")
    def _settings_fit_together(self):
        problem = rules.written_decoding_problem(self.model_dump(exclude_unset=False), DecodingConfig())
        if problem:
            raise ValueError(problem)
        self.to_config()  # DecodingConfig's own rules (a deferral_threshold out of its rule's range, ...)
        return self

    def to_config(self) -> DecodingConfig:
        return self.to_settings()


class ComputeSection(settings_section(BatchPolicy, "ComputeSection")):
    """How many actors decode and what each holds; the batching keys are BatchPolicy's."""

    actors: int = Field(default=1, ge=1, description="Decoding actors, each holding one model pair.")
    gpus_per_actor: float = Field(default=0.0, ge=0.0)
    cpus_per_actor: float = Field(default=1.0, gt=0.0)
    records_per_call: int | None = Field(
        default=None, ge=1,
        description="Records Ray hands an actor per call (default 4 x batch_size: rows to refill the batch from).")

    def records_per_actor_call(self) -> int:
        return self.records_per_call or 4 * self.batch_size

    def batch_policy(self) -> BatchPolicy:
        return BatchPolicy(**{field.name: getattr(self, field.name) for field in dataclasses.fields(BatchPolicy)})


class OutputSection(_Section):
    path: str
    mode: Literal["resume", "overwrite", "error"] = "resume"
    # Rows gathered into one Parquet file. Each file is the unit of resume: after a crash, at most
    # this many rows per writer are decoded again. Larger means fewer, bigger files.
    rows_per_file: int = Field(default=1000, ge=1)
    storage_options: dict[str, Any] = Field(default_factory=dict)
    retry_errors: bool = Field(
        default=False,
        description="On resume, decode again the records whose rows hold an `error` (a poison record since fixed, "
                    "a store that was down); each id keeps one row, the new one.")


class ReportSection(_Section):
    """What the report compares the job's output with (the decoding itself is `decoding:`)."""

    baseline: Literal[METHODS] | None = Field(
        default=None,
        description="Also decode the first `baseline_records` records with this method, on the same actors and "
                    "in the same calls as the job's own (side by side); the report then shows the speedup over "
                    "it, the quality of both and the quality difference with a paired bootstrap interval.")
    baseline_records: int = Field(default=100, ge=1)
    baseline_engine: Literal[ENGINES] | None = Field(
        default=None,
        description="The engine the baseline runs on (default: models.engine), e.g. ct2: the report then "
                    "compares the job with CTranslate2 running report.baseline on the same actors.")


class JobConfig(_Section):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    task: Literal["translation", "summarization"] = "translation"
    input: InputSection
    prompt: str | None = Field(default=None, description='Template around each text, e.g. "summarize: {text}".')
    models: ModelsSection
    decoding: DecodingSection = Field(default_factory=DecodingSection)
    compute: ComputeSection = Field(default_factory=ComputeSection)
    output: OutputSection
    report: ReportSection = Field(default_factory=ReportSection)

    @field_validator("prompt")
    @classmethod
    def _prompt_has_text(cls, prompt: str | None) -> str | None:
        if prompt is not None:
            check_prompt(prompt)
        return prompt

    @model_validator(mode="after")
    def _reference_differs_from_text(self) -> "JobConfig":
        if self.input.reference_column and self.input.reference_column == self.input.text_column:
            raise ValueError("input.reference_column must differ from input.text_column")
        problems = rules.job_problems(
            method=self.decoding.method, engine=self.models.engine, baseline=self.report.baseline,
            baseline_engine=self.report.baseline_engine, do_sample=self.decoding.do_sample,
            ratio_budget=isinstance(self.decoding.max_new_tokens, TokenBudgetSection))
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def redacted(self) -> dict:
        """The resolved config with secrets (keys, tokens, passwords) replaced: safe to write or print."""
        return fingerprint.redact(self.model_dump())

    def config_hash(self) -> str:
        """A short hash of every setting that decides the rows (fingerprint.settings_hash), secrets excluded."""
        return fingerprint.settings_hash(self)


def check_prompt(prompt: str) -> None:
    """A prompt template holds {text} and nothing else to fill in (ValueError saying what is wrong)."""
    if "{text}" not in prompt:
        raise ValueError(f"the prompt template {prompt!r} must contain {{text}}, where each input goes")
    try:
        prompt.format(text="")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"the prompt template {prompt!r} may hold no field but {{text}} (found {exc}); write "
                         "a literal brace as {{ or }}") from exc
