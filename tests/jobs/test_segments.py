"""input.segment: sentence — documents split into sentences (io/segments.py), their sentences decoded as
units batched across records by the stage, and one row per record put back together (docs/design.md §2)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline.decoding import BatchPolicy, DecodingConfig, Generator, ModelPair, ModelSpec
from pipeline.decoding.stats import GenerationResult
from pipeline.decoding.stats import DecodeStats
from pipeline.io.segments import Document, join_results, split_sentences
from pipeline.jobs.fingerprint import decisive_settings
from pipeline.jobs.schema import InputSection, JobConfig
from pipeline.stage import DecodeStage, DecodeStageSpec

MAX_NEW = 12
DOCUMENTS = [
    "Ein Hund läuft über die Wiese. Zwei Männer spielen Fußball im Park.",
    "Eine Frau liest z.B. ein Buch.\n\nKinder bauen eine Sandburg am Strand! Die Sonne scheint.",
    "Ein Mann fährt Rad.",
    " \r\nDr. Müller wohnt in Berlin.\r\nEin alter Mann liest eine Zeitung.\rZwei Kinder spielen.\n\n\r\nEnde.  ",
    "Ein Hund. Eine Katze. Ein Vogel. Ein Fisch. Ein Pferd. Eine Kuh. Ein Schaf. Eine Ziege.",
]


# --- splitting ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", DOCUMENTS + ["", "   \n\n ", "...!?", "« Ja. » Nein.", "kein Satzzeichen",
                                              "Eins.\u00a0 Zwei.\u2028Drei. —\n"])
def test_a_document_is_its_sentences_and_what_lies_between_them(text):
    document = split_sentences(text, "de")
    assert document.text == text  # the layout comes back: paragraph breaks, mixed newlines, spaces
    assert all(sentence == sentence.strip() and sentence for sentence in document.sentences)
    assert len(document.gaps) == len(document.sentences)


def test_sentences_are_split_by_the_languages_rules():
    document = split_sentences(DOCUMENTS[1], "de")
    assert document.sentences == ("Eine Frau liest z.B. ein Buch.", "Kinder bauen eine Sandburg am Strand!",
                                  "Die Sonne scheint.")
    assert document.gaps == ("\n\n", " ", "")
    assert split_sentences(DOCUMENTS[3], "de").sentences[0] == "Dr. Müller wohnt in Berlin."
    # pieces without a letter or digit stay between the sentences, untranslated and uncounted
    assert split_sentences("...!?", "de").sentences == ()
    assert split_sentences("Eins. —\n\nZwei.", "de").join(["One.", "Two."]) == "One. —\n\nTwo."
    assert split_sentences("« Ja. » Nein.", "de").sentences == ("« Ja. »", "Nein.")  # quotes stay with theirs


# --- putting a record back together ---------------------------------------------------------------


def _result(prediction, tokens, **flags):
    return GenerationResult(prediction=prediction, error=None, method="bild", input_tokens=tokens + 1,
                            truncated=flags.pop("truncated", False), latency_ms=float(tokens),
                            stats=DecodeStats(output_tokens=tokens, small_tokens=tokens - 1, large_tokens=1,
                                              large_calls=2), token_ids=list(range(tokens)), **flags)


def test_a_record_is_its_sentences_translations_in_place_and_the_sums_of_their_counters():
    document = Document("  ", ("Eins.", "Zwei.", "Drei."), ("\n\n", " ", "\n"))
    parts = [_result("One.", 3, stopped_by_budget=False, repetition=False, unknown_tokens=0),
             _result("Two.", 4, stopped_by_budget=True, repetition=False, unknown_tokens=2, truncated=True),
             _result("Three.", 5, stopped_by_budget=False, repetition=False, unknown_tokens=1)]
    joined = join_results(document, parts, "bild")
    assert joined.prediction == "  One.\n\nTwo. Three.\n"
    assert joined.error is None and joined.method == "bild"
    assert joined.stats == DecodeStats(output_tokens=12, small_tokens=9, large_tokens=3, large_calls=6)
    assert (joined.input_tokens, joined.latency_ms, joined.truncated) == (15, 12.0, True)
    assert (joined.stopped_by_budget, joined.repetition, joined.unknown_tokens) == (True, False, 3)
    assert joined.token_ids == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4]


def test_a_failed_sentence_fails_its_record_naming_the_segment():
    document = Document("", ("Eins.", "Zwei.", "Drei."), (" ", " ", ""))
    parts = [_result("One.", 3), GenerationResult(prediction=None, error="boom", method="bild"),
             GenerationResult(prediction=None, error="bang", method="bild")]
    joined = join_results(document, parts, "bild")
    assert joined.prediction is None
    assert joined.error == "segment 1 of 3: boom (and 1 more)"


def test_an_empty_document_is_an_error_and_one_of_punctuation_comes_back_as_it_is():
    assert join_results(split_sentences(" \n ", "de"), [], "large").error == "input text is empty"
    kept = join_results(split_sentences("...!?", "de"), [], "large")
    assert (kept.prediction, kept.error, kept.stats.output_tokens, kept.stopped_by_budget) == ("...!?", None, 0, False)


# --- the job keys ---------------------------------------------------------------------------------


def _job(**input_keys) -> JobConfig:
    return JobConfig(name="d", input={"path": "in.parquet", **input_keys}, models={"small": "s", "large": "l"},
                     output={"path": "out"})


def test_segment_is_a_validated_decisive_key_that_leaves_unsegmented_runs_as_they_were():
    with pytest.raises(ValueError, match="segment"):
        InputSection(path="x", segment="paragraph")
    with pytest.raises(ValueError, match="language"):
        InputSection(path="x", language="German!")
    plain = decisive_settings(_job())
    assert "input.segment" not in plain and "input.language" not in plain  # older runs resume, same hash
    assert _job(language="de").config_hash() == _job().config_hash()
    segmented = decisive_settings(_job(segment="sentence", language="de"))
    assert segmented["input.segment"] == "sentence" and segmented["input.language"] == "de"
    assert _job(segment="sentence", language="de").config_hash() != _job(segment="sentence").config_hash()


# --- the stage ------------------------------------------------------------------------------------


def _stage(pair, config, batch_size, segment="sentence", prompt=None):
    small, large = pair
    spec = DecodeStageSpec(models=ModelSpec(small, large, device="cpu"), points=((config.method, config),),
                           prompt=prompt, job_name="t", config_hash="h", batch=BatchPolicy(batch_size), segment=segment,
                           language="de")
    return DecodeStage(spec)


@pytest.mark.parametrize("method", ["large", "bild"])
def test_a_documents_prediction_is_its_sentences_decoded_one_by_one_and_joined(saved_tiny_pair, method):
    """Greedy: batch 1, 4 and 8, every document's row is the join of its sentences decoded alone, counters
    summed; the sentences of several records share the batch."""
    small, large = saved_tiny_pair
    config = DecodingConfig(method=method, max_new_tokens=MAX_NEW, fallback_threshold=0.5, rollback_threshold=0.0,
                            adaptive_draft=False)  # counters compared: each sentence's rounds as alone
    alone = Generator(ModelPair.from_spec(ModelSpec(small, large, device="cpu")), config)
    expected = []
    for text in DOCUMENTS:
        document = split_sentences(text, "de")
        results = [alone.generate_one(sentence) for sentence in document.sentences]
        expected.append((document.join([r.prediction for r in results]), len(results),
                         DecodeStats.total(r.stats for r in results), sum(r.input_tokens for r in results)))
    records = pa.table({"id": [f"d{i}" for i in range(len(DOCUMENTS))], "text": DOCUMENTS,
                        "reference": ["x"] * len(DOCUMENTS), "input_error": [None] * len(DOCUMENTS)})
    for size in (1, 4, 8):
        rows = _stage(saved_tiny_pair, config, size)(records).to_pylist()
        assert [row["id"] for row in rows] == [f"d{i}" for i in range(len(DOCUMENTS))]
        got = [(row["prediction"], row["segments"], DecodeStats.from_sums(row), row["input_tokens"]) for row in rows]
        assert got == expected, f"batch {size}"
        assert all(row["error"] is None and row["latency_ms"] > 0 for row in rows)
        assert [row["segments"] for row in rows] == [2, 3, 1, 4, 8]


def test_bad_documents_each_get_a_clear_row(saved_tiny_pair):
    small, large = saved_tiny_pair
    config = DecodingConfig(method="large", max_new_tokens=MAX_NEW, max_input_tokens=8)
    long_sentence = "Ein sehr langer Satz " + "mit vielen Wörtern " * 10 + "endet hier."
    texts = ["", "  \n\t ", "... !? —", "Eins.\r\nZwei.\rDrei.\n\nVier.", f"Kurz. {long_sentence} Auch kurz.", None]
    records = pa.table({"id": [f"b{i}" for i in range(len(texts))], "text": texts, "reference": [None] * len(texts),
                        "input_error": [None] * 5 + ["missing text (column 'de' is null or absent)"]})
    alone = Generator(ModelPair.from_spec(ModelSpec(small, large, device="cpu")), config)
    for size in (1, 4):
        rows = {row["id"]: row for row in _stage(saved_tiny_pair, config, size)(records).to_pylist()}
        assert len(rows) == len(texts)
        assert rows["b0"]["error"] == rows["b1"]["error"] == "input text is empty"
        assert rows["b0"]["segments"] == rows["b1"]["segments"] == 0 and rows["b0"]["prediction"] is None
        assert (rows["b2"]["prediction"], rows["b2"]["error"], rows["b2"]["segments"]) == ("... !? —", None, 0)
        assert rows["b2"]["output_tokens"] == 0 and rows["b2"]["stopped_by_budget"] is False
        mixed, document = rows["b3"], split_sentences(texts[3], "de")
        assert mixed["error"] is None and mixed["segments"] == 4 and document.gaps == ("\r\n", "\r", "\n\n", "")
        alone_each = [alone.generate_one(text).prediction for text in document.sentences]
        assert mixed["prediction"] == document.join(alone_each)
        long = rows["b4"]
        assert long["error"] is None and long["segments"] == 3 and long["truncated"] is True
        assert long["input_tokens"] <= 3 * 8
        assert rows["b5"]["error"].startswith("missing text") and rows["b5"]["segments"] == 0


def test_unsegmented_rows_say_one_segment_and_decode_the_record_whole(saved_tiny_pair):
    config = DecodingConfig(method="large", max_new_tokens=MAX_NEW)
    records = pa.table({"id": ["a"], "text": [DOCUMENTS[0]], "reference": [None], "input_error": [None]})
    row = _stage(saved_tiny_pair, config, 1, segment="none")(records).to_pylist()[0]
    whole = _stage(saved_tiny_pair, config, 1)  # the same pair
    alone = Generator(whole._pairs["auto"], config).generate_one(DOCUMENTS[0])
    assert (row["segments"], row["prediction"]) == (1, alone.prediction)
    assert row["output_tokens"] == alone.stats.output_tokens


def test_a_five_thousand_sentence_document_is_one_row_of_five_thousand_segments(saved_tiny_pair):
    """Split in milliseconds, decoded as 5,000 units among the call's other records, one row back."""
    sentences = [f"Satz Nummer {i} ist hier." for i in range(5000)]
    text = "\n\n".join(" ".join(sentences[i : i + 10]) for i in range(0, 5000, 10))
    document = split_sentences(text, "de")
    assert document.sentences == tuple(sentences) and document.text == text
    config = DecodingConfig(method="large", max_new_tokens=1)
    records = pa.table({"id": ["long", "short"], "text": [text, "Ein Hund."], "reference": [None, None],
                        "input_error": [None, None]})
    rows = _stage(saved_tiny_pair, config, 16)(records).to_pylist()
    assert [(row["id"], row["segments"], row["output_tokens"], row["error"]) for row in rows] == [
        ("long", 5000, 5000, None), ("short", 1, 1, None)]


# --- the shipped sample and job -------------------------------------------------------------------


def test_the_documents_sample_is_what_its_script_makes_and_its_job_validates():
    import importlib.util

    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from pipeline.cli import main
    from support import REPO

    spec = importlib.util.spec_from_file_location("make_documents_sample",
                                                  REPO / "scripts" / "make_documents_sample.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    sample = REPO / "data" / "documents_sample" / "multi30k_documents.parquet"
    source = pq.read_table(REPO / "data" / "multi30k_sample" / "test_2016_flickr.parquet").to_pylist()
    table = make.documents(source)
    assert table.equals(pq.read_table(sample)) and sample.stat().st_size < 64 * 2**10
    assert sum(table["sentences"].to_pylist()) == len(source)
    assert set(table["sentences"].to_pylist()) <= set(range(2, 9))
    assert " ".join(table["en"].to_pylist()).count("\n\n") == 16  # some documents are two paragraphs
    result = CliRunner().invoke(main, ["validate", str(REPO / "jobs" / "documents.yaml")])
    assert result.exit_code == 0, result.output
