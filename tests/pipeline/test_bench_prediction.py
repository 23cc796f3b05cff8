"""`bench`'s prediction (pipeline/bench/rounds.py, prediction.py): scripted records run the rounds they are
asked for, the parts are recovered from their timings, and a method's counted rounds are priced by them."""

from __future__ import annotations

import pytest

from pipeline.bench.prediction import allowance, price
from pipeline.bench.rounds import BUDGET, ROUND_PARTS, Scripter, Timed, parts_of, round_counts
from pipeline.decoding import DecodingConfig, Generator
from pipeline.decoding.stats import DecodeStats
from support.pairs import TEXTS, tiny_pair

MOST = 4


@pytest.mark.parametrize("timed", [False, True])
@pytest.mark.parametrize("method", ["bild", "speculative", "large", "small"])
def test_a_scripted_record_runs_the_rounds_it_is_asked_for(method, timed):
    """Every draft kept, so a record of BUDGET tokens makes BUDGET plain rounds at a window of 0 (or alone), and
    ceil(BUDGET / (k + 1)) rounds at a window of k; the real engines (timed) make the very same calls."""
    pair = tiny_pair("t5", "noisy", 0)
    config = DecodingConfig(method=method, max_draft_tokens=MOST)
    ids = Generator(pair, config).encode(TEXTS[0])[0][0]
    scripter = Scripter(pair, config, ids, timed=timed)
    large = pair.engine("large", 1)
    for window, rounds in ({None: BUDGET} if method in ("large", "small") else
                           {0: BUDGET, 1: BUDGET // 2, MOST: -(-BUDGET // (MOST + 1))}).items():
        calls_before = large.calls
        found = scripter.run(window)
        assert found.calls == rounds and len(found.rounds) == rounds - 1, window
        assert found.wall > 0 and all(seconds > 0 for seconds in found.rounds)
        expected_calls = rounds if timed and method != "small" else 0
        assert large.calls - calls_before == expected_calls  # the real large engine ran beside the script, or not


def test_the_parts_come_back_from_records_made_of_them():
    """Records built from known parts (a round of window k: k drafting steps, k drafted positions and a
    verification) give those parts back; the small model's admission and a drafted position are given."""
    config = DecodingConfig(method="bild", max_draft_tokens=MOST)
    truth = {"record": 2e-3, "small admission": 5e-4, "plain": 4e-4, "draft": 1e-4, "verify": 6e-4,
             "drafted position": 5e-5}

    def record(window: int, noise: float) -> Timed:
        each = truth["plain"] if window == 0 else window * (truth["draft"] + truth["drafted position"]) + truth["verify"]
        calls = BUDGET if window == 0 else -(-BUDGET // (window + 1))
        extra = truth["record"] + (truth["small admission"] if window else 0.0)
        return Timed(extra + calls * each + noise, [each] * (calls - 1), calls)

    runs = {window: [record(window, noise) for noise in (-1e-5, 0.0, 2e-5)] for window in (0, 1, MOST)}
    found = parts_of(config, runs, truth["drafted position"], truth["small admission"])
    assert found == pytest.approx(truth, rel=1e-9, abs=1e-12)


def test_a_methods_rounds_are_priced_part_by_part():
    stats = DecodeStats(output_tokens=30, small_tokens=20, large_tokens=10, small_calls=24, large_calls=10,
                        draft_tokens=22, plain_steps=3, rollbacks=2, fallbacks=2)
    counts = round_counts("bild", stats, records=2, drafted_records=1)
    assert counts == [2, 1, 3, 24, 7, 22]  # records, small admissions, plain rounds, drafting steps, verifications, drafts
    assert round_counts("large", DecodeStats(output_tokens=9, large_tokens=9, large_calls=9), 1, 0) == [1, 0, 9, 0, 0, 0]
    seconds = dict(zip(ROUND_PARTS, (1.0, 10.0, 100.0, 1000.0, 1e4, 1e5)))
    priced = price(counts, seconds)
    assert priced == {"record": 2.0, "small admission": 10.0, "plain": 300.0, "draft": 24000.0, "verify": 70000.0,
                      "drafted position": 2.2e6}


def test_what_the_costs_allow_follows_the_acceptance():
    """A verification that costs a plain step: drafting that is always kept pays, one never kept does not."""
    parts = {"record": 0.0, "small admission": 0.0, "plain": 1.0, "draft": 0.1, "verify": 1.0, "drafted position": 0.0}
    kept = DecodeStats(output_tokens=100, small_tokens=80, large_tokens=20, small_calls=80, draft_tokens=80,
                       large_calls=20)
    allowed = allowance(kept, 10, parts, parts, most=4)
    assert allowed["best_window"] == 4 and allowed["best_speed_vs_large"] > 2
    rejected = DecodeStats(output_tokens=100, large_tokens=100, small_calls=80, draft_tokens=80, large_calls=100,
                           rollbacks=80)
    allowed = allowance(rejected, 10, parts, parts, most=4)
    assert allowed["best_window"] == 0 and allowed["best_speed_vs_large"] == pytest.approx(1.0)
