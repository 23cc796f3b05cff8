"""Job schema, secrets and input normal form (no Ray needed)."""

from __future__ import annotations

import dataclasses
import re

import click
import pydantic
import pytest

from pipeline.decoding import BatchPolicy, DecodingConfig, ModelSpec
from pipeline.io.records import normalize, parse_jsonl
from pipeline.jobs.fingerprint import REDACTED, redact
from pipeline.jobs.schema import DecodingSection, JobConfig, ModelsSection

BASE = {"name": "j", "input": {"path": "s3://b/in/", "storage_options": {"key": "AKIA-SECRET-ID",
                                                                          "secret": "very-secret"}},
        "models": {"small": "s", "large": "l"}, "output": {"path": "s3://b/out/"}}


def test_each_section_is_derived_from_its_settings_dataclass():
    """decoding:, models: and compute:'s batching keys are DecodingConfig's, ModelSpec's and BatchPolicy's fields
    (settings.setting), with their defaults and help; the CLI's options are the same fields."""
    from pipeline.cli.options import decoding_options, model_options
    from pipeline.jobs.schema import ComputeSection

    for section, settings in ((DecodingSection, DecodingConfig), (ModelsSection, ModelSpec)):
        assert list(section.model_fields) == [f.name for f in dataclasses.fields(settings)]
    assert DecodingSection().to_config() == DecodingConfig()
    assert ComputeSection().batch_policy() == BatchPolicy()
    assert DecodingSection.model_fields["top_p"].description == dataclasses.fields(DecodingConfig)[-2].metadata["help"]
    options = [param.name for param in click.command()(decoding_options(lambda **_: None)).params]
    assert options == [f.name for f in dataclasses.fields(DecodingConfig)]
    models = [param.name for param in click.command()(model_options(lambda **_: None)).params]
    assert models == [f.name for f in dataclasses.fields(ModelSpec) if f.name != "ct2_cache"]


def test_models_section_gives_the_frozen_model_spec():
    """The job's models: section, the CLI and the decoding stage share one frozen ModelSpec."""
    section = ModelsSection(small="s", large="l", dtype="bfloat16", engine="hf")
    assert section.to_spec() == ModelSpec("s", "l", dtype="bfloat16", engine="hf")
    with pytest.raises(dataclasses.FrozenInstanceError):
        section.to_spec().small = "other"
    with pytest.raises(ValueError, match="engine must be one of"):
        ModelSpec("s", "l", engine="vllm")


@pytest.mark.parametrize("key, value, words", [
    ("top_p", 0, "top_p must be in (0, 1], got 0"),
    ("fallback_threshold", 1.5, "fallback_threshold must be in [0, 1], got 1.5"),
    ("max_draft_tokens", 0, "max_draft_tokens must be >= 1, got 0"),
    ("lenience", 1.0, "lenience must be in [0, 1), got 1.0"),
])
def test_a_bound_is_stated_once_and_refused_alike_by_the_job_file_the_option_and_the_api(key, value, words):
    from pipeline.cli.options import decoding_config

    with pytest.raises(pydantic.ValidationError) as job_error:
        JobConfig.model_validate({**BASE, "decoding": {key: value}})
    assert job_error.value.errors()[0]["loc"] == ("decoding", key) and words in str(job_error.value)
    with pytest.raises(ValueError, match=re.escape(words)):
        DecodingConfig(**{key: value})
    with pytest.raises(click.UsageError, match=re.escape(words)):
        decoding_config({key: value})


def test_redaction_hides_secrets_only():
    job = JobConfig.model_validate(BASE)
    text = str(job.redacted())
    assert "very-secret" not in text and "AKIA-SECRET-ID" not in text
    assert job.redacted()["decoding"]["max_new_tokens"] == 128  # "tokens" is not a secret
    nested = redact({"client_kwargs": {"aws_secret_access_key": "x", "session_token": "y", "endpoint_url": "u"},
                     "password": "p", "api_key": "k", "id_column": "id"})
    assert nested == {"client_kwargs": {"aws_secret_access_key": REDACTED, "session_token": REDACTED,
                                        "endpoint_url": "u"}, "password": REDACTED, "api_key": REDACTED,
                      "id_column": "id"}


def test_config_hash_follows_what_decides_outputs():
    job = JobConfig.model_validate(BASE)
    other_secret = JobConfig.model_validate({**BASE, "input": {**BASE["input"], "storage_options": {"key": "z"}}})
    other_compute = JobConfig.model_validate({**BASE, "compute": {"actors": 8}})
    other_method = JobConfig.model_validate({**BASE, "decoding": {"method": "large"}})
    assert job.config_hash() == other_secret.config_hash() == other_compute.config_hash()
    assert job.config_hash() != other_method.config_hash()


def test_prompt_template_is_checked():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="must contain"):
        JobConfig.model_validate({**BASE, "prompt": "summarize:"})
    assert JobConfig.model_validate({**BASE, "prompt": "summarize: {text}"}).prompt == "summarize: {text}"


def test_normal_form_of_records():
    assert normalize({"id": 7.0, "t": "x"}, "id", "t", None) == {"id": "7", "text": "x", "reference": None,
                                                                 "input_error": None}
    assert "string" in normalize({"id": 1, "t": 3}, "id", "t", None)["input_error"]
    assert "missing" in normalize({"id": 1}, "id", "t", None)["input_error"]
    assert normalize({"id": " ", "t": "x"}, "id", "t", None)["id"] is None


@pytest.mark.parametrize("ids", [["a", " ", None, "b"], [7, 8, None, -1], [7.0, 7.5, None, 1e20]])
@pytest.mark.parametrize("texts", [["x", None, "y", ""], [1, 2, None, 3]])
@pytest.mark.parametrize("references", [["r", None, "s", "t"], [5, None, 6.0, 7], None])
def test_a_block_of_rows_takes_the_normal_form_each_row_would(ids, texts, references):
    """normalize_table (Arrow, for a corpus of millions) and normalize (row by row) agree, whatever the types."""
    import pyarrow as pa

    from pipeline.io.records import RECORD_SCHEMA, id_strings, normalize_table

    columns = {"id": ids, "t": texts} | ({"r": references} if references is not None else {})
    table = pa.table(columns)
    rows = [normalize(raw, "id", "t", "r") for raw in table.to_pylist()]
    assert normalize_table(table, "id", "t", "r") == pa.Table.from_pylist(rows, schema=RECORD_SCHEMA)
    assert id_strings(table["id"]).to_pylist() == [row["id"] for row in rows]


def test_jsonl_lines_with_bad_bytes_keep_their_id():
    data = b'{"id": "a", "t": "gut"}\n\n{"id": "b", "t": "\xff"}\nnot json\n[1, 2]\n'
    records = list(parse_jsonl(data, "f.jsonl", "id", "t", None))
    assert [r["id"] for r in records] == ["a", "b", "f.jsonl:4", "f.jsonl:5"]
    assert records[0]["input_error"] is None
    assert "UTF-8" in records[1]["input_error"] and "JSON" in records[2]["input_error"]
    assert "object" in records[3]["input_error"]


def test_report_baseline_takes_every_decoding_method():
    """The baseline's methods are the decoding methods (one list), cascade among them."""
    from pipeline.decoding.config import METHODS
    from pipeline.jobs.schema import ReportSection

    assert "cascade" in METHODS
    for method in METHODS:
        assert ReportSection(baseline=method).baseline == method
