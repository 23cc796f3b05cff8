"""Where a block's inline tags go in its translation (markup.py): each inline element wraps the target words that
best match its own text's translation, found as the same words in the sentence's translation (case and
punctuation aside), the occurrence nearest the element's place in the source; where its translation is not
there, its longest word; else the words at the element's relative place in the source. An element nested in
another stays inside the other's words; siblings never overlap (a later one that would is placed right after
the earlier one, empty rather than crossing). Every element is placed exactly once."""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

WORD = re.compile(r"\w+(?:['’-]\w+)*")  # words of a plain translated text (no markup is left in it)


@dataclass
class Span:
    """An inline element over a block's plain text: characters [start, end), its tags' exact text."""

    start: int
    end: int
    open: str
    close: str
    verbatim: bool = False  # its text is kept as it is (code, translate="no")
    inner_raw: str = ""  # verbatim: the exact source between its tags
    open_inside: int = 0  # verbatim, while read: its elements opened and not yet closed
    parent: int | None = None  # the span it sits in
    translation: str | None = None  # its own text's translation (None: not decoded, e.g. verbatim)


def _words(text: str) -> list[tuple[int, int, str]]:
    return [(m.start(), m.end(), m.group().lower().strip(string.punctuation)) for m in WORD.finditer(text)]


def _find(target_words, wanted: list[str], lo: int, hi: int, near: float) -> tuple[int, int] | None:
    """Word indices [i, j) in target_words[lo:hi] equal to ``wanted``, the occurrence nearest ``near``."""
    if not wanted:
        return None
    hits = [i for i in range(lo, hi - len(wanted) + 1)
            if [w for _, _, w in target_words[i:i + len(wanted)]] == wanted]
    if not hits:
        return None
    best = min(hits, key=lambda i: abs((i - lo) / max(1, hi - lo) - near))
    return best, best + len(wanted)


STEM = 4  # letters two words must share at least (and all but their last two) to count as one word's forms


def _find_stem(target_words, word: str, lo: int, hi: int, near: float) -> tuple[int, int] | None:
    """The word of target_words[lo:hi] that shares ``word``'s stem (its first letters), nearest ``near``."""
    if len(word) < STEM:
        return None
    hits = [i for i in range(lo, hi) if _same_stem(target_words[i][2], word)]
    if not hits:
        return None
    best = min(hits, key=lambda i: abs((i - lo) / max(1, hi - lo) - near))
    return best, best + 1


def _same_stem(a: str, b: str) -> bool:
    stem = max(STEM, min(len(a), len(b)) - 2)
    return len(a) >= STEM and len(b) >= STEM and a[:stem] == b[:stem]


def place_spans(source: str, target: str, spans: list[Span]) -> list[tuple[int, int]]:
    """Each span's [start, end) in ``target`` (character offsets), nested spans inside their parent's, no two
    siblings crossing. ``spans`` are in source order, parents before their children."""
    words = _words(target)
    placed: list[tuple[int, int]] = []  # word ranges
    exact: dict[int, tuple[int, int]] = {}  # a verbatim span found as it is: its character range
    for k, span in enumerate(spans):
        lo, hi = (0, len(words)) if span.parent is None else placed[span.parent]
        siblings = [placed[j] for j in range(k) if spans[j].parent == span.parent]
        if siblings:
            lo = max(lo, max(end for _, end in siblings))  # after the siblings placed so far: never crossing
        lo = min(lo, hi)
        near = span.start / max(1, len(source))
        if span.end == span.start:  # covers no text (an image, a lone inline tag): at its relative place
            at = _boundary(target, round(near * len(target)))
            exact[k] = (at, at)
            placed.append(_word_range(words, at, at, lo))
            continue
        if span.verbatim:  # its own text, copied by the model as it is (code, names): there exactly
            at = _find_text(target, source[span.start:span.end], words, lo, hi, near)
            if at is not None:
                exact[k] = at
                placed.append(_word_range(words, *at, lo))
                continue
        own = [w for _, _, w in _words(source[span.start:span.end])]
        wanted = [w for _, _, w in _words(span.translation)] if span.translation else own
        found = _find(words, wanted, lo, hi, near)
        # Else one word of it (a model may wrap a lone word in a sentence of its own: "Mann" -> "Many man.",
        # "Hut" -> "A hat hat is wearing a hat."), as it is or by its first letters (girls, girl), or one of the
        # source's own words (names and numbers pass through): of those found, words of three letters or more
        # before shorter ones, then the one nearest the element's place, then the most repeated in its translation.
        if found is None:
            hits = []
            for rank, candidate in enumerate(dict.fromkeys(wanted + own)):
                at = _find(words, [candidate], lo, hi, near) or _find_stem(words, candidate, lo, hi, near)
                if at is not None:
                    distance = abs((at[0] - lo) / max(1, hi - lo) - near)
                    hits.append(((len(candidate) < 3, candidate not in wanted, round(distance, 2),
                                  -wanted.count(candidate), rank), at))
            found = min(hits)[1] if hits else None
        if found is None:  # by its relative place, as many words as it covers in the source
            width = min(max(1 if span.end > span.start else 0, len(_words(source[span.start:span.end]))), hi - lo)
            first = lo + round(near * (hi - lo - width)) if hi - lo > width else lo
            found = (first, first + width)
        placed.append(found)
    return [exact.get(k) or _characters(words, first, last, len(target)) for k, (first, last) in enumerate(placed)]


def _word_range(words, start: int, end: int, default: int) -> tuple[int, int]:
    """The words a character range covers (an empty range: none, at the first word after it)."""
    covered = [i for i, (a, b, _) in enumerate(words) if a < end and b > start]
    if covered:
        return covered[0], covered[-1] + 1
    after = next((i for i, (a, _, _) in enumerate(words) if a >= start), len(words))
    return (after, after) if start == end else (default, default)


def _boundary(text: str, at: int) -> int:
    """``at`` moved to the end of the word it falls in (a tag never splits a word)."""
    while 0 < at < len(text) and text[at - 1].isalnum() and text[at].isalnum():
        at += 1
    return at


def _find_text(target: str, text: str, words, lo: int, hi: int, near: float) -> tuple[int, int] | None:
    """Where ``text`` occurs in ``target`` within words [lo, hi), the occurrence nearest ``near``."""
    if not text.strip():
        return None
    start = words[lo][0] if lo < len(words) else len(target)
    end = words[hi - 1][1] if 0 < hi <= len(words) else len(target)
    hits, at = [], target.find(text, start)
    while at != -1 and at + len(text) <= max(end, start + len(text)):
        hits.append(at)
        at = target.find(text, at + 1)
    if not hits:
        return None
    best = min(hits, key=lambda i: abs(i / max(1, len(target)) - near))
    return best, best + len(text)


def _characters(words, first: int, last: int, length: int) -> tuple[int, int]:
    """Word indices [first, last) as character offsets (an empty range sits where word ``first`` begins)."""
    if first >= len(words):
        return length, length
    if last <= first:
        return words[first][0], words[first][0]
    return words[first][0], words[last - 1][1]
