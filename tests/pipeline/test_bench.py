"""The benchmark's machinery on a tiny pair (its figures live in BENCHMARKS.md, not in tests)."""

from __future__ import annotations

import dataclasses
import json
import runpy
import shutil
import sys
from collections import Counter

import pytest
import torch
from click.testing import CliRunner

from pipeline.bench.harness import Measured, balanced_orders, interleave
from pipeline.bench.methods import HF, OURS, render_markdown, run_bench, summarize_methods
from pipeline.cli import main
from pipeline.decoding import DecodingConfig
from pipeline.decoding.stats import DecodeOutput
from pipeline.metrics.interleaving import order_coverage
from pipeline.pairs.tiny import save_pair
from support import REPO
from support.pairs import TEXTS, tiny_pair


def test_interleave_balances_the_order_and_keeps_every_result():
    calls = []

    def method(name):
        def run(index):
            calls.append((name, index))
            return f"{name}{index}"
        return run

    runs = interleave({name: method(name) for name in "abc"}, inputs=3, repeats=2, device=torch.device("cpu"))
    assert calls[:3] == [("a", 0), ("b", 0), ("c", 0)]  # the warm-up, outside the measurements
    turns = ["".join(name for name, _ in calls[3 + 3 * turn : 6 + 3 * turn]) for turn in range(6)]
    assert turns == ["abc", "bca", "cab", "cba", "acb", "bac"]  # balanced_orders(3), one per input's turn
    assert [index for _, index in calls[3:]] == [0, 0, 0, 1, 1, 1, 2, 2, 2] * 2
    assert runs["b"].last == ["b0", "b1", "b2"] and runs["b"].repeats == 2
    assert len(runs["c"].all_seconds) == 6 and runs["c"].total_seconds == sum(runs["c"].repetition_seconds())


@pytest.mark.parametrize("count", range(1, 14))
def test_balanced_orders_put_every_method_behind_every_other_equally_often(count):
    orders = balanced_orders(count)
    assert all(sorted(order) == list(range(count)) for order in orders)
    behind = Counter((before, after) for order in orders for before, after in zip(order, order[1:]))
    assert set(behind) == {(a, b) for a in range(count) for b in range(count) if a != b}
    assert len(set(behind.values())) <= 1  # every method right after every other equally often
    places = Counter((place, method) for order in orders for place, method in enumerate(order))
    assert len(places) == count * count and len(set(places.values())) == 1  # and at every place equally often


def test_a_rotated_order_is_not_balanced():
    """The negative control: rotating one order keeps each method behind the same neighbour."""
    rotations = [[(place + shift) % 5 for place in range(5)] for shift in range(5)]
    behind = Counter((before, after) for order in rotations for before, after in zip(order, order[1:]))
    assert len(behind) == 5 and (1, 0) not in behind


@pytest.mark.parametrize("count", range(2, 10))
def test_a_header_says_not_fully_balanced_exactly_where_the_turns_taken_are_not(count):
    """interleave takes balanced_orders in turn: only whole cycles of them are balanced (bench-batch's 3
    repetitions of 6 cells are half a cycle), and the headers say so."""
    orders = balanced_orders(count)
    for turns in range(1, 2 * len(orders) + 2):
        taken = [orders[turn % len(orders)] for turn in range(turns)]
        behind = Counter((before, after) for order in taken for before, after in zip(order, order[1:]))
        places = Counter((place, method) for order in taken for place, method in enumerate(order))
        balanced = (len(behind) == count * (count - 1) and len(set(behind.values())) == 1
                    and len(places) == count * count and len(set(places.values())) == 1)
        assert ("not fully balanced" not in order_coverage(count, turns)) == balanced, (count, turns)
    assert order_coverage(6, 3) == "balanced orders, 3 of a cycle's 6 turns: not fully balanced"
    assert order_coverage(3, 12) == "balanced orders, 2 full cycles of 6 turns"
    assert order_coverage(1, 3) == "balanced orders, 3 full cycles of 1 turn"  # one method: one order, any turns


def assert_speeds_follow_the_timings(rows: dict) -> None:
    """Every method row's speed ratios are its yardstick's time over its own: every method decodes the same
    inputs the same number of times, so that is the ratio of their mean latencies in the same report."""
    for yardstick, key in (("large", "speedup_vs_large"), ("ct2_large", "speed_vs_ct2_large"),
                           ("ct2_large_int8", "speed_vs_ct2_large_int8")):
        for name, row in rows.items():
            if yardstick not in rows:
                assert key not in row, (name, key)
                continue
            want = rows[yardstick]["mean_latency_ms"] / row["mean_latency_ms"]
            assert row[key] == pytest.approx(want, rel=1e-9), (name, key)


def assert_ratios_follow_the_rates(cells: dict) -> None:
    """Every batch row's ratios are its tokens/s over its yardstick cell's tokens/s in the same report."""
    for name, row in cells.items():
        size, method = row["batch_size"], row["method"]
        yardsticks = {"ratio_vs_loop_b1": f"{method} loop", "ratio_vs_batch_b1": f"{method} B=1",
                      "ratio_vs_large_same_b": "large loop" if row["path"] == "loop" else f"large B={size}",
                      "ratio_vs_ct2_large_same_b": f"ct2_large B={size}",
                      "ratio_vs_ct2_large_int8_same_b": f"ct2_large_int8 B={size}"}
        for key, yardstick in yardsticks.items():
            if yardstick in cells:
                assert row[key] == pytest.approx(row["tokens_per_s"] / cells[yardstick]["tokens_per_s"], rel=1e-9), \
                    (name, key)
            else:
                assert key not in row, (name, key)


def test_the_paired_ratio_is_the_median_of_each_repetitions_own_ratio():
    """A machine that slows down between repetitions moves both cells of a repetition alike: the paired
    ratio follows each repetition (2, 0.8, 4/3: median 4/3), the ratio of the medians does not (2 / 2.5)."""
    from pipeline.bench.batch import Cell, summarize

    tokens = [[1] * 6, [2] * 4]
    cells = [Cell("large", 1, seconds=[1.0, 2.0, 4.0], tokens=tokens),
             Cell("bild", 1, seconds=[0.5, 2.5, 3.0], tokens=tokens)]
    report = summarize(tiny_pair("t5", "noisy"), cells, None, DecodingConfig(method="bild"), inputs=2, repeats=3)
    rows = {row["cell"]: row for row in report["rows"]}
    assert rows["bild B=1"]["ratio_vs_large_same_b"] == pytest.approx(0.8)
    assert rows["bild B=1"]["paired_vs_large"] == pytest.approx(4 / 3)
    assert rows["large B=1"]["paired_vs_large"] == pytest.approx(1.0)


def test_speed_ratios_are_computed_from_the_timings():
    """summarize_methods on hand-made timings: each ratio is the yardstick's total time over the method's."""
    pair = tiny_pair("t5", "noisy")
    outputs = [DecodeOutput([5, 6, 7]), DecodeOutput([8, 9])]  # 5 tokens per repetition

    def measured(*repetitions):
        return Measured(seconds=[list(r) for r in repetitions], results=[outputs for _ in repetitions])

    runs = {"large": measured((0.2, 0.3), (0.25, 0.25)), "bild": measured((0.1, 0.1), (0.15, 0.15)),
            "ct2_large": measured((0.5, 0.5), (0.5, 0.5)), "ct2_large_int8": measured((0.3, 0.2), (0.3, 0.2))}
    rows = {row["method"]: row for row in summarize_methods(pair, runs, None)}
    want = {  # (speedup_vs_large, speed_vs_ct2_large, speed_vs_ct2_large_int8, tokens_per_s, mean_latency_ms)
        "large": (1.0, 2.0, 1.0, 10.0, 250.0),
        "bild": (2.0, 4.0, 2.0, 20.0, 125.0),
        "ct2_large": (0.5, 1.0, 0.5, 5.0, 500.0),
        "ct2_large_int8": (1.0, 2.0, 1.0, 10.0, 250.0),
    }
    keys = ("speedup_vs_large", "speed_vs_ct2_large", "speed_vs_ct2_large_int8", "tokens_per_s", "mean_latency_ms")
    assert set(rows) == set(want)
    for name, expected in want.items():
        assert tuple(rows[name][key] for key in keys) == pytest.approx(expected, rel=1e-12), name
    assert_speeds_follow_the_timings(rows)


def test_batch_ratios_are_computed_from_the_timings():
    """bench-batch's summarize on hand-made cells: tokens/s over each cell's median repetition, and each
    ratio that over its yardstick's (the same method at batch size 1, loop or batch; large and CTranslate2
    at the same batch size)."""
    from pipeline.bench.batch import Cell, summarize

    pair = tiny_pair("t5", "noisy")
    tokens = [[1] * 6, [2] * 4]  # 10 tokens
    cells = [Cell("large", 0, seconds=[2.0, 1.0, 4.0], tokens=tokens), Cell("large", 1, seconds=[1.0], tokens=tokens),
             Cell("large", 3, seconds=[0.5], tokens=tokens), Cell("bild", 0, seconds=[1.0], tokens=tokens),
             Cell("bild", 1, seconds=[0.8], tokens=tokens), Cell("bild", 3, 0.5, seconds=[0.25], tokens=tokens),
             Cell("ct2_large", 1, seconds=[2.0], tokens=tokens), Cell("ct2_large", 3, seconds=[1.0], tokens=tokens)]
    config = DecodingConfig(method="bild", max_new_tokens=12)
    report = summarize(pair, cells, None, config, inputs=2, repeats=1)
    rows = {row["cell"]: row for row in report["rows"]}
    assert report["order"] == order_coverage(len(cells), 1)  # a turn per repetition: 1 of 8 orders
    keys = ("tokens_per_s", "ratio_vs_loop_b1", "ratio_vs_batch_b1", "ratio_vs_large_same_b",
            "ratio_vs_ct2_large_same_b")
    want = {  # worked out by hand from the seconds above (None: no such yardstick)
        "large loop": (5.0, 1.0, 0.5, 1.0, 1.0),
        "large B=1": (10.0, 2.0, 1.0, 1.0, 2.0),
        "large B=3": (20.0, 4.0, 2.0, 1.0, 2.0),
        "bild loop": (10.0, 1.0, 0.8, 2.0, 2.0),
        "bild B=1": (12.5, 1.25, 1.0, 1.25, 2.5),
        "bild B=3 share=0.5": (40.0, 4.0, 3.2, 2.0, 4.0),
        "ct2_large B=1": (5.0, None, 1.0, 0.5, 1.0),
        "ct2_large B=3": (10.0, None, 2.0, 0.5, 1.0),
    }
    assert set(rows) == set(want)
    for name, expected in want.items():
        assert [key for key, value in zip(keys, expected) if value is None] == [k for k in keys if k not in rows[name]]
        assert [rows[name][key] for key, value in zip(keys, expected) if value is not None] == \
            pytest.approx([value for value in expected if value is not None], rel=1e-12), name
    assert_ratios_follow_the_rates(rows)


def test_bench_runs_every_method_side_by_side():
    pair = tiny_pair("t5", "noisy")
    config = DecodingConfig(method="bild", max_new_tokens=12, max_draft_tokens=4)
    report = run_bench(pair, TEXTS[:2], TEXTS[:2], config, repeats=1, with_projection=False)
    rows = {row["method"]: row for row in report["methods"]}
    assert set(rows) == set(OURS + HF)
    # Greedy speculative decoding and HF's own greedy paths reproduce the large model's output.
    for lossless in ("large", "speculative", "hf_generate", "hf_assisted"):
        assert rows[lossless]["exact_match_with_large"] == 1.0, lossless
    assert_speeds_follow_the_timings(rows)  # every row's speedup from its own and large's measured times
    assert all(rows[name]["predicted_s"] > 0 for name in OURS)
    assert "bleu" in rows["bild"] and "measured_over_predicted" in render_markdown(report)
    # a turn per input and repetition: 2 of the cycle of len(rows) methods' orders
    assert f"(interleaved, {order_coverage(len(rows), 2)})" in render_markdown(report)
    assert report["bleu_signature"].startswith("nrefs:1|") and "BLEU: sacrebleu nrefs:1|" in render_markdown(report)
    assert rows["small"]["small_token_share"] == 1.0 and "small_token_share" not in rows["hf_generate"]
    # The cost model's steps were timed between the records (2 inputs x 1 repetition), not after the runs.
    assert report["cost_model"]["samples"] == 2
    assert set(report["cost_model"]["large_verify_s"]) == set(range(1, config.max_draft_tokens + 2))
    assert "each step timed 2 times between the runs' records" in render_markdown(report)


def test_bench_adds_cascade_rows_that_decode_by_their_rule():
    """`bench --cascade`: each (rule, alpha) is a row of ours, named as the sweep names the point; chow at
    alpha 0 always defers (large's tokens), at alpha 1 never (no rollback: every draft kept)."""
    from pipeline.bench.methods import cascade_variants

    pair = tiny_pair("t5", "noisy")
    config = DecodingConfig(method="bild", max_new_tokens=12, max_draft_tokens=4)
    fixed = dataclasses.replace(config, adaptive_draft=False)  # windows as given: every rule drafts
    variants = cascade_variants(fixed, [("chow", 0.0), ("chow", 1.0), ("diff", 0.1)])
    assert set(variants) == {"cascade_chow_a0", "cascade_chow_a1", "cascade_diff_a0.1"}
    report = run_bench(pair, TEXTS[:2], TEXTS[:2], config, repeats=1, with_projection=False, variants=variants)
    rows = {row["method"]: row for row in report["methods"]}
    assert set(rows) == set(OURS + HF) | set(variants)
    assert rows["cascade_chow_a0"]["exact_match_with_large"] == 1.0
    assert rows["cascade_chow_a1"]["rollbacks_per_100_tokens"] == 0 and rows["cascade_chow_a1"]["small_token_share"] > 0.5
    assert all(rows[name]["predicted_s"] > 0 for name in variants)


def test_bench_command_refuses_a_cascade_alpha_outside_its_rule():
    result = CliRunner().invoke(main, ["bench", "--limit", "1", "--repeats", "1", "--no-ct2", "--no-projection",
                                       "--cascade", "chow=1.5"])
    assert result.exit_code == 2 and "--cascade" in result.output and "1.5" in result.output


def test_batch_bench_measures_every_cell_and_checks_outputs_against_batch_size_1():
    from pipeline.bench.batch import render_markdown as render_batch
    from pipeline.bench.batch import run_batch_bench

    pair = tiny_pair("t5", "noisy")
    config = DecodingConfig(method="bild", max_new_tokens=12, max_draft_tokens=4)
    # bild_fixed: fixed windows, so that its rows may be compared across batch sizes (measured windows follow
    # the batch's speed, and with them a lossy row's tokens)
    report = run_batch_bench(pair, TEXTS * 2, TEXTS * 2, config, methods=("large", "bild_fixed", "large"),
                             batch_sizes=(1, 3, 3), verify_shares=(0.5, 1.0), repeats=1)  # a value twice: one cell
    cells = {row["cell"]: row for row in report["rows"]}
    assert len(report["rows"]) == len(cells) == 7
    assert set(cells) == {"large loop", "bild_fixed loop", "large B=1", "large B=3", "bild_fixed B=1",
                          "bild_fixed B=3 share=0.5", "bild_fixed B=3 share=1.0"}
    assert all(row["identical_to_b1"] for row in cells.values())  # batching never changes a row's output
    assert_ratios_follow_the_rates(cells)  # each ratio from the two cells' measured tokens/s
    assert cells["large B=3"]["large_calls"] < cells["large B=1"]["large_calls"]  # rows shared passes
    assert "| bild_fixed B=3 share=1.0 |" in render_batch(report)
    for row in cells.values():  # where each run's time went: steps and admissions happen inside its wall time
        spent = row["time_spent"]
        assert 0 < spent["forward"] and 0 < spent["admit"] and spent["forward"] + spent["admit"] < spent["wall"]
        assert spent["runtime"] == 0 and row["time_split"].startswith("steps ")  # the native engine: no runtime call


def test_time_split_says_where_a_runs_wall_time_went():
    from pipeline.bench.batch import time_split

    spent = {"wall": 2.0, "forward": 1.5, "runtime": 1.0, "admit": 0.2}
    assert time_split(spent) == "steps 75% (runtime 50%), admission 10%, rest 15%"
    assert time_split({**spent, "runtime": 0.0}) == "steps 75%, admission 10%, rest 15%"
    assert time_split({}) == ""


@pytest.mark.parametrize("engine", ["hf", "native"])
def test_bench_runs_in_bfloat16(engine):
    """The dtype of the GPU run (`--dtype bfloat16`), exercised here on the CPU with a tiny pair."""
    pair = tiny_pair("t5", "noisy", dtype="bfloat16", engine=engine)
    config = DecodingConfig(method="bild", max_new_tokens=12, max_draft_tokens=4)
    report = run_bench(pair, TEXTS[:2], TEXTS[:2], config, repeats=1, with_projection=False)
    assert report["dtype"] == "bfloat16" and report["engine"] == engine
    rows = {row["method"]: row for row in report["methods"]}
    assert set(rows) == set(OURS + HF)
    assert all(row["output_tokens"] > 0 for row in rows.values())
    if engine == "hf":  # the same modules, one step at a time: HF generate's tokens. (The native engine
        # rounds differently in bfloat16, so its tokens may part from HF's: compared in float32 only.)
        assert rows["hf_generate"]["exact_match_with_large"] == 1.0


def test_bench_adds_ctranslate2_rows_on_the_same_models(tmp_path):
    """CTranslate2 converts the pair's own checkpoints; greedy, it writes our large model's tokens."""
    pytest.importorskip("ctranslate2")
    from pipeline.bench.batch import render_markdown as render_batch
    from pipeline.bench.batch import run_batch_bench
    from pipeline.bench.ct2 import convert_pair
    from pipeline.bench.methods import CT2

    pair = tiny_pair("t5", "noisy")
    ct2 = convert_pair(pair, tmp_path)
    config = DecodingConfig(method="bild", max_new_tokens=12, max_draft_tokens=4)
    report = run_bench(pair, TEXTS[:2], TEXTS[:2], config, repeats=1, with_projection=False, ct2=ct2)
    rows = {row["method"]: row for row in report["methods"]}
    assert set(rows) == set(OURS + HF + CT2)
    assert rows["ct2_large"]["exact_match_with_large"] == 1.0
    assert_speeds_follow_the_timings(rows)  # every row against each translator's own measured times
    assert rows["ct2_large_int8"]["speed_vs_ct2_large"] != 1.0  # a second translator, timed on its own
    assert "speed_vs_ct2_large" in render_markdown(report) and "CTranslate2 4." in render_markdown(report)

    report = run_batch_bench(pair, TEXTS * 2, None, config, methods=("large",), batch_sizes=(1, 3), repeats=1, ct2=ct2)
    cells = {row["cell"]: row for row in report["rows"]}
    assert {"ct2_large B=1", "ct2_large B=3"} <= set(cells)
    assert cells["ct2_large B=3"]["identical_to_ours"] and cells["ct2_large B=3"]["identical_to_b1"]
    assert_ratios_follow_the_rates(cells)
    assert {"ratio_vs_ct2_large_same_b", "ratio_vs_ct2_large_int8_same_b"} <= set(cells["large B=3"])
    assert "| ct2_large B=3 |" in render_batch(report)


def test_bench_records_the_engine():
    for engine in ("native", "hf"):
        pair = tiny_pair("t5", "noisy", engine=engine)
        config = DecodingConfig(method="bild", max_new_tokens=8, max_draft_tokens=4)
        report = run_bench(pair, TEXTS[:1], None, config, repeats=1, with_projection=False)
        assert report["engine"] == engine and f"engine {engine}" in render_markdown(report)


def test_bench_compares_the_engines_on_the_same_models():
    pair = tiny_pair("bart", "noisy")
    config = DecodingConfig(method="bild", max_new_tokens=8, max_draft_tokens=4)
    report = run_bench(pair, TEXTS[:2], None, config, repeats=1, with_projection=False, with_engines=True)
    engines = report["engines"]
    assert engines["identical_records"] == engines["records"] == 2
    assert set(engines["step_ms"]) == {"native", "hf"} and engines["large_speed_native_over_hf"] > 0
    assert "native speed vs hf" in render_markdown(report)
    gpt2 = tiny_pair("gpt2", "noisy")
    assert "skipped" in run_bench(gpt2, TEXTS[:1], None, config, repeats=1, with_projection=False,
                                  with_engines=True)["engines"]


def test_table1_command_writes_the_papers_table(tmp_path, capsys, monkeypatch):
    small, large = save_pair(tmp_path / "models", "t5", small="noisy")
    shutil.copytree(small, tmp_path / "models" / "small-aligned")
    (tmp_path / "src.txt").write_text("\n".join(TEXTS[:3]) + "\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("\n".join(TEXTS[:3]) + "\n", encoding="utf-8")
    (tmp_path / "preset.yaml").write_text("decoding:\n  fallback_threshold: 0.4\n  rollback_threshold: 1.0\n"
                                          "  adaptive_draft: false\n")  # the paper's fixed windows: BiLD's columns
    args = ["--models", str(tmp_path / "models"), "--source", str(tmp_path / "src.txt"), "--reference",
            str(tmp_path / "ref.txt"), "--preset", str(tmp_path / "preset.yaml"), "--max-new-tokens", "8",
            "--out", str(tmp_path / "out"), "--threads", str(torch.get_num_threads())]  # leaves the worker's as is
    result = CliRunner().invoke(main, ["bench-table1", *args])
    assert result.exit_code == 0, result.output
    table = json.loads((tmp_path / "out" / "table.json").read_text())
    rows = {row["method"]: row for row in table["rows"]}
    assert list(rows) == ["large", "small", "small (aligned)", "BiLD (unaligned)", "BiLD (aligned)"]
    assert rows["large"]["speedup_vs_large"] == 1.0 and rows["large"]["small_token_share"] == 0.0
    assert rows["small"]["small_token_share"] == 1.0 and rows["BiLD (aligned)"]["draft_acceptance"] is not None
    assert table["decoding"]["rollback_threshold"] == 1.0 and table["cost"]["small_step_s"] > 0
    markdown = (tmp_path / "out" / "table.md").read_text()
    assert "| BiLD (aligned) |" in markdown and "BLEU: sacrebleu nrefs:1|" in markdown
    # scripts/demo_table.py, the command earlier versions documented, runs the same command.
    monkeypatch.setattr(sys, "argv", ["demo_table.py", "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(REPO / "scripts" / "demo_table.py"), run_name="__main__")
    assert done.value.code == 0 and "--preset" in capsys.readouterr().out


def test_bench_loop_command_reports_both_ratios():
    result = CliRunner().invoke(main, ["bench-loop", "--inputs", "2", "--repeats", "1", "--max-new-tokens", "8"])
    assert result.exit_code == 0, result.output
    assert "**speed ratio generate/ours**" in result.output and "| identical token ids | True |" in result.output
