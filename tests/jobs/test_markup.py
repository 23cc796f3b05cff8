"""input.markup: html and xml pages, their structure kept byte for byte and their text translated, inline tags put
back around the words they covered (io/markup.py, io/markup_place.py)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.decoding import DecodingConfig, ModelSpec
from pipeline.io.markup import MarkupError, html_events, parse_page
from pipeline.jobs.fingerprint import decisive_settings
from pipeline.jobs.schema import JobConfig
from pipeline.stage import DecodeStage, DecodeStageSpec
from support import REPO

PAGE = ('<!DOCTYPE html><html><head><title>Hunde</title><style>p{color:red}</style></head><body>\n'
        '<p>Ein <b>Hund</b> läuft über die <a href="/wiese" title="Wiese">Wiese</a>.</p>\n'
        '<p class="notranslate">Berlin &amp; Co</p><p>Tom &amp; <code>ls -la</code> <i>spielen <b>Fußball</b></i>!</p>'
        '<!-- ein Kommentar --><script>if (a < b && c) { x("<p>"); }</script></body></html>')
WORDS = {"Ein Hund läuft über die Wiese.": "A dog runs across the meadow.", "Hund": "The dog.", "Wiese": "meadow",
         "Hunde": "Dogs", "Tom & ls -la spielen Fußball!": "Tom and ls -la play football!",
         "spielen Fußball": "play football", "Fußball": "Football football."}


def translated(page: str, markup: str = "html", words: dict | None = None) -> str:
    parsed = parse_page(page, markup)
    return parsed.join([(words or WORDS).get(text, text.upper()) for text in parsed.sentences])


def test_a_page_comes_back_byte_for_byte_where_nothing_is_translated():
    sample = pq.read_table(REPO / "data/markup_sample/pages.parquet").column("html").to_pylist()
    for page in [PAGE, *sample[:10]]:
        parsed = parse_page(page, "html")
        assert parsed.join(list(parsed.sentences)) == page
    xml = '<?xml version="1.0"?><doc a="1"><!-- c --><para>Ein <term>Hund</term> &amp; eine Katze.</para><x/></doc>'
    parsed = parse_page(xml, "xml")
    assert parsed.join(list(parsed.sentences)) == xml


def test_the_text_is_translated_the_rest_kept_and_inline_tags_wrap_their_words():
    out = translated(PAGE)
    assert "<title>Dogs</title>" in out and "<style>p{color:red}</style>" in out
    assert '<p>A <b>dog</b> runs across the <a href="/wiese" title="Wiese">meadow</a>.</p>' in out
    assert '<p class="notranslate">Berlin &amp; Co</p>' in out  # kept, entity and all
    assert "<code>ls -la</code>" in out and "<i>play <b>football</b></i>!" in out  # nested stays nested
    assert '<!-- ein Kommentar --><script>if (a < b && c) { x("<p>"); }</script>' in out
    html_events(out)  # it parses


def test_an_entity_the_translation_drops_is_kept_and_siblings_never_cross():
    out = translated("<p>Katze &amp; <b>Hund</b> und <i>Maus</i></p>", "html",
                     {"Katze & Hund und Maus": "Mouse and dog and cat", "Hund": "dog", "Maus": "mouse"})
    assert out.count("&amp;") == 1 and out.count("<b>") == out.count("</b>") == 1
    assert out.index("</b>") <= out.index("<i>")  # <i>'s words come before <b>'s here: it is placed after instead
    html_events(out)


def test_xml_inline_elements_are_those_inside_a_run_of_text():
    out = translated('<doc><para>Ein <term>Hund</term> läuft.</para><note translate="no">Hund</note></doc>', "xml",
                     {"Ein Hund läuft.": "A dog runs.", "Hund": "dog"})
    assert out == '<doc><para>A <term>dog</term> runs.</para><note translate="no">Hund</note></doc>'


@pytest.mark.parametrize("page, markup, words", [
    ("<p>Ein <b>Hund</p>", "html", "</p> at line 1, column 15 closes no open <p> (<b> is open)"),
    ("<p>Ein Hund</b></p>", "html", "</b> at line 1, column 12 closes no open <b>"),
    ("<div>\n<p>Ein Hund</p>", "html", "<div> at line 1, column 1 is never closed"),
    ("<doc><a>Ein Hund</doc>", "xml", "mismatched tag at line 1, column 19"),
])
def test_markup_that_does_not_parse_names_where(page, markup, words):
    with pytest.raises(MarkupError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_page(page, markup)


def test_left_out_end_tags_html_allows_and_pages_without_text():
    assert parse_page("<ul><li>Ein Hund<li>Eine <b>Katze</b></ul><p>Zwei", "html").sentences == \
        ("Ein Hund", "Eine Katze", "Katze", "Zwei")
    for page in ("<html><body><img src='a.png'><!-- x --></body></html>", "<script>var p = '<p>Hund</p>';</script>"):
        assert parse_page(page, "html").sentences == () and parse_page(page, "html").join([]) == page


def test_a_megabyte_page_is_read():
    page = "<html><body>" + "<p>Ein <b>Hund</b> läuft über die Wiese.</p>\n" * 25_000 + "</body></html>"
    assert len(page) > 1_000_000
    parsed = parse_page(page, "html")
    assert len(parsed.sentences) == 50_000 and parsed.join(list(parsed.sentences)) == page


def test_markup_none_keeps_a_jobs_config_hash_and_html_decides_the_rows():
    base = {"name": "j", "input": {"path": "x"}, "models": {"small": "s", "large": "l"}, "output": {"path": "o"}}
    plain = JobConfig.model_validate(base)
    marked = JobConfig.model_validate({**base, "input": {"path": "x", "markup": "html"}})
    assert "input.markup" not in decisive_settings(plain) and decisive_settings(marked)["input.markup"] == "html"


def test_the_stage_writes_each_page_or_an_error_naming_where_it_broke(saved_tiny_pair):
    small, large = saved_tiny_pair
    pages = ["<p>Ein <b>Hund</b> läuft.</p>", "<p>Ein <b>Hund</p>", "<script>x = 1;</script>",
             "<p>Die Sonne &amp; der <i>Mond</i>.</p>" * 2]
    records = pa.table({"id": [f"r{i}" for i in range(4)], "text": pages, "reference": [None] * 4,
                        "input_error": [None] * 4})
    spec = DecodeStageSpec(models=ModelSpec(small, large, device="cpu"),
                           points=(("large", DecodingConfig(method="large", max_new_tokens=8)),), prompt=None,
                           job_name="t", config_hash="h", markup="html")
    rows = DecodeStage(spec)(records).to_pylist()
    assert rows[1]["error"] == "input.markup html: </p> at line 1, column 15 closes no open <p> (<b> is open)"
    assert rows[2]["error"] is None and rows[2]["prediction"] == pages[2] and rows[2]["segments"] == 0
    for row in (rows[0], rows[3]):
        assert row["error"] is None
        html_events(row["prediction"])  # it parses
    assert rows[0]["prediction"].count("<b>") == rows[0]["prediction"].count("</b>") == 1
    assert rows[3]["prediction"].count("<i>") == rows[3]["prediction"].count("</i>") == 2
    assert rows[3]["prediction"].count("&amp;") == 2
    assert rows[3]["segments"] == 4  # per paragraph: its sentence, and its inline element's text


def test_an_inline_elements_own_decode_has_a_small_budget_and_flags_nothing_of_the_page():
    from pipeline.decoding.stats import DecodeStats, GenerationResult
    from pipeline.io.segments import join_results

    page = parse_page("<p>Ein <b>Hund</b> läuft.</p>", "html")
    assert page.sentences == ("Ein Hund läuft.", "Hund") and page.auxiliary == (False, True)
    assert page.budgets[0] is None and page.budgets[1] < 10  # one word: a few tokens, not max_new_tokens

    def result(text, loops):
        return GenerationResult(prediction=text, error=None, method="large", stats=DecodeStats(output_tokens=3),
                                stopped_by_budget=loops, repetition=loops, unknown_tokens=int(loops))

    joined = join_results(page, [result("A dog runs.", False), result("dog dog dog dog", True)], "large")
    assert (joined.stopped_by_budget, joined.repetition, joined.unknown_tokens) == (False, False, 0)
    assert joined.stats.output_tokens == 6  # the work is counted all the same


MARKDOWN = ("# Hunde *im* Park #\n\n> Ein **Hund** läuft über die [Wiese](/wiese \"Die Wiese\").\n\n"
            "- Tom und `ls -la` spielen ![Foto](/a.jpg) mit <b>x</b>\n1. Eine _Katze_ schläft.\n\n"
            "```js\nrender(\"*Hund*\");\n```\n\n    eingerückter Code\n")


def test_markdown_keeps_its_markers_fences_and_code_and_places_its_emphasis():
    sample = pq.read_table(REPO / "data/markup_sample/markdown.parquet").column("markdown").to_pylist()
    for page in [MARKDOWN, *sample[:10]]:
        parsed = parse_page(page, "markdown")
        assert parsed.join(list(parsed.sentences)) == page  # byte for byte where nothing is translated
    out = translated(MARKDOWN, "markdown", {"Ein Hund läuft über die Wiese.": "A dog runs across the meadow.",
                                            "Hund": "dog", "Wiese": "meadow", "Eine Katze schläft.": "A cat & a dog sleep.",
                                            "Katze": "Cat."})
    assert "> A **dog** runs across the [meadow](/wiese \"Die Wiese\").\n" in out
    assert "`ls -la`" in out and "![Foto](/a.jpg)" in out and "1. A _cat_ & a dog sleep.\n" in out  # Markdown's text is not HTML-escaped
    assert out.endswith("```js\nrender(\"*Hund*\");\n```\n\n    eingerückter Code\n")  # fenced and indented code kept
