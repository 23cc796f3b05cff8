"""Records with markup (``input.markup: html | xml | markdown``): the structure kept byte for byte, the text
translated.

A page is read by a real parser (the standard library's ``html.parser`` for HTML, expat for XML, markdown-it-py
for Markdown: markup_events.py) into events,
each with the exact source text it covers, so the page is always the concatenation of its events. Text runs
between block boundaries become *blocks*; the tags inside a block are *inline* (HTML's phrasing elements; in
XML an element inside a run of text). What is never translated stays as it is: tags and their attributes
(``alt`` and ``title`` included: they are kept, not translated), comments, doctypes, processing instructions,
``<script>``, ``<style>``, ``<pre>``, ``<textarea>``, and elements with ``translate="no"`` or
``class="notranslate"``; an inline ``<code>`` or no-translate element keeps its own text inside the translation.

Each block's text is decoded without its inline tags (with input.segment: sentence, sentence by sentence), and
each inline element's own text is decoded too; the tags are then put back around the words of the block's
translation that best match their text's translation (markup_place.py): never dropped, never doubled, never
crossing. An entity of the text (``&amp;``) stays an entity, and where the translation left its character out it
is put back at its relative place: an entity is markup. A page whose markup does not parse (an unclosed or stray tag, malformed XML) is an input error naming
the line and column."""

from __future__ import annotations

import html
from dataclasses import dataclass

from pipeline.io.markup_events import (VERBATIM_INLINE, Event, MarkupError, html_events, inline_tags,
                                      markdown_events, xml_events)
from pipeline.io.markup_place import Span, place_spans
from pipeline.io.segments import has_word, split_sentences

__all__ = ["MARKUPS", "MarkedPage", "MarkupError", "html_events", "parse_page", "xml_events"]

MARKUPS: tuple[str, ...] = ("none", "html", "xml", "markdown")  # input.markup

# An inline element's text is decoded to find its words in the block's translation: a few tokens per word do
# (a model trained on sentences may otherwise write a whole one around a lone word, up to max_new_tokens).
SPAN_TOKENS_PER_WORD, SPAN_TOKENS_EXTRA = 3, 4


@dataclass
class _Unit:
    start: int  # characters of its block's plain text
    end: int


@dataclass
class _BlockPlan:
    events: list[Event]
    text: str  # plain text
    spans: list[Span]
    units: list[_Unit]  # what is decoded of its text (the block, or its sentences)
    decoded_spans: list[int]  # the spans whose own text is decoded too
    entities: dict[str, list[tuple[int, str]]]  # character -> where the source wrote it as an entity, and how
    markup: str = "html"


@dataclass
class MarkedPage:
    """A page as skeleton texts and blocks; ``sentences``: every unit to decode (each block's units, then its
    inline elements' texts), ``join(translations)``: the page with each block's text translated and its tags
    put back. Read by io/segments.decode_records as it reads a Document."""

    pieces: list  # str (kept as it is) or _BlockPlan
    text: str
    markup: str
    sentences: tuple[str, ...] = ()
    budgets: tuple[int | None, ...] = ()  # an inline element's text: a small max_new_tokens of its own
    auxiliary: tuple[bool, ...] = ()  # an inline element's text: decoded to place its tags, not written

    def __post_init__(self):
        units, budgets = [], []
        for piece in self.pieces:
            if isinstance(piece, _BlockPlan):
                units += [piece.text[u.start:u.end] for u in piece.units]
                budgets += [None] * len(piece.units)
                for k in piece.decoded_spans:
                    units.append(piece.text[piece.spans[k].start:piece.spans[k].end].strip())
                    budgets.append(SPAN_TOKENS_PER_WORD * len(units[-1].split()) + SPAN_TOKENS_EXTRA)
        self.sentences, self.budgets = tuple(units), tuple(budgets)
        self.auxiliary = tuple(budget is not None for budget in budgets)

    def join(self, translations) -> str:
        if len(translations) != len(self.sentences):
            raise ValueError(f"{len(translations)} translations for {len(self.sentences)} units")
        out, at = [], 0
        for piece in self.pieces:
            if isinstance(piece, str):
                out.append(piece)
                continue
            mine = translations[at:at + len(piece.units)]
            at += len(piece.units)
            for k in piece.decoded_spans:
                piece.spans[k].translation = translations[at]
                at += 1
            out.append(_rebuilt(piece, mine))
        return "".join(out)


def _escape(text: str, entities: dict[str, list[tuple[int, str]]], markup: str = "html") -> str:
    """Translated text as markup: in HTML and XML &, < and > escaped, a character the source wrote as an entity
    written so; Markdown's text as it is."""
    if markup == "markdown":
        return text
    escaped = html.escape(text, quote=False)
    for character, written in entities.items():
        if character not in "&<>":
            escaped = escaped.replace(character, written[0][1])
    return escaped


def _missing_entities(plan: _BlockPlan, target: str) -> list[tuple[int, str]]:
    """The source's entities whose character the translation left out, each at its relative place in the
    target (at a word's edge): an entity is markup, and stays even where its character is not translated."""
    missing = []
    for character, written in plan.entities.items():
        for offset, raw in written[target.count(character):]:
            at = round(offset / max(1, len(plan.text)) * len(target))
            while 0 < at < len(target) and target[at - 1].isalnum() and target[at].isalnum():
                at += 1
            missing.append((at, raw + (" " if at < len(target) and target[at].isalnum() else "")))
    return missing


def _rebuilt(plan: _BlockPlan, translations: list[str]) -> str:
    """A block in the target language: its units' translations in place of their text (what lies between the
    units kept), its inline tags around the words they match (a verbatim element with its own source text)."""
    target, at = "", 0
    for unit, translation in zip(plan.units, translations):
        target += plan.text[at:unit.start] + translation
        at = unit.end
    target += plan.text[at:]
    places = place_spans(plan.text, target, plan.spans)
    depth = [0] * len(plan.spans)
    for k, span in enumerate(plan.spans):
        depth[k] = 0 if span.parent is None else depth[span.parent] + 1
    # (offset, 0 for a close / 1 for an open, inner closes and outer opens first, tag text)
    inserts, dropped = [], []
    for k, (span, (start, end)) in enumerate(zip(plan.spans, places)):
        if span.verbatim or start == end:  # one piece: its tags around its own source text, or around nothing
            inserts.append((start, 1, depth[k], span.open + (span.inner_raw if span.verbatim else "") + span.close))
            if span.verbatim:
                dropped.append((start, end))
        else:
            inserts.append((start, 1, depth[k], span.open))
            inserts.append((end, 0, -depth[k], span.close))
    inserts += [(at, 1, 99, raw) for at, raw in _missing_entities(plan, target)]
    inserts.sort(key=lambda item: item[:3])
    out, cursor = [], 0
    for offset, _, _, text in inserts:
        out.append(_escape(_kept(target, cursor, offset, dropped), plan.entities, plan.markup))
        out.append(text)
        cursor = max(cursor, offset)
    out.append(_escape(_kept(target, cursor, len(target), dropped), plan.entities, plan.markup))
    return "".join(out)


def _kept(target: str, start: int, end: int, dropped: list[tuple[int, int]]) -> str:
    """target[start:end] without the characters a verbatim element's own text replaced."""
    return "".join(ch for i, ch in enumerate(target[start:end], start) if not any(a <= i < b for a, b in dropped))


def parse_page(page: str, markup: str, language: str = "en", segment: str = "none") -> MarkedPage:
    """``page`` as a MarkedPage (MarkupError where its markup does not parse)."""
    events = {"html": html_events, "xml": xml_events, "markdown": markdown_events}[markup](page)
    inline = inline_tags(events, markup)
    while True:  # an inline element that a block boundary cuts in two ends blocks itself
        blocks = _blocks(events, inline)
        cut = _cut_elements(events, blocks)
        if not cut:
            break
        inline -= cut
    pieces = [_plan(events[first:last], markup, language, segment) if is_block else
              "".join(event.raw for event in events[first:last]) for is_block, first, last in blocks]
    return MarkedPage(pieces, page, markup)


def _blocks(events: list[Event], inline: set[int]) -> list[tuple[bool, int, int]]:
    """The page as runs of events: (a block, first, last) where a block is text with its inline tags."""
    runs, kept_depth = [], 0
    for i, event in enumerate(events):
        in_block = not kept_depth and (event.kind == "text" or i in inline)
        if kept_depth:
            kept_depth += {"start": 1, "end": -1}.get(event.kind, 0)
        elif event.kind == "start" and event.keep and i not in inline:
            kept_depth = 1
        if not runs or runs[-1][0] != in_block:
            runs.append([in_block, i, i + 1])
        else:
            runs[-1][2] = i + 1
    return [tuple(run) for run in runs]


def _cut_elements(events: list[Event], blocks) -> set[int]:
    """Inline start and end events whose partner lies in another block."""
    cut = set()
    for is_block, first, last in blocks:
        if not is_block:
            continue
        stack = []
        for i in range(first, last):
            if events[i].kind == "start":
                stack.append(i)
            elif events[i].kind == "end":
                if stack:
                    stack.pop()
                else:
                    cut.add(i)
        cut |= set(stack)
    return cut


def _plan(events: list[Event], markup: str, language: str, segment: str) -> _BlockPlan | str:
    """A block's plain text, its inline spans and what is decoded of it; its raw text where it has no word."""
    text, spans, stack, entities, verbatim_in = "", [], [], {}, None
    for event in events:
        if verbatim_in is not None:  # inside a verbatim element: its source as it is
            if event.kind == "end" and stack[-1] == verbatim_in and spans[verbatim_in].open_inside == 0:
                spans[verbatim_in].end, spans[verbatim_in].close = len(text), event.raw
                stack.pop()
                verbatim_in = None
                continue
            spans[verbatim_in].inner_raw += event.raw
            spans[verbatim_in].open_inside += {"start": 1, "end": -1}.get(event.kind, 0)
            text += event.text if event.kind == "text" else ""
            continue
        if event.kind == "text":
            if event.raw.startswith("&") and event.raw != event.text:
                entities.setdefault(event.text, []).append((len(text), event.raw))
            text += event.text
        elif event.kind in ("start", "empty"):
            verbatim = event.keep or (markup == "html" and event.tag in VERBATIM_INLINE)
            spans.append(Span(len(text), len(text), event.raw, "", verbatim=verbatim and event.kind == "start",
                              parent=stack[-1] if stack else None))
            if event.kind == "start":
                stack.append(len(spans) - 1)
                if verbatim:
                    verbatim_in = len(spans) - 1
        elif event.kind == "end":
            k = stack.pop()
            spans[k].end, spans[k].close = len(text), event.raw
    if not has_word(text):
        return "".join(event.raw for event in events)
    units = _units(text, spans, language, segment)
    decoded = [k for k, span in enumerate(spans) if not span.verbatim and has_word(text[span.start:span.end])]
    return _BlockPlan(events, text, spans, units, decoded, entities, markup)


def _units(text: str, spans: list[Span], language: str, segment: str) -> list[_Unit]:
    """The block's text as one unit (its whitespace around left out), or its sentences, two merged where an
    inline element runs across them."""
    core = text.strip()
    start = text.index(core)
    if segment != "sentence":
        return [_Unit(start, start + len(core))]
    document, units, at = split_sentences(text, language), [], 0
    for sentence in document.sentences:
        begin = text.index(sentence, at)
        units.append(_Unit(begin, begin + len(sentence)))
        at = begin + len(sentence)
    merged: list[_Unit] = []
    for unit in units:
        if merged and any(span.start < merged[-1].end < span.end or span.start < unit.start < span.end
                          for span in spans):
            merged[-1].end = unit.end
        else:
            merged.append(unit)
    return merged
