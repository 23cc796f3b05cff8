"""What the markup sample's job kept and where it put the inline tags, against the same sentences without markup.

    bild-pipeline run jobs/markup.yaml --set decoding.adaptive_draft=false
    bild-pipeline run jobs/markup.yaml --set decoding.adaptive_draft=false \
        --set input.path=data/markup_sample/plain.parquet --set input.text_column=de \
        --set input.reference_column=en --set input.markup=none --set input.segment=none \
        --set output.path=runs/markup-plain
    python scripts/markup_check.py runs/markup runs/markup-plain
    # Markdown: the same job with --set input.markup=markdown --set input.text_column=markdown
    #   --set input.path=data/markup_sample/markdown.parquet --set output.path=runs/markup-md, then
    python scripts/markup_check.py runs/markup-md runs/markup-plain markdown

Per page: the multiset of its start tags (attributes as written), end tags, entities, comments and declarations
in the input and the output; whether the output parses (io/markup.html_events); the paragraphs' text against
the references (BLEU, against the plain run's on the same sentences); and for each tagged noun, whether the
element around it in the output holds one of the English words data/markup_sample's `tags` list for it."""

from __future__ import annotations

import html
import json
import sys
from collections import Counter
from html.parser import HTMLParser
from urllib.parse import unquote

import pyarrow.parquet as pq
import sacrebleu

from pipeline.io.markup import MarkupError, html_events
from pipeline.io.markup_events import markdown_events


class _Inventory(HTMLParser):
    """A page's markup as a multiset, and each paragraph's text and the text inside each of its inline tags."""

    def __init__(self):
        super().__init__(convert_charrefs=False)
        self.markup, self.paragraphs, self.open_elements = Counter(), [], []

    def handle_starttag(self, tag, attrs):
        self.markup["start " + self.get_starttag_text()] += 1
        if tag == "p":
            self.paragraphs.append({"text": "", "inline": {}})
        elif self.paragraphs and tag != "code":
            self.open_elements.append(self.get_starttag_text())
            self.paragraphs[-1]["inline"].setdefault(self.get_starttag_text(), "")

    def handle_startendtag(self, tag, attrs):
        self.markup["start " + self.get_starttag_text()] += 1

    def handle_endtag(self, tag):
        self.markup["end " + tag] += 1
        if tag != "p" and tag != "code" and self.open_elements:
            self.open_elements.pop()

    def _text(self, text):
        if self.paragraphs:
            self.paragraphs[-1]["text"] += text
            for element in self.open_elements:
                self.paragraphs[-1]["inline"][element] += text

    def handle_data(self, data):
        self._text(data)

    def handle_entityref(self, name):
        self.markup[f"entity &{name};"] += 1
        self._text(html.unescape(f"&{name};"))

    def handle_charref(self, name):
        self.markup[f"entity &#{name};"] += 1

    def handle_comment(self, data):
        self.markup["comment " + data] += 1

    def handle_decl(self, decl):
        self.markup["decl " + decl] += 1


def inventory(page: str) -> _Inventory:
    parser = _Inventory()
    parser.feed(page)
    parser.close()
    return parser


class _MarkdownInventory:
    """The same of a Markdown page, from markdown-it-py's tokens: every token but text with its markup and
    attributes; each paragraph's or list item's text and the text inside each of its emphases and links."""

    def __init__(self, page: str):
        from markdown_it import MarkdownIt

        self.markup, self.paragraphs = Counter(), []
        tokens = MarkdownIt("commonmark").parse(page)
        inline_number = 0
        for token in tokens:
            self.markup[(token.type, token.markup, tuple(sorted(token.attrs.items())))] += 1
            if token.type != "inline":
                continue
            inline_number += 1
            in_paragraph = 3 <= inline_number <= 7  # after the heading and the quote: the five sentences
            paragraph, open_keys = {"text": "", "inline": {}}, []
            for child in token.children or []:
                if child.type not in ("text", "softbreak"):
                    self.markup[(child.type, child.markup, tuple(sorted(child.attrs.items())))] += 1
                kind, _, side = child.type.rpartition("_")
                key = (f"link:{unquote(child.attrs.get('href'))}" if child.type == "link_open"  # as the sample wrote it
                       else f"{kind}:{child.markup}")
                if side == "open":
                    open_keys.append(key)
                    paragraph["inline"].setdefault(key, "")
                elif side == "close" and open_keys:
                    open_keys.pop()
                elif child.type in ("text", "code_inline"):
                    paragraph["text"] += child.content
                    for key in open_keys:
                        paragraph["inline"][key] += child.content
            if in_paragraph:
                self.paragraphs.append(paragraph)


def main(pages_run: str, plain_run: str, markup: str = "html") -> None:
    sample, column = ("pages", "html") if markup == "html" else ("markdown", "markdown")
    pages = {row["id"]: row for row in pq.read_table(f"data/markup_sample/{sample}.parquet").to_pylist()}
    out = {row["id"]: row for row in pq.read_table(f"{pages_run}/data").to_pylist()}
    plain = {row["id"]: row["prediction"] for row in pq.read_table(f"{plain_run}/data").to_pylist()}
    plain_ids = [row["id"] for row in pq.read_table("data/markup_sample/plain.parquet").to_pylist()]
    same_markup = parsed = placed = tags = translated = placed_where_translated = 0
    marked_text, plain_text, references, misplaced = [], [], [], []
    for k, (page_id, page) in enumerate(sorted(pages.items())):
        row = out[page_id]
        assert row["error"] is None, (page_id, row["error"])
        read = inventory if markup == "html" else _MarkdownInventory
        source, target = read(page[column]), read(row["prediction"])
        same_markup += source.markup == target.markup
        try:
            (html_events if markup == "html" else markdown_events)(row["prediction"])
            parsed += 1
        except MarkupError:
            pass
        infos = json.loads(page["tags"])
        ids = plain_ids[k * len(infos):(k + 1) * len(infos)]
        for paragraph, source_paragraph, info, sentence_id, reference in zip(
                target.paragraphs, source.paragraphs, infos, ids, page["en"].split("\n")):
            marked_text.append(" ".join(paragraph["text"].split()))
            plain_text.append(plain[sentence_id])
            references.append(reference)
            wrapped = paragraph["inline"].get(info["tag"], "")
            tags += 1
            words = {word.strip(".,;:!?\"'").lower() for word in wrapped.split()}
            holds = bool({w.strip(".,;:!?\"'").lower() for w in paragraph["text"].split()} & set(info["english"]))
            translated += holds
            if words & set(info["english"]):
                placed += 1
                placed_where_translated += holds
            else:
                misplaced.append(f"{info['noun']} -> {info['english']}: {info['tag']}{wrapped}… in “{marked_text[-1]}”")
    bleu_marked = sacrebleu.corpus_bleu(marked_text, [references]).score
    bleu_plain = sacrebleu.corpus_bleu(plain_text, [references]).score
    print(f"pages: {len(pages)}; markup multiset equal: {same_markup}/{len(pages)}; outputs that parse: {parsed}/{len(pages)}")
    print(f"BLEU of the paragraphs: {bleu_marked:.2f} with markup, {bleu_plain:.2f} without (difference "
          f"{bleu_marked - bleu_plain:+.2f}) on {len(references)} sentences")
    print(f"inline tags around the noun's translation: {placed}/{tags} ({placed / tags:.1%}); where the sentence's "
          f"translation holds it: {placed_where_translated}/{translated} ({placed_where_translated / translated:.1%})")
    for line in misplaced[:8]:
        print("  missed:", line)


if __name__ == "__main__":
    main(*sys.argv[1:4])
