"""Tiny pairs over a 6-token vocabulary, whose output distributions can be enumerated exactly:
what the chi-square tests of speculative sampling compare against, the pooled chi-square they use,
and negative controls that get the rejection sampler slightly wrong."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import NamedTuple

import torch
from scipy.stats import chisquare

from pipeline.decoding import BatchPolicy, BatchRequest, DecodingConfig, Feed, Scheduler
from pipeline.decoding.models import build_engine
from pipeline.decoding.policies import Verdict, speculative_verify

VOCAB = 6
P_FLOOR = 1e-3  # a correct sampler fails a test at this level about once in a thousand runs; seeds are fixed
MIN_EXPECTED = 5.0  # Pearson's chi-square needs expected counts of about 5 or more per cell
# How far the noisy drafter is from the large model, per family: a total variation of 0.1 to 0.35
# per position, so about half the first windows of 3 drafts are accepted whole (a bonus token).
NOISE = {"gpt2": 0.5, "t5": 0.15}
# BiLD's fallback window on that drafter: about one fallback in two runs, and still many windows of 3.
FALLBACK = {"gpt2": 0.3, "t5": 0.6}


@functools.lru_cache(maxsize=None)
def tiny_vocab_pair(family: str = "gpt2"):
    """(small, large) over a 6-token vocabulary, so the output distribution can be enumerated: GPT-2
    (run by the Hugging Face engine) or T5 (run by the native engine). The small model is a noisy
    copy of the large one, a close drafter as a real one is."""
    import pipeline.pairs.tiny as tiny

    config = tiny._config(family, "large")
    config.vocab_size = VOCAB
    torch.manual_seed(0)
    large = tiny._MODEL_CLASSES[family](config).double().eval()
    tiny._scale_weights(large, 1.0, logit_std=1.5)
    return tiny.noisy_copy(large, NOISE[family], seed=1), large


SOURCE = torch.tensor([2, 3, 4])  # the prompt (GPT-2) or the encoder input (T5)


def next_token_probs(model, tokens: list[int]) -> torch.Tensor:
    """pL(. | tokens) [V]: after the prompt (GPT-2), or the decoder's start token and tokens (T5)."""
    return next_token_probs_of(model, torch.tensor([tokens], dtype=torch.long))[0]


@torch.inference_mode()
def next_token_probs_of(model, tokens: torch.Tensor) -> torch.Tensor:
    """pL(. | row) [R, V] for R rows of generated tokens [R, n] (n may be 0), in one pass."""
    rows = len(tokens)
    if model.config.is_encoder_decoder:
        decoder = torch.cat([torch.zeros((rows, 1), dtype=torch.long), tokens], dim=1)
        logits = model(input_ids=SOURCE.expand(rows, -1), decoder_input_ids=decoder).logits
    else:
        ids = torch.cat([SOURCE.expand(rows, -1), tokens], dim=1)
        logits = model(ids, attention_mask=torch.ones_like(ids)).logits
    return torch.softmax(logits[:, -1], -1)


def engine_probs_of(engine) -> Callable[[torch.Tensor], torch.Tensor]:
    """next_token_probs_of for the model an encoder-decoder engine runs, with the engine's own
    arithmetic (int8 included): each row fed after the start token (0), one row at a time."""

    def probs_of(tokens: torch.Tensor) -> torch.Tensor:
        rows = []
        for row in tokens:
            engine.admit([0], [SOURCE])
            fed = torch.cat([torch.zeros(1, dtype=torch.long), row])[None]  # [1, n + 1]
            logits = engine.forward(Feed([0], fed, [0], [fed.shape[1]], [1]))[0, 0]
            engine.release(0)
            rows.append(torch.softmax(logits.double(), -1))
        return torch.stack(rows)

    return probs_of


def sequence_distribution(large, length: int, probs_of=None) -> torch.Tensor:
    """pL(t1 .. t_length | source) over all VOCAB ** length sequences, flattened in base VOCAB
    (t1 most significant): the index sequence_index() gives. ``probs_of``: another way to compute
    next_token_probs_of(large, ...) (engine_probs_of)."""
    probs_of = probs_of or functools.partial(next_token_probs_of, large)
    probs = torch.ones(1, dtype=torch.float64)
    for n in range(length):
        prefixes = torch.tensor(list(itertools.product(range(VOCAB), repeat=n)), dtype=torch.long).reshape(VOCAB**n, n)
        probs = (probs[:, None] * probs_of(prefixes)).flatten()
    return probs


def sequence_index(tokens: list[int]) -> int:
    index = 0
    for token in tokens:
        index = index * VOCAB + token
    return index


def sequence_counts(outputs, length: int) -> torch.Tensor:
    """How often each sequence of ``length`` tokens was decoded (outputs: DecodeOutputs)."""
    counts = torch.zeros(VOCAB**length, dtype=torch.float64)
    for out in outputs:
        assert len(out.tokens) == length, out.tokens
        counts[sequence_index(out.tokens)] += 1
    return counts


class Pooled(NamedTuple):
    statistic: float
    pvalue: float
    cells: int  # cells left after pooling


def pooled_chisquare(observed: torch.Tensor, probs: torch.Tensor, min_expected: float = MIN_EXPECTED) -> Pooled:
    """Pearson's chi-square of counts ``observed`` against the distribution ``probs``, with every cell
    whose expected count is below ``min_expected`` pooled into one cell (joined by the next-rarest
    cells until that one, too, expects ``min_expected``)."""
    total = float(observed.sum())
    expected = probs.double() * total
    order = torch.argsort(expected)
    pooled = int((expected < min_expected).sum())
    while 0 < pooled < len(order) and float(expected[order[:pooled]].sum()) < min_expected:
        pooled += 1
    kept, rare = order[pooled:], order[:pooled]
    observed_cells, expected_cells = observed[kept].double(), expected[kept]
    if pooled:
        observed_cells = torch.cat([observed_cells, observed[rare].double().sum()[None]])
        expected_cells = torch.cat([expected_cells, expected[rare].sum()[None]])
    assert len(expected_cells) >= 2 and float(expected_cells.min()) >= min_expected, expected_cells
    result = chisquare(observed_cells.numpy(), expected_cells.numpy() * total / float(expected_cells.sum()))
    return Pooled(float(result.statistic), float(result.pvalue), len(expected_cells))


# --- negative controls: rejection samplers that are only slightly wrong ----------------------------

RESIDUALS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    # The replacement after a rejection from norm(max(0, p - 0.9 q)) instead of norm(max(0, p - q)).
    "residual_minus_0.9q": lambda p, q: (p - 0.9 * q).clamp(min=0.0),
    # ... or from p itself, as if the rejected draft had not been drawn from q.
    "residual_is_p": lambda p, q: p,
}


def verify_with_residual(name: str):
    """speculative_verify, except that a rejected draft's replacement is drawn from RESIDUALS[name]:
    the same acceptances, the same bonus tokens, a slightly wrong distribution."""
    residual = RESIDUALS[name]

    def verify(drafts, num_drafts, draft_probs, target_probs, sampler, lenience: float = 0.0) -> Verdict:
        assert lenience == 0.0  # the controls are of the lossless sampler
        verdict = speculative_verify(drafts, num_drafts, draft_probs, target_probs, sampler)
        if drafts.shape[1] == 0 or not bool(verdict.rejected.any()):
            return verdict
        rows = torch.arange(len(drafts), device=drafts.device)
        p = target_probs[rows, verdict.accepted]
        q = draft_probs[rows, verdict.accepted.clamp(max=drafts.shape[1] - 1)]  # read only where rejected
        wrong = torch.where(verdict.rejected[:, None], residual(p, q), p)
        wrong = wrong / wrong.sum(dim=-1, keepdim=True)
        next_token = torch.where(verdict.rejected, sampler.categorical(wrong), verdict.next_token)
        return Verdict(verdict.accepted, next_token, verdict.rejected)

    return verify


# --- the decoding loop's output: four tokens from windows of up to three drafts -------------------

LOOP_TOKENS = 4
LOOP_WINDOW = 3  # a first window accepted whole is followed by a bonus token: the fourth


def sample_loop(family: str, samples: int, batch_size: int, variant: str = "fixed", engine: str | None = None,
                quantize: str = "none", draft_length=None) -> list:
    """``samples`` outputs of LOOP_TOKENS tokens from the scheduler on the noisy tiny-vocab pair
    (GPT-2 on the Hugging Face engine, T5 on the native one, or on ``engine`` in float32 with
    ``quantize``), one seed per run: speculative sampling with a fixed window (variant "fixed", or a
    RESIDUALS control the caller patches in) or BiLD's fallback window ("fallback"); "small_only"
    samples the drafter alone (a negative control). ``draft_length``: the scheduler's window chooser."""
    small, large = tiny_vocab_pair(family)
    method = "small" if variant == "small_only" else "speculative"
    config = DecodingConfig(method=method, do_sample=True, max_new_tokens=LOOP_TOKENS, max_draft_tokens=LOOP_WINDOW,
                            draft_window="fallback" if variant == "fallback" else "fixed",
                            fallback_threshold=FALLBACK[family], adaptive_draft=False)
    kind = engine or ("native" if family == "t5" else "hf")
    if engine is not None:
        small, large = small.float(), large.float()
    engines = [build_engine(model, kind, batch_size, quantize=quantize) for model in (small, large)]
    scheduler = Scheduler(engines[0], None if method == "small" else engines[1], config,
                          BatchPolicy(batch_size=batch_size), frozenset(), prefix_for=prefix_for(large),
                          draft_length=draft_length)
    return scheduler.run([BatchRequest(SOURCE, seed=seed) for seed in range(samples)])


def is_bonus_run(out) -> bool:
    """The first window's LOOP_WINDOW drafts were all accepted, so its one verification appended a
    bonus token sampled from pL: the output's last token."""
    return out.stats.large_calls == 1 and out.stats.small_tokens == LOOP_WINDOW and len(out.tokens) == LOOP_TOKENS


def loop_tests(outputs, large, probs_of=None) -> tuple[Pooled, Pooled | None, int]:
    """(the pooled chi-square of the outputs against pL(t1..t4), the same for the bonus tokens
    against pL(t4 | t1..t3) of their runs, the number of bonus runs).

    The bonus test sums each run's own conditional distribution into the expected counts; given
    their prefixes the bonus tokens are independent draws, and Pearson's statistic is then, if
    anything, smaller than with one common distribution (conservative)."""
    joint = sequence_distribution(large, LOOP_TOKENS, probs_of)
    whole = pooled_chisquare(sequence_counts(outputs, LOOP_TOKENS), joint)
    bonus = [out for out in outputs if is_bonus_run(out)]
    if not bonus:
        return whole, None, 0
    table = joint.view(-1, VOCAB)
    conditional = table / table.sum(dim=-1, keepdim=True)  # [V^3, V]: pL(t4 | t1..t3)
    expected = torch.stack([conditional[sequence_index(out.tokens[:-1])] for out in bonus]).mean(dim=0)
    observed = torch.bincount(torch.tensor([out.tokens[-1] for out in bonus]), minlength=VOCAB).double()
    return whole, pooled_chisquare(observed, expected), len(bonus)


def check_loop(outputs, family: str, variant: str, samples: int, probs_of=None) -> None:
    """The assertions of the loop tests on ``samples`` outputs of sample_loop: a correct sampler
    (variant "fixed" or "fallback") passes both chi-square tests of loop_tests, a control (a
    RESIDUALS name, or "small_only": the drafter alone) fails them; a first window accepted whole,
    and so a bonus token, occurred in many runs (not for "small_only", which verifies nothing).
    ``probs_of``: the large model's next-token probabilities as its engine computes them (int8)."""
    whole, bonus, bonus_runs = loop_tests(outputs, tiny_vocab_pair(family)[1], probs_of)
    if variant == "small_only":
        assert bonus_runs == 0 and whole.pvalue < P_FLOOR, whole
        return
    assert bonus_runs > samples // 10, bonus_runs  # windows accepted whole, and bonus tokens sampled and tested
    if variant == "fallback":  # the window really was BiLD's dynamic one
        assert sum(out.stats.fallbacks for out in outputs) > samples // 10
    if variant in RESIDUALS:
        assert min(whole.pvalue, bonus.pvalue) < P_FLOOR, (whole, bonus)
    else:
        assert whole.pvalue > P_FLOOR and bonus.pvalue > P_FLOOR, (whole, bonus)


def prefix_for(model):
    if model.config.is_encoder_decoder:
        return lambda input_ids: torch.tensor([0])
    return lambda input_ids: input_ids
