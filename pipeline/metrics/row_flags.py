"""The row flags (docs/design.md §2): what a reader of the output should look at, decided from the row's own
tokens and text (``stopped_by_budget``, ``repetition``, ``unknown_tokens``)."""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence

# The tail of an output loops when its last n tokens, or its last n words, n = 1 .. REPEAT_UNIT, are
# repeated at least REPEAT_TIMES times in a row ("... being being being"); a unit without a letter or
# digit ("!", "...") must be repeated REPEAT_TIMES_SYMBOLS times, so that "Wow!!!" is writing, not a loop.
REPEAT_UNIT = 4
REPEAT_TIMES = 3
REPEAT_TIMES_SYMBOLS = 6


def ends_in_repeats(items: Sequence, longest: int = REPEAT_UNIT, times: int = REPEAT_TIMES) -> list | None:
    """The shortest unit of 1 .. ``longest`` items that ``items`` ends with ``times`` times in a row
    (or more), else None."""
    items = list(items)
    for n in range(1, longest + 1):
        if len(items) < n * times:
            return None
        unit = items[-n:]
        if all(items[len(items) - (k + 1) * n: len(items) - k * n] == unit for k in range(1, times)):
            return unit
    return None


def _loops(items: Sequence, text_of: Callable[[list], str]) -> bool:
    """Whether ``items`` ends in a loop: a unit with a letter or digit REPEAT_TIMES times, or any
    unit REPEAT_TIMES_SYMBOLS times."""
    unit = ends_in_repeats(items)
    if unit is None:
        return False
    return any(ch.isalnum() for ch in text_of(unit)) or ends_in_repeats(items, times=REPEAT_TIMES_SYMBOLS) is not None


def is_repetition(tokens: Sequence[int], prediction: str | None, eos_ids, decode: Callable[[list[int]], str]) -> bool:
    """The ``repetition`` column: the output's tail loops, in its tokens (a trailing EOS left out) or in
    the words of its text (split on whitespace, punctuation around each stripped)."""
    body = list(tokens)
    if body and body[-1] in eos_ids:
        body.pop()
    if _loops(body, decode):
        return True
    words = [word for word in (word.strip(string.punctuation) for word in (prediction or "").split()) if word]
    return _loops(words, " ".join)


def is_stopped_by_budget(tokens: Sequence[int], max_new_tokens: int, eos_ids) -> bool:
    """The ``stopped_by_budget`` column: the output reached max_new_tokens without ending on EOS (cut off)."""
    return len(tokens) >= max_new_tokens and not (len(tokens) and tokens[-1] in eos_ids)


def unknown_token_count(input_ids: Sequence[int], tokenizer) -> int:
    """The ``unknown_tokens`` column: source tokens that are the tokenizer's unknown token (text it has
    no token for, e.g. "€" in a vocabulary without it). 0 for a tokenizer without one, or whose
    "unknown" token is also its BOS, EOS or padding (GPT-2's <|endoftext|>: it marks no unknown text)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    others = {getattr(tokenizer, name, None) for name in ("bos_token_id", "eos_token_id", "pad_token_id")}
    if unk is None or unk in others:
        return 0
    return sum(1 for token in input_ids if int(token) == unk)


def output_flags(tokens: Sequence[int], prediction: str | None, *, max_new_tokens: int, eos_ids, tokenizer) -> dict:
    """A decoded row's ``stopped_by_budget`` and ``repetition``."""
    return {"stopped_by_budget": is_stopped_by_budget(tokens, max_new_tokens, eos_ids),
            "repetition": is_repetition(tokens, prediction, eos_ids,
                                        lambda unit: tokenizer.decode(unit, skip_special_tokens=True))}
