"""The names a setting may take (methods, deferral rules, draft windows, dtypes, quantize, engines): the
vocabulary config.py's settings and rules.py's rules are written in."""

from __future__ import annotations

from typing import Literal, get_args

from pipeline.decoding.engines.registry import ENGINES

Method = Literal["bild", "speculative", "cascade", "large", "small"]
METHODS: tuple[str, ...] = get_args(Method)
DraftWindow = Literal["fixed", "fallback"]
DRAFT_WINDOWS: tuple[str, ...] = get_args(DraftWindow)
# Speculative cascades' deferral rules (policies.deferral; Narasimhan et al., ICLR 2025).
Deferral = Literal["chow", "diff", "opt"]
DEFERRALS: tuple[str, ...] = get_args(Deferral)
# Which engine runs the models: engines/registry.py, one line per engine.
EngineName = Literal[ENGINES]
PLAIN_METHODS: tuple[str, ...] = ("large", "small")  # one model decodes alone: what a whole decoder (ct2) runs
DRAFTING_METHODS: tuple[str, ...] = ("bild", "speculative", "cascade")  # the small model drafts, the large verifies
DType = Literal["auto", "float32", "bfloat16", "float16", "float64"]
DTYPE_NAMES: tuple[str, ...] = get_args(DType)
# Weights as the native engines multiply by them on a CPU: as loaded, or int8 where it pays (engines/int8.py).
Quantize = Literal["none", "int8"]
QUANTIZE_NAMES: tuple[str, ...] = get_args(Quantize)
