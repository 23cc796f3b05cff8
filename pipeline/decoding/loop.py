"""The decode loops: plain autoregressive, BiLD, and speculative decoding (DESIGN.md §1).

Each loop works on one token buffer ``sequence`` [B, prefix + max_new_tokens] and two
``CachedDecoder``-like runners. A drafting round (small model) writes candidate tokens into the
buffer after the kept output; a verification round (large model) decides, through a policy
from ``policies.py``, how many of them stay and which large-model token follows. Both caches
are then cut back to the kept prefix. The loops count what they do in ``DecodeStats``.

The loops below run one sequence (B = 1); the policies, the sampler and the runners already take
a batch dimension so that a batched scheduler can drive them row by row.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol

import torch

from pipeline.decoding.config import DecodingConfig
from pipeline.decoding.policies import Verdict, bild_verify, fallback, greedy_match_verify, speculative_verify
from pipeline.decoding.sampling import RowSampler, choose, to_probs


class DecoderRunner(Protocol):
    """What a loop needs from a model (see runner.CachedDecoder)."""

    cached: int

    def forward(self, sequence: torch.Tensor) -> torch.Tensor: ...

    def rewind(self, keep: int) -> None: ...


@dataclass
class DecodeStats:
    """Per-record counters; names are DESIGN.md §2 columns (plus draft_tokens)."""

    output_tokens: int = 0
    small_tokens: int = 0  # final-output tokens written by the small model
    large_tokens: int = 0  # final-output tokens written by the large model
    fallbacks: int = 0
    rollbacks: int = 0  # verifications that rejected at least one draft
    small_calls: int = 0
    large_calls: int = 0
    draft_tokens: int = 0  # small-model tokens sent for verification (kept or discarded)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class DecodeOutput:
    tokens: list[int]  # generated ids, EOS included when generated; no prompt, no start token
    stats: DecodeStats = field(default_factory=DecodeStats)


def _is_eos(token: torch.Tensor, eos_ids: frozenset[int]) -> bool:
    return int(token) in eos_ids


def _next_probs(logits: torch.Tensor, config: DecodingConfig) -> torch.Tensor:
    """pS or pL for these logits: temperature and top-p only when sampling."""
    if config.do_sample:
        return to_probs(logits, config.temperature, config.top_p)
    return to_probs(logits)


def _new_buffer(prefix: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """[B, prefix + max_new_tokens] token buffer whose first positions hold the prefix."""
    batch, prefix_len = prefix.shape
    sequence = torch.zeros((batch, prefix_len + max_new_tokens), dtype=torch.long, device=prefix.device)
    sequence[:, :prefix_len] = prefix
    return sequence


# --- plain autoregressive decoding -------------------------------------------------------------


def decode_autoregressive(
    runner: DecoderRunner,
    prefix: torch.Tensor,
    config: DecodingConfig,
    eos_ids: frozenset[int],
    sampler: RowSampler | None,
    *,
    writer: str,
) -> DecodeOutput:
    """One model, one token per forward pass. ``writer`` is "small" or "large" (for the stats)."""
    sequence = _new_buffer(prefix, config.max_new_tokens)
    start = length = prefix.shape[1]
    while length - start < config.max_new_tokens:
        logits = runner.forward(sequence[:, :length])[:, -1]  # [1, V]
        if config.do_sample:
            token = choose(to_probs(logits, config.temperature, config.top_p), True, sampler)
        else:
            token = logits.argmax(dim=-1)
        sequence[:, length] = token
        length += 1
        if _is_eos(token, eos_ids):
            break
    produced = length - start
    stats = DecodeStats(output_tokens=produced)
    setattr(stats, f"{writer}_tokens", produced)
    setattr(stats, f"{writer}_calls", produced)
    return DecodeOutput(tokens=sequence[0, start:length].tolist(), stats=stats)


# --- drafting and verification -----------------------------------------------------------------


@dataclass
class Drafts:
    """What a drafting round proposes: the tokens sit in the sequence buffer after the kept output."""

    count: int
    probs: list[torch.Tensor]  # q for each draft, [1, V] each (kept only when sampling)
    ended_on_eos: bool


def draft(
    small: DecoderRunner,
    sequence: torch.Tensor,
    length: int,
    window: int,
    config: DecodingConfig,
    eos_ids: frozenset[int],
    sampler: RowSampler | None,
    stats: DecodeStats,
    use_fallback: bool,
) -> Drafts:
    """Let the small model write up to ``window`` tokens at sequence[:, length:].

    Stops early at EOS and, with ``use_fallback``, as soon as max pS < alpha_FB (that last
    prediction is discarded: the large model takes over).
    """
    count, probs_kept = 0, []
    while count < window:
        logits = small.forward(sequence[:, : length + count])[:, -1]  # [1, V]
        stats.small_calls += 1
        probs = _next_probs(logits, config)
        if use_fallback and bool(fallback(probs, config.fallback_threshold)):
            stats.fallbacks += 1
            break
        token = choose(probs, config.do_sample, sampler)
        sequence[:, length + count] = token
        count += 1
        if config.do_sample:
            probs_kept.append(probs)
        if _is_eos(token, eos_ids):
            return Drafts(count, probs_kept, ended_on_eos=True)
    return Drafts(count, probs_kept, ended_on_eos=False)


def verify(
    large: DecoderRunner,
    sequence: torch.Tensor,
    length: int,
    drafts: Drafts,
    config: DecodingConfig,
    sampler: RowSampler | None,
    stats: DecodeStats,
) -> Verdict:
    """One large-model pass over all pending drafts; the method's policy decides what stays."""
    k = drafts.count
    logits = large.forward(sequence[:, : length + k])[:, -(k + 1) :]  # [1, k+1, V]
    stats.large_calls += 1
    draft_tokens = sequence[:, length : length + k]  # [1, k]
    num_drafts = torch.full((1,), k, dtype=torch.long, device=sequence.device)
    if config.method == "speculative" and not config.do_sample:
        return greedy_match_verify(draft_tokens, num_drafts, logits.argmax(dim=-1))
    large_probs = _next_probs(logits, config)  # [1, k+1, V]
    if config.method == "speculative":
        draft_probs = torch.stack(drafts.probs, dim=1) if k else large_probs[:, :0]  # [1, k, V]
        return speculative_verify(draft_tokens, num_drafts, draft_probs, large_probs, sampler)
    large_choice = choose(large_probs, config.do_sample, sampler, counts=num_drafts + 1)
    return bild_verify(draft_tokens, num_drafts, large_probs, large_choice, config.rollback_threshold)


# --- BiLD and speculative decoding --------------------------------------------------------------


def decode_with_drafts(
    small: DecoderRunner,
    large: DecoderRunner,
    prefix: torch.Tensor,
    config: DecodingConfig,
    eos_ids: frozenset[int],
    sampler: RowSampler | None,
) -> DecodeOutput:
    """BiLD or speculative decoding, by config.method: draft, verify, keep, cut caches, repeat."""
    use_fallback = config.method == "bild" or config.draft_window == "fallback"
    sequence = _new_buffer(prefix, config.max_new_tokens)
    start = length = prefix.shape[1]
    stats = DecodeStats()
    finished = False
    while not finished and length - start < config.max_new_tokens:
        budget = config.max_new_tokens - (length - start)
        window = min(config.max_draft_tokens, budget)
        drafts = draft(small, sequence, length, window, config, eos_ids, sampler, stats, use_fallback)
        verdict = verify(large, sequence, length, drafts, config, sampler, stats)

        accepted = int(verdict.accepted[0])
        stats.draft_tokens += drafts.count
        stats.small_tokens += accepted
        stats.rollbacks += int(verdict.rejected[0])
        length += accepted  # kept drafts are already in the buffer
        # Both models may have read drafts past the kept prefix: drop those cache entries.
        small.rewind(length)
        large.rewind(length)

        if accepted == drafts.count and drafts.ended_on_eos:
            finished = True  # a kept EOS ends the sequence; nothing follows it
        elif length - start < config.max_new_tokens:
            sequence[:, length] = verdict.next_token
            length += 1
            stats.large_tokens += 1
            finished = _is_eos(verdict.next_token, eos_ids)

    stats.output_tokens = length - start
    return DecodeOutput(tokens=sequence[0, start:length].tolist(), stats=stats)
