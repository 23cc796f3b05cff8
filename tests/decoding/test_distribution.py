"""Speculative sampling preserves the large model's distribution (DESIGN.md §1).

Chi-square tests that can fail: a negative control with a wrong acceptance rule must be
rejected by the same test, so a pass means something.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from pipeline.decoding import BatchPolicy, BatchRequest, DecodingConfig, Scheduler, speculative_verify
from pipeline.decoding.hf_engine import HFEngine
from pipeline.decoding.models import build_engine
from pipeline.decoding.policies import Verdict
from pipeline.decoding.sampling import RowSampler
from support.distributions import P_FLOOR, SOURCE, VOCAB, prefix_for, tiny_vocab_pair, two_token_distribution


def random_dist(generator: torch.Generator, rows: int) -> torch.Tensor:
    return torch.softmax(torch.randn(rows, VOCAB, generator=generator, dtype=torch.float64) * 1.5, -1)


def emitted_tokens(drafts: torch.Tensor, verdict: Verdict, count: int) -> torch.Tensor:
    """The first `count` tokens each row emits: kept drafts, then the large model's token."""
    rows, width = drafts.shape
    slots = torch.arange(width + 1)[None, :].expand(rows, -1)
    padded = torch.cat([drafts, torch.zeros(rows, 1, dtype=torch.long)], dim=1)
    emitted = torch.where(slots < verdict.accepted[:, None], padded, verdict.next_token[:, None])
    emitted = torch.where(slots <= verdict.accepted[:, None], emitted, -1)  # nothing after next_token
    return emitted[:, :count]


def run_policy(samples: int, accept_everything: bool = False):
    """Draws K=3 drafts from position-wise q and verifies them against position-wise p."""
    g = torch.Generator().manual_seed(0)
    q = random_dist(g, 3)  # [K, V]: the drafter's distribution per slot
    p = random_dist(g, 4)  # [K+1, V]: the target's distribution per slot
    sampler = RowSampler.seeded([1])
    drafts = torch.multinomial(q, samples, replacement=True, generator=sampler.generators[0]).T  # [N, K]
    num_drafts = torch.full((samples,), 3)
    if accept_everything:  # the negative control: treat drafts as if they were samples of p
        verdict = Verdict(num_drafts, sampler.categorical(p[3].expand(samples, -1)), torch.zeros(samples, dtype=torch.bool))
    else:
        verdict = speculative_verify(drafts, num_drafts, q.expand(samples, -1, -1), p.expand(samples, -1, -1), sampler)
    return emitted_tokens(drafts, verdict, 1)[:, 0], p


@pytest.mark.parametrize("accept_everything", [False, True], ids=["speculative_verify", "negative_control"])
def test_policy_output_is_distributed_as_the_target(accept_everything):
    samples = 60_000
    first_tokens, p = run_policy(samples, accept_everything)
    # Every row emits a first token (a kept draft or the replacement): it must follow p[0].
    # (Later tokens of rows that rejected early come from the next round: the loop test covers them.)
    observed = torch.bincount(first_tokens, minlength=VOCAB).double()
    result = chisquare(observed, p[0] * samples)
    if accept_everything:
        assert result.pvalue < 1e-6  # the test detects a sampler that outputs q instead of p
    else:
        assert result.pvalue > P_FLOOR, result


@pytest.mark.slow  # make test-fast keeps the batched scheduler's chi-square test (tests/decoding/test_batch.py)
@pytest.mark.parametrize("family", ["gpt2", "t5"])
@pytest.mark.parametrize("draft_window", ["fixed", "fallback", "negative_control"])
def test_speculative_loop_preserves_the_large_models_distribution(family, draft_window):
    small, large = tiny_vocab_pair(family)
    expected = two_token_distribution(large)
    control = draft_window == "negative_control"
    config = DecodingConfig(method="small" if control else "speculative", do_sample=True, max_new_tokens=2,
                            max_draft_tokens=2, draft_window="fixed" if control else draft_window,
                            fallback_threshold=0.35)
    kind = "native" if family == "t5" else "hf"
    engines = [build_engine(model, kind, 1) for model in (small, large)]
    scheduler = Scheduler(engines[0], None if control else engines[1], config, BatchPolicy(batch_size=1),
                          frozenset(), prefix_for=prefix_for(large))
    samples = 3000
    counts = torch.zeros(VOCAB * VOCAB, dtype=torch.float64)
    for out in scheduler.run([BatchRequest(SOURCE, seed=5 + seed) for seed in range(samples)]):
        counts[out.tokens[0] * VOCAB + out.tokens[1]] += 1
    result = chisquare(counts, expected * samples)
    if control:  # the small model's own samples: the same test must see they are not pL's
        assert result.pvalue < 1e-6, result
    else:
        assert result.pvalue > P_FLOOR, result


def test_the_t5_engine_runs_natively_here():
    """The T5 half of the test above really goes through the native engine."""
    from pipeline.decoding.native import NativeEngine

    small, large = tiny_vocab_pair("t5")
    assert isinstance(build_engine(large, "native", 1), NativeEngine)
    assert isinstance(build_engine(large, "hf", 1), HFEngine)
