"""Flags in every row, counts in every summary (issue 44): a row says when its output ran to the token
budget, when its tail loops, and how many of its source tokens became <unk>; the report counts each
flag and lists the worst rows, gives the paired speed ratio a bootstrap interval, and shows no rate
that does not apply to the run's method. No Ray: tiny models and runs written by hand."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer, models, processors
from transformers import PreTrainedTokenizerFast

from pipeline.decoding import DecodingConfig, Generator, ModelPair
from pipeline.metrics.row_flags import is_repetition, is_stopped_by_budget, unknown_token_count
from pipeline.io.schema import OUTPUT_SCHEMA
from pipeline.jobs.report import build_report, write_report
from pipeline.pairs.tiny import EOS, SPECIAL_TOKENS, VOCAB_SIZE, build_pair
from support.pairs import TEXTS, tiny_pair

EOS_IDS = frozenset({EOS})


def words(text: str) -> bool:
    """is_repetition on a text alone (tokens that do not loop)."""
    return is_repetition([], text, EOS_IDS, lambda unit: "")


def tokens(ids: list[int], text: str = "") -> bool:
    """is_repetition on token ids, each decoding to a letter (x for 10, y for 11, ...), "!" for 3."""
    return is_repetition(ids, text, EOS_IDS, lambda unit: "".join("!" if i == 3 else chr(ord("x") + i - 10)
                                                                    for i in unit))


# The rules, on crafted sequences.

def test_a_looping_tail_is_a_repetition_and_a_normal_sentence_is_not():
    assert words("The man is being being being")
    assert words("The man is being being being.")  # punctuation around a word does not hide the loop
    assert words("of the city of the city of the city")  # a unit of three words
    assert tokens([12, 13, 10, 11, 10, 11, 10, 11])  # a unit of two tokens
    assert tokens([12, 10, 10, 10, EOS])  # a loop that ended on EOS still loops
    for sentence in ("A dog runs across the grass.", "Two men are playing football in a park.",
                     "I had had enough.", "Bye bye bye.", "He said no, no.", ""):
        assert not words(sentence), sentence
    assert not tokens([10, 11, 12, 13, 10, 11])
    assert not tokens([10, 11, 10, 11])  # twice is not a loop
    assert not tokens([10, 11, 12, 13, 14, 10, 11, 12, 13, 14, 10, 11, 12, 13, 14])  # a unit longer than 4
    assert not words("Wow!!!") and not tokens([10, 3, 3, 3])  # a few "!" are writing
    assert tokens([10, 3, 3, 3, 3, 3, 3])  # six are a loop


def test_the_budget_stop_is_the_budget_reached_without_eos():
    assert is_stopped_by_budget([5, 6, 7, 8], 4, EOS_IDS)
    assert not is_stopped_by_budget([5, 6, 7, EOS], 4, EOS_IDS)  # EOS as the last token the budget allowed
    assert not is_stopped_by_budget([5, 6, EOS], 4, EOS_IDS)
    assert not is_stopped_by_budget([5, 6], 4, EOS_IDS)  # shorter, without EOS: not the budget


def ascii_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny models' vocabulary size, but one token per printable ASCII character only: "ü", "é" and
    "€" have no token and become <unk>."""
    names = SPECIAL_TOKENS + [chr(code) for code in range(32, 127)]
    names += [f"<extra_{i}>" for i in range(VOCAB_SIZE - len(names))]
    vocab = {name: i for i, name in enumerate(names)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def test_unknown_tokens_count_the_unk_id_only_where_it_marks_unknown_text():
    tokenizer = ascii_tokenizer()
    assert unknown_token_count(tokenizer("Zürich Café €")["input_ids"], tokenizer) == 3
    assert unknown_token_count(tokenizer("Zurich Cafe")["input_ids"], tokenizer) == 0
    gpt2_like = PreTrainedTokenizerFast(tokenizer_object=tokenizer._tokenizer, eos_token="</s>", unk_token="</s>")
    assert unknown_token_count([5, EOS, EOS], gpt2_like) == 0  # its "unknown" token is its EOS
    no_unk = PreTrainedTokenizerFast(tokenizer_object=tokenizer._tokenizer, eos_token="</s>")
    assert unknown_token_count([2, 2], no_unk) == 0


# The rows a tiny pair decodes.

def test_a_tiny_pair_flags_its_looping_budget_stopped_rows():
    generator = Generator(tiny_pair("t5"), DecodingConfig(max_new_tokens=16))
    looping = generator.generate_one(TEXTS[1])  # "1\ufffdppppppppppppp": the tiny t5 repeats one byte
    assert looping.prediction.endswith("ppp") and len(looping.token_ids) == 16
    record = looping.to_record()
    assert record["stopped_by_budget"] is True and record["repetition"] is True and record["unknown_tokens"] == 0
    varied = Generator(tiny_pair("gpt2"), DecodingConfig(max_new_tokens=16)).generate_one(TEXTS[0])
    assert varied.stopped_by_budget is True and varied.repetition is False  # cut off, but no loop
    failed = generator.generate_one("")
    assert (failed.stopped_by_budget, failed.repetition, failed.unknown_tokens) == (None, None, None)


@pytest.mark.parametrize("method", ["bild", "large"])
def test_an_output_that_ends_on_eos_is_not_stopped_by_the_budget(method):
    small, large, tokenizer = build_pair("t5", seed=0)
    with torch.no_grad():  # EOS where the models would go on: their favourite token's row, stronger
        for model in (small, large):
            model.lm_head.weight[EOS] = 3 * model.lm_head.weight[3]
    generator = Generator(ModelPair(small, large, tokenizer, torch.device("cpu")),
                          DecodingConfig(method=method, max_new_tokens=2))
    for text in TEXTS[:2]:
        result = generator.generate_one(text)
        assert result.token_ids[-1] == EOS, result.token_ids
        assert result.stopped_by_budget is False and result.repetition is False


def test_source_characters_the_tokenizer_lacks_are_counted():
    small, large, _ = build_pair("t5", seed=0)
    generator = Generator(ModelPair(small, large, ascii_tokenizer(), torch.device("cpu")),
                          DecodingConfig(max_new_tokens=4))
    lost, kept = generator.generate(["Zürich, Café, 5 €", "Zurich, Cafe, 5 EUR"])
    assert lost.unknown_tokens == 3 and lost.to_record()["unknown_tokens"] == 3
    assert kept.unknown_tokens == 0
    byte_level = Generator(tiny_pair("t5"), DecodingConfig(max_new_tokens=4)).generate_one("Zürich, Café, 5 €")
    assert byte_level.unknown_tokens == 0  # a byte-level vocabulary has a token for everything


def test_ctranslate2_rows_carry_the_same_flags_as_our_engines(saved_tiny_pair, tmp_path):
    """The CT2 decoder's Generator builds its own results: the same three flags as Generator on the same tokens."""
    pytest.importorskip("ctranslate2")
    from pipeline.decoding.config import ModelSpec
    from pipeline.decoding.decoders import open_generator

    small, large = saved_tiny_pair
    config = DecodingConfig(method="large", max_new_tokens=12)
    ours = Generator(ModelPair.from_pretrained(small, large, device="cpu", engine="native"), config)
    theirs = open_generator(ModelSpec(small, large, device="cpu", engine="ct2", ct2_cache=str(tmp_path)), config)
    flags = [[(r.token_ids, r.stopped_by_budget, r.repetition, r.unknown_tokens)
              for r in generator.generate(TEXTS + [""])] for generator in (ours, theirs)]
    assert flags[0] == flags[1]
    assert all(row[1] is not None and row[3] == 0 for row in flags[1][:-1]) and flags[1][-1][1:] == (None, None, None)
    assert any(row[1] for row in flags[1])  # the tiny pair runs to the budget


# The report of a run written by hand.

def write_run(path, rows: list[dict], method: str = "bild", flags: bool = True) -> None:
    schema = OUTPUT_SCHEMA if flags else pa.schema([f for f in OUTPUT_SCHEMA
                                                    if f.name not in ("stopped_by_budget", "repetition",
                                                                      "unknown_tokens")])
    (path / "data").mkdir(parents=True)
    full = [{**{name: None for name in schema.names}, "method": method, "worker": "host:1", "input_tokens": 5,
             "truncated": False, "engine": "native",
             **{key: value for key, value in row.items() if key in schema.names}} for row in rows]
    pq.write_table(pa.Table.from_pylist(full, schema=schema), path / "data" / "part-0.parquet")
    manifest = {"job": {"name": "flags", "task": "translation", "decoding": {"method": method}},
                "config_hash": "abc", "attempts": [{"summary": {"wall_seconds": 2.0}}]}
    (path / "run.json").write_text(json.dumps(manifest))


def made_up_rows() -> list[dict]:
    """Twelve decoded rows and one error: two loops to the budget, one more budget stop, one shorter loop,
    two rows with unknown tokens; each paired with a `large` baseline 2.5 to 3.5 times slower."""
    rows = []
    for i in range(12):
        latency = 10.0 + i
        rows.append({"id": f"r{i:02d}", "prediction": f"A sentence number {i}.", "reference": "A sentence.",
                     "output_tokens": 8 + i, "small_tokens": 6, "large_tokens": 2 + i, "fallbacks": 1, "rollbacks": 1,
                     "small_calls": 8, "large_calls": 3, "draft_tokens": 7, "latency_ms": latency,
                     "call_started_at": 1000.0 + i / 10, "call_seconds": 0.05,
                     "stopped_by_budget": False, "repetition": False, "unknown_tokens": 0,
                     "baseline_method": "large", "baseline_prediction": "A sentence.", "baseline_output_tokens": 8,
                     "baseline_latency_ms": latency * (2.5 + (i % 3) / 2)})
    rows[3].update(prediction="The man is " + "being " * 40, output_tokens=64, stopped_by_budget=True,
                   repetition=True)
    rows[7].update(prediction="Smmmemememememe", output_tokens=60, stopped_by_budget=True, repetition=True)
    rows[5].update(prediction="A long sentence cut off in the", output_tokens=64, stopped_by_budget=True)
    rows[9].update(prediction="yes yes yes", repetition=True)
    rows[1].update(unknown_tokens=3)
    rows[10].update(unknown_tokens=1)
    rows.append({"id": "broken", "error": "RuntimeError: boom", "reference": "A sentence."})
    return rows


def test_the_report_counts_each_flag_and_lists_the_worst_rows(tmp_path):
    write_run(tmp_path / "run", made_up_rows())
    summary, numeric = build_report(str(tmp_path / "run"))
    assert summary["flags"] == {"rows_checked": 12, "stopped_by_budget": 3, "repetition": 3,
                                "rows_with_unknown_tokens": 2, "unknown_tokens": 4}
    listed = {name: [row["id"] for row in rows] for name, rows in summary["flagged_rows"].items()}
    # Loops that ran to the budget first, then the longest; most unknown tokens first.
    assert listed == {"stopped_by_budget": ["r03", "r07", "r05"], "repetition": ["r03", "r07", "r09"],
                      "unknown_tokens": ["r01", "r10"]}
    excerpt = summary["flagged_rows"]["repetition"][0]["prediction"]
    assert excerpt.startswith("The man is being") and excerpt.endswith("being being") and len(excerpt) <= 80
    write_report(summary, numeric, tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## Flagged rows" in report and "3 stopped by the token budget" in report
    assert "- `r03` (64 tokens): “The man is being" in report and "- `r01` (3 unknown token(s))" in report
    assert json.loads((tmp_path / "report" / "summary.json").read_text())["flags"]["repetition"] == 3


def test_the_worst_rows_are_at_most_five(tmp_path):
    rows = [{**row, "stopped_by_budget": True} for row in made_up_rows() if row["id"] != "broken"]
    write_run(tmp_path / "run", rows)
    summary, _ = build_report(str(tmp_path / "run"))
    assert summary["flags"]["stopped_by_budget"] == 12 and len(summary["flagged_rows"]["stopped_by_budget"]) == 5


def test_a_run_written_before_the_flags_still_reports_without_them(tmp_path):
    write_run(tmp_path / "run", made_up_rows(), flags=False)
    summary, numeric = build_report(str(tmp_path / "run"))
    assert "flags" not in summary and summary["records"]["total"] == 13
    write_report(summary, numeric, tmp_path / "report")
    assert "Flagged rows" not in (tmp_path / "report" / "report.md").read_text()


def test_the_paired_speed_ratio_has_a_bootstrap_interval_around_it(tmp_path):
    write_run(tmp_path / "run", made_up_rows())
    summary, numeric = build_report(str(tmp_path / "run"))
    paired = summary["paired_baseline"]
    interval = paired["latency_speedup_interval"]
    assert interval["low"] < paired["latency_speedup"] < interval["high"]
    assert 2.5 <= interval["low"] and interval["high"] <= 3.5  # every record's own ratio lies in [2.5, 3.5]
    write_report(summary, numeric, tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    assert f"95% interval [{interval['low']:.2f}, {interval['high']:.2f}], a paired bootstrap over records" in report


def test_a_report_shows_only_the_rates_that_apply_to_its_method(tmp_path):
    write_run(tmp_path / "bild", made_up_rows())
    bild, numeric = build_report(str(tmp_path / "bild"))
    assert "deferral_share" not in bild["bild"] and "plain_step_share" not in bild["bild"]
    assert {"fallbacks_per_100_tokens", "rollbacks_per_100_tokens", "small_token_share"} <= set(bild["bild"])
    write_report(bild, numeric, tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "deferral_share" not in report and "| rollbacks_per_100_tokens |" in report
    # Every row of the throughput table is defined in a line under it.
    table = [line.split(" | ")[0].removeprefix("| ") for line in report.split("## Throughput and latency")[1]
             .split("\n\n")[1].splitlines()[2:]]
    assert {"wall_seconds", "records_per_s", "output_tokens_per_s", "utilization"} <= set(table)
    for measure in table:
        assert f"- **{measure.split()[0]}**: " in report, measure
    plain = [{key: value for key, value in row.items() if not key.startswith("baseline_")}
             | {"small_tokens": 0, "large_tokens": row.get("output_tokens"), "fallbacks": 0, "rollbacks": 0,
                "small_calls": 0, "draft_tokens": 0} for row in made_up_rows()]
    write_run(tmp_path / "large", plain, method="large")
    large, _ = build_report(str(tmp_path / "large"))
    assert set(large["bild"]) == {"output_tokens"}  # no fallback, rollback or drafting rows
    cascade = [{**row, "deferrals": 2} for row in made_up_rows()]
    write_run(tmp_path / "cascade", cascade, method="cascade")
    assert build_report(str(tmp_path / "cascade"))[0]["bild"]["deferral_share"] == pytest.approx(24 / 84)
