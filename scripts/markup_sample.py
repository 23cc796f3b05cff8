"""Builds data/markup_sample/: HTML pages made of the Multi30k test sentences in data/multi30k_sample, each
sentence a paragraph, a noun of NOUNS in it wrapped in an inline tag, and around them what real pages hold
(a title, a navigation bar marked notranslate, an image with alt text, entities, a comment, a script, a
style, inline code). pages.parquet: id, html (the page), de (its sentences, one per line), en (their
references); markdown.parquet: the same sentences as Markdown pages (id, markdown, de, en, tags: the noun in
**, *, _, __ or a [link](...), a heading, a block quote, a list, an image, a code span and a fenced block);
plain.parquet: the same sentences one per record, for the same job without markup.

    python scripts/markup_sample.py   # from the repository root; deterministic
"""

from __future__ import annotations

import html
import json
import random
import re

import pyarrow as pa
import pyarrow.parquet as pq

SOURCE = "data/multi30k_sample/test_2016_flickr.parquet"
OUT = "data/markup_sample"
PER_PAGE = 5
# German nouns (their forms in the sentences) and the English words a translation of them uses.
NOUNS = {
    "Hund": ["dog"], "Hunde": ["dogs"], "Mann": ["man", "guy"], "Männer": ["men"], "Frau": ["woman", "lady"],
    "Frauen": ["women"], "Kind": ["child", "kid"], "Kinder": ["children", "kids"], "Mädchen": ["girl", "girls"],
    "Junge": ["boy"], "Jungen": ["boy", "boys"], "Straße": ["street", "road"], "Wasser": ["water"],
    "Ball": ["ball"], "Hemd": ["shirt"], "Fahrrad": ["bike", "bicycle"], "Auto": ["car"], "Gruppe": ["group"],
    "Menschen": ["people"], "Leute": ["people"], "Hut": ["hat"], "Strand": ["beach"], "Baum": ["tree"],
    "Gebäude": ["building"], "Person": ["person"], "Personen": ["people", "persons"], "Bühne": ["stage"],
    "Gitarre": ["guitar"], "Schnee": ["snow"], "Gras": ["grass"], "Feld": ["field"], "Park": ["park"],
    "Stadt": ["city", "town"], "Sand": ["sand"], "Wand": ["wall"], "Tisch": ["table"], "Pferd": ["horse"],
    "Boot": ["boat"], "Fenster": ["window"], "Jacke": ["jacket"], "Mütze": ["hat", "cap"], "Brille": ["glasses"],
}
MARKDOWN_TAGS = [("**", "**", "strong:**"), ("*", "*", "em:*"), ("_", "_", "em:_"), ("__", "__", "strong:__"),
                 ("[", "](/wiki/{slug})", "link:/wiki/{slug}")]
TAGS = [("<b>", "</b>"), ("<i>", "</i>"), ('<a href="/wiki/{slug}" title="{word}">', "</a>"),
        ('<span class="term">', "</span>"), ("<em>", "</em>"), ("<strong>", "</strong>")]


def tagged(sentence: str, rng: random.Random) -> tuple[str, dict] | None:
    """The sentence as HTML with one noun of NOUNS in an inline tag, and which noun; None without one."""
    words = [m for m in re.finditer(r"\w+", sentence) if m.group() in NOUNS]
    if not words:
        return None
    word = rng.choice(words)
    open_tag, close_tag = rng.choice(TAGS)
    open_tag = open_tag.format(slug=word.group().lower(), word=word.group())
    escaped = html.escape(sentence[: word.start()], quote=False), html.escape(sentence[word.end():], quote=False)
    return (escaped[0] + open_tag + word.group() + close_tag + escaped[1],
            {"noun": word.group(), "tag": open_tag, "english": NOUNS[word.group()]})


def markdown_tagged(sentence: str, noun: str, rng: random.Random) -> tuple[str, str]:
    """The sentence as Markdown with its first ``noun`` emphasized or linked, and the element's key."""
    at = next(m for m in re.finditer(r"\w+", sentence) if m.group() == noun)
    before, after, key = rng.choice(MARKDOWN_TAGS)
    slug = noun.lower()
    return (sentence[: at.start()] + before + noun + after.format(slug=slug) + sentence[at.end():],
            key.format(slug=slug))


def markdown_page(number: int, sentences: list[str]) -> str:
    items = "\n".join(f"- {sentence}" for sentence in sentences[2:])
    return (f"# Bilder {number}\n\n> Seite {number} von [Bilder](/bilder \"Alle Bilder\")\n\n{sentences[0]}\n\n"
            f"{sentences[1]}\n\n{items}\n\n![Foto {number}](/img/{number}.jpg)\n\nMehr unter `/bilder/{number}`.\n\n"
            f"```js\nwindow.page = {number}; render(\"<p>*{number}*</p>\");\n```\n")


def page(number: int, paragraphs: list[str]) -> str:
    body = "\n".join(f"    <p>{paragraph}</p>" for paragraph in paragraphs)
    return (f"<!DOCTYPE html>\n<html lang=\"de\">\n<head>\n  <meta charset=\"utf-8\">\n  <title>Bilder {number}</title>\n"
            f"  <style>p {{ margin: 0 0 1em; }} .term {{ font-weight: 600; }}</style>\n</head>\n<body>\n"
            f"  <nav class=\"notranslate\"><a href=\"/\">Start</a> &middot; <a href=\"/bilder\">Bilder</a></nav>\n"
            f"  <!-- Seite {number} -->\n  <main>\n    <h1>Bilder &amp; Beschreibungen</h1>\n"
            f"    <img src=\"/img/{number}.jpg\" alt=\"Foto {number}\">\n{body}\n"
            f"    <p>Mehr unter <code>/bilder/{number}</code>.</p>\n  </main>\n"
            f"  <footer translate=\"no\">&copy; 2026 Bilder&nbsp;GmbH</footer>\n"
            f"  <script>window.page = {number}; if (a < b && c) {{ render(\"<p>\"); }}</script>\n</body>\n</html>\n")


def main() -> None:
    table = pq.read_table(SOURCE).to_pylist()
    rng = random.Random(7)
    rows, plain, chunk, markdown = [], [], [], []
    markdown_rng = random.Random(8)  # its own: the HTML pages stay as they were built before the Markdown ones
    for record in table:
        made = tagged(record["de"], rng)
        if made is None:
            continue
        chunk.append((record, *made))
        if len(chunk) == PER_PAGE:
            number = len(rows)
            rows.append({"id": f"page-{number:03d}", "html": page(number, [html_text for _, html_text, _ in chunk]),
                         "de": "\n".join(r["de"] for r, _, _ in chunk), "en": "\n".join(r["en"] for r, _, _ in chunk),
                         "tags": json.dumps([info for _, _, info in chunk], ensure_ascii=False)})
            plain += [{"id": r["id"], "de": r["de"], "en": r["en"]} for r, _, _ in chunk]
            marked = [markdown_tagged(r["de"], info["noun"], markdown_rng) for r, _, info in chunk]
            markdown.append({"id": f"page-{number:03d}", "markdown": markdown_page(number, [m for m, _ in marked]),
                             "de": rows[-1]["de"], "en": rows[-1]["en"],
                             "tags": json.dumps([{**info, "tag": key} for (_, _, info), (_, key) in zip(chunk, marked)],
                                                ensure_ascii=False)})
            chunk = []
    pq.write_table(pa.Table.from_pylist(rows), f"{OUT}/pages.parquet")
    pq.write_table(pa.Table.from_pylist(plain), f"{OUT}/plain.parquet")
    pq.write_table(pa.Table.from_pylist(markdown), f"{OUT}/markdown.parquet")
    print(f"{len(rows)} pages, {len(plain)} sentences with a tagged noun, written to {OUT}")


if __name__ == "__main__":
    main()
