"""Documents decoded sentence by sentence (``input.segment: sentence``, docs/segments.md).

Each record's text is split into sentences by sentencex (chosen by measurement, docs/segments.md),
keeping what lies between them (the whitespace after a sentence, paragraph breaks, mixed newlines) as
it is; the stage decodes the sentences of all the records of a call together, as units, and puts each
record's translations back where its sentences were: one result per record, whose counters are the
sums over its sentences.

A piece with no letter or digit (a lone "...", "–", a closing quote the splitter set apart) is not a
sentence: it stays between the sentences as it is, untranslated and not counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

SEGMENTS: tuple[str, ...] = ("none", "sentence")  # input.segment


@dataclass(frozen=True)
class Document:
    """A text as its sentences and what surrounds them: ``text == lead + sentence_0 + gap_0 + ...``."""

    lead: str  # what comes before the first sentence (whitespace, lone punctuation)
    sentences: tuple[str, ...]  # each stripped of the whitespace around it
    gaps: tuple[str, ...]  # what follows each sentence, up to the next one (or the end)

    def join(self, translations: Sequence[str]) -> str:
        """The document with each sentence replaced by its translation, in its place."""
        if len(translations) != len(self.sentences):
            raise ValueError(f"{len(translations)} translations for {len(self.sentences)} sentences")
        return self.lead + "".join(text + gap for text, gap in zip(translations, self.gaps))

    @property
    def text(self) -> str:
        return self.join(self.sentences)


def has_word(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


def split_sentences(text: str, language: str = "en") -> Document:
    """``text`` as a Document of sentences (sentencex's rules for ``language``, an ISO 639 code; a code it
    does not know gets its defaults). Whatever the splitter returns, the Document's text is ``text``."""
    import sentencex

    sentences: list[str] = []
    between = [""]  # the lead, then the gap after each sentence
    covered = 0
    for boundary in sentencex.get_sentence_boundaries(language, text):
        end = max(covered, boundary["end_index"])
        piece, covered = text[covered:end], end  # contiguous pieces: nothing the splitter skips is lost
        core = piece.strip()
        if not has_word(core):  # whitespace, a paragraph break, lone punctuation: kept between sentences
            between[-1] += piece
            continue
        before = piece[: piece.index(core)]
        between[-1] += before
        sentences.append(core)
        between.append(piece[len(before) + len(core):])
    between[-1] += text[covered:]
    return Document(between[0], tuple(sentences), tuple(between[1:]))


def documents_of(records: list[dict], language: str) -> list[Document | None]:
    """Each record's Document (None where the record failed to read: it keeps its input_error)."""
    return [None if row.get("input_error") or not isinstance(row.get("text"), str)
            else split_sentences(row["text"], language) for row in records]


def unit_key(record_id: str, index: int) -> str:
    """What a sentence's seed is drawn from: the record's id for its first (a one-sentence document samples
    as the same record unsegmented would), the id and the sentence's index after it."""
    return record_id if index == 0 else f"{record_id}#{index}"


@dataclass(frozen=True)
class Unit:
    """What one decoding unit is: a text, or one sentence of a document."""

    record: int  # its record's place among those decoded together
    index: int  # its place in its record (0 for a text decoded whole)
    text: str
    budget: int | None = None  # a smaller max_new_tokens of its own (an inline element's text, io/markup.py)


def decode_records(decode, items: Sequence[Document | str | None], method: str) -> list:
    """One result per item from one ``decode(units) -> results`` call over every item's Units: a
    Document's sentences (its result joined from theirs: join_results), a str as one unit (its result
    as is). A None item (a record that failed to read) is not decoded: its result is None, for the
    caller to fill. The stage and `generate` both decode records this way."""
    units = [Unit(i, k, text, _budget(item, k)) for i, item in enumerate(items) if item is not None
             for k, text in enumerate(item.sentences if _units_of(item) else [item])]
    decoded: dict[int, list] = {i: [] for i, item in enumerate(items) if item is not None}
    for unit, result in zip(units, decode(units), strict=True):
        decoded[unit.record].append(result)
    return [None if item is None else join_results(item, decoded[i], method) if _units_of(item)
            else decoded[i][0] for i, item in enumerate(items)]


def _budget(item, index: int) -> int | None:
    budgets = getattr(item, "budgets", None)
    return budgets[index] if budgets else None


def _units_of(item) -> bool:
    """Whether an item is decoded as units (a Document, or io/markup.MarkedPage: ``sentences`` and ``join``)."""
    return not isinstance(item, str) and hasattr(item, "sentences")


def join_results(document: Document, results: Sequence, method: str):
    """One record's GenerationResult from its sentences' (in order): the prediction is the document with
    each sentence translated in its place, the counters and latency are sums, a flag is set where any
    sentence's is; a sentence that failed fails the record with an error naming it."""
    from pipeline.decoding.stats import DecodeStats, GenerationResult

    if len(results) != len(document.sentences):
        raise ValueError(f"{len(results)} results for {len(document.sentences)} sentences")
    if not document.sentences and not document.text.strip():
        return GenerationResult(prediction=None, error="input text is empty", method=method)
    failed = [(index, result.error) for index, result in enumerate(results) if result.error is not None]
    if failed:
        index, error = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return GenerationResult(prediction=None, error=f"segment {index} of {len(results)}: {error}{more}"[:500],
                                method=method, input_tokens=sum(result.input_tokens for result in results),
                                truncated=any(result.truncated for result in results))
    combined = {}
    written = [not auxiliary for auxiliary in getattr(document, "auxiliary", ())] or [True] * len(results)
    for spec in fields(GenerationResult):
        parts = [getattr(result, spec.name) for result in results]
        if spec.name in ("stopped_by_budget", "repetition", "unknown_tokens"):  # of what the output holds
            parts = [part for part, kept in zip(parts, written) if kept]
        if spec.name == "prediction":
            combined[spec.name] = document.join(parts)
        elif spec.name == "error":
            combined[spec.name] = None
        elif spec.name == "method":
            combined[spec.name] = method
        elif spec.name == "stats":
            combined[spec.name] = DecodeStats.total(parts)
        elif spec.name == "token_ids":
            combined[spec.name] = [token for part in parts for token in part]
        else:
            combined[spec.name] = _combined(parts, flag="bool" in str(spec.type))
    return GenerationResult(**combined)


def _combined(parts: list, flag: bool):
    """A sentence-level value over a document: a flag is set where any sentence's is, counts and times are
    summed (False and 0 where no sentence was decoded); None where every sentence's is None (not known)."""
    known = [part for part in parts if part is not None]
    if parts and not known:
        return None
    return any(known) if flag else sum(known)
