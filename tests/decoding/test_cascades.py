"""Speculative cascades (method: cascade) and lossy speculative sampling (speculative, lenience > 0).

The rules are pure functions in policies.py; one verification routine (target_verify) applies any
target. Tested here: each rule's emission at a position is exactly its target pi (computed, and
sampled with a chi-square test and a negative control); a rule that always defers is lossless
speculative decoding; one that never defers rejects nothing and keeps the small model's own
choices, the token after a kept window being the large model's; deferrals fall as alpha grows;
tokens and statistics do not depend on the batch size; bad settings name their key.
"""

from __future__ import annotations

import functools

import pydantic
import pytest
import torch
from transformers import DynamicCache, EncoderDecoderCache

import pipeline.decoding.policies as policies_module
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
    """Fixed windows: a cascade's tokens follow the windows, and these tests compare runs and batch sizes."""
    return DecodingConfig(method="cascade", deferral=rule, deferral_threshold=alpha, max_new_tokens=MAX_NEW,
                          adaptive_draft=False, **settings)


@functools.lru_cache(maxsize=None)
def hf_greedy(family: str, pair_kind: str, role: str) -> tuple[tuple[int, ...], ...]:
    """transformers' own greedy search (generate) of one model of a tiny pair over TEXTS, cut after EOS: a
    reference that runs neither our scheduler nor our engines."""
    pair = tiny_pair(family, pair_kind, 0, engine="native")
    model = getattr(pair, role)
    outputs = []
    for text in TEXTS:
        input_ids = pair.tokenizer(text, return_tensors="pt")["input_ids"]
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        with torch.inference_mode():
            out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=MAX_NEW,
                                 do_sample=False, num_beams=1, cache=cache)[0, 1:].tolist()
        eos = [i for i, token in enumerate(out) if token in pair.eos_token_ids]
        outputs.append(tuple(out[: eos[0] + 1] if eos else out))
    return tuple(outputs)


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_a_rule_that_always_defers_is_lossless_speculative_decoding(family):
    """Greedy: chow at alpha 0 (max q < 1) defers at every position, so it writes the large model's greedy
    output, transformers' own greedy search of it (not our `large` method), while the small model's own
    greedy output is another: the deferrals replaced drafts. Sampled: the very draws of speculative sampling."""
    pair = tiny_pair(family, "noisy", 0, engine="native")
    large, small = ([list(tokens) for tokens in hf_greedy(family, "noisy", role)] for role in ("large", "small"))
    assert large != small  # the premise: following the small model would show
    always = cascade("chow", 0.0)  # max q < 1: every position defers
    for batch in (None, BatchPolicy(3)):
        results = Generator(pair, always).generate(TEXTS, batch=batch)
        assert len(results) == len(TEXTS)
        assert [r.token_ids for r in results] == large, batch
    assert sum(r.stats.rollbacks for r in results) > 0 and sum(r.stats.small_tokens for r in results) > 0
    # Sampling: the target is p at every position, so the very draws of speculative sampling (whose
    # distribution tests/decoding/test_distribution.py holds to p with a chi-square test).
    sampled = dict(do_sample=True, temperature=0.7, seed=3)
    speculative = Generator(pair, DecodingConfig(method="speculative", max_new_tokens=MAX_NEW, adaptive_draft=False, **sampled)).generate(TEXTS)
    got = Generator(pair, cascade("chow", 0.0, **sampled)).generate(TEXTS)
    assert [r.token_ids for r in got] == [r.token_ids for r in speculative]


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_a_rule_that_never_defers_keeps_every_draft_and_the_large_model_writes_after_the_window(family):
    """Never deferring (chow, alpha 1: max q < 0) rejects nothing: every draft is the small model's own
    greedy choice and is kept; the token after a window kept whole comes from p, the large model's
    choice after it (as in speculative decoding; pi is q there only where q was drafted)."""
    pair = tiny_pair(family, "independent", 0, engine="native")
    # A window as long as the budget: the output is the small model's own greedy output, transformers' greedy
    # search of it, not the large model's.
    small, large = ([list(tokens) for tokens in hf_greedy(family, "independent", role)] for role in ("small", "large"))
    assert small != large
    whole = Generator(pair, cascade("chow", 1.0, max_draft_tokens=MAX_NEW)).generate(TEXTS)
    assert [r.token_ids for r in whole] == small
    assert all(r.stats.small_tokens == len(r.token_ids) and r.stats.large_tokens == 0 for r in whole)
    # A window of 3: three drafts of the small model's, then the large model's choice after them, again and
    # again, each token the argmax of its model over the output before it (the models themselves, no cache).
    window = 3
    generator = Generator(pair, cascade("chow", 1.0, max_draft_tokens=window))
    for text in TEXTS:
        result = generator.generate_one(text)
        input_ids, _ = generator.encode(text)
        prefix = pair.decoder_prefix(input_ids[0]).tolist()
        tokens = result.token_ids
        assert len(tokens) == MAX_NEW
        writers = ["large" if position % (window + 1) == window else "small" for position in range(len(tokens))]
        for position, (token, writer) in enumerate(zip(tokens, writers)):
            logits = next_token_logits(getattr(pair, writer), input_ids, prefix + tokens[:position])[-1]
            assert token == int(logits.argmax()), (position, writer)
        assert (result.stats.small_tokens, result.stats.large_tokens) == (writers.count("small"), writers.count("large"))
        assert result.stats.rollbacks == 0


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


@pytest.mark.parametrize("settings", [dict(), dict(do_sample=True, temperature=0.7, seed=2)], ids=["greedy", "sampled"])
def test_each_verification_defers_where_the_models_themselves_say(monkeypatch, settings):
    """Every verification of `opt` at alpha 0.5, held to the two models themselves (run without a cache on
    the output so far, in float64): the logits it was handed at every drafted position and the one after;
    q and p (tempered when sampling); its deferral decision at each drafted position, the rule worked out
    here from those models' distributions (max q < max p - alpha * D_TV, untempered maxima, tempered D_TV);
    greedy, the kept drafts and the token after them; sampled, a rejection only where it deferred (where it
    does not, pi = q keeps the draft) and a replacement the residual max(0, p - q) can give. Put together,
    the verifications rebuild the record's output, and its deferral count is the one worked out here."""
    alpha, temperature = 0.5, settings.get("temperature", 1.0)
    decisions, calls = [], []
    real_deferral, real_verify = policies_module.deferral, policies_module.cascade_verify

    def recording_deferral(*args):
        decisions.append(real_deferral(*args))
        return decisions[-1]

    def recording_verify(rule, a, drafts, num_drafts, small_logits, large_logits, draft_probs, large_probs, sampler):
        verdict = real_verify(rule, a, drafts, num_drafts, small_logits, large_logits, draft_probs, large_probs, sampler)
        calls.append((drafts.clone(), num_drafts.clone(), small_logits.clone(), large_logits.clone(),
                      draft_probs.clone(), large_probs.clone(), verdict))
        return verdict

    monkeypatch.setattr(policies_module, "deferral", recording_deferral)
    monkeypatch.setattr(policies_module, "cascade_verify", recording_verify)
    pair = tiny_pair("t5", "noisy", 0)
    generator = Generator(pair, cascade("opt", alpha, **settings))
    deferred = drafted = close_calls = 0
    for text in TEXTS[:2]:
        decisions.clear()
        calls.clear()
        result = generator.generate_one(text)
        assert result.error is None and len(calls) == len(decisions) == result.stats.large_calls > 0
        input_ids, _ = generator.encode(text)
        context = pair.decoder_prefix(input_ids[0]).tolist()
        start, record_deferred = len(context), 0
        for (drafts, num_drafts, small_logits, large_logits, q, p, verdict), decided in zip(calls, decisions,
                                                                                            strict=True):
            width = int(num_drafts[0])
            window = drafts[0, :width].tolist()
            small = next_token_logits(pair.small, input_ids, context + window[:-1])[len(context) - 1:].double()
            large = next_token_logits(pair.large, input_ids, context + window)[len(context) - 1:].double()
            assert small.shape[0] == width and large.shape[0] == width + 1
            # (float32 against float64 on these sharp random models: logits agree to ~2e-4)
            torch.testing.assert_close(small_logits[0, :width].double(), small, atol=1e-3, rtol=0)
            torch.testing.assert_close(large_logits[0, : width + 1].double(), large, atol=1e-3, rtol=0)
            q_want, p_want = torch.softmax(small / temperature, -1), torch.softmax(large / temperature, -1)
            torch.testing.assert_close(q[0, :width].double(), q_want, atol=1e-4, rtol=0)
            torch.testing.assert_close(p[0, : width + 1].double(), p_want, atol=1e-4, rtol=0)
            distance = (q_want - p_want[:width]).clamp(min=0).sum(-1)
            margin = (torch.softmax(large[:width], -1).max(-1).values - alpha * distance
                      - torch.softmax(small, -1).max(-1).values)
            want = margin > 0
            clear = margin.abs() > 1e-3  # a float tie may fall either way
            close_calls += int((~clear).sum())
            got = decided[0, :width]
            assert torch.equal(got[clear], want[clear]), (margin, got)
            record_deferred += int(got.sum())
            accepted, next_token = int(verdict.accepted[0]), int(verdict.next_token[0])
            if "do_sample" not in settings:
                replaced = [i for i in range(width) if got[i] and window[i] != int(large[i].argmax())]
                assert accepted == (replaced[0] if replaced else width)
                assert next_token == int(large[accepted].argmax())
            elif accepted < width:  # rejected: only where it deferred, and replaced from max(0, p - q)
                assert got[accepted] and p_want[accepted, next_token] > q_want[accepted, next_token]
            context += window[:accepted]
            if len(context) - start < MAX_NEW:
                context.append(next_token)
        assert context[start:] == result.token_ids
        assert result.stats.deferrals == record_deferred and result.stats.draft_tokens == sum(
            int(call[1][0]) for call in calls)
        deferred, drafted = deferred + record_deferred, drafted + result.stats.draft_tokens
    assert 0 < deferred < drafted and close_calls <= 1, (deferred, drafted, close_calls)  # both branches ran
