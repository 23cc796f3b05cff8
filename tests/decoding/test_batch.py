"""Batched decoding (pipeline.decoding.scheduler): every row decodes as it would alone.

The invariants of docs/design.md §1 hold per row inside a batch: greedy BiLD with alpha_RB = 0
reproduces each row's large-model greedy output; a row's tokens and statistics equal those of
the record decoded alone (greedy and sampling), whatever other records share the batch; and
batched speculative sampling keeps the large model's distribution (with negative controls).
"""

from __future__ import annotations

import pytest
import torch

import pipeline.decoding.policies as policies_module
from pipeline.decoding import DecodingConfig, Generator
from pipeline.decoding.engine import length_groups
from pipeline.decoding.scheduler import BatchPolicy, BatchRequest, _Row, decode_batch, scheduler_for
from support.distributions import RESIDUALS, check_loop, sample_loop, verify_with_residual
from support.families import FAMILIES, families, slow_unless
from support.pairs import TEXTS, tiny_pair

MAX_NEW = 24
# Inputs of different lengths (so rows finish at different times and others join).
INPUTS = TEXTS + ["Ein Hund.", "Zwei Kinder spielen am Strand mit einem roten Ball und lachen laut.",
                  "Die Sonne scheint.", "Ein alter Mann liest eine Zeitung auf der Bank vor dem Haus."]


def requests_for(pair, texts, seeds=None):
    generator = Generator(pair, DecodingConfig())
    seeds = seeds or list(range(len(texts)))
    return [BatchRequest(generator.encode(text)[0][0], seed) for text, seed in zip(texts, seeds)]


def alone(pair, config, texts, seeds=None):
    """Each record decoded by itself with the record-by-record loop."""
    generator = Generator(pair, config)
    seeds = seeds or list(range(len(texts)))
    return [generator.generate_one(text, seed=seed) for text, seed in zip(texts, seeds)]


@pytest.mark.parametrize("family", families())
@pytest.mark.parametrize("small_kind, seed", [("independent", 0), ("noisy", 1)])
def test_batched_greedy_bild_without_rollback_threshold_is_each_rows_large_greedy_output(family, small_kind, seed):
    pair = tiny_pair(family, small_kind, seed)
    expected = alone(pair, DecodingConfig(method="large", max_new_tokens=MAX_NEW), INPUTS)
    assert max(len(set(r.token_ids)) for r in expected) >= 5  # non-trivial outputs
    totals = dict(fallbacks=0, rollbacks=0, small_tokens=0)
    for threshold, window, (size, share) in [(0.2, 1, (3, 0.25)), (0.6, 4, (8, 1.0)), (0.6, 10, (3, 0.5)),
                                             (0.2, 10, (8, 0.25))]:
        config = DecodingConfig(method="bild", rollback_threshold=0.0, fallback_threshold=threshold,
                                max_draft_tokens=window, max_new_tokens=MAX_NEW)
        outputs = decode_batch(pair, config, BatchPolicy(size, share), requests_for(pair, INPUTS))
        for want, got in zip(expected, outputs):
            assert got.tokens == want.token_ids, f"fb={threshold} k={window} B={size}"
            s = got.stats
            assert s.small_tokens + s.large_tokens == s.output_tokens == len(got.tokens)
            for key in totals:
                totals[key] += getattr(s, key)
    # The paths under test ran: fallbacks and rollbacks; with a noisy copy, kept drafts too.
    assert totals["fallbacks"] and totals["rollbacks"], totals
    assert totals["small_tokens"] or small_kind == "independent", totals


# Fixed windows: a row's rounds then do not depend on the batch it is in. Measured windows (the default) follow
# the batch's measured speed, and with them the lossy and sampled rows' tokens and every row's counters; what
# holds whatever the windows is in test_draft_length.py.
FIXED = dict(adaptive_draft=False)
CONFIGS = {
    "large": dict(method="large"),
    "small": dict(method="small"),
    "bild": dict(method="bild", fallback_threshold=0.5, rollback_threshold=2.0, max_draft_tokens=4, **FIXED),
    "speculative": dict(method="speculative", max_draft_tokens=3, **FIXED),
    "speculative_fallback_window": dict(method="speculative", draft_window="fallback", fallback_threshold=0.5,
                                        **FIXED),
    "bild_sampling": dict(method="bild", do_sample=True, temperature=0.9, top_p=0.95, fallback_threshold=0.5,
                          **FIXED),
    "speculative_sampling": dict(method="speculative", do_sample=True, max_draft_tokens=3, **FIXED),
}


# make test-fast: every config on T5 (native) and GPT-2 (Hugging Face, decoder-only), a greedy and a
# sampled one on BART (Hugging Face, encoder-decoder); make test: every config on all five families.
@pytest.mark.parametrize("name, family", slow_unless(
    [(name, family) for family in FAMILIES for name in CONFIGS],
    fast=[(name, family) for family in ("t5", "gpt2") for name in CONFIGS]
    + [("bild", "bart"), ("speculative_sampling", "bart")]))
def test_a_row_in_a_batch_decodes_exactly_as_alone(family, name):
    pair = tiny_pair(family, "noisy", 0)
    config = DecodingConfig(max_new_tokens=MAX_NEW, **CONFIGS[name])
    expected = alone(pair, config, INPUTS)
    for size, share in [(3, 1.0), (16, 0.25)]:
        outputs = decode_batch(pair, config, BatchPolicy(size, share), requests_for(pair, INPUTS))
        for want, got in zip(expected, outputs):
            assert got.tokens == want.token_ids, f"B={size} share={share}"
            assert got.stats.to_dict() == want.stats.to_dict(), f"B={size} share={share}"


@pytest.mark.parametrize("name", ["bild", "bild_sampling", "speculative_sampling"])
def test_results_do_not_depend_on_which_records_share_the_batch(name):
    pair = tiny_pair("t5", "noisy", 1)
    config = DecodingConfig(max_new_tokens=MAX_NEW, **CONFIGS[name])
    target_text, target_seed = INPUTS[1], 11
    companies = [[], INPUTS[2:5], INPUTS[::-1]]
    seen = []
    for company, size in [(companies[0], 2), (companies[1], 8), (companies[2], 2), (companies[2], 8)]:
        texts = company[: len(company) // 2] + [target_text] + company[len(company) // 2 :]
        seeds = [100 + i for i in range(len(texts))]
        seeds[len(company) // 2] = target_seed
        outputs = decode_batch(pair, config, BatchPolicy(size), requests_for(pair, texts, seeds))
        target = outputs[len(company) // 2]
        seen.append((target.tokens, target.stats.to_dict()))
    assert all(s == seen[0] for s in seen), "a row's output changed with its batch company"


def test_continuous_batching_keeps_the_batch_full_and_shares_forward_passes():
    pair = tiny_pair("t5", "noisy", 0)
    config = DecodingConfig(method="bild", max_new_tokens=MAX_NEW, fallback_threshold=0.5)
    texts = INPUTS * 3
    decoder = scheduler_for(pair, config, BatchPolicy(batch_size=4, refill_share=0.25))
    admissions = []
    original = decoder.large.admit
    decoder.large.admit = lambda slots, *rest: (admissions.append(len(slots)), original(slots, *rest))[1]
    calls_before = decoder.large.calls, decoder.small.calls
    try:
        outputs = decoder.run(requests_for(pair, texts))
    finally:
        del decoder.large.admit  # the engine is the pair's, shared with later tests
    assert sum(admissions) == len(texts) and admissions[0] == 4
    assert len(admissions) > len(texts) // 4  # finished rows were replaced while others ran
    # Each model pass served several rows: far fewer passes than the rows' own call counts.
    assert decoder.large.calls - calls_before[0] < 0.6 * sum(o.stats.large_calls for o in outputs)
    assert decoder.small.calls - calls_before[1] < 0.6 * sum(o.stats.small_calls for o in outputs)


@pytest.mark.parametrize("overhead, expected", [
    (None, [[1, 1, 9, 9, 11]]),  # no fit yet: one pass
    (100.0, [[1, 1, 9, 9, 11]]),  # a call costs more than all the padding
    (5.0, [[1, 1], [9, 9, 11]]),  # short tails apart from long ones
    (0.5, [[1, 1], [9, 9], [11]]),  # calls almost free: no padding at all
])
def test_verification_is_split_where_padding_costs_more_than_a_call(overhead, expected):
    pair = tiny_pair("t5", "noisy", 0)
    decoder = scheduler_for(pair, DecodingConfig(method="bild"), BatchPolicy(batch_size=8))
    decoder.large.call_cost.overhead_in_positions = lambda: overhead
    tails = [9, 1, 11, 1, 9]  # the large model has cached nothing: a row's tail is its length
    rows = [_Row(request=i, slot=i, start=0, length=t, joined=0.0, sampler=None) for i, t in enumerate(tails)]
    try:
        groups = decoder._verify_groups(rows)
    finally:
        del decoder.large.call_cost.overhead_in_positions
    assert [sorted(row.length for row in group) for group in groups] == expected
    assert sorted(row.slot for group in groups for row in group) == list(range(len(rows)))


@pytest.mark.parametrize("lengths, padding, expected", [
    ([5, 40, 38, 6, 39], 0.125, [[1, 4, 2], [3, 0]]),  # alike lengths share a call, longest first
    ([5, 40, 38, 6, 39], 1.0, [[1, 4, 2, 3, 0]]),  # any padding allowed: one call
    ([5, 40, 38, 6, 39], 0.0, [[1], [4], [2], [3], [0]]),  # none allowed: each length alone
    ([7, 7, 7], 0.0, [[0, 1, 2]]),  # equal lengths pad nothing
    ([], 0.125, []),
])
def test_newcomers_are_encoded_in_groups_of_similar_length(lengths, padding, expected):
    groups = length_groups(lengths, padding)
    assert groups == expected
    for group in groups:
        cells = len(group) * lengths[group[0]]
        assert max(lengths[i] for i in group) == lengths[group[0]]
        assert cells - sum(lengths[i] for i in group) <= padding * cells


def test_an_engine_admits_newcomers_in_length_groups_and_returns_their_states_in_order():
    """One encoder call per length group; the states come back in the rows' order, each row as its
    group computed it, zeros past its group's padding."""
    pair = tiny_pair("t5", "noisy", 0)
    engine = pair.engine("large", 4)
    calls = []
    admit = engine._admit  # (the pair's engines are cached: restored below)
    engine._admit = lambda slots, ids, encoded: calls.append(slots) or admit(slots, ids, encoded)
    sources = [torch.arange(2, 2 + n) for n in (5, 40, 6, 39)]
    try:
        states = engine.admit([3, 0, 1, 2], sources)
    finally:
        del engine._admit
    assert calls == [[0, 2], [1, 3]]  # (slots of the 40- and 39-long rows, then of the 6- and 5-long)
    alone = pair.engine("large", 1)
    for row, source in enumerate(sources):
        own = alone.admit([0], [source])[0]
        assert torch.allclose(states[row, : len(source)], own, atol=1e-5)
        group_width = 6 if len(source) < 10 else 40
        assert not states[row, group_width:].any()


BATCHED_SAMPLES = 4000


# make test-fast: the sampler on both families and one negative control (on T5); make test: all of them.
@pytest.mark.parametrize("variant, family", [
    ("fixed", "gpt2"), ("fixed", "t5"), ("residual_is_p", "t5"),
    *(pytest.param(variant, family, marks=pytest.mark.slow)
      for variant, family in [("residual_is_p", "gpt2"), ("fallback", "gpt2"), ("fallback", "t5"),
                              ("small_only", "gpt2"), ("small_only", "t5")])])
def test_batched_speculative_sampling_preserves_the_large_models_distribution(variant, family, monkeypatch):
    """Batches of 64 rows: four tokens from windows of up to three drafts follow pL(t1..t4) (pooled
    chi-square), and the bonus tokens after a first window accepted whole follow pL(t4 | t1..t3).
    A replacement drawn from p instead of the residual, and the drafter's own samples, fail the
    same tests at the same sample count."""
    if variant in RESIDUALS:
        monkeypatch.setattr(policies_module, "speculative_verify", verify_with_residual(variant))
    check_loop(sample_loop(family, BATCHED_SAMPLES, 64, variant), family, variant, BATCHED_SAMPLES)


def test_bad_records_in_a_batch_get_their_own_errors():
    pair = tiny_pair("t5", "noisy", 0)
    config = DecodingConfig(method="bild", max_new_tokens=MAX_NEW, **FIXED)
    texts = [INPUTS[0], "", None, INPUTS[1], "   ", INPUTS[2]]
    results = Generator(pair, config).generate(texts, seeds=[0] * 6, batch=BatchPolicy(4))
    errors = [r.error for r in results]
    assert errors[0] is None and errors[3] is None and errors[5] is None
    assert "empty" in errors[1] and "string" in errors[2] and "empty" in errors[4]
    expected = alone(pair, config, [INPUTS[0], INPUTS[1], INPUTS[2]], seeds=[0, 0, 0])
    assert [results[i].token_ids for i in (0, 3, 5)] == [r.token_ids for r in expected]
    assert all(results[i].latency_ms > 0 for i in (0, 3, 5))


def test_a_failing_batch_is_retried_record_by_record(monkeypatch):
    """Only the batched call fails: each record is then decoded alone, with no error and the
    tokens and statistics it has alone (computed before anything is patched)."""
    import pipeline.decoding.pair_decoder as decoder_module

    pair = tiny_pair("t5", "noisy", 0)
    config = DecodingConfig(method="bild", max_new_tokens=MAX_NEW, **FIXED)
    expected = alone(pair, config, INPUTS[:3], [0, 0, 0])
    assert all(r.error is None and r.token_ids for r in expected)
    real, batched = decoder_module.decode_batch, []

    def fails_with_several_rows(pair, config, policy, requests, chooser=None):
        if len(requests) > 1:
            batched.append(len(requests))
            raise RuntimeError("out of memory")
        return real(pair, config, policy, requests, chooser)

    monkeypatch.setattr(decoder_module, "decode_batch", fails_with_several_rows)
    results = Generator(pair, config).generate(INPUTS[:3], seeds=[0, 0, 0], batch=BatchPolicy(4))
    assert batched == [3]  # the batch was tried once, then every record alone
    assert [r.error for r in results] == [None, None, None]
    assert [r.token_ids for r in results] == [r.token_ids for r in expected]
    assert [r.stats.to_dict() for r in results] == [r.stats.to_dict() for r in expected]


def test_policy_rejects_nonsense():
    for bad in (dict(batch_size=0), dict(verify_share=0.0), dict(verify_share=1.5), dict(refill_share=0)):
        with pytest.raises(ValueError):
            BatchPolicy(**bad)
