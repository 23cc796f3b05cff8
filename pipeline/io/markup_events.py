"""The events of a page with markup (io/markup.py reads pages through them): a real parser's (the standard
library's ``html.parser`` for HTML, expat for XML), each event with the exact source text it covers, so that a
page is always the concatenation of its events; and which of them sit inside a sentence (inline)."""

from __future__ import annotations

import html
from dataclasses import dataclass
from html.parser import HTMLParser
from xml.parsers import expat

from pipeline.io.segments import has_word

# HTML's phrasing elements that sit inside a sentence; everything else ends a block.
INLINE = frozenset("a abbr b bdi bdo cite code data dfn em font i ins kbd mark q s samp small span strong sub sup "
                   "time u var del".split())
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
# Elements whose end tag HTML lets a page leave out: closed where their parent closes or the page ends.
OPTIONAL_END = frozenset("html head body p li dt dd tr td th thead tbody tfoot colgroup option optgroup rt rp "
                         "caption".split())
KEPT = frozenset("script style pre textarea noscript svg math template".split())  # content never translated
VERBATIM_INLINE = frozenset({"code", "kbd", "samp", "var"})  # inline, their text kept as it is


class MarkupError(ValueError):
    """The record's markup does not parse (the message names the line and column)."""


@dataclass
class Event:
    kind: str  # "start", "end", "empty" (a void or self-closed tag), "text", "other" (comment, doctype, ...)
    raw: str  # the exact source text
    tag: str = ""
    text: str = ""  # kind text: the characters it stands for (entities decoded)
    keep: bool = False  # a start tag whose element is never translated (KEPT, translate="no", notranslate)


def _keeps(tag: str, attributes: list[tuple[str, str | None]]) -> bool:
    values = {name.lower(): (value or "") for name, value in attributes}
    return (tag in KEPT or values.get("translate", "").lower() == "no"
            or "notranslate" in values.get("class", "").split())


class _HTMLEvents(HTMLParser):
    """The page as events whose raw texts are consecutive slices of it (each event's slice runs from its start
    to the next event's start: html.parser reports where each begins)."""

    def __init__(self, page: str):
        super().__init__(convert_charrefs=False)
        self.page, self.events, self.starts = page, [], []
        self.line_starts = line_starts(page)

    def _add(self, kind: str, **values) -> None:
        line, column = self.getpos()
        self.starts.append(self.line_starts[line - 1] + column)
        self.events.append(Event(kind, "", **values))

    def handle_starttag(self, tag, attrs):
        self._add("empty" if tag in VOID else "start", tag=tag, keep=_keeps(tag, attrs))

    def handle_startendtag(self, tag, attrs):
        self._add("empty", tag=tag)

    def handle_endtag(self, tag):
        self._add("end", tag=tag)

    def handle_data(self, data):
        self._add("text", text=data)

    def handle_entityref(self, name):
        self._add("text", text=html.unescape(f"&{name};"))

    def handle_charref(self, name):
        self._add("text", text=html.unescape(f"&#{name};"))

    def handle_comment(self, data):
        self._add("other")

    handle_decl = handle_pi = unknown_decl = handle_comment

    def parsed(self) -> list[Event]:
        self.feed(self.page)
        self.close()
        for event, start, end in zip(self.events, self.starts, self.starts[1:] + [len(self.page)]):
            event.raw = self.page[start:end]
        if self.starts and self.starts[0] > 0 or not self.events and self.page:
            self.events.insert(0, Event("other", self.page[: self.starts[0] if self.starts else len(self.page)]))
        return self.events


def line_starts(page: str) -> list[int]:
    """The offset where each line of ``page`` begins."""
    return [0] + [i + 1 for i, ch in enumerate(page) if ch == "\n"]


def _where(page: str, offset: int) -> str:
    line = page.count("\n", 0, offset) + 1
    return f"line {line}, column {offset - (page.rfind(chr(10), 0, offset) + 1) + 1}"


def html_events(page: str) -> list[Event]:
    """The page's events; MarkupError where a tag is never closed or closes what is not open."""
    events = _HTMLEvents(page).parsed()
    open_tags: list[tuple[str, int]] = []
    offset = 0
    for event in events:
        if event.kind == "start":
            open_tags.append((event.tag, offset))
        elif event.kind == "end":
            while open_tags and open_tags[-1][0] != event.tag and open_tags[-1][0] in OPTIONAL_END \
                    and any(tag == event.tag for tag, _ in open_tags):
                open_tags.pop()  # an end tag the page left out
            if not open_tags or open_tags[-1][0] != event.tag:
                raise MarkupError(f"</{event.tag}> at {_where(page, offset)} closes no open <{event.tag}>"
                                  + (f" (<{open_tags[-1][0]}> is open)" if open_tags else ""))
            open_tags.pop()
        offset += len(event.raw)
    unclosed = [(tag, at) for tag, at in open_tags if tag not in OPTIONAL_END]
    if unclosed:
        tag, at = unclosed[-1]
        raise MarkupError(f"<{tag}> at {_where(page, at)} is never closed")
    return events


def xml_events(page: str) -> list[Event]:
    """The page's events from expat, each with its exact source slice; MarkupError with expat's position."""
    parser = expat.ParserCreate()
    data = page.encode("utf-8")
    marks: list[tuple[int, str, dict]] = []  # (byte offset, kind, values)

    def mark(kind, **values):
        marks.append((parser.CurrentByteIndex, kind, values))

    parser.StartElementHandler = lambda tag, attrs: mark("start", tag=tag, keep=_keeps(tag, list(attrs.items())))
    parser.EndElementHandler = lambda tag: mark("end", tag=tag)
    parser.CharacterDataHandler = lambda text: mark("text", text=text)
    parser.CommentHandler = parser.ProcessingInstructionHandler = lambda *_: mark("other")
    parser.StartDoctypeDeclHandler = lambda *_: mark("other")
    parser.XmlDeclHandler = lambda *_: mark("other")
    try:
        parser.Parse(data, True)
    except expat.ExpatError as error:
        raise MarkupError(f"{expat.ErrorString(error.code)} at line {error.lineno}, column {error.offset + 1}") from None
    events: list[Event] = []
    for (start, kind, values), (end, _, _) in zip(marks, marks[1:] + [(len(data), "", {})]):
        raw = data[start:end].decode("utf-8")
        if kind == "text" and events and events[-1].kind == "text" and events[-1].raw == "":
            continue
        if kind == "end" and raw == "":  # a self-closed element: expat reports its end where it started
            events[-1].kind = "empty"
            continue
        events.append(Event(kind, raw, **values))
    if marks and marks[0][0] > 0:
        events.insert(0, Event("other", data[: marks[0][0]].decode("utf-8")))
    return events


def inline_tags(events: list[Event], markup: str) -> set[int]:
    """The indices of the start, end and empty events that sit inside a sentence."""
    if markup == "markdown":  # its tags are all inline: its blocks are bounded by what is kept
        return {i for i, event in enumerate(events) if event.kind in ("start", "end", "empty")}
    if markup == "html":
        return {i for i, event in enumerate(events) if event.kind in ("start", "end", "empty") and event.tag in INLINE}
    # XML: an element is inline where its parent holds text of its own beside it (mixed content).
    inline, stack = set(), []  # stack: [start index, has text, child starts]
    pairs = {}
    for i, event in enumerate(events):
        if event.kind == "start":
            if stack:
                stack[-1][2].append(i)
            stack.append([i, False, []])
        elif event.kind == "text" and stack and has_word(event.text):
            stack[-1][1] = True
        elif event.kind == "empty" and stack:
            stack[-1][2].append(i)
        elif event.kind == "end" and stack:
            start, mixed, children = stack.pop()
            pairs[start] = i
            if mixed:
                inline |= {child for child in children} | {pairs[child] for child in children if child in pairs}
    return inline


def markdown_events(page: str) -> list[Event]:
    """A Markdown page's events (markdown-it-py, CommonMark): the text of its paragraphs and headings with their
    emphasis, links, images, code spans and inline HTML; everything else (markers, fences, code and HTML blocks)
    kept as it is. Each event's raw text runs from where it begins to where the next one does."""
    from markdown_it import MarkdownIt

    starts_of_lines = line_starts(page)
    starts: list[tuple[int, Event]] = [(0, Event("other", ""))]
    for token in MarkdownIt("commonmark").parse(page):
        if token.type != "inline" or not token.content:
            continue
        where = _content_offsets(page, starts_of_lines, token)
        starts += [(where(at), event) for at, event in _inline_events(token)]
        starts.append((where(len(token.content)), Event("other", "")))
    starts.sort(key=lambda item: item[0])  # stable: events found at one offset keep their order
    events = []
    for (start, event), (end, _) in zip(starts, starts[1:] + [(len(page), None)]):
        event.raw = page[start:end]
        if event.raw or event.kind != "other":
            events.append(event)
    return events


def _content_offsets(page: str, line_starts: list[int], token):
    """content index -> page offset, for an inline token whose content is its lines' text without their
    container prefixes (list markers, "> ") and trailing whitespace."""
    offsets = []
    for number, line in enumerate(token.content.split("\n")):
        first = line_starts[token.map[0] + number]
        end = page.find("\n", first)
        source = page[first:] if end == -1 else page[first:end]
        column = source.rfind(line) if line else len(source)
        offsets += [first + column + i for i in range(len(line) + 1)]  # and where the line's text ends
    return lambda at: offsets[min(at, len(offsets) - 1)]


def _next(content: str, text: str, at: int) -> int:
    """Where ``text`` next occurs in ``content`` from ``at``, not escaped by a backslash (or len(content))."""
    found = content.find(text, at)
    while found > 0 and content[found - 1] == "\\":
        found = content.find(text, found + 1)
    return len(content) if found == -1 else found


def _destination_end(content: str, at: int) -> int:
    """After a link's or image's "]": past its "(destination)" or "[label]", if it has one."""
    if at < len(content) and content[at] in "([":
        return min(len(content), _next(content, ")" if content[at] == "(" else "]", at) + 1)
    return at


def _inline_events(token) -> list[tuple[int, Event]]:
    """The inline token's events at their content index."""
    content, at, events = token.content, 0, []
    tags = {"em": "em", "strong": "strong", "link": "a"}
    for child in token.children or []:
        kind, _, side = child.type.rpartition("_")
        if child.type == "text":
            events.append((at, Event("text", "", text=child.content)))
        elif child.type in ("softbreak", "hardbreak"):
            at = _next(content, "\n", at)
            events.append((at, Event("text", "", text=" ")))
            at += 1
        elif kind in ("em", "strong") and side in ("open", "close"):
            at = _next(content, child.markup, at)
            events.append((at, Event("start" if side == "open" else "end", "", tag=tags[kind])))
            at += len(child.markup)
        elif child.type == "link_open":
            at = _next(content, "[", at)
            events.append((at, Event("start", "", tag="a")))
            at += 1
        elif child.type == "link_close":
            at = _next(content, "]", at)
            events.append((at, Event("end", "", tag="a")))
            at = _destination_end(content, at + 1)
        elif child.type == "code_inline":
            at = _next(content, child.markup, at)
            events.append((at, Event("start", "", tag="code", keep=True)))
            events.append((at + len(child.markup), Event("text", "", text=child.content)))
            at = _next(content, child.markup, at + len(child.markup) + len(child.content)) + len(child.markup)
            events.append((at - len(child.markup), Event("end", "", tag="code")))
        elif child.type == "image":
            at = _next(content, "![", at)
            events.append((at, Event("empty", "", tag="img")))
            at = _destination_end(content, _next(content, "]", at + 2) + 1)
        else:  # inline HTML and anything else: kept as it is
            at = _next(content, child.content or child.markup, at)
            events.append((at, Event("empty", "", tag=child.type)))
            at += len(child.content or child.markup)
    return events
