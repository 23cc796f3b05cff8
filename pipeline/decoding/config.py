"""Decoding settings: which models run (ModelSpec), and which method with which thresholds
(DecodingConfig, DESIGN.md §1)."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    import torch

# What the pipeline keeps between runs on one machine (converted checkpoints, model fingerprints).
CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bild-pipeline"

Method = Literal["bild", "speculative", "cascade", "large", "small"]
DraftWindow = Literal["fixed", "fallback"]
METHODS: tuple[str, ...] = get_args(Method)
# Speculative cascades' deferral rules (policies.deferral; Narasimhan et al., ICLR 2025).
DEFERRALS: tuple[str, ...] = ("chow", "diff", "opt")
DRAFT_WINDOWS: tuple[str, ...] = ("fixed", "fallback")
# Which engine runs a pair's models (engine.py): auto/native take the native one where it exists; onnx
# runs the native engine's decoder step as one onnxruntime call (engines/onnx_engine.py; CPU, float32 or int8).
PAIR_ENGINES: tuple[str, ...] = ("auto", "native", "hf", "onnx")
# A job may also run one model alone on CTranslate2 (engines/ct2_engine.py: methods large and small only).
ENGINES: tuple[str, ...] = (*PAIR_ENGINES, "ct2")
PLAIN_METHODS: tuple[str, ...] = ("large", "small")  # one model decodes alone: what ct2 runs
DRAFTING_METHODS: tuple[str, ...] = ("bild", "speculative", "cascade")  # the small model drafts, the large verifies
DTYPE_NAMES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16", "float64")
# Weights as the native engines multiply by them on a CPU: as loaded, or int8 where it pays (engines/int8.py).
QUANTIZE_NAMES: tuple[str, ...] = ("none", "int8")


# A sampled record must depend on its id and seed alone; CTranslate2's sampling does not follow
# ctranslate2.set_random_seed (OpenNMT/CTranslate2#1757, seen here too), so ct2 decodes greedily only.
CT2_SAMPLING_UNSUPPORTED = (
    "decoding.do_sample with models.engine ct2: CTranslate2's sampling does not follow a seed "
    "(OpenNMT/CTranslate2#1757), so a record's output would not be reproducible; decode greedily or sample on "
    "our own engine")


# --- which settings go together: each rule once, in the words of the job file's keys ----------------------
# The job schema asks these of the settings as written (device "auto" may be the CPU); ModelPair and the
# CTranslate2 generator ask them again of what was resolved (the device found, the engine auto chose), for
# callers that skip the schema (the CLI's options, the Python API). The engines only assert.


def engine_problem(engine: str, quantize: str, device: str, dtype: str) -> str | None:
    """Why models.engine / quantize / device / dtype cannot run together (None: they can)."""
    off_cpu = device not in ("cpu", "auto")  # a GPU, mps...; auto may resolve to the CPU: asked again once resolved
    float32 = dtype in ("float32", "auto")
    if engine == "ct2":
        return "models.dtype float64 does not run on CTranslate2 (models.engine ct2)" if dtype == "float64" else None
    if engine == "onnx" and (off_cpu or not float32):
        return f"models.engine onnx runs on the CPU in float32; models.device is {device!r} and models.dtype {dtype!r}"
    if quantize == "int8":
        if engine == "hf":
            return "models.quantize int8 runs on the native or onnx engine; models.engine is 'hf'"
        if off_cpu or not float32:
            return (f"models.quantize int8 runs on the CPU in float32; models.device is {device!r} and "
                    f"models.dtype {dtype!r}")
    return None


def ct2_method_problem(methods, do_sample: bool = False, key: str = "decoding.method") -> str | None:
    """Why CTranslate2 cannot decode with ``methods`` (None: it can): it runs one model alone, greedily."""
    drafting = sorted(set(methods) - set(PLAIN_METHODS))
    if drafting:
        return (f"models.engine ct2 runs methods {' and '.join(PLAIN_METHODS)} only (CTranslate2's Python API "
                f"cannot cut a decoder cache back to verify drafts); {key} is {', '.join(map(repr, drafting))}")
    return CT2_SAMPLING_UNSUPPORTED if do_sample else None


@dataclass(frozen=True)
class ModelSpec:
    """Which model pair to load and how: the one description the job file's ``models:`` section,
    the CLI's model options and the decoding stage hand down to ``ModelPair.from_spec``."""

    small: str  # hub id or local folder
    large: str
    tokenizer: str | None = None  # None: the large model's
    dtype: str = "float32"  # one of DTYPE_NAMES
    device: str = "auto"  # auto, cpu, cuda, cuda:1 ...
    trust_remote_code: bool = False
    engine: str = "auto"  # one of ENGINES
    quantize: str = "none"  # one of QUANTIZE_NAMES
    ct2_cache: str | None = None  # engine ct2: where converted checkpoints are kept (None: ~/.cache/bild-pipeline/ct2)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.quantize not in QUANTIZE_NAMES:
            raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_NAMES)}, got {self.quantize!r}")


@dataclass(frozen=True)
class TokenBudget:
    """``max_new_tokens`` that follows the input: a unit of ``n`` input tokens (a record, or one sentence of it
    with input.segment: sentence; ``n`` counted as the input_tokens column does, after truncation, prompt
    included) may generate ``min(cap, ceil(ratio * n) + extra)`` tokens, EOS included; no cap: the ratio alone
    (n is at most max_input_tokens)."""

    ratio: float
    extra: int = 0
    cap: int | None = None

    def __post_init__(self) -> None:
        if not self.ratio > 0:
            raise ValueError(f"max_new_tokens.ratio must be > 0, got {self.ratio}")
        if self.extra < 0:
            raise ValueError(f"max_new_tokens.extra must be >= 0, got {self.extra}")
        if self.cap is not None and self.cap < 1:
            raise ValueError(f"max_new_tokens.cap must be >= 1, got {self.cap}")

    def tokens(self, input_tokens: int) -> int:
        """The budget of a unit of ``input_tokens`` input tokens: at least 1."""
        budget = math.ceil(self.ratio * input_tokens - 1e-9) + self.extra  # 1.5 * 4 is 6, not 7 from 6.000001
        return max(1, budget if self.cap is None else min(self.cap, budget))


@dataclass(frozen=True)
class DecodingConfig:
    """Everything that decides how one record is decoded.

    Field names match the job file's ``decoding:`` section, so a job maps onto this one to one.
    """

    method: Method = "bild"
    # BiLD paper defaults (arXiv 2302.07863, §4): alpha_FB = 0.4 ... 0.6, alpha_RB = 2 ... 5.
    fallback_threshold: float = 0.4
    rollback_threshold: float = 3.0
    # The draft window: BiLD's cap on small-model tokens between two large-model calls,
    # and speculative decoding's `k`.
    max_draft_tokens: int = 10
    # `speculative` only: "fixed" drafts exactly k tokens; "fallback" stops early, as BiLD does,
    # when the small model's confidence falls below fallback_threshold. Lossless either way.
    draft_window: DraftWindow = "fixed"
    # Each round's window from measured costs and acceptance, 0 (a plain `large` step) included, at most
    # max_draft_tokens (draft_length.py): on by default, so that a drafting method is never slower than `large`
    # on the machine it runs on (DESIGN.md §1, "How many drafts"). Greedy speculative and BiLD with alpha_RB = 0
    # return the large model's tokens whatever the windows; lossy settings (BiLD's rollback threshold, cascades,
    # lenience) and sampled rows keep their rules but follow the windows chosen, so they repeat exactly run to
    # run only with fixed windows (False: always max_draft_tokens).
    adaptive_draft: bool = True
    # `cascade` only: the rule that defers a drafted position to the large model, and its alpha.
    deferral: str = "chow"  # one of DEFERRALS
    deferral_threshold: float = 0.1
    # `speculative` only: lossy speculative sampling's lambda (0: lossless; Leviathan et al., A.5).
    lenience: float = 0.0
    max_input_tokens: int = 512
    # Tokens a unit may generate, EOS included: a number, or a TokenBudget that follows each unit's input (budget()).
    max_new_tokens: int | TokenBudget = 128
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if self.method not in METHODS:
            problems.append(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.draft_window not in DRAFT_WINDOWS:
            problems.append(f"draft_window must be one of {', '.join(DRAFT_WINDOWS)}, got {self.draft_window!r}")
        if self.deferral not in DEFERRALS:
            problems.append(f"deferral must be one of {', '.join(DEFERRALS)}, got {self.deferral!r}")
        low = {"chow": 0.0, "diff": -1.0, "opt": 0.0}.get(self.deferral, 0.0)
        high = float("inf") if self.deferral == "opt" else 1.0
        if not low <= self.deferral_threshold <= high:
            problems.append(f"deferral_threshold for {self.deferral} must lie in [{low:g}, {high:g}], "
                            f"got {self.deferral_threshold}")
        if not 0.0 <= self.lenience < 1.0:
            problems.append(f"lenience must lie in [0, 1), got {self.lenience}")
        if self.lenience and self.method != "speculative":
            problems.append(f"lenience is lossy speculative decoding's; method is {self.method!r}")
        if not 0.0 <= self.fallback_threshold <= 1.0:
            problems.append(f"fallback_threshold must lie in [0, 1], got {self.fallback_threshold}")
        if self.rollback_threshold < 0:
            problems.append(f"rollback_threshold must be >= 0, got {self.rollback_threshold}")
        if isinstance(self.max_new_tokens, dict):  # as asdict() and a job file write it
            object.__setattr__(self, "max_new_tokens", TokenBudget(**self.max_new_tokens))
        for name in ("max_draft_tokens", "max_input_tokens", "max_new_tokens"):
            if not isinstance(getattr(self, name), TokenBudget) and getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature <= 0:
            problems.append(f"temperature must be > 0, got {self.temperature} (use do_sample: false for greedy)")
        if not 0.0 < self.top_p <= 1.0:
            problems.append(f"top_p must lie in (0, 1], got {self.top_p}")
        if problems:
            raise ValueError("; ".join(problems))

    def budget(self, input_tokens: int) -> int:
        """The most tokens a unit of ``input_tokens`` input tokens may generate (max_new_tokens)."""
        if isinstance(self.max_new_tokens, TokenBudget):
            return self.max_new_tokens.tokens(input_tokens)
        return self.max_new_tokens

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class BatchPolicy:
    """How a batch is scheduled; it changes speed only, never a row's tokens or statistics."""

    batch_size: int = 16
    # Call the large model when this share of the active rows waits for verification. Lower
    # shares verify sooner (rows wait less), higher ones fill the large model's batch more; 1.0
    # (every row waits) gave the most tokens/s at B=4 and B=16 in BENCHMARKS.md.
    verify_share: float = 1.0
    # Admit queued records once this share of the slots is free (always when the batch is
    # empty): newcomers then share one encoder pass.
    refill_share: float = 0.25

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        for name in ("verify_share", "refill_share"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in (0, 1], got {getattr(self, name)}")


@dataclass
class BatchRequest:
    """One record to decode: its encoder input (or decoder-only prompt) ids and its seed."""

    input_ids: torch.Tensor  # [S]
    seed: int = 0
