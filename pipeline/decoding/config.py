"""Decoding settings, each written once: which models run (ModelSpec), which method with which thresholds
(DecodingConfig, docs/design.md §1), how a batch is scheduled (BatchPolicy)."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.decoding import rules
from pipeline.decoding.engines.registry import engines_help
from pipeline.decoding.names import (DEFERRALS, DRAFT_WINDOWS, DRAFTING_METHODS, DTYPE_NAMES, ENGINES, METHODS,
                                     PLAIN_METHODS, QUANTIZE_NAMES, Deferral, DraftWindow, DType, EngineName,
                                     Method, Quantize)

__all__ = ["BatchPolicy", "BatchRequest", "DecodingConfig", "ModelSpec", "TokenBudget", "CACHE_ROOT",  # and the
           "DEFERRALS", "DRAFT_WINDOWS", "DRAFTING_METHODS", "DTYPE_NAMES", "ENGINES", "METHODS",  # names it is
           "PLAIN_METHODS", "QUANTIZE_NAMES", "Method"]  # written in (names.py), for its readers
from pipeline.decoding.settings import check_settings, setting, setting_problems

if TYPE_CHECKING:
    import torch

# What the pipeline keeps between runs on one machine (converted checkpoints, model fingerprints).
CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bild-pipeline"

# Each section's settings below are written once, with setting() (settings.py): the job file's sections and
# the CLI's options are derived from these fields; which settings go together is rules.py's.


@dataclass(frozen=True)
class ModelSpec:
    """Which model pair to load and how: the job file's ``models:`` section, the CLI's model options and what
    the decoding stage hands to ``ModelPair.from_spec``."""

    small: str = setting(help="Small (drafting) model: hub id or local folder.")
    large: str = setting(help="Large (verifying) model: hub id or local folder.")
    tokenizer: str | None = setting(None, "Tokenizer (default: the large model's).")
    dtype: DType = setting("float32", "The models' weights and compute type (auto: bfloat16 on a GPU that has "
                                      "it, else float32).")
    device: str = setting("auto", "auto, cpu, cuda, cuda:1 ...")
    trust_remote_code: bool = setting(False, "Allow model code from the hub.", flag="--trust-remote-code")
    engine: EngineName = setting("auto", engines_help())
    quantize: Quantize = setting(
        "none", "int8: both models' linear layers and output heads in int8 (per-channel weights, per-row "
                "activations) where it pays; the native and onnx engines on a CPU in float32; CTranslate2's int8 "
                "compute type with engine ct2 (int8_float16 on a GPU).")
    ct2_cache: str | None = setting(
        None, "engine ct2: the local folder of converted checkpoints, one per checkpoint content hash (default "
              "~/.cache/bild-pipeline/ct2).", option=False)

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True)
class TokenBudget:
    """``max_new_tokens`` that follows the input: a unit of ``n`` input tokens (a record, or one sentence of it
    with input.segment: sentence; ``n`` counted as the input_tokens column does, after truncation, prompt
    included) may generate ``min(cap, ceil(ratio * n) + extra)`` tokens, EOS included; no cap: the ratio alone
    (n is at most max_input_tokens)."""

    ratio: float = setting(help="Tokens the output may have per input token.", gt=0.0)
    extra: int = setting(0, "Tokens added to ratio x input tokens (short inputs, EOS).", ge=0)
    cap: int | None = setting(None, "The most any unit may generate (default: no cap but the ratio of "
                                    "max_input_tokens).", ge=1)

    def __post_init__(self) -> None:
        problems = [f"max_new_tokens.{problem}" for problem in setting_problems(self)]
        if problems:
            raise ValueError("; ".join(problems))

    def tokens(self, input_tokens: int) -> int:
        """The budget of a unit of ``input_tokens`` input tokens: at least 1."""
        budget = math.ceil(self.ratio * input_tokens - 1e-9) + self.extra  # 1.5 * 4 is 6, not 7 from 6.000001
        return max(1, budget if self.cap is None else min(self.cap, budget))


@dataclass(frozen=True)
class DecodingConfig:
    """Everything that decides how one record is decoded: the job file's ``decoding:`` section."""

    method: Method = setting("bild", "bild, speculative, cascade (the small model drafts, the large one verifies), "
                                     "or large or small alone.")
    # BiLD paper defaults (arXiv 2302.07863, §4): alpha_FB = 0.4 ... 0.6, alpha_RB = 2 ... 5.
    fallback_threshold: float = setting(
        0.4, "alpha_FB: the small model falls back when its top probability is below this.", ge=0.0, le=1.0)
    rollback_threshold: float = setting(
        3.0, "alpha_RB: a draft with -log pL above this (and not the large model's choice) rolls back.", ge=0.0)
    max_draft_tokens: int = setting(
        10, "The draft window: BiLD's cap on small-model tokens between two large-model calls, and speculative "
            "decoding's k.", ge=1)
    draft_window: DraftWindow = setting(
        "fixed", "speculative and cascade: fixed drafts exactly k tokens; fallback stops early, as BiLD does, when "
                 "the small model's confidence falls below fallback_threshold (lossless either way).")
    # On by default, so that a drafting method is never slower than `large` on the machine it runs on
    # (docs/design.md, "How many drafts"). Greedy speculative and BiLD with alpha_RB = 0 return the large
    # model's tokens whatever the windows.
    adaptive_draft: bool = setting(
        True, "Choose each round's draft window (0 included: a plain large step) from measured costs and "
              "acceptance, at most max_draft_tokens (the default: never slower than large). Lossy methods and "
              "sampled rows then follow the windows chosen; false: always max_draft_tokens, so that they repeat "
              "exactly run to run.")
    deferral: Deferral = setting("chow", "cascade: the rule that defers a drafted position to the large model "
                                         "(chow, diff, opt; docs/decoding.md).")
    deferral_threshold: float = setting(
        0.1, "cascade: the rule's alpha (chow: [0, 1], diff: [-1, 1], opt: >= 0); a higher alpha defers less.")
    lenience: float = setting(0.0, "speculative: lossy speculative sampling's lambda (0: lossless; Leviathan et "
                                   "al., A.5).", ge=0.0, lt=1.0)
    max_input_tokens: int = setting(512, "Input tokens a unit keeps (longer inputs are truncated).", ge=1)
    max_new_tokens: int | TokenBudget = setting(
        128, "Tokens a unit (a record, or a sentence with input.segment: sentence) may generate, EOS included: a "
             "number, or {ratio: R, extra: E, cap: C} for min(C, ceil(R x input tokens) + E), its input tokens "
             "counted after truncation, the prompt included (the input_tokens column).", ge=1)
    do_sample: bool = setting(False, "Sample (with temperature and top_p) instead of decoding greedily.",
                              flag="--do-sample/--greedy")
    temperature: float = setting(1.0, "Sampling temperature (use do_sample: false for greedy).", gt=0.0)
    top_p: float = setting(1.0, "Nucleus sampling's top-p.", gt=0.0, le=1.0)
    seed: int = setting(0, "The base of each record's seed (stage.record_seed).")

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, dict):  # as asdict() and a job file write it
            object.__setattr__(self, "max_new_tokens", TokenBudget(**self.max_new_tokens))
        check_settings(self, *rules.decoding_problems(self))

    @property
    def measures_windows(self) -> bool:
        """Whether each round's draft window is measured (adaptive_draft on a drafting method): a window chooser
        (draft_length.DraftLength) runs."""
        return self.adaptive_draft and self.method in DRAFTING_METHODS

    def budget(self, input_tokens: int) -> int:
        """The most tokens a unit of ``input_tokens`` input tokens may generate (max_new_tokens)."""
        if isinstance(self.max_new_tokens, TokenBudget):
            return self.max_new_tokens.tokens(input_tokens)
        return self.max_new_tokens

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class BatchPolicy:
    """How a batch is scheduled (the job file's compute: batching keys); it changes speed only, never a row's
    tokens or statistics."""

    batch_size: int = setting(
        8, "Records an actor decodes together (continuous batching, each with its own fallbacks and rollbacks); "
           "1 decodes record by record.", ge=1)
    # 1.0 (every row waits) gave the most tokens/s at B=4 and B=16 in BENCHMARKS.md.
    verify_share: float = setting(
        1.0, "Batched bild/speculative: call the large model once this share of the batch waits for it (1.0, "
             "measured fastest in BENCHMARKS.md: once every row waits).", gt=0.0, le=1.0)
    refill_share: float = setting(
        0.25, "Admit queued records once this share of the batch's slots is free (always when it is empty): "
              "newcomers then share one encoder pass.", gt=0.0, le=1.0)

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass
class BatchRequest:
    """One record to decode: its encoder input (or decoder-only prompt) ids and its seed."""

    input_ids: torch.Tensor  # [S]
    seed: int = 0
    max_new_tokens: int | None = None  # a smaller budget of its own (an inline element's text: io/markup.py)

    def budget(self, config: DecodingConfig) -> int:
        """The most tokens it may generate: the config's budget of its input, or its own where smaller."""
        budget = config.budget(len(self.input_ids))
        return budget if self.max_new_tokens is None else max(1, min(budget, self.max_new_tokens))
