"""Rows that end on EOS at different steps while others go on (docs/design.md §1, a batch of rows).

The encoder-decoder pairs of support/pairs.py never write EOS: their rows all run to
max_new_tokens. Here a row finishes on EOS while the rest of its batch decodes on and a queued
record takes its slot. First a scripted pair (support/scripted.py) whose rows end on EOS at known
steps, through each path BiLD has for it (a kept EOS draft, an EOS draft rolled back, a fallback
before EOS, EOS written after a rollback) or run to the budget. Then tiny T5 and BART pairs whose
large model's EOS logit is scaled up until greedy decoding stops on EOS after a few to twenty-odd
tokens for some inputs and runs on for others, on the native engine and the Hugging Face engine.
Each test first checks that its rows really end apart, so it proves its own premise.
"""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import DynamicCache, EncoderDecoderCache

from pipeline.decoding import BatchPolicy, BatchRequest, DecodingConfig, Generator, ModelPair, Scheduler
from pipeline.pairs.tiny import EOS as TINY_EOS
from pipeline.pairs.tiny import build_model, byte_tokenizer, noisy_copy
from support.pairs import TEXTS
from support.scripted import EOS, ScriptedEngine, peaked

# --- a scripted pair: each row's EOS step is known --------------------------------------------------

START = 0
SCRIPTED_MAX_NEW = 12
# The large model's greedy output per row (it writes EOS past the end of its target).
TARGETS = {
    0: [3, 4, EOS],  # the small model drafts EOS too: kept, nothing appended after it
    1: [5, 6, 7, 2, 3, 4, EOS],  # the small model drafts EOS at step 2: rolled back, the row goes on
    2: [2, 3, 4, 5, 6, 7] * 3,  # no EOS: runs to the budget
    3: [6, EOS],  # the small model is unsure at step 1: it falls back and the large model writes EOS
    4: [4, 5, 6, 7, 2, EOS],  # the small model drafts 3 instead of EOS: rolled back, the large model writes EOS
    5: [7, 6, 5, 4, 3, 2, 7, EOS],  # EOS drafted and kept in the second window
}
SMALL_TURNS = {1: (2, "wrong", EOS), 3: (1, "unsure", None), 4: (5, "wrong", 3)}  # row: (step, what, token)
# BiLD's counters per row at window 4, alpha_FB = 0.4, alpha_RB = 3 (worked out by hand from the scripts).
BILD_STATS = {
    0: dict(small_tokens=3, large_tokens=0, rollbacks=0, fallbacks=0, large_calls=1),
    1: dict(small_tokens=6, large_tokens=1, rollbacks=1, fallbacks=0, large_calls=2),
    2: dict(small_tokens=10, large_tokens=2, rollbacks=0, fallbacks=0, large_calls=3),
    3: dict(small_tokens=1, large_tokens=1, rollbacks=0, fallbacks=1, large_calls=1),
    4: dict(small_tokens=4, large_tokens=2, rollbacks=1, fallbacks=0, large_calls=2),
    5: dict(small_tokens=7, large_tokens=1, rollbacks=0, fallbacks=0, large_calls=2),
}
ORDER = [0, 1, 2, 3, 4, 5, 2, 0, 5, 3, 1, 4]  # twelve requests: rows end early and newcomers take their slots


def _step(prefix: tuple[int, ...]) -> tuple[int, int]:
    """(row, generated tokens so far) from a prefix [START, 10 + row, generated...]."""
    return prefix[1] - 10, len(prefix) - 2


def scripted_large(prefix: tuple[int, ...]) -> torch.Tensor:
    row, step = _step(prefix)
    target = TARGETS[row]
    return peaked(target[step] if step < len(target) else EOS, 0.9)


def scripted_small(prefix: tuple[int, ...]) -> torch.Tensor:
    row, step = _step(prefix)
    target = TARGETS[row]
    token = target[step] if step < len(target) else EOS
    turn_step, what, other = SMALL_TURNS.get(row, (None, None, None))
    if step == turn_step:
        return peaked(token, 0.2) if what == "unsure" else peaked(other, 0.9)
    return peaked(token, 0.9)


SCRIPTED_CONFIGS = {
    "large": dict(method="large"),
    "bild": dict(method="bild"),
    "speculative": dict(method="speculative"),
    "speculative_fallback_window": dict(method="speculative", draft_window="fallback"),
}


def run_scripted(name: str, batch_size: int):
    small, large = ScriptedEngine(scripted_small, batch_size), ScriptedEngine(scripted_large, batch_size)
    config = DecodingConfig(max_new_tokens=SCRIPTED_MAX_NEW, fallback_threshold=0.4, rollback_threshold=3.0,
                            max_draft_tokens=4, adaptive_draft=False, **SCRIPTED_CONFIGS[name])  # rows draft as scripted
    scheduler = Scheduler(small, large, config, BatchPolicy(batch_size, refill_share=0.25), frozenset({EOS}),
                          prefix_for=lambda input_ids: input_ids)  # the prompt [START, 10 + row] names the row
    outputs = scheduler.run([BatchRequest(torch.tensor([START, 10 + row])) for row in ORDER])
    return outputs, large


@pytest.mark.parametrize("name", list(SCRIPTED_CONFIGS))
def test_scripted_rows_end_on_eos_at_their_own_step_in_any_batch(name):
    """Every request ends exactly where its script does (EOS, or the budget), at every batch size;
    a finished row leaves and a newcomer takes its slot while others go on, and nothing about a row
    changes with the batch."""
    want = [TARGETS[row][:SCRIPTED_MAX_NEW] for row in ORDER]
    # The premise: rows end on EOS at different steps before the budget, and one runs on to it.
    assert len({len(tokens) for tokens in want if tokens[-1] == EOS}) >= 4
    assert any(len(tokens) == SCRIPTED_MAX_NEW and EOS not in tokens for tokens in want)
    alone, _ = run_scripted(name, 1)
    assert len(alone) == len(ORDER) and [out.tokens for out in alone] == want
    if name == "bild":  # the paths named in TARGETS ran
        for row, out in zip(ORDER, alone, strict=True):
            got = {key: getattr(out.stats, key) for key in BILD_STATS[row]}
            assert got == BILD_STATS[row], row
    for batch_size in (2, 3, 4, 8):
        outputs, large = run_scripted(name, batch_size)
        assert len(outputs) == len(ORDER), batch_size  # one output per request: none lost, none added
        assert len(large.admitted) > 1  # queued requests joined while other rows were decoding
        for row, solo, out in zip(ORDER, alone, outputs, strict=True):
            assert out.tokens == solo.tokens, (batch_size, row)
            assert out.stats.to_dict() == solo.stats.to_dict(), (batch_size, row)
            assert out.stats.small_tokens + out.stats.large_tokens == out.stats.output_tokens == len(out.tokens)


# --- tiny T5 and BART pairs whose large model likes EOS --------------------------------------------

MAX_NEW = 24
INPUTS = TEXTS + ["Ein Hund.", "Zwei Kinder spielen am Strand mit einem roten Ball und lachen laut.",
                  "Die Sonne scheint.", "Ein alter Mann liest eine Zeitung auf der Bank vor dem Haus."]
# Found by a search over seeds and scales: greedy decoding of INPUTS ends on EOS after 1 to 23
# tokens for some inputs and runs to MAX_NEW for others (the tests check it).
EOS_PAIRS = {
    "t5": dict(seed=5, init_scale=None, eos_scale=2.0),
    "bart": dict(seed=4, init_scale=4.0, eos_scale=2.2),
}
ENGINES = ["native", "hf"]


@functools.lru_cache(maxsize=None)
def eos_models(family: str):
    """(small, large): the large model's EOS row of the output layer scaled up, the small model a
    noisy copy of it (so it drafts EOS too)."""
    settings = EOS_PAIRS[family]
    large = build_model(family, "large", seed=settings["seed"], init_scale=settings["init_scale"])
    with torch.no_grad():
        large.get_output_embeddings().weight[TINY_EOS] *= settings["eos_scale"]
    return noisy_copy(large, 0.1, seed=settings["seed"] + 1), large


@functools.lru_cache(maxsize=None)
def eos_pair(family: str, engine: str) -> ModelPair:
    small, large = eos_models(family)
    pair = ModelPair(small, large, byte_tokenizer(append_eos=True), torch.device("cpu"), engine_request=engine)
    assert pair.engine_kind == engine and pair.eos_token_ids == {TINY_EOS}
    return pair


def assert_rows_end_apart(results, max_new: int = MAX_NEW) -> None:
    """The premise: rows end on EOS at (at least two) different steps before max_new_tokens while
    another row runs on to it; EOS, where it comes, is a row's last token."""
    tokens = [r.token_ids for r in results]
    assert all(r.error is None for r in results)
    assert all(TINY_EOS not in t[:-1] for t in tokens), "a row went on after EOS"
    ended = {len(t) for t in tokens if t and t[-1] == TINY_EOS and len(t) < max_new}
    assert len(ended) >= 2, [len(t) for t in tokens]
    assert any(len(t) == max_new and TINY_EOS not in t for t in tokens), [len(t) for t in tokens]


@functools.lru_cache(maxsize=None)
def hf_greedy(family: str) -> list[list[int]]:
    """transformers' own greedy search of each input, cut after EOS: a reference that does not use
    our scheduler."""
    _, large = eos_models(family)
    outputs = []
    for text in INPUTS:
        input_ids = byte_tokenizer(append_eos=True)(text, return_tensors="pt")["input_ids"]
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())  # as test_invariants.py hands it to generate
        with torch.inference_mode():
            out = large.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=MAX_NEW,
                                 do_sample=False, num_beams=1, cache=cache)[0, 1:].tolist()
        outputs.append(out[: out.index(TINY_EOS) + 1] if TINY_EOS in out else out)
    return outputs


CONFIGS = {  # fixed windows: a row's rounds (and so its counters) as alone, whatever its batch
    "large": dict(method="large"),
    "bild": dict(method="bild", fallback_threshold=0.5, rollback_threshold=2.0, max_draft_tokens=4, adaptive_draft=False),
    "speculative": dict(method="speculative", max_draft_tokens=3, adaptive_draft=False),
    "speculative_sampling": dict(method="speculative", do_sample=True, max_draft_tokens=3, adaptive_draft=False),
}
FAST_CONFIGS = ("large", "bild", "speculative")  # make test-fast; speculative_sampling in make test
BATCHES = [BatchPolicy(3), BatchPolicy(4, refill_share=0.5), BatchPolicy(8, verify_share=0.5)]


@pytest.mark.parametrize("family", list(EOS_PAIRS))
@pytest.mark.parametrize("name", [name if name in FAST_CONFIGS else pytest.param(name, marks=pytest.mark.slow)
                                  for name in CONFIGS])
def test_rows_ending_on_eos_decode_in_a_batch_as_alone_on_both_engines(family, name):
    """At batch sizes 3, 4 and 8 every row's tokens and statistics equal those of the record
    decoded alone, on the native and on the Hugging Face engine; and the two engines agree."""
    config = DecodingConfig(max_new_tokens=MAX_NEW, **CONFIGS[name])
    seeds = list(range(len(INPUTS)))
    solo = {}
    for engine in ENGINES:
        generator = Generator(eos_pair(family, engine), config)
        solo[engine] = generator.generate(INPUTS, seeds=seeds)
        assert len(solo[engine]) == len(INPUTS)
        assert_rows_end_apart(solo[engine])
        for batch in BATCHES:
            results = generator.generate(INPUTS, seeds=seeds, batch=batch)
            assert len(results) == len(INPUTS), (engine, batch)  # one result per record, the last one too
            assert [r.input_tokens for r in results] == [r.input_tokens for r in solo[engine]], (engine, batch)
            for want, got in zip(solo[engine], results, strict=True):
                assert got.token_ids == want.token_ids, (engine, batch)
                assert got.stats.to_dict() == want.stats.to_dict(), (engine, batch)
    assert [r.token_ids for r in solo["native"]] == [r.token_ids for r in solo["hf"]]
    assert [r.stats for r in solo["native"]] == [r.stats for r in solo["hf"]]


@pytest.mark.parametrize("family", list(EOS_PAIRS))
@pytest.mark.parametrize("engine", ["native", pytest.param("hf", marks=pytest.mark.slow)])  # both engines run above
def test_greedy_bild_without_rollback_threshold_stops_where_the_large_model_stops(family, engine):
    """Greedy BiLD with alpha_RB = 0 (and greedy speculative decoding) returns the large model's
    greedy output, EOS where it has one, at batch sizes 1, 3 and 8; that output is transformers'
    own greedy search, so a row that decodes past EOS cannot hide behind our own large loop."""
    pair = eos_pair(family, engine)
    expected = Generator(pair, DecodingConfig(method="large", max_new_tokens=MAX_NEW)).generate(INPUTS)
    assert len(expected) == len(INPUTS)
    assert_rows_end_apart(expected)
    assert [r.token_ids for r in expected] == hf_greedy(family)
    totals = dict(fallbacks=0, rollbacks=0, small_tokens=0)
    variants = [dict(method="bild", rollback_threshold=0.0, fallback_threshold=0.6, max_draft_tokens=4),
                dict(method="bild", rollback_threshold=0.0, fallback_threshold=0.2, max_draft_tokens=10),
                dict(method="speculative", max_draft_tokens=4)]
    for variant in variants:
        generator = Generator(pair, DecodingConfig(max_new_tokens=MAX_NEW, **variant))
        for batch in (None, BatchPolicy(3), BatchPolicy(8, refill_share=0.5)):
            results = generator.generate(INPUTS, batch=batch)
            assert len(results) == len(INPUTS), (variant, batch)  # one result per record, the last one too
            assert [r.input_tokens for r in results] == [r.input_tokens for r in expected], (variant, batch)
            for want, got in zip(expected, results, strict=True):
                assert got.token_ids == want.token_ids, (variant, batch)
                s = got.stats
                assert s.small_tokens + s.large_tokens == s.output_tokens == len(got.token_ids)
                for key in totals:
                    totals[key] += getattr(s, key)
    # The paths under test ran: fallbacks, rollbacks and kept drafts.
    assert all(totals.values()), totals
