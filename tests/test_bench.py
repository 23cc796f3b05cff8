"""The benchmark's machinery on a tiny pair (its figures live in BENCHMARKS.md, not in tests)."""

from __future__ import annotations

from conftest import TEXTS, tiny_pair
from pipeline.benchmark import HF, OURS, render_markdown, run_bench
from pipeline.decoding import DecodingConfig


def test_bench_runs_every_method_side_by_side():
    pair = tiny_pair("t5", "noisy")
    config = DecodingConfig(method="bild", max_new_tokens=12, max_draft_tokens=4)
    report = run_bench(pair, TEXTS[:2], TEXTS[:2], config, repeats=1, with_projection=False)
    rows = {row["method"]: row for row in report["methods"]}
    assert set(rows) == set(OURS + HF)
    # Greedy speculative decoding and HF's own greedy paths reproduce the large model's output.
    for lossless in ("large", "speculative", "hf_generate", "hf_assisted"):
        assert rows[lossless]["exact_match_with_large"] == 1.0, lossless
    assert rows["large"]["speedup_vs_large"] == 1.0
    assert all(rows[name]["predicted_s"] > 0 for name in OURS)
    assert "bleu" in rows["bild"] and "measured_over_predicted" in render_markdown(report)
