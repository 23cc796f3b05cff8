"""The tiny-model families the decoding invariants run on, and which of them `make test-fast` runs.

`make test` runs every family. `make test-fast` runs one model down each engine path: T5 on the native
engine, BART on Hugging Face's encoder-decoder path, GPT-2 on its decoder-only path. Marian is BART's
path again and Llama GPT-2's, so the quick loop skips them and the full suite still proves them.
"""

from __future__ import annotations

import pytest

FAMILIES = ("t5", "bart", "marian", "gpt2", "llama")
FAST_FAMILIES = ("t5", "bart", "gpt2")


def families(names=FAMILIES) -> list:
    """``names`` as a parametrize list, those outside FAST_FAMILIES marked slow."""
    return [name if name in FAST_FAMILIES else pytest.param(name, marks=pytest.mark.slow) for name in names]


def slow_unless(cases, fast) -> list:
    """Tuples of parameters for parametrize, those not in ``fast`` marked slow."""
    return [case if case in fast else pytest.param(*case, marks=pytest.mark.slow) for case in cases]
