"""Named cases for the decision rules and the scheduler around them, in the style of vLLM's
rejection-sampler tests: each case is one situation the paper's algorithm must handle."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.decoding import BatchPolicy, BatchRequest, DecodingConfig, Scheduler, bild_verify, fallback, greedy_match_verify
from pipeline.decoding.sampling import greedy
from support.scripted import EOS, VOCAB, ScriptedEngine, peaked

START = 0
TARGET = [3, 4, 5, 6, 7, 2, 3, EOS]  # the large model's greedy output
WRONG = 7  # a token the large model finds unlikely where it does not want it


def large_script(prefix: tuple[int, ...]) -> torch.Tensor:
    """The large model writes TARGET position by position, confidently (0.9)."""
    position = len(prefix) - 1
    return peaked(TARGET[position] if position < len(TARGET) else EOS, 0.9)


def small_script(*, wrong_at: int | None = None, unsure_at: int | None = None):
    """A small model that follows TARGET except for one confident mistake or one unsure step."""

    def script(prefix: tuple[int, ...]) -> torch.Tensor:
        position = len(prefix) - 1
        token = TARGET[position] if position < len(TARGET) else EOS
        if position == wrong_at:
            return peaked(WRONG if token != WRONG else 2, 0.9)
        if position == unsure_at:
            return peaked(token, 0.2)  # below alpha_FB = 0.4
        return peaked(token, 0.9)

    return script


def run(small, large, seed: int = 0, **overrides):
    """One record through the scheduler (batch size 1), decoder prefix [START]."""
    config = DecodingConfig(**{"method": "bild", "fallback_threshold": 0.4, "rollback_threshold": 3.0,
                               "max_draft_tokens": 4, "max_new_tokens": 32, **overrides})
    scheduler = Scheduler(small, large, config, BatchPolicy(batch_size=1), frozenset({EOS}),
                          prefix_for=lambda input_ids: torch.tensor([START]))
    return scheduler.run([BatchRequest(torch.tensor([5, 6]), seed=seed)])[0]


def check_accounting(out):
    assert out.stats.small_tokens + out.stats.large_tokens == out.stats.output_tokens == len(out.tokens)


# --- the policies on their own (batched tensors) ------------------------------------------------


def one_hot_probs(tokens: list[int], confidence: float = 0.9) -> torch.Tensor:
    return torch.stack([peaked(t, confidence) for t in tokens])


def test_fallback_policy_per_row():
    probs = torch.stack([peaked(3, 0.9), peaked(3, 0.39), peaked(3, 0.4)])
    assert fallback(probs, 0.4).tolist() == [False, True, False]


def test_bild_verify_batch_of_named_rows():
    # Rows: perfect match | early mismatch (slot 1) | rollback at the first draft | padding only.
    drafts = torch.tensor([[3, 4, 5], [3, WRONG, 5], [WRONG, 4, 5], [0, 0, 0]])
    num_drafts = torch.tensor([3, 3, 3, 0])
    large_tokens = [3, 4, 5, 6]
    large_probs = one_hot_probs(large_tokens).expand(4, -1, -1).float()
    large_choice = torch.tensor(large_tokens).expand(4, -1)
    verdict = bild_verify(drafts, num_drafts, large_probs, large_choice, rollback_threshold=3.0)
    assert verdict.accepted.tolist() == [3, 1, 0, 0]
    assert verdict.next_token.tolist() == [6, 4, 3, 3]
    assert verdict.rejected.tolist() == [False, True, True, False]


def test_bild_verify_keeps_a_plausible_draft_below_the_threshold():
    # The large model prefers 4 (0.6) but gives the draft 5 probability 0.3: -log 0.3 = 1.2 < 3.
    probs = torch.full((2, VOCAB), 0.1 / (VOCAB - 2))
    probs[0, 4], probs[0, 5] = 0.6, 0.3
    probs[1] = peaked(6, 0.9).float()
    verdict = bild_verify(torch.tensor([[5]]), torch.tensor([1]), probs[None], torch.tensor([[4, 6]]), 3.0)
    assert verdict.accepted.tolist() == [1] and verdict.next_token.tolist() == [6]
    # ... and rolls it back once the threshold is below its cross-entropy.
    verdict = bild_verify(torch.tensor([[5]]), torch.tensor([1]), probs[None], torch.tensor([[4, 6]]), 1.0)
    assert verdict.accepted.tolist() == [0] and verdict.next_token.tolist() == [4]
    assert -math.log(0.3) > 1.0


def test_greedy_match_verify_stops_at_first_difference():
    drafts = torch.tensor([[3, 4, 9, 6], [3, 4, 5, 6]])
    verdict = greedy_match_verify(drafts, torch.tensor([4, 2]), torch.tensor([[3, 4, 5, 6, 7]] * 2))
    assert verdict.accepted.tolist() == [2, 2]
    assert verdict.next_token.tolist() == [5, 5]
    assert verdict.rejected.tolist() == [True, False]


# --- the scheduler, case by case ---------------------------------------------------------------------


def test_perfect_match_keeps_every_draft():
    small, large = ScriptedEngine(small_script()), ScriptedEngine(large_script)
    out = run(small, large)
    assert out.tokens == TARGET
    assert out.stats.rollbacks == 0 and out.stats.fallbacks == 0
    # Window 4: round 1 keeps 4 drafts and adds the large model's token; round 2 drafts the
    # remaining 3 tokens, ending in EOS, so nothing is appended after them.
    assert out.stats.large_calls == 2 and out.stats.small_tokens == 7 and out.stats.large_tokens == 1
    check_accounting(out)


def test_early_mismatch_rolls_back_and_recovers():
    small, large = ScriptedEngine(small_script(wrong_at=1)), ScriptedEngine(large_script)
    out = run(small, large)
    assert out.tokens == TARGET
    assert out.stats.rollbacks == 1
    # Round 1 drafts 4 tokens, keeps 1, and the large model fixes slot 1.
    assert large.fed[0] == [START, 3, WRONG, 5, 6]
    assert large.fed[1][0] == 4  # the replacement is read next, nothing before it again
    check_accounting(out)


def test_rollback_at_the_first_draft():
    small, large = ScriptedEngine(small_script(wrong_at=0)), ScriptedEngine(large_script)
    out = run(small, large)
    assert out.tokens == TARGET
    assert out.stats.rollbacks == 1
    assert out.stats.large_tokens >= 1 and out.tokens[0] == 3
    check_accounting(out)


def test_fallback_on_the_first_step():
    small, large = ScriptedEngine(small_script(unsure_at=0)), ScriptedEngine(large_script)
    out = run(small, large)
    assert out.tokens == TARGET
    assert out.stats.fallbacks == 1
    assert large.fed[0] == [START]  # no drafts: the large model writes the first token itself
    assert out.stats.rollbacks == 0
    check_accounting(out)


def test_window_reached_triggers_verification():
    small, large = ScriptedEngine(small_script()), ScriptedEngine(large_script)
    out = run(small, large, max_draft_tokens=3, max_new_tokens=6)
    # Round 1: 3 drafts + the large model's token; round 2: window = min(3, 2 left) drafts.
    assert [len(fed) for fed in large.fed] == [4, 3]
    assert out.tokens == TARGET[:6]
    check_accounting(out)


def test_eos_drafted_ends_the_sequence_without_a_bonus_token():
    small, large = ScriptedEngine(small_script()), ScriptedEngine(large_script)
    out = run(small, large, max_draft_tokens=10)
    assert out.tokens == TARGET and out.tokens[-1] == EOS
    assert out.stats.large_calls == 1  # the one verification kept all 8 drafts, EOS included
    assert out.stats.small_tokens == 8 and out.stats.large_tokens == 0
    check_accounting(out)


def test_max_new_tokens_reached_mid_draft():
    small, large = ScriptedEngine(small_script()), ScriptedEngine(large_script)
    out = run(small, large, max_draft_tokens=10, max_new_tokens=5)
    assert out.tokens == TARGET[:5]
    assert small.calls == 5  # drafting stopped at the budget, not at the window
    assert out.stats.large_calls == 1 and out.stats.large_tokens == 0
    check_accounting(out)


def test_fallback_mid_draft_discards_only_the_unsure_prediction():
    small, large = ScriptedEngine(small_script(unsure_at=2)), ScriptedEngine(large_script)
    out = run(small, large)
    assert large.fed[0] == [START, 3, 4]  # two drafts, then the large model writes slot 2
    assert out.tokens == TARGET and out.stats.fallbacks == 1
    check_accounting(out)


@pytest.mark.parametrize("method", ["bild", "speculative"])
def test_sampling_loop_runs_on_scripted_models(method):
    small, large = ScriptedEngine(small_script(wrong_at=1)), ScriptedEngine(large_script)
    out = run(small, large, method=method, do_sample=True, max_draft_tokens=4, max_new_tokens=16)
    check_accounting(out)
    assert 1 <= len(out.tokens) <= 16


def test_speculative_verify_with_no_drafts_samples_the_large_model():
    """A fallback on the first drafting step leaves nothing to verify: the token comes from p alone."""
    from pipeline.decoding import speculative_verify
    from pipeline.decoding.sampling import RowSampler

    target = one_hot_probs([5], confidence=0.999)[None]  # [1, K+1 = 1, V]
    verdict = speculative_verify(torch.zeros((1, 0), dtype=torch.long), torch.zeros(1, dtype=torch.long),
                                 torch.zeros((1, 0, VOCAB), dtype=torch.float64), target, RowSampler.seeded([0]))
    assert verdict.accepted.tolist() == [0] and verdict.rejected.tolist() == [False]
    assert verdict.next_token.tolist() == [5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_greedy_is_torchs_argmax_first_of_ties_included(dtype):
    """greedy (numpy's argmax on the CPU) picks what torch's argmax picks: the first of tied scores,
    a NaN where there is one, over the last axis of any shape, views included."""
    scores = torch.randn(4, 3, 50, generator=torch.Generator().manual_seed(0)).to(dtype)
    scores[0, 0, [7, 30]] = 9.0  # a tie: the first wins
    scores[1, 2, 11] = float("nan")
    for view in (scores, scores[:, 1], scores.transpose(0, 1), scores[..., ::2]):
        assert torch.equal(greedy(view), view.argmax(dim=-1))
    assert greedy(scores)[0, 0] == 7 and greedy(scores)[1, 2] == 11
