"""What decoding one record produced: its tokens and its per-record counters (docs/design.md §2),
and the BiLD rates read from them — defined here once for records, runs and benchmarks alike —
and the record's outcome as its output row's columns (GenerationResult). Torch-free: a job's driver
reads these without loading a model library."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields

import numpy as np


@dataclass
class DecodeStats:
    """Per-record counters; names are docs/design.md §2 columns (plus draft_tokens). Added together
    (``a + b``, ``DecodeStats.total(...)``) they are a run's counters, and the rates below read
    the same either way."""

    output_tokens: int = 0
    small_tokens: int = 0  # final-output tokens written by the small model
    large_tokens: int = 0  # final-output tokens written by the large model
    fallbacks: int = 0
    rollbacks: int = 0  # verifications that rejected at least one draft
    small_calls: int = 0
    large_calls: int = 0
    draft_tokens: int = 0  # small-model tokens sent for verification (kept or discarded)
    deferrals: int = 0  # cascade: drafted positions its deferral rule sent to the large model
    plain_steps: int = 0  # large-model steps taken without drafting (a window of 0: decoding.adaptive_draft)

    def count_plain_step(self, by_large: bool) -> None:
        """A token from one step of one model, without drafting."""
        if by_large:
            self.large_tokens += 1
            self.large_calls += 1
        else:
            self.small_tokens += 1
            self.small_calls += 1

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def __add__(self, other: DecodeStats) -> DecodeStats:
        return DecodeStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    @classmethod
    def total(cls, stats: Iterable[DecodeStats]) -> DecodeStats:
        return sum(stats, cls())

    @classmethod
    def from_sums(cls, sums: dict[str, int]) -> DecodeStats:
        """Counters from summed output columns; a column not given counts 0."""
        return cls(**{f.name: int(sums.get(f.name, 0)) for f in fields(cls)})

    @classmethod
    def per_record(cls, columns) -> DecodeStats:
        """Every record's counters at once, as arrays (``columns``: name -> column of a table, e.g. a
        pyarrow Table); the rates below then read per record too. A column not given counts 0."""
        present = {f.name: np.asarray(columns[f.name], float) for f in fields(cls) if f.name in columns}
        rows = len(next(iter(present.values()))) if present else 0
        return cls(**{f.name: present.get(f.name, np.zeros(rows)) for f in fields(cls)})

    # Rates per output token; 0 when nothing was generated (record by record for per_record's arrays).
    def _per_token(self, count):
        if np.ndim(self.output_tokens):
            tokens = np.asarray(self.output_tokens, float)
            return np.divide(count, tokens, out=np.zeros_like(tokens), where=tokens > 0)
        return count / self.output_tokens if self.output_tokens else 0.0

    @property
    def small_token_share(self) -> float:
        return self._per_token(self.small_tokens)

    @property
    def fallbacks_per_100_tokens(self) -> float:
        return 100.0 * self._per_token(self.fallbacks)

    @property
    def rollbacks_per_100_tokens(self) -> float:
        return 100.0 * self._per_token(self.rollbacks)

    @property
    def small_calls_per_token(self) -> float:
        return self._per_token(self.small_calls)

    @property
    def large_calls_per_token(self) -> float:
        return self._per_token(self.large_calls)

    @property
    def plain_step_share(self) -> float:
        """Share of the large model's calls made without drafting (a window of 0: decoding.adaptive_draft)."""
        if np.ndim(self.large_calls):
            calls = np.asarray(self.large_calls, float)
            return np.divide(self.plain_steps, calls, out=np.zeros_like(calls), where=calls > 0)
        return self.plain_steps / self.large_calls if self.large_calls else 0.0

    @property
    def discarded_draft_tokens(self) -> int:
        """Drafts the large model rejected (or that a rollback dropped): sent, never kept."""
        return self.draft_tokens - self.small_tokens

    @property
    def discarded_per_100_tokens(self) -> float:
        return 100.0 * self._per_token(self.discarded_draft_tokens)

    @property
    def draft_acceptance(self) -> float | None:
        """Share of the drafts sent for verification that were kept; None without drafts."""
        return self.small_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def deferral_share(self) -> float | None:
        """Share of the drafts sent for verification whose deferral rule deferred (cascade); None without
        drafts (NaN for per_record's records without drafts)."""
        if np.ndim(self.draft_tokens):
            drafts = np.asarray(self.draft_tokens, float)
            return np.divide(self.deferrals, drafts, out=np.full_like(drafts, np.nan), where=drafts > 0)
        return self.deferrals / self.draft_tokens if self.draft_tokens else None


@dataclass
class DecodeOutput:
    tokens: list[int]  # generated ids, EOS included when generated; no prompt, no start token
    stats: DecodeStats = field(default_factory=DecodeStats)
    seconds: float = 0.0  # the record's time in the scheduler, from joining to leaving


@dataclass
class GenerationResult:
    """One record's outcome. ``to_record()`` gives the docs/design.md §2 columns it owns."""

    prediction: str | None
    error: str | None
    method: str
    input_tokens: int = 0
    truncated: bool = False
    latency_ms: float = 0.0
    stats: DecodeStats = field(default_factory=DecodeStats)
    token_ids: list[int] = field(default_factory=list)
    # The row's flags (output_flags, unknown_token_count); None where they cannot be known (an error row:
    # no output; unknown_tokens also without an encoded input).
    stopped_by_budget: bool | None = None
    repetition: bool | None = None
    unknown_tokens: int | None = None

    def to_record(self) -> dict:
        return {
            "prediction": self.prediction,
            "error": self.error,
            "method": self.method,
            "input_tokens": self.input_tokens,
            "truncated": self.truncated,
            **self.stats.to_dict(),
            "latency_ms": self.latency_ms,
            "stopped_by_budget": self.stopped_by_budget,
            "repetition": self.repetition,
            "unknown_tokens": self.unknown_tokens,
        }
