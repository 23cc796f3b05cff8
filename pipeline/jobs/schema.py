"""The job file: a pydantic model that maps one to one onto the YAML users write.

Unknown keys are errors (a typo must not be silently ignored), and every error names the key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from pipeline.decoding.config import (
    DEFERRALS,
    DTYPE_NAMES,
    ENGINES,
    METHODS,
    PLAIN_METHODS,
    QUANTIZE_NAMES,
    DecodingConfig,
    ModelSpec,
    ct2_method_problem,
    engine_problem,
)
from pipeline.io.segments import SEGMENTS


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


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
                    "rules for input.segment: sentence.")


class ModelsSection(_Section):
    """The fields of pipeline.decoding.ModelSpec, validated here so errors name the key."""

    small: str
    large: str
    tokenizer: str | None = None
    dtype: Literal[DTYPE_NAMES] = "float32"
    device: str = "auto"
    trust_remote_code: bool = False
    engine: Literal[ENGINES] = Field(
        default="auto",
        description="auto/native: our own forward pass where the architecture has one (the T5 and BART "
                    "families), else Hugging Face's modules (logged once per actor); hf: always Hugging Face's; "
                    "onnx: the native engine with its decoder step run by onnxruntime (CPU, float32; faster there); "
                    "ct2: CTranslate2 (methods large and small: the model decodes alone; converted once per "
                    "checkpoint into models.ct2_cache; a converted CTranslate2 folder is taken as it is).")
    quantize: Literal[QUANTIZE_NAMES] = Field(
        default="none",
        description="int8: both models' linear layers and output heads in int8 (per-channel weights, per-row "
                    "activations) where it pays; the native engine on a CPU in float32 only; CTranslate2's int8 "
                    "compute type with engine ct2 (int8_float16 on a GPU).")
    ct2_cache: str | None = Field(
        default=None,
        description="engine ct2: the local folder of converted checkpoints, one per checkpoint content hash "
                    "(default ~/.cache/bild-pipeline/ct2).")

    @model_validator(mode="after")
    def _int8_runs_where_it_can(self):
        problem = engine_problem(self.engine, self.quantize, self.device, self.dtype)
        if problem:
            raise ValueError(problem)
        return self

    def to_spec(self) -> ModelSpec:
        return ModelSpec(**self.model_dump())


class TokenBudgetSection(_Section):
    """decoding.max_new_tokens in its ratio form (pipeline.decoding.config.TokenBudget)."""

    ratio: float = Field(gt=0.0, description="Tokens the output may have per input token.")
    extra: int = Field(default=0, ge=0, description="Tokens added to ratio x input tokens (short inputs, EOS).")
    cap: int | None = Field(default=None, ge=1, description="The most any unit may generate (default: no cap "
                                                             "but the ratio of max_input_tokens).")


_WHOLE_NUMBER = TypeAdapter(Annotated[int, Field(ge=1)])


class DecodingSection(_Section):
    """The fields of pipeline.decoding.DecodingConfig, validated here so errors name the key."""

    method: Literal[METHODS] = "bild"
    fallback_threshold: float = Field(default=0.4, ge=0.0, le=1.0)
    rollback_threshold: float = Field(default=3.0, ge=0.0)
    max_draft_tokens: int = Field(default=10, ge=1)
    draft_window: Literal["fixed", "fallback"] = "fixed"
    adaptive_draft: bool = Field(
        default=True, description="Choose each round's draft window (0 included: a plain large step) from measured "
                                  "costs and acceptance, at most max_draft_tokens (the default: never slower than "
                                  "large). Lossy methods and sampled rows then follow the windows chosen; false: "
                                  "always max_draft_tokens, so that they repeat exactly run to run.")
    deferral: Literal[DEFERRALS] = Field(
        default="chow", description="cascade: the deferral rule (chow, diff, opt; docs/decoding.md).")
    deferral_threshold: float = Field(
        default=0.1, description="cascade: the rule's alpha (chow: [0, 1], diff: [-1, 1], opt: >= 0); a higher "
                                 "alpha defers less.")
    lenience: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="speculative: lossy speculative sampling's lambda (0: lossless).")
    max_input_tokens: int = Field(default=512, ge=1)
    max_new_tokens: Annotated[int, Field(ge=1)] | TokenBudgetSection = Field(
        default=128,
        description="Tokens a unit (a record, or a sentence with input.segment: sentence) may generate, EOS "
                    "included: a number, or {ratio: R, extra: E, cap: C} for min(C, ceil(R x input tokens) + E), "
                    "its input tokens counted after truncation, the prompt included (the input_tokens column).")

    @field_validator("max_new_tokens", mode="before")
    @classmethod
    def _one_budget_form(cls, value):
        """One message for either form (not pydantic's one per member of the union)."""
        form = TokenBudgetSection if isinstance(value, dict) else _WHOLE_NUMBER
        try:
            return form.model_validate(value) if form is TokenBudgetSection else form.validate_python(value)
        except ValidationError as exc:
            problems = [f"{'.'.join(map(str, item['loc']))}: "
                        f"{'unknown key' if item['type'] == 'extra_forbidden' else item['msg']}" if item["loc"]
                        else item["msg"] for item in exc.errors()]
            hint = "" if form is TokenBudgetSection else " (a number, or {ratio: R, extra: E, cap: C})"
            raise ValueError("; ".join(problems) + hint) from None
    do_sample: bool = False
    temperature: float = Field(default=1.0, gt=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int = 0

    @model_validator(mode="after")
    def _settings_fit_together(self):
        if self.method != "cascade":  # as DecodingConfig refuses lenience outside speculative
            for key in ("deferral", "deferral_threshold"):
                if getattr(self, key) != type(self).model_fields[key].default:
                    raise ValueError(f"decoding.{key} is the cascade method's; decoding.method is {self.method!r}")
        self.to_config()  # DecodingConfig's own checks (a deferral_threshold out of its rule's range, ...)
        return self

    def to_config(self) -> DecodingConfig:
        return DecodingConfig(**self.model_dump())


class ComputeSection(_Section):
    actors: int = Field(default=1, ge=1, description="Decoding actors, each holding one model pair.")
    gpus_per_actor: float = Field(default=0.0, ge=0.0)
    cpus_per_actor: float = Field(default=1.0, gt=0.0)
    batch_size: int = Field(
        default=8, ge=1,
        description="Records an actor decodes together (continuous batching, each with its own fallbacks and "
                    "rollbacks); 1 decodes record by record.")
    verify_share: float = Field(
        default=1.0, gt=0.0, le=1.0,
        description="Batched bild/speculative: call the large model once this share of the batch waits for it "
                    "(1.0, measured fastest in BENCHMARKS.md: once every row waits).")
    records_per_call: int | None = Field(
        default=None, ge=1,
        description="Records Ray hands an actor per call (default 4 x batch_size: rows to refill the batch from).")

    def records_per_actor_call(self) -> int:
        return self.records_per_call or 4 * self.batch_size


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
        baseline_engine = self.report.baseline_engine or self.models.engine
        if self.report.baseline is not None and self.report.baseline == self.decoding.method \
                and baseline_engine == self.models.engine:
            raise ValueError("report.baseline must differ from decoding.method (or run on another "
                             "report.baseline_engine)")
        if self.models.engine == "ct2" or baseline_engine == "ct2":
            methods = [self.decoding.method] if self.models.engine == "ct2" else []
            problem = ct2_method_problem(methods, self.decoding.do_sample)
            if problem:
                raise ValueError(problem)
        ct2_runs = self.models.engine == "ct2" or (self.report.baseline is not None and baseline_engine == "ct2")
        if ct2_runs and isinstance(self.decoding.max_new_tokens, TokenBudgetSection):
            raise ValueError("decoding.max_new_tokens in its ratio form runs on the pair engines; CTranslate2 "
                             "(models.engine or report.baseline_engine ct2) takes a number")
        if baseline_engine == "ct2" and self.report.baseline not in (None, *PLAIN_METHODS):
            raise ValueError(f"report.baseline_engine ct2 runs report.baseline large or small only; "
                             f"report.baseline is {self.report.baseline!r}")
        return self

    def redacted(self) -> dict:
        """The resolved config with secrets (keys, tokens, passwords) replaced: safe to write or print."""
        return redact(self.model_dump())

    def config_hash(self) -> str:
        """A short hash of every setting that decides the rows (settings_hash), secrets excluded."""
        return settings_hash(self)


# Settings a row's tokens do not depend on: how much is decoded, where things are kept, credentials.
_NOT_DECISIVE = {"input.limit", "input.storage_options", "models.ct2_cache", "report.baseline_records"}
_DECISIVE_SECTIONS = ("task", "prompt", "input", "models", "decoding", "report")


def _decides_nothing(name: str, resolved: dict) -> bool:
    """Keys added after runs were recorded, left out where they change no row (so those runs resume and keep
    their config_hash): input.segment none, and input.language, which only the sentence splitter reads."""
    segmented = resolved["input"].get("segment") == "sentence"
    return name in ("input.segment", "input.language") and not segmented


def decisive_settings(job: JobConfig) -> dict[str, Any]:
    """{dotted key: value} of every setting that decides the rows (engine and quantize included: onnx int8
    and native int8 quantize differently, so their tokens can differ)."""
    resolved = job.redacted()
    flat: dict[str, Any] = {}
    for section in _DECISIVE_SECTIONS:
        value = resolved[section]
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for key, item in items:
            name = section if key is None else f"{section}.{key}"
            if name not in _NOT_DECISIVE and not _decides_nothing(name, resolved):
                flat[name] = item
    return flat


def settings_hash(job: JobConfig) -> str:
    """A short hash of decisive_settings (the rows' config_hash column)."""
    blob = json.dumps(decisive_settings(job), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def check_prompt(prompt: str) -> None:
    """A prompt template holds {text} and nothing else to fill in (ValueError saying what is wrong)."""
    if "{text}" not in prompt:
        raise ValueError(f"the prompt template {prompt!r} must contain {{text}}, where each input goes")
    try:
        prompt.format(text="")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"the prompt template {prompt!r} may hold no field but {{text}} (found {exc}); write "
                         "a literal brace as {{ or }}") from exc


# Keys whose values are secrets: "key", "secret", "token", "aws_secret_access_key", "session_token",
# "api_key", "password" ... but not "max_new_tokens" or "id_column".
_SECRET_KEY = re.compile(r"(^|_)(key|token|secret|password|passwd|credentials?)$|secret|password|private_key", re.I)
REDACTED = "***"


def is_secret_key(key: str) -> bool:
    """Whether a config key (its last dotted part) names a secret."""
    return bool(_SECRET_KEY.search(str(key).split(".")[-1]))


# Storage options shown as they are in run.json and printed configs: where the data lives, never how one
# signs in. Every other storage option (aws_access_key_id, a token, a credentials file) is redacted.
STORAGE_OPTIONS_SHOWN = frozenset({"endpoint_url", "endpoint", "region", "region_name", "profile", "profile_name",
                                   "anon", "use_ssl", "client_kwargs"})


def redact(value: Any, in_storage_options: bool = False) -> Any:
    """Replace the values of secret-looking keys anywhere in a nested structure, and of every storage option
    outside STORAGE_OPTIONS_SHOWN."""
    if isinstance(value, dict):
        shown = {}
        for key, item in value.items():
            hidden = (in_storage_options and key not in STORAGE_OPTIONS_SHOWN) or is_secret_key(key)
            nested = in_storage_options or key == "storage_options"
            shown[key] = REDACTED if hidden and item not in (None, "") else redact(item, nested)
        return shown
    if isinstance(value, list):
        return [redact(item, in_storage_options) for item in value]
    return value


def _decoding_fields_match() -> bool:
    """DecodingSection must mirror DecodingConfig field for field (checked by a test)."""
    return set(DecodingSection.model_fields) == {f.name for f in dataclasses.fields(DecodingConfig)}
