"""The report's section on input.language_check: how many records were confidently in another language than
input.language (and which), how many were already in input.target_language, and how many were returned
untranslated (skipped: language)."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from pipeline.io.language import CONFIDENT, base_code
from pipeline.jobs.run_rows import RunRows

LISTED_ROWS = 5  # the records report.md lists in another language, most confident first
TOP_LANGUAGES = 8  # the languages report.md names, most frequent first
COLUMNS = ["id", "prediction", "detected_language", "language_confidence", "skipped"]


def language_rows(rows: RunRows, job: dict) -> dict | None:
    """The counts and the listed rows; None where the run did not check languages."""
    inputs = job.get("input") or {}
    if inputs.get("language_check", "off") == "off" or "detected_language" not in rows.columns:
        return None
    language, target = base_code(inputs.get("language", "en")), inputs.get("target_language")
    languages, counts, listed = Counter(), Counter(), None
    for batch in rows.batches(COLUMNS, where=pads.field("detected_language").is_valid()):
        languages.update(dict(zip(*_value_counts(batch["detected_language"]))))
        counts["checked"] += batch.num_rows
        counts["skipped"] += batch.num_rows - batch["skipped"].null_count
        elsewhere = batch.filter(pc.and_(pc.not_equal(batch["detected_language"], language),
                                         pc.greater_equal(batch["language_confidence"], CONFIDENT)))
        counts["elsewhere"] += elsewhere.num_rows
        if target:
            counts["in_target"] += batch.filter(pc.and_(pc.equal(batch["detected_language"], base_code(target)),
                                                        pc.greater_equal(batch["language_confidence"],
                                                                         CONFIDENT))).num_rows
        both = elsewhere if listed is None else pa.concat_tables([listed, elsewhere])
        listed = both.take(pc.sort_indices(both, sort_keys=[("language_confidence", "descending"),
                                                            ("id", "ascending")])[:LISTED_ROWS])
    return {"mode": inputs["language_check"], "language": language, "target_language": target,
            "confidence_at_least": CONFIDENT, "rows_checked": counts["checked"], "elsewhere": counts["elsewhere"],
            "skipped": counts["skipped"], "in_target": counts["in_target"] if target else None,
            "languages": dict(languages.most_common(TOP_LANGUAGES)),
            "listed": [{"id": row["id"], "detected_language": row["detected_language"],
                        "language_confidence": round(row["language_confidence"], 3), "skipped": row["skipped"],
                        "text": " ".join((row["prediction"] or "").split())[:80]}
                       for row in (listed.to_pylist() if listed is not None else [])]}


def _value_counts(column) -> tuple[list, list]:
    counted = pc.value_counts(column)
    return counted.field("values").to_pylist(), counted.field("counts").to_pylist()


def render_languages(section: dict) -> str:
    """report.md's "Languages" section."""
    language, checked = section["language"], section["rows_checked"]
    lines = ["## Languages", "",
             f"input.language_check {section['mode']}: of the {checked} records checked, {section['elsewhere']} were "
             f"in another language than `{language}` (detected with a confidence of at least "
             f"{section['confidence_at_least']:g}); {section['skipped']} were returned untranslated (skipped: language)."]
    if section["target_language"]:
        lines[-1] += f" {section['in_target']} were already in `{section['target_language']}`."
    lines += ["", "Detected: " + ", ".join(f"`{code}` {n}" for code, n in section["languages"].items()) + "."]
    if section["listed"]:
        lines += ["", f"In another language ({len(section['listed'])} shown, the most confident first; the text is "
                      "the record's own where it was skipped, else its translation):", ""]
        lines += [f"- `{row['id']}` (`{row['detected_language']}`, {row['language_confidence']:.2f}"
                  f"{', skipped' if row['skipped'] else ''}): “{row['text']}”" for row in section["listed"]]
    return "\n".join(lines)
