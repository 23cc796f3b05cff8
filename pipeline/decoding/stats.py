"""What decoding one record produced: its tokens and its per-record counters (DESIGN.md §2)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


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
    seconds: float = 0.0  # the record's time in the scheduler, from joining to leaving
