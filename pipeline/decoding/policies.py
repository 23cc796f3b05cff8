"""The decision rules of BiLD and speculative decoding, as pure functions over batched tensors.

Shapes: B rows, K draft slots (the widest window in the batch), V vocabulary entries.
A row's drafts occupy slots [0, num_drafts[b]); slots beyond are padding and are ignored.
The large model's distributions have K + 1 positions: one per draft, and one after the last.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.decoding.sampling import RowSampler


@dataclass(frozen=True)
class Verdict:
    """What one verification decides for each row."""

    accepted: torch.Tensor  # [B] long: drafts kept, a prefix of the row's drafts
    next_token: torch.Tensor  # [B] long: the large model's token for slot `accepted`
    rejected: torch.Tensor  # [B] bool: a draft was replaced (a rollback / a rejection)


def fallback(small_probs: torch.Tensor, fallback_threshold: float) -> torch.Tensor:
    """BiLD's fallback policy: the small model is unsure when max pS < alpha_FB.

    small_probs: [B, V] -> [B] bool
    """
    return small_probs.max(dim=-1).values < fallback_threshold


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
    """BiLD's rollback policy (DESIGN.md §1, step 2).

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
    """Greedy speculative decoding: keep drafts while d_i == argmax pL, then take argmax pL.

    drafts [B, K], num_drafts [B], large_choice [B, K+1] (the large model's argmax per slot)
    """
    width = drafts.shape[1]
    mismatch = (drafts != large_choice[:, :width]) & _draft_slots(num_drafts, width)
    accepted = _first_true(mismatch, default=num_drafts)
    next_token = large_choice.gather(1, accepted[:, None]).squeeze(1)
    return Verdict(accepted=accepted, next_token=next_token, rejected=mismatch.any(dim=1))


def speculative_verify(
    drafts: torch.Tensor,
    num_drafts: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    sampler: RowSampler,
) -> Verdict:
    """Speculative sampling's acceptance rule (Leviathan et al. 2023, Chen et al. 2023).

    Accept d_i with probability min(1, p(d_i) / q(d_i)). At the first rejection, sample the
    replacement from norm(max(0, p - q)); if every draft is accepted, sample a bonus token from p.
    The result is distributed exactly as p, whatever q is.

    drafts [B, K], num_drafts [B], draft_probs q [B, K, V], target_probs p [B, K+1, V]
    """
    batch, width = drafts.shape
    q_of_draft = draft_probs.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)  # [B, K]
    p_of_draft = target_probs[:, :width].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)  # [B, K]
    u = sampler.uniform(num_drafts, width, device=drafts.device)
    # u < p/q, written without the division; a draft with p = 0 is always rejected.
    reject = ~(u * q_of_draft < p_of_draft) & _draft_slots(num_drafts, width)
    accepted = _first_true(reject, default=num_drafts)
    rejected = reject.any(dim=1)

    rows = torch.arange(batch, device=drafts.device)
    p_next = target_probs[rows, accepted]  # [B, V]
    q_padded = torch.cat([draft_probs, draft_probs.new_zeros((batch, 1, target_probs.shape[-1]))], dim=1)  # [B, K+1, V]
    q_next = torch.where(rejected[:, None], q_padded[rows, accepted], torch.zeros_like(p_next))
    residual = (p_next - q_next).clamp(min=0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    # p == q gives no residual mass; a rejection then has probability 0, so this is only a guard.
    next_dist = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_next)
    next_token = sampler.categorical(next_dist)
    return Verdict(accepted=accepted, next_token=next_token, rejected=rejected)
