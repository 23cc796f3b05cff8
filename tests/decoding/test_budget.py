"""decoding.max_new_tokens in its ratio form (config.TokenBudget): each record's budget follows its own input,
in every method, batched or not, and its tokens are those of a larger budget cut at its own."""

from __future__ import annotations

import pytest

from pipeline.decoding import BatchPolicy, DecodingConfig, Generator
from pipeline.decoding.config import TokenBudget
from support.pairs import TEXTS, tiny_pair

INPUTS = TEXTS + ["Ein Hund.", "Zwei Kinder spielen am Strand mit einem roten Ball und lachen sehr laut."]


def test_a_ratio_budget_is_ratio_times_the_input_plus_extra_within_its_cap():
    budget = TokenBudget(ratio=1.5, extra=10)
    assert [budget.tokens(n) for n in (0, 1, 4, 10)] == [10, 12, 16, 25]
    assert TokenBudget(ratio=1.5, extra=10, cap=20).tokens(10) == 20
    assert TokenBudget(ratio=0.1).tokens(1) == 1  # never below one token
    assert TokenBudget(ratio=0.3).tokens(10) == 3  # 0.3 x 10 is 3, not 4 from float rounding
    config = DecodingConfig(max_new_tokens={"ratio": 2.0, "extra": 1})  # as a job file's section hands it over
    assert config.max_new_tokens == TokenBudget(ratio=2.0, extra=1) and config.budget(7) == 15
    assert DecodingConfig(max_new_tokens=64).budget(7) == 64
    for bad in ({"ratio": 0}, {"ratio": 1, "extra": -1}, {"ratio": 1, "cap": 0}):
        with pytest.raises(ValueError, match="max_new_tokens"):
            DecodingConfig(max_new_tokens=bad)


@pytest.mark.parametrize("method", ["large", "small", "bild", "speculative"])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_each_record_stops_at_its_own_budget_with_the_tokens_of_a_larger_one(method, batch_size):
    """The tiny pairs never write EOS: every row runs to its budget, ceil(0.5 x input tokens) + 2, and its
    tokens are the first that many of a fixed budget of 64 (greedy; bild with alpha_RB = 0 is large's)."""
    pair = tiny_pair("t5", small="noisy")
    common = dict(method=method, rollback_threshold=0.0, fallback_threshold=0.5, max_draft_tokens=4)
    ratio = Generator(pair, DecodingConfig(max_new_tokens={"ratio": 0.5, "extra": 2}, **common))
    fixed = Generator(pair, DecodingConfig(max_new_tokens=64, **common))
    policy = BatchPolicy(batch_size=batch_size)
    cut, whole = ratio.generate(INPUTS, batch=policy), fixed.generate(INPUTS, batch=policy)
    budgets = [-(-r.input_tokens // 2) + 2 for r in cut]
    assert len(set(budgets)) > 2  # the records' budgets differ: each follows its input
    assert [r.stats.output_tokens for r in cut] == budgets
    assert [r.token_ids for r in cut] == [w.token_ids[:b] for w, b in zip(whole, budgets)]
    assert all(r.stopped_by_budget for r in cut) and all(r.stats.small_tokens + r.stats.large_tokens == b
                                                        for r, b in zip(cut, budgets))
