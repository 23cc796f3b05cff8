"""Speculative sampling preserves the large model's distribution (docs/design.md §1).

Chi-square tests that can fail, every cell that expects fewer than 5 samples pooled into one
(support/distributions.py). Next to the sampler under test run negative controls that get it
only slightly wrong (the replacement after a rejection drawn from norm(max(0, p - 0.9 q)), or from p,
instead of norm(max(0, p - q))): the same test at the same sample count must reject them, so a
pass means something. Every slot of a window of four drafts is checked, the bonus token after a
window accepted whole included, and the tests assert that such windows occurred.
"""

from __future__ import annotations

import pytest
import torch

import pipeline.decoding.policies as policies_module
from pipeline.decoding import speculative_verify
from pipeline.decoding.engines.hf_engine import HFEngine
from pipeline.decoding.models import build_engine
from pipeline.decoding.policies import Verdict
from pipeline.decoding.sampling import RowSampler
from support.distributions import (P_FLOOR, RESIDUALS, VOCAB, check_loop, pooled_chisquare, sample_loop,
                                   tiny_vocab_pair, verify_with_residual)

K = 4  # drafts per window in the policy test
POLICY_SAMPLES = 200_000
CONTROLS = ["accept_everything", *RESIDUALS]


def emitted_tokens(drafts: torch.Tensor, verdict: Verdict, count: int) -> torch.Tensor:
    """The first `count` tokens each row emits: kept drafts, then the large model's token (-1 after it)."""
    rows, width = drafts.shape
    slots = torch.arange(width + 1)[None, :].expand(rows, -1)
    padded = torch.cat([drafts, torch.zeros(rows, 1, dtype=torch.long)], dim=1)
    emitted = torch.where(slots < verdict.accepted[:, None], padded, verdict.next_token[:, None])
    emitted = torch.where(slots <= verdict.accepted[:, None], emitted, -1)  # nothing after next_token
    return emitted[:, :count]


def run_policy(control: str | None):
    """K drafts per row from position-wise q, verified against position-wise p (K + 1 slots)."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(K + 1, VOCAB, generator=g, dtype=torch.float64) * 1.5, -1)  # [K+1, V]
    # A drafter near p (total variation 0.13 to 0.43 per slot), as a real one is: windows are often accepted whole.
    q = torch.softmax(p[:K].log() + 0.8 * torch.randn(K, VOCAB, generator=g, dtype=torch.float64), -1)  # [K, V]
    sampler = RowSampler.seeded([1])
    samples = POLICY_SAMPLES
    drafts = torch.multinomial(q, samples, replacement=True, generator=sampler.generators[0]).T  # [N, K]
    num_drafts = torch.full((samples,), K)
    if control == "accept_everything":  # drafts treated as if they were samples of p
        bonus = sampler.categorical(p[K].expand(samples, -1))
        verdict = Verdict(num_drafts, bonus, torch.zeros(samples, dtype=torch.bool))
    else:
        verify = speculative_verify if control is None else verify_with_residual(control)
        verdict = verify(drafts, num_drafts, q.expand(samples, -1, -1), p.expand(samples, -1, -1), sampler)
    return emitted_tokens(drafts, verdict, K + 1), verdict, p


@pytest.mark.parametrize("control", [None, *CONTROLS], ids=["speculative_verify", *CONTROLS])
def test_policy_output_is_distributed_as_the_target_at_every_slot(control):
    """The token a window emits at slot j (a kept draft or the replacement of a rejected one; at
    slot K the bonus token of a window accepted whole) follows p[j] among the rows that reach slot j
    (p and q do not depend on earlier slots here; the loop tests below cover that)."""
    emitted, verdict, p = run_policy(control)
    bonus = int((verdict.accepted == K).sum())
    assert int((emitted[:, K] >= 0).sum()) == bonus > POLICY_SAMPLES // 10  # bonus tokens were sampled, and are tested
    pvalues = []
    for slot in range(K + 1):
        tokens = emitted[emitted[:, slot] >= 0, slot]
        pvalues.append(pooled_chisquare(torch.bincount(tokens, minlength=VOCAB).double(), p[slot]).pvalue)
    if control is None:
        assert min(pvalues) > P_FLOOR, pvalues
    else:  # the same test, the same samples, rejects a sampler that is only slightly wrong
        assert min(pvalues) < P_FLOOR, pvalues


LOOP_SAMPLES = 3000


# make test-fast keeps the batched scheduler's version (tests/decoding/test_batch.py). That one runs on both
# families, and a sampled row decodes there exactly as alone (test_batch.py), so a second family at batch 1
# (GPT-2 on the Hugging Face engine, 150 s of the suite) would test nothing new; T5 checks the one-row path
# directly.
@pytest.mark.slow
@pytest.mark.parametrize("family", ["t5"])
@pytest.mark.parametrize("variant", ["fixed", "fallback", "residual_is_p"])
def test_speculative_loop_preserves_the_large_models_distribution(family, variant, monkeypatch):
    """At batch size 1, four tokens from windows of up to three drafts (a fixed window, or BiLD's fallback
    window) follow pL(t1..t4), and the bonus tokens after a first window accepted whole follow
    pL(t4 | t1..t3); a replacement drawn from p instead of the residual fails the same tests."""
    if variant in RESIDUALS:
        monkeypatch.setattr(policies_module, "speculative_verify", verify_with_residual(variant))
    check_loop(sample_loop(family, LOOP_SAMPLES, 1, variant), family, variant, LOOP_SAMPLES)


def test_the_t5_engine_runs_natively_here():
    """The T5 half of the tests above really goes through the native engine."""
    from pipeline.decoding.engines.native import NativeEngine

    small, large = tiny_vocab_pair("t5")
    assert isinstance(build_engine(large, "native", 1), NativeEngine)
    assert isinstance(build_engine(large, "hf", 1), HFEngine)
