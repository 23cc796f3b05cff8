"""The decision rules of BiLD and speculative decoding, as pure functions over batched tensors.

Shapes: B rows, K draft slots (the widest window in the batch), V vocabulary entries.
A row's drafts occupy slots [0, num_drafts[b]); slots beyond are padding and are ignored.
The large model's distributions have K + 1 positions: one per draft, and one after the last.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.decoding.sampling import RowSampler, choose, greedy, to_probs


@dataclass(frozen=True)
class Verdict:
    """What one verification decides for each row."""

    accepted: torch.Tensor  # [B] long: drafts kept, a prefix of the row's drafts
    next_token: torch.Tensor  # [B] long: the large model's token for slot `accepted`
    rejected: torch.Tensor  # [B] bool: a draft was replaced (a rollback / a rejection)
    deferred: torch.Tensor | None = None  # [B] long: drafted positions a cascade's rule deferred


def fallback(small_probs: torch.Tensor, fallback_threshold: float) -> torch.Tensor:
    """BiLD's fallback policy: the small model is unsure when max pS < alpha_FB.

    small_probs: [B, V] -> [B] bool
    """
    return small_probs.amax(dim=-1) < fallback_threshold


def _first_true(mask: torch.Tensor, default: torch.Tensor) -> torch.Tensor:
    """Index of the first True in each row of mask [B, K], or default[b] when there is none."""
    if mask.shape[1] == 0:
        return default
    first = mask.to(torch.int8).argmax(dim=1)
    return torch.where(mask.any(dim=1), first, default)


def _draft_slots(num_drafts: torch.Tensor, width: int) -> torch.Tensor:
    """[B, K] bool: which slots hold real drafts."""
    return torch.arange(width, device=num_drafts.device)[None, :] < num_drafts[:, None]


def bild_verify(
    drafts: torch.Tensor,
    num_drafts: torch.Tensor,
    large_probs: torch.Tensor,
    large_choice: torch.Tensor,
    rollback_threshold: float,
) -> Verdict:
    """BiLD's rollback policy (docs/design.md §1, step 2).

    Roll back at the earliest draft d_i whose cross-entropy under the large model,
    -log pL(d_i | y + d_<i), exceeds alpha_RB *and* that is not the large model's own choice;
    keep d_<i and put the large model's choice in slot i. Without a rollback every draft stays
    and the large model's choice for the slot after the last draft is appended.

    drafts [B, K], num_drafts [B], large_probs [B, K+1, V], large_choice [B, K+1]
    """
    width = drafts.shape[1]
    draft_prob = large_probs[:, :width].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)  # [B, K]
    cross_entropy = -torch.log(draft_prob)
    rollback = (
        (cross_entropy > rollback_threshold)
        & (drafts != large_choice[:, :width])
        & _draft_slots(num_drafts, width)
    )
    accepted = _first_true(rollback, default=num_drafts)
    next_token = large_choice.gather(1, accepted[:, None]).squeeze(1)
    return Verdict(accepted=accepted, next_token=next_token, rejected=rollback.any(dim=1))


def greedy_match_verify(drafts: torch.Tensor, num_drafts: torch.Tensor, large_choice: torch.Tensor) -> Verdict:
    """Greedy speculative decoding: keep drafts while d_i == argmax pL, then take argmax pL (a greedy
    cascade whose rule defers at every position).

    drafts [B, K], num_drafts [B], large_choice [B, K+1] (the large model's argmax per slot)
    """
    return greedy_cascade_verify(drafts, num_drafts, torch.ones_like(drafts, dtype=torch.bool), large_choice)


def deferral(rule: str, alpha: float, q_raw: torch.Tensor, p_raw: torch.Tensor, q: torch.Tensor,
             p: torch.Tensor) -> torch.Tensor:
    """A speculative cascade's deferral decision r_t per drafted position (Narasimhan et al. 2025):
    True where the position defers to the large model.

    The decision reads untempered (temperature 1) distributions, as the paper's reference does:
    ``chow``: max q < 1 - alpha; ``diff``: max q < max p - alpha; ``opt``: max q < max p - alpha *
    D_TV(p, q), with D_TV = sum_v max(0, q(v) - p(v)) over the tempered q and p.

    q_raw, p_raw, q, p: [B, K, V] -> [B, K] bool
    """
    confidence = q_raw.max(dim=-1).values
    if rule == "chow":
        return confidence < 1.0 - alpha
    if rule == "diff":
        return confidence < p_raw.max(dim=-1).values - alpha
    if rule == "opt":
        distance = (q - p).clamp(min=0.0).sum(dim=-1)
        return confidence < p_raw.max(dim=-1).values - alpha * distance
    raise ValueError(f"deferral must be one of chow, diff, opt, got {rule!r}")


def cascade_target(q: torch.Tensor, p: torch.Tensor, defer: torch.Tensor) -> torch.Tensor:
    """The cascade's target pi_t = (1 - r_t) q_t + r_t p_t.  q, p: [B, K, V], defer: [B, K] -> [B, K, V]"""
    return torch.where(defer[..., None], p, q)


def greedy_cascade_verify(drafts: torch.Tensor, num_drafts: torch.Tensor, defer: torch.Tensor,
                          large_choice: torch.Tensor) -> Verdict:
    """A greedy cascade: q and p one-hot at their argmax, so a draft is kept where the rule does not
    defer, or where it is the large model's own choice; else argmax p replaces it. After a window
    kept whole, the large model's choice follows (as in speculative decoding).

    drafts [B, K], num_drafts [B], defer [B, K], large_choice [B, K+1]
    """
    width = drafts.shape[1]
    replaced = defer & (drafts != large_choice[:, :width]) & _draft_slots(num_drafts, width)
    accepted = _first_true(replaced, default=num_drafts)
    next_token = large_choice.gather(1, accepted[:, None]).squeeze(1)
    return Verdict(accepted=accepted, next_token=next_token, rejected=replaced.any(dim=1))


def cascade_verify(rule: str, alpha: float, drafts: torch.Tensor, num_drafts: torch.Tensor, small_logits: torch.Tensor,
                   large_logits: torch.Tensor, draft_probs: torch.Tensor, large_probs: torch.Tensor,
                   sampler: RowSampler | None) -> Verdict:
    """A speculative cascade's verification: each drafted position's deferral decision (from the
    untempered distributions), then the target (1 - r) q + r p verified as speculative sampling
    verifies p (greedy without a sampler: greedy_cascade_verify). ``deferred`` counts the drafted
    positions that deferred.

    drafts [B, K], num_drafts [B], small_logits [B, K, V] (zeros past the drafts), large_logits
    [B, K+1, V], draft_probs q and large_probs p (tempered when sampling) [B, K, V] and [B, K+1, V]
    """
    width = drafts.shape[1]
    drafted = _draft_slots(num_drafts, width)
    defer = deferral(rule, alpha, to_probs(small_logits), to_probs(large_logits[:, :width]), draft_probs,
                     large_probs[:, :width]) & drafted
    if sampler is None:
        verdict = greedy_cascade_verify(drafts, num_drafts, defer, large_logits.argmax(dim=-1))
    else:
        # Past a row's drafts the target is p: the slot after its last draft gives the last token.
        target = torch.cat([cascade_target(draft_probs, large_probs[:, :width], defer | ~drafted),
                            large_probs[:, width:]], dim=1)
        verdict = target_verify(drafts, num_drafts, draft_probs, target, sampler)
    return Verdict(accepted=verdict.accepted, next_token=verdict.next_token, rejected=verdict.rejected,
                   deferred=defer.sum(dim=1))


def acceptance(q_of_draft: torch.Tensor, target_of_draft: torch.Tensor, lenience: float = 0.0) -> torch.Tensor:
    """The probability of keeping a draft x: min(1, pi(x) / ((1 - lambda) q(x))) (lambda: lenience)."""
    return (target_of_draft / ((1.0 - lenience) * q_of_draft)).clamp(max=1.0)


def residual(target: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where the token after a rejected draft is drawn from: norm(max(0, pi - q)) over the last axis
    (pi itself where pi <= q everywhere, which a rejection then cannot reach)."""
    excess = (target - q).clamp(min=0.0)
    mass = excess.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, excess / mass.clamp(min=1e-30), target)


def target_verify(
    drafts: torch.Tensor,
    num_drafts: torch.Tensor,
    draft_probs: torch.Tensor,
    targets: torch.Tensor,
    sampler: RowSampler,
    lenience: float = 0.0,
) -> Verdict:
    """The one verification of drafts against a target distribution per position.

    Keep d_i with probability ``acceptance`` (u (1 - lambda) q(d_i) < pi(d_i), written without the
    division; a draft with pi = 0 is always rejected). At the first rejection, sample the replacement
    from ``residual``(pi, q); if every draft is kept, sample from the target at the slot after the
    row's last draft (the large model's p there: nothing was drafted). Speculative sampling (pi = p,
    lambda = 0) is exact for p; a cascade passes its mixture; lossy speculative sampling lambda > 0.

    drafts [B, K], num_drafts [B], draft_probs q [B, K, V], targets pi [B, K+1, V]
    """
    batch, width = drafts.shape
    q_of_draft = draft_probs.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)  # [B, K]
    target_of_draft = targets[:, :width].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)  # [B, K]
    u = sampler.uniform(num_drafts, width, device=drafts.device)
    reject = ~(u * (1.0 - lenience) * q_of_draft < target_of_draft) & _draft_slots(num_drafts, width)
    accepted = _first_true(reject, default=num_drafts)
    rejected = reject.any(dim=1)

    rows = torch.arange(batch, device=drafts.device)
    target_next = targets[rows, accepted]  # [B, V]
    q_padded = torch.cat([draft_probs, draft_probs.new_zeros((batch, 1, targets.shape[-1]))], dim=1)  # [B, K+1, V]
    q_next = torch.where(rejected[:, None], q_padded[rows, accepted], torch.zeros_like(target_next))
    next_token = sampler.categorical(residual(target_next, q_next))
    return Verdict(accepted=accepted, next_token=next_token, rejected=rejected)


def speculative_verify(
    drafts: torch.Tensor,
    num_drafts: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    sampler: RowSampler,
    lenience: float = 0.0,
) -> Verdict:
    """Speculative sampling's acceptance rule (Leviathan et al. 2023, Chen et al. 2023): target_verify
    with the large model's p as the target. Accept d_i with probability min(1, p(d_i) / q(d_i)); at
    the first rejection sample from norm(max(0, p - q)); after a window kept whole, from p. The
    result is distributed exactly as p, whatever q is (lenience 0).

    drafts [B, K], num_drafts [B], draft_probs q [B, K, V], target_probs p [B, K+1, V]
    """
    return target_verify(drafts, num_drafts, draft_probs, target_probs, sampler, lenience)


def judge(config, drafts: torch.Tensor, num_drafts: torch.Tensor, logits: torch.Tensor,
          draft_probs: list[list[torch.Tensor]], draft_logits: list[list[torch.Tensor]],
          sampler: RowSampler | None) -> Verdict:
    """The verdict of ``config.method``'s policy on a batch of waiting rows: drafts [R, K] (num_drafts [R] of
    them real), the large model's logits [R, K+1, V], and each row's per-draft q and small-model logits as
    the scheduler kept them (sampling and cascades read them)."""
    drafts, num_drafts = drafts.to(logits.device), num_drafts.to(logits.device)  # the token buffer is on the CPU
    if config.method == "speculative" and not config.do_sample:
        return greedy_match_verify(drafts, num_drafts, greedy(logits))
    large_probs = model_probs(config, logits)  # [R, K+1, V] (tempered when sampling)
    if config.method == "cascade":  # deferral decisions from untempered q and p (cascade_verify)
        small_logits = per_draft(draft_logits, logits[:, :-1])
        q = (per_draft(draft_probs, large_probs[:, :-1]) if sampler
             else model_probs(config, small_logits))  # sampling: the very q each draft was drawn from
        return cascade_verify(config.deferral, config.deferral_threshold, drafts, num_drafts, small_logits, logits,
                              q, large_probs, sampler)
    if config.method == "speculative":
        return speculative_verify(drafts, num_drafts, per_draft(draft_probs, large_probs[:, :-1]), large_probs,
                                  sampler, config.lenience)
    large_choice = choose(large_probs, config.do_sample, sampler, counts=num_drafts + 1)
    return bild_verify(drafts, num_drafts, large_probs, large_choice, config.rollback_threshold)


def per_draft(per_row: list[list[torch.Tensor]], like: torch.Tensor) -> torch.Tensor:
    """[R, K, V] shaped as ``like``: each row's per-draft vectors (q or logits), zeros past its drafts."""
    stacked = torch.zeros_like(like)
    for i, values in enumerate(per_row):
        if values:
            stacked[i, : len(values)] = torch.stack(values)
    return stacked


def model_probs(config, logits: torch.Tensor) -> torch.Tensor:
    """The model's distribution, tempered and top-p cut when the config samples."""
    return to_probs(logits, config.temperature, config.top_p) if config.do_sample else to_probs(logits)
