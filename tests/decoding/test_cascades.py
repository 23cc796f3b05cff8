"""Speculative cascades (method: cascade) and lossy speculative sampling (speculative, lenience > 0).

The rules are pure functions in policies.py; one verification routine (target_verify) applies any
target. Tested here: each rule's emission at a position is exactly its target pi (computed, and
sampled with a chi-square test and a negative control); a rule that always defers is lossless
speculative decoding; one that never defers rejects nothing and keeps the small model's own
choices, the token after a kept window being the large model's; deferrals fall as alpha grows;
tokens and statistics do not depend on the batch size; bad settings name their key.
"""

from __future__ import annotations

import pydantic
import pytest
import torch

from pipeline.decoding import BatchPolicy, DecodingConfig, Generator
from pipeline.decoding.policies import acceptance, cascade_target, deferral, residual, target_verify
from pipeline.decoding.sampling import RowSampler
from pipeline.jobs.schema import DecodingSection
from support.distributions import P_FLOOR, pooled_chisquare
from support.pairs import TEXTS, tiny_pair
from support.reference import next_token_logits

RULES = [("chow", 0.3), ("diff", 0.05), ("opt", 0.5)]
MAX_NEW = 24


def random_pair_of_distributions(seed: int, vocab: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * 1.5, -1)
    q = torch.softmax(p.log() + torch.randn(vocab, generator=g, dtype=torch.float64), -1)
    return q, p


def emission(q: torch.Tensor, target: torch.Tensor, lenience: float = 0.0) -> torch.Tensor:
    """The exact probability of emitting each token at a drafted position: the draft x ~ q kept with
    acceptance(x), else a draw from the residual."""
    kept = q * acceptance(q, target, lenience)
    return kept + (1.0 - kept.sum()) * residual(target, q)


@pytest.mark.parametrize("rule, alpha", RULES)
def test_each_rules_emission_is_exactly_its_target(rule, alpha):
    deferred = 0
    for seed in range(40):
        q, p = random_pair_of_distributions(seed)
        defer = deferral(rule, alpha, q[None, None], p[None, None], q[None, None], p[None, None])[0, 0]
        target = cascade_target(q[None, None], p[None, None], defer[None, None])[0, 0]
        torch.testing.assert_close(target, p if defer else q)
        torch.testing.assert_close(emission(q, target), target, atol=1e-12, rtol=0)
        deferred += int(defer)
    assert 0 < deferred < 40  # both branches were exercised


def test_lossy_speculative_sampling_emits_p_only_at_lenience_zero():
    q, p = random_pair_of_distributions(1)
    torch.testing.assert_close(emission(q, p), p, atol=1e-12, rtol=0)
    lossy = emission(q, p, lenience=0.5)
    assert abs(float(lossy.sum()) - 1.0) < 1e-12 and float((lossy - p).abs().max()) > 1e-3
    assert float((q * acceptance(q, p, 0.5)).sum()) > float((q * acceptance(q, p)).sum())  # keeps more drafts


@pytest.mark.parametrize("control", [None, "residual_from_target"])
def test_the_sampler_draws_the_cascade_target(control):
    """target_verify over 100k drafts of one position, against a target that mixes q and p: the
    emitted tokens follow pi (chi-square); a replacement drawn from pi instead of the residual fails
    the same test."""
    q, p = random_pair_of_distributions(3)
    target = 0.5 * q + 0.5 * p  # any target: a cascade's is q or p per position
    samples = 100_000
    sampler = RowSampler.seeded([5])
    drafts = torch.multinomial(q, samples, replacement=True, generator=sampler.generators[0])[:, None]  # [N, 1]
    targets = torch.stack([target, p])[None].expand(samples, -1, -1)  # [N, 2, V]
    num_drafts = torch.ones(samples, dtype=torch.long)
    if control is None:
        verdict = target_verify(drafts, num_drafts, q.expand(samples, 1, -1), targets, sampler)
        emitted = torch.where(verdict.accepted == 1, drafts[:, 0], verdict.next_token)
    else:
        keep = sampler.uniform(num_drafts, 1)[:, 0] * q[drafts[:, 0]] < target[drafts[:, 0]]
        emitted = torch.where(keep, drafts[:, 0], sampler.categorical(target.expand(samples, -1)))
    pvalue = pooled_chisquare(torch.bincount(emitted, minlength=len(q)).double(), target).pvalue
    assert (pvalue > P_FLOOR) if control is None else (pvalue < P_FLOOR), pvalue


def cascade(rule: str, alpha: float, **settings) -> DecodingConfig:
    return DecodingConfig(method="cascade", deferral=rule, deferral_threshold=alpha, max_new_tokens=MAX_NEW,
                          **settings)


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_a_rule_that_always_defers_is_lossless_speculative_decoding(family):
    pair = tiny_pair(family, "noisy", 0, engine="native")
    large = [r.token_ids for r in Generator(pair, DecodingConfig(method="large", max_new_tokens=MAX_NEW)).generate(TEXTS)]
    always = cascade("chow", 0.0)  # max q < 1: every position defers
    for batch in (None, BatchPolicy(3)):
        results = Generator(pair, always).generate(TEXTS, batch=batch)
        assert [r.token_ids for r in results] == large
        assert all(r.stats.deferrals == r.stats.draft_tokens for r in results)
    assert sum(r.stats.rollbacks for r in results) > 0
    # Sampling: the target is p at every position, so the very draws of speculative sampling (whose
    # distribution tests/decoding/test_distribution.py holds to p with a chi-square test).
    sampled = dict(do_sample=True, temperature=0.7, seed=3)
    speculative = Generator(pair, DecodingConfig(method="speculative", max_new_tokens=MAX_NEW, **sampled)).generate(TEXTS)
    got = Generator(pair, cascade("chow", 0.0, **sampled)).generate(TEXTS)
    assert [r.token_ids for r in got] == [r.token_ids for r in speculative]


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_a_rule_that_never_defers_keeps_every_draft_and_the_large_model_writes_after_the_window(family):
    """Never deferring (chow, alpha 1: max q < 0) rejects nothing: every draft is the small model's own
    greedy choice and is kept; the token after a window kept whole comes from p, the large model's
    choice after it (as in speculative decoding; pi is q there only where q was drafted)."""
    pair = tiny_pair(family, "independent", 0, engine="native")
    window = 3
    config = cascade("chow", 1.0, max_draft_tokens=window)
    generator = Generator(pair, config)
    for text in TEXTS:
        result = generator.generate_one(text)
        stats = result.stats
        assert stats.rollbacks == 0 and stats.deferrals == 0 and stats.small_tokens == stats.draft_tokens
        input_ids, _ = generator.encode(text)
        prefix = pair.decoder_prefix(input_ids[0]).tolist()
        tokens = result.token_ids
        for position, token in enumerate(tokens):
            model = pair.large if position % (window + 1) == window else pair.small
            logits = next_token_logits(model, input_ids, prefix + tokens[:position])[-1]
            assert token == int(logits.argmax()), (position, "large" if model is pair.large else "small")


@pytest.mark.parametrize("rule, alphas", [("chow", [0.0, 0.2, 0.5, 0.8, 1.0]), ("diff", [-0.5, 0.0, 0.1, 0.3, 1.0])])
def test_the_deferral_share_falls_as_alpha_grows(rule, alphas):
    pair = tiny_pair("t5", "noisy", 0)
    shares = []
    for alpha in alphas:
        results = Generator(pair, cascade(rule, alpha)).generate(TEXTS)
        deferrals, drafts = (sum(getattr(r.stats, key) for r in results) for key in ("deferrals", "draft_tokens"))
        shares.append(deferrals / drafts)
    assert shares == sorted(shares, reverse=True) and shares[0] > shares[-1], shares


@pytest.mark.parametrize("settings", [dict(), dict(do_sample=True, temperature=0.7, seed=1)], ids=["greedy", "sampled"])
@pytest.mark.parametrize("rule, alpha", RULES)
def test_tokens_and_statistics_do_not_depend_on_the_batch_size(rule, alpha, settings):
    pair = tiny_pair("t5", "noisy", 0)
    config = cascade(rule, alpha, **settings)
    alone = Generator(pair, config).generate(TEXTS)
    assert sum(r.stats.deferrals for r in alone) > 0
    for size in (3, 8):
        batched = Generator(pair, config).generate(TEXTS, batch=BatchPolicy(size))
        assert [r.token_ids for r in batched] == [r.token_ids for r in alone], size
        assert [r.stats for r in batched] == [r.stats for r in alone], size


@pytest.mark.parametrize("settings, key", [
    (dict(method="cascade", deferral="chow", deferral_threshold=1.5), "deferral_threshold"),
    (dict(method="cascade", deferral="maybe"), "deferral"),
    (dict(method="bild", lenience=0.2), "lenience"),
    (dict(method="speculative", lenience=1.0), "lenience"),
])
def test_bad_settings_name_their_key(settings, key):
    with pytest.raises(pydantic.ValidationError, match=key):
        DecodingSection(**settings)


@pytest.mark.parametrize("settings", [dict(), dict(do_sample=True, seed=2)], ids=["greedy", "sampled"])
def test_the_rules_read_both_models_distributions_at_every_drafted_position(monkeypatch, settings):
    """`opt` needs q and p themselves (their total variation), greedy too: every drafted position
    hands the rule a distribution of each model."""
    import pipeline.decoding.policies as policies

    seen = []

    def recording(rule, alpha, q_raw, p_raw, q, p):
        seen.append((q_raw, p_raw, q, p))
        return deferral(rule, alpha, q_raw, p_raw, q, p)

    monkeypatch.setattr(policies, "deferral", recording)
    results = Generator(tiny_pair("t5", "noisy", 0), cascade("opt", 0.5, **settings)).generate(TEXTS[:2])
    assert seen and sum(r.stats.draft_tokens for r in results) > 0
    for q_raw, p_raw, q, p in seen:
        for distribution in (q_raw, p_raw, q, p):
            torch.testing.assert_close(distribution.sum(-1), torch.ones(distribution.shape[:-1], dtype=distribution.dtype))
