"""input.language_check: each record's language detected before it is decoded (io/language.py); flag fills two
columns, skip returns a record confidently in another language untranslated; the report counts them."""

from __future__ import annotations

import pyarrow as pa
import pydantic
import pytest

from pipeline.decoding import DecodingConfig, ModelSpec
from pipeline.io.language import CONFIDENT, Detected, LanguageCheck, base_code, detect
from pipeline.jobs.fingerprint import decisive_settings, settings_hash
from pipeline.jobs.report_language import language_rows, render_languages
from pipeline.jobs.schema import JobConfig
from pipeline.stage import DecodeStage, DecodeStageSpec

GERMAN = ["Ein Hund läuft über die grüne Wiese.", "Zwei Männer spielen Fußball im Park.",
          "Eine Frau liest ein Buch auf einer Bank."]
OTHERS = {"en": "A man in a blue shirt is riding a bicycle down the street.",
          "fr": "Un chien court dans l'herbe verte près de la rivière."}
BASE = {"name": "j", "input": {"path": "in.parquet", "language": "de"}, "models": {"small": "s", "large": "l"},
        "output": {"path": "out"}}


def test_sentences_are_detected_in_their_language_with_confidence():
    assert {detect(text).language for text in GERMAN} == {"de"}
    assert all(detect(text).confidence >= CONFIDENT for text in GERMAN)
    for language, text in OTHERS.items():
        assert detect(text).language == language and detect(text).confidence >= CONFIDENT


def test_only_a_confident_other_language_is_skipped():
    check = LanguageCheck("skip", "de-DE")
    assert base_code("de-DE") == base_code("de_de") == "de"
    assert not check.skips(Detected("de", 0.99))
    assert check.skips(Detected("en", CONFIDENT))
    assert not check.skips(Detected("en", CONFIDENT - 0.01))  # unsure: decoded as usual
    assert not LanguageCheck("flag", "de").skips(Detected("en", 0.99))  # flag never skips


def test_the_job_file_takes_yaml_off_and_refuses_a_code_the_check_cannot_compare():
    assert JobConfig.model_validate({**BASE, "input": {**BASE["input"], "language_check": False}}).input.language_check \
        == "off"  # YAML's bare `off`
    with pytest.raises(pydantic.ValidationError, match="input.language_check compares two-letter"):
        JobConfig.model_validate({**BASE, "input": {**BASE["input"], "language": "deu", "language_check": "skip"}})
    JobConfig.model_validate({**BASE, "input": {**BASE["input"], "language": "deu"}})  # no check: any code


def test_a_job_without_the_check_keeps_its_config_hash_and_one_with_it_gets_another():
    plain = JobConfig.model_validate(BASE)
    off = JobConfig.model_validate({**BASE, "input": {**BASE["input"], "language_check": "off", "target_language": "en"}})
    skip = JobConfig.model_validate({**BASE, "input": {**BASE["input"], "language_check": "skip"}})
    other_language = JobConfig.model_validate({**BASE, "input": {**BASE["input"], "language": "fr"}})
    assert settings_hash(plain) == settings_hash(off) == settings_hash(other_language)
    # as written before the check existed: none of its keys among the decisive ones
    assert not {"input.language_check", "input.target_language", "input.language"} & set(decisive_settings(off))
    assert {"input.language_check", "input.language"} <= set(decisive_settings(skip))
    assert settings_hash(skip) != settings_hash(plain)


def _stage_rows(saved_tiny_pair, texts, check):
    small, large = saved_tiny_pair
    config = DecodingConfig(method="large", max_new_tokens=8)
    records = pa.table({"id": [f"r{i}" for i in range(len(texts))], "text": texts, "reference": ["x"] * len(texts),
                        "input_error": [None] * len(texts)})
    spec = DecodeStageSpec(models=ModelSpec(small, large, device="cpu"), points=(("large", config),), prompt=None,
                           job_name="t", config_hash="h", language_check=check)
    return DecodeStage(spec)(records).to_pylist()


def test_skip_returns_other_languages_untranslated_and_leaves_the_rest_as_without_the_check(saved_tiny_pair):
    texts = [GERMAN[0], OTHERS["en"], GERMAN[1], OTHERS["fr"], GERMAN[2]]
    without = _stage_rows(saved_tiny_pair, texts, None)
    skipped = _stage_rows(saved_tiny_pair, texts, LanguageCheck("skip", "de", "en"))
    flagged = _stage_rows(saved_tiny_pair, texts, LanguageCheck("flag", "de", "en"))
    assert [row["skipped"] for row in skipped] == [None, "language", None, "language", None]
    assert [row["error"] for row in skipped] == [None] * 5
    for i in (1, 3):  # untranslated: their own text, no tokens, no quality statistics, no latency
        assert skipped[i]["prediction"] == texts[i] and skipped[i]["output_tokens"] == 0
        assert skipped[i]["quality_stats"] is None and skipped[i]["latency_ms"] is None
    for i in (0, 2, 4):
        assert skipped[i]["prediction"] == without[i]["prediction"] == flagged[i]["prediction"]
        assert skipped[i]["output_tokens"] == without[i]["output_tokens"]
    assert [row["detected_language"] for row in skipped] == ["de", "en", "de", "fr", "de"]
    assert [row["detected_language"] for row in without] == [None] * 5
    assert all(row["skipped"] is None for row in flagged) and flagged[1]["detected_language"] == "en"
    assert flagged[1]["prediction"] != texts[1]  # flag decodes it


class _Rows:
    """What language_rows reads of a run: its columns and filtered batches."""

    def __init__(self, table: pa.Table):
        self.table = table
        self.columns = table.column_names

    def batches(self, columns, where=None):
        import pyarrow.dataset as pads

        yield pads.dataset(self.table).to_table(columns=list(columns), filter=where)


def test_the_report_counts_and_lists_the_records_in_another_language():
    table = pa.table({"id": ["a", "b", "c", "d", "e"], "prediction": ["x", "A dog.", "y", "Un chat.", "z"],
                      "detected_language": ["de", "en", "de", "fr", None],
                      "language_confidence": [0.99, 0.95, 0.99, 0.5, None],
                      "skipped": [None, "language", None, None, None]})
    job = {"input": {"language": "de", "language_check": "skip", "target_language": "en"}}
    section = language_rows(_Rows(table), job)
    assert (section["rows_checked"], section["elsewhere"], section["skipped"], section["in_target"]) == (4, 1, 1, 1)
    assert section["languages"] == {"de": 2, "en": 1, "fr": 1}
    assert [row["id"] for row in section["listed"]] == ["b"]  # fr at 0.5: not confident, not listed
    assert "1 were in another language than `de`" in render_languages(section)
    assert language_rows(_Rows(table), {"input": {"language_check": "off"}}) is None
