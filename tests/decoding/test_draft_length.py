"""Each round's draft window chosen by the scheduler (draft_length.py) and the one-call drafter (Engine.draft).

The invariants of docs/design.md §1 hold whatever window is chosen, 0 (a plain large step) included: greedy
speculative decoding and BiLD with alpha_RB = 0 return the large model's greedy tokens at batch 1, 3, 8
and 32, and speculative sampling keeps the large model's distribution (with a negative control). Scripted
windows exercise every length deterministically; the measured chooser is checked on its own with known
costs. The one-call drafter changes no token and no counter of the step-by-step drafter it replaced.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest

import pipeline.decoding.policies as policies_module
from pipeline.decoding import DecodingConfig
from pipeline.decoding.draft_length import (
    EPOCH_SECONDS,
    EXPLORE_EVERY,
    EXPLORE_GAP,
    FIRST_RATIOS,
    SETTLING_EPOCHS,
    DraftLength,
)
from pipeline.decoding.drafting import Drafter
from pipeline.decoding.scheduler import BatchPolicy, decode_batch, scheduler_for
from support.distributions import RESIDUALS, check_loop, sample_loop, verify_with_residual
from support.families import slow_unless
from support.pairs import tiny_pair
from test_batch import INPUTS, MAX_NEW, requests_for

WINDOWS = (0, 2, 5, 1, 0, 10, 3)


class ScriptedWindows(DraftLength):
    """Windows from a fixed cycle, whatever is measured: every length, 0 included, in every run."""

    def __init__(self, most: int, windows=WINDOWS):
        super().__init__(most)
        self.windows = itertools.cycle(windows)
        self.chosen: list[int] = []

    def choose(self, rows: int) -> int:
        self.chosen.append(min(next(self.windows), self.most))
        return self.chosen[-1]


def run(pair, config, size, draft_length=None):
    scheduler = scheduler_for(pair, config, BatchPolicy(size))
    if draft_length is not None:
        scheduler.draft_length = draft_length
    return scheduler.run(requests_for(pair, INPUTS * (2 if size == 32 else 1)))


WINDOW_CONFIGS = {"bild_rb0": dict(method="bild", rollback_threshold=0.0, fallback_threshold=0.5),
                  "speculative": dict(method="speculative"),
                  "speculative_fallback_window": dict(method="speculative", draft_window="fallback",
                                                      fallback_threshold=0.5)}


# make test-fast: every config on T5, and GPT-2's engine under the one scheduler once; make test: every
# config on T5, GPT-2 and BART.
WINDOW_CASES = slow_unless([(name, family) for family in ("t5", "gpt2", "bart") for name in WINDOW_CONFIGS],
                           fast=[(name, "t5") for name in WINDOW_CONFIGS] + [("speculative", "gpt2")])


@pytest.mark.parametrize("name, family", WINDOW_CASES)
def test_any_windows_keep_the_large_models_greedy_tokens(name, family):
    pair = tiny_pair(family, "noisy", 0)
    config = DecodingConfig(max_new_tokens=MAX_NEW, max_draft_tokens=10, **WINDOW_CONFIGS[name])
    for size in (1, 3, 8, 32):
        expected = run(pair, DecodingConfig(method="large", max_new_tokens=MAX_NEW), size)
        scripted = ScriptedWindows(config.max_draft_tokens)
        for chooser in (scripted, None):  # scripted windows, then the measured ones (adaptive_draft)
            measured = DecodingConfig(**{**config.to_dict(), "adaptive_draft": chooser is None})
            outputs = run(pair, measured, size, chooser)
            for want, got in zip(expected, outputs):
                assert got.tokens == want.tokens, f"B={size} {'scripted' if chooser else 'measured'}"
                s = got.stats
                assert s.small_tokens + s.large_tokens == s.output_tokens == len(got.tokens)
            if chooser is scripted:  # plain steps and kept drafts both happened
                assert sum(out.stats.plain_steps for out in outputs) > 0, f"B={size}"
                assert sum(out.stats.small_tokens for out in outputs) > 0, f"B={size}"
        assert 0 in scripted.chosen and 10 in scripted.chosen


def test_a_window_of_zero_is_a_plain_large_step_and_is_counted():
    pair = tiny_pair("t5", "noisy", 0)
    config = DecodingConfig(method="bild", rollback_threshold=0.0, max_new_tokens=MAX_NEW)
    small = pair.engine("small", 3)
    admitted_before = small.admit_seconds
    chooser = ScriptedWindows(10, windows=(0,))
    outputs = run(pair, config, 3, chooser)
    assert small.admit_seconds == admitted_before  # rows join the small engine on their first draft only
    for out in outputs:
        s = out.stats
        assert s.small_calls == s.small_tokens == s.draft_tokens == 0
        assert s.plain_steps == s.large_calls == s.large_tokens == s.output_tokens
    # The chooser times every plain round as a verification that made one token per row (its epochs' rates).
    assert chooser.made == sum(out.stats.output_tokens for out in outputs)
    assert chooser.large_cost.n == len(chooser.chosen) and chooser.small_calls == chooser.drafts == 0


# The negative control once in make test-fast (on T5), on both families in make test.
@pytest.mark.parametrize("variant, family", [("fixed", "gpt2"), ("fixed", "t5"), ("residual_is_p", "t5"),
                                             pytest.param("residual_is_p", "gpt2", marks=pytest.mark.slow)])
def test_speculative_sampling_with_any_windows_keeps_the_large_models_distribution(variant, family, monkeypatch):
    """The first round drafts three (so bonus runs are tested), later rounds 0 to 3 drafts."""
    if variant in RESIDUALS:
        monkeypatch.setattr(policies_module, "speculative_verify", verify_with_residual(variant))
    chooser = ScriptedWindows(3, windows=(3, 2, 0, 3, 1))
    outputs = sample_loop(family, 4000, 64, variant, draft_length=chooser)
    assert {0, 1, 2, 3} <= set(chooser.chosen) and sum(out.stats.plain_steps for out in outputs) > 100
    check_loop(outputs, family, variant, 4000)


# --- the measured choice ------------------------------------------------------------------------------


def measured(small_seconds, large_seconds, kept_share=0.9, draft_share=0.95, most=10, rows=1, clock=None):
    """A DraftLength for batches of ``rows`` that has seen 20 drafting steps and 20 verifications of 1..10
    positions per row at the given costs (seconds per call of ``rows`` rows, and of ``positions``), and has
    settled (its first plain epochs played)."""
    chooser = DraftLength(most, rows) if clock is None else DraftLength(most, rows, clock=clock)
    chooser.settling = 0
    for call in range(20):
        chooser.drafted(rows, small_seconds(rows))
        positions = rows * (1 + call % 10)
        drafts = 100
        kept = int(kept_share * drafts)
        chooser.verified(positions, large_seconds(positions), calls=round(drafts / draft_share), drafts=drafts,
                         kept=kept, rejections=drafts - kept)
    return chooser


def test_the_configured_window_until_both_costs_are_known():
    chooser = DraftLength(7)
    assert chooser.choose(1) == 7
    chooser.drafted(1, 0.001)
    assert chooser.choose(1) == 7


def test_speculation_pays_where_a_verification_costs_about_one_step():
    """The paper's T5 pair on a GPU, or an inflated pair's weight-bound step: a step 24 ms, each more
    position 1 ms, a draft 2.5 ms."""
    chooser = measured(lambda rows: 0.0025, lambda positions: 0.024 + 0.001 * positions)
    assert chooser.modelled(1) >= 5
    assert chooser.tokens_per_second(chooser.modelled(1), 1) > 1.5 * chooser.tokens_per_second(0, 1)


def test_speculation_steps_aside_where_verifying_k_drafts_costs_k_steps():
    """A compute-bound large model (the demo pair at batch 32 on a CPU): every position costs the same."""
    chooser = measured(lambda rows: 0.0004 * rows, lambda positions: 0.0001 + 0.0008 * positions, rows=32)
    assert chooser.modelled(32) == 0
    # ... while a lone row, whose step is mostly the call's fixed cost, still drafts.
    lone = measured(lambda rows: 0.0005, lambda positions: 0.004 + 0.0002 * positions)
    assert lone.modelled(1) > 0


def test_a_batch_is_priced_at_its_longest_row():
    """16 rows that each draft with probability 0.6 per step: the average row drafts ~1.5 tokens, but the
    drafting call runs until the longest row stops and the verification pads every row to it. Priced by
    the average row, a window of 6 looked 1.27x ahead of plain steps (the demo pair at batch 32 ran at
    0.81x `large` so); priced by the longest row it is behind, and the round is a plain step. A lone row
    with the same costs still drafts."""
    costs = dict(small_seconds=lambda rows: 0.0005, large_seconds=lambda positions: 0.004 + 0.0002 * positions,
                 kept_share=0.95, draft_share=0.6)
    assert measured(**costs, rows=16).modelled(16) == 0
    assert measured(**costs, rows=1).modelled(1) > 0


def test_poor_acceptance_turns_drafting_off():
    chooser = measured(lambda rows: 0.0025, lambda positions: 0.024 + 0.001 * positions, kept_share=0.05)
    assert chooser.modelled(1) == 0


class Clock:
    """A clock the test moves: each round takes what the test says."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


GPU_LIKE = dict(small_seconds=lambda rows: 0.0025, large_seconds=lambda positions: 0.024 + 0.001 * positions)
COMPUTE_BOUND = dict(small_seconds=lambda rows: 0.0004 * rows, large_seconds=lambda p: 0.0001 + 0.0008 * p, rows=32)


def play(costs: dict, rows: int, epochs: int, drafting_speedup: float, machine_speed=lambda now: 1.0) -> list[int]:
    """The windows of ``epochs`` epochs when the model's fits are ``costs`` but a round that drafts in fact
    makes its tokens ``drafting_speedup`` times as fast as a plain one (what the fits miss), on a machine
    whose speed moves with the time as ``machine_speed`` says. A token takes a millisecond."""
    clock = Clock()
    chooser = measured(**costs, clock=clock)
    chosen = []
    decide = chooser._epoch_window
    chooser._epoch_window = lambda rows: (chosen.append(decide(rows)[0]), (chosen[-1], True))[1]  # one per epoch
    while len(chosen) < epochs:
        window = chooser.choose(rows)
        made = rows * (1 + window // 2)
        clock.now += made * 0.001 / (drafting_speedup if window else 1.0) / machine_speed(clock.now)
        chooser.made += made
    return chosen


def test_the_rounds_that_teach_the_fits_are_no_sample_and_plain_steps_come_first():
    """Until the fits hold, rounds draft the configured window; that epoch also takes first calls' costs, so it
    is paired with nothing, and so are the plain epochs that follow while the process settles. Then the arms
    alternate from plain steps, and the first sample pairs two epochs chosen by measurement."""
    clock = Clock()
    chooser = DraftLength(4, min_calls=2, clock=clock)
    assert chooser.choose(1) == 4  # the fits learn
    for positions in (1, 3, 5):
        chooser.drafted(1, 0.001)
        chooser.verified(positions, 0.001 * positions, calls=4, drafts=3, kept=3, rejections=0, made=4)
    for _ in range(SETTLING_EPOCHS):  # plain epochs while the process settles, compared with nothing
        clock.now += 1.01 * EPOCH_SECONDS
        assert chooser.choose(1) == 0 and not chooser._epoch[4]
        chooser.made += 30
    clock.now += 1.01 * EPOCH_SECONDS
    assert chooser.choose(1) == 0 and chooser._epoch[4]  # measured now: plain steps first
    chooser.made += 10
    clock.now += 1.01 * EPOCH_SECONDS
    assert chooser.choose(1) > 0
    assert chooser.ratios == {}  # the plain epoch did not pair with the fits' one, nor with the settling ones
    chooser.made += 20
    clock.now += 1.01 * EPOCH_SECONDS
    chooser.choose(1)
    assert chooser.ratios[True].samples == 1 and chooser.ratios[True].log_gain == pytest.approx(math.log(2))


def test_admissions_are_not_counted_in_an_epoch():
    """Newcomers join in bursts (continuous batching) and both arms pay their admissions alike: the chooser's
    clock stands still while they are admitted, so that an epoch that took a burst is not measured slower."""
    pair = tiny_pair("t5", "noisy", 0)
    config = DecodingConfig(method="bild", max_new_tokens=MAX_NEW)
    scheduler = scheduler_for(pair, config, BatchPolicy(3))
    chooser = scheduler.draft_length = DraftLength(config.max_draft_tokens, 3)
    paused_while_admitted = []
    admit = scheduler.large.admit

    def admitted(*args, **kwargs):
        paused_while_admitted.append(chooser._paused_at is not None)
        return admit(*args, **kwargs)

    scheduler.large.admit = admitted
    try:
        scheduler.run(requests_for(pair, INPUTS))
    finally:
        del scheduler.large.admit  # the engine is the pair's, shared with later tests
    assert len(paused_while_admitted) > 2 and all(paused_while_admitted)


@pytest.mark.parametrize("size", [1, 3])
def test_a_calibrated_chooser_knows_the_costs_before_any_record_and_learns_the_acceptance_from_them(size):
    """scripted.calibrate (an actor's warm-up) runs scripted rounds on the pair's real engines: the chooser's cost
    fits hold before the first record, so its first epoch already measures (plain steps first); a script keeps
    every draft, so what it tells of acceptance is left to the records. A config with fixed windows is left be."""
    from pipeline.decoding.pair_decoder import PairDecoder

    pair = tiny_pair("t5", "noisy", 0)
    config = DecodingConfig(method="bild", max_new_tokens=MAX_NEW, max_draft_tokens=4)
    decoder = PairDecoder(pair, config)
    decoder.calibrate(BatchPolicy(size))
    chooser = decoder.chooser(size)
    assert chooser.small_cost.n >= chooser.small_cost.min_calls and chooser.large_cost.n >= chooser.large_cost.min_calls
    assert chooser.small_calls == chooser.drafts == chooser.kept == chooser.made == 0
    assert chooser.choose(size) == 0 and not chooser._epoch[4]  # no fits' epoch: the settling plain ones at once
    fixed = PairDecoder(pair, DecodingConfig(method="bild", max_new_tokens=MAX_NEW, adaptive_draft=False))
    fixed.calibrate(BatchPolicy(size))
    assert fixed._choosers == {}


def drafting_share(epochs: list[int]) -> float:
    """The share of epochs (all alike in length) that drafted, after the first 20."""
    return sum(1 for window in epochs[20:] if window > 0) / len(epochs[20:])


def test_measured_rates_overrule_the_model_and_the_arm_behind_is_still_tried():
    """The model expects drafting to pay, but drafting epochs run at 0.9x plain ones: after a few epochs
    of each (plain steps first, the safe arm), plain steps; drafting is tried again about one epoch in
    EXPLORE_EVERY."""
    epochs = play(GPU_LIKE, rows=1, epochs=400, drafting_speedup=0.9)
    assert [window > 0 for window in epochs[: FIRST_RATIOS + 1]] == [i % 2 == 1 for i in range(FIRST_RATIOS + 1)]
    assert 0.5 / EXPLORE_EVERY < drafting_share(epochs) < 2 / EXPLORE_EVERY


def test_drafting_is_kept_where_it_measures_faster_though_the_model_says_no():
    epochs = play(COMPUTE_BOUND, rows=32, epochs=200, drafting_speedup=1.3)
    assert epochs[0] == 0 and epochs[1] > 0  # the arms alternate, the model's first
    assert drafting_share(epochs) > 1 - 2 / EXPLORE_EVERY


def test_the_choice_holds_while_the_machine_speeds_up_and_slows_down():
    """A shared CPU's speed drifts (here by up to 2x over a few dozen epochs): drafting 10% ahead still
    wins, because each sample compares neighbouring epochs."""
    drift = lambda now: 1.5 + 0.5 * math.sin(now / 0.5)  # noqa: E731
    epochs = play(GPU_LIKE, rows=1, epochs=400, drafting_speedup=1.1, machine_speed=drift)
    assert drafting_share(epochs) > 1 - 2 / EXPLORE_EVERY


def test_a_draining_batch_goes_by_what_the_full_batch_measured():
    """The model expects drafting to pay; measured with 8 of 8 rows busy it ran at 0.7x. When the batch drains
    (rows finish, no records left to join), its first epoch plays plain steps instead of the model's arm."""
    clock = Clock()
    chooser = measured(**GPU_LIKE, rows=8, clock=clock)
    assert chooser.modelled(2) > 0
    while chooser.ratios.get(True) is None or chooser.ratios[True].samples < FIRST_RATIOS:
        window = chooser.choose(8)
        clock.now += 0.001 * (1 + window // 2) / (0.7 if window else 1.0)
        chooser.made += 1 + window // 2
    clock.now += 1.0  # the full batch's epoch ends
    assert chooser.choose(2) == 0


def test_the_arm_behind_is_tried_only_where_the_try_can_be_paired():
    """A try is a sample only beside an epoch that played the arm ahead with the batch as full. When the batch
    turns from full to draining, the epoch just closed was a full one: a try there would pair with nothing (the
    demo pair at batch 8, whose draining tails last about an epoch), so it waits for the next draining epoch."""
    clock = Clock()
    chooser = measured(**GPU_LIKE, rows=8, clock=clock)

    def epoch(rows: int, drafting_speed: float = 0.7) -> int:
        window = chooser.choose(rows)
        clock.now += 1.01 * EPOCH_SECONDS * (1.0 / drafting_speed if window else 1.0)  # an epoch is a round
        chooser.made += 100
        return window

    while chooser.ratios.get(True) is None or chooser.ratios[True].samples < FIRST_RATIOS:
        epoch(8)
    while epoch(8) > 0:  # until the full batch plays a plain epoch
        pass
    chooser.untried = 10**6  # a try long overdue
    assert epoch(2) == 0  # draining now: the epoch just closed was a full one, so no try
    assert epoch(2) > 0  # next to a draining plain epoch: the try
    draining_samples = chooser.ratios[False].samples if False in chooser.ratios else 0
    epoch(2)
    assert chooser.ratios[False].samples == draining_samples + 1  # and it gave a sample


def test_an_arm_far_behind_is_tried_rarely():
    """Trying an arm 3x behind every EXPLORE_EVERY epochs would cost 25% of the time; it is tried so rarely
    that trying costs about as much as trying an arm just EXPLORE_GAP behind."""
    epochs = play(GPU_LIKE, rows=1, epochs=400, drafting_speedup=1 / 3)
    assert 0 < drafting_share(epochs) < 2 * EXPLORE_GAP / (2 * EXPLORE_EVERY)


def test_the_arm_behind_is_tried_at_most_once_in_explore_every_epochs_while_its_gap_moves():
    """On a machine whose speed jumps from epoch to epoch by up to 30% each way, each paired sample moves the
    measured gap, and with it how rarely the arm behind is tried: tries still come EXPLORE_EVERY epochs apart
    or more (counted from the last try; counting epochs modulo a moving period tried twice within 2 epochs)."""
    rng = random.Random(3)
    speeds: dict[int, float] = {}
    jumpy = lambda now: speeds.setdefault(int(now / EPOCH_SECONDS), 0.7 + 0.6 * rng.random())  # noqa: E731
    epochs = play(GPU_LIKE, rows=1, epochs=600, drafting_speedup=0.8, machine_speed=jumpy)
    tried = [i for i, window in enumerate(epochs) if window > 0 and i >= 20]
    assert len(tried) > 5
    assert min(later - earlier for earlier, later in zip(tried, tried[1:])) >= EXPLORE_EVERY


def test_records_shorter_than_an_epoch_still_pair_their_epochs_and_the_time_between_them_is_not_counted():
    """At batch 1 each record is a scheduler run of its own, ended by a pause, and shorter than an epoch; between
    records the machine does other work (here 5 epochs' worth, at whatever speed). The epoch's clock stops while
    paused, so epochs span records and pair: drafting, 0.8x as fast, is soon played rarely."""
    clock = Clock()
    chooser = measured(**GPU_LIKE, clock=clock)
    chosen = []
    for record in range(400):
        for _ in range(4):  # a record: 4 rounds of ~3 ms, a fifth of an epoch
            window = chooser.choose(1)
            made = 1 + window // 2
            clock.now += made * 0.001 / (0.8 if window else 1.0)
            chooser.made += made
        chosen.append(window)
        chooser.pause()
        clock.now += 5 * EPOCH_SECONDS
    assert chooser.ratios[True].samples >= FIRST_RATIOS
    assert chooser.ratios[True].log_gain == pytest.approx(math.log(0.8), abs=0.05)
    assert sum(1 for window in chosen[100:] if window > 0) / len(chosen[100:]) < 2 / EXPLORE_EVERY


# --- the one-call drafter ---------------------------------------------------------------------------


def step_by_step(self, rows, sequence, enough):
    """The drafter before drafting.draft_window: one small-model step per round."""
    self._draft_step(rows, sequence)
    return 1


# Fixed windows: both drafters must meet the very same rounds (measured windows differ run to run).
DRAFTER_CONFIGS = {"bild": dict(method="bild", fallback_threshold=0.5, rollback_threshold=1.0, adaptive_draft=False),
                   "speculative": dict(method="speculative", max_draft_tokens=3, adaptive_draft=False),
                   "speculative_fallback_window": dict(method="speculative", draft_window="fallback",
                                                       fallback_threshold=0.5, adaptive_draft=False)}
# drafting.draft_window over each engine's forward: on the native and onnx T5 engines under every config in make
# test-fast, on Hugging Face's (GPT-2, BART) under one config there and under every config in make test.
DRAFTER_CASES = slow_unless(
    [(name, engine, family) for engine, family in [("auto", "t5"), ("onnx", "t5"), ("auto", "gpt2"), ("auto", "bart")]
     for name in DRAFTER_CONFIGS],
    fast=[(name, engine, "t5") for name in DRAFTER_CONFIGS for engine in ("auto", "onnx")]
    + [("speculative", "auto", "gpt2")])


@pytest.mark.parametrize("name, engine, family", DRAFTER_CASES)
def test_the_one_call_drafter_changes_no_token_and_no_counter(name, engine, family, monkeypatch):
    pair = tiny_pair(family, "noisy", 0, engine=engine)
    config = DecodingConfig(max_new_tokens=MAX_NEW, **DRAFTER_CONFIGS[name])
    for size, share in [(1, 1.0), (8, 1.0), (8, 0.5)]:
        one_call = decode_batch(pair, config, BatchPolicy(size, share), requests_for(pair, INPUTS))
        with monkeypatch.context() as patched:
            patched.setattr(Drafter, "draft", step_by_step)
            stepwise = decode_batch(pair, config, BatchPolicy(size, share), requests_for(pair, INPUTS))
        for a, b in zip(one_call, stepwise):
            assert a.tokens == b.tokens and a.stats == b.stats, f"B={size} share={share}"
        assert sum(out.stats.small_tokens for out in one_call) > 0
