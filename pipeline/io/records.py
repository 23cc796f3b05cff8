"""Input records in one normal form, whatever the file format.

Every input row becomes ``{"id", "text", "reference", "input_error"}``: ids are strings, text
and reference are strings or None, and ``input_error`` says why a row cannot be decoded (the
stage then writes an error row for it instead of decoding). Keeping bad values out of the
``text`` column keeps the Arrow schema stable across blocks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

RECORD_SCHEMA = pa.schema(
    [("id", pa.string()), ("text", pa.string()), ("reference", pa.string()), ("input_error", pa.string())]
)


def id_string(value: Any) -> str | None:
    """A raw id as the normal form's string; None for a missing or blank one."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 7.0 from a float column is the id "7"
    text = str(value)
    return text if text.strip() else None


def normalize(raw: dict, id_column: str, text_column: str, reference_column: str | None) -> dict:
    """One raw input row -> the normal form."""
    text = raw.get(text_column)
    error = None
    if text_column not in raw or text is None:
        error = f"missing text (column {text_column!r} is null or absent)"
        text = None
    elif not isinstance(text, str):
        error = f"input text must be a string, got {type(text).__name__}"
        text = None
    reference = raw.get(reference_column) if reference_column else None
    if reference is not None and not isinstance(reference, str):
        reference = str(reference)
    return {"id": id_string(raw.get(id_column)), "text": text, "reference": reference, "input_error": error}


def id_strings(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """id_string over a whole column, in Arrow where its type allows (strings, integers): a corpus of millions of
    ids never becomes Python objects. Other types (floats, booleans) go value by value."""
    import pyarrow.compute as pc

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_integer(column.type):
        return column.cast(pa.string())
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_null(column.type):
        column = column.cast(pa.string())
        return pc.if_else(pc.equal(pc.utf8_trim_whitespace(column), ""), pa.scalar(None, pa.string()), column)
    return pa.array([id_string(value) for value in column.to_pylist()], pa.string())


def _is_text(column: pa.Array | pa.ChunkedArray) -> bool:
    kind = column.type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)


def normalize_table(table: pa.Table, id_column: str, text_column: str, reference_column: str | None) -> pa.Table:
    """normalize over a block of rows, in Arrow where the text and reference columns hold strings (a corpus's
    usual case); row by row otherwise, so that every rule above holds for any column type."""
    import pyarrow.compute as pc

    names = table.column_names
    has_reference = reference_column is not None and reference_column in names
    if text_column not in names or not _is_text(table[text_column]) or (
            has_reference and not _is_text(table[reference_column])):
        rows = [normalize(raw, id_column, text_column, reference_column) for raw in table.to_pylist()]
        return pa.Table.from_pylist(rows, schema=RECORD_SCHEMA)
    count = table.num_rows
    ids = id_strings(table[id_column]) if id_column in names else pa.nulls(count, pa.string())
    text = table[text_column].cast(pa.string())
    missing = f"missing text (column {text_column!r} is null or absent)"
    error = pc.if_else(pc.is_null(text), pa.scalar(missing), pa.scalar(None, pa.string()))
    reference = table[reference_column].cast(pa.string()) if has_reference else pa.nulls(count, pa.string())
    return pa.table([ids, text, reference, error], schema=RECORD_SCHEMA)


def parse_jsonl(
    data: bytes, source: str, id_column: str, text_column: str, reference_column: str | None
) -> Iterator[dict]:
    """Records of one JSONL file. A line that is not valid UTF-8 or JSON becomes an error record;
    its id is recovered where the line can still be parsed, else it is ``<file>:<line number>``."""
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            raw, problem = _salvage(line), "invalid UTF-8 in the input line"
        except json.JSONDecodeError as exc:
            raw, problem = None, f"invalid JSON in the input line ({exc.msg})"
        else:
            problem = None if isinstance(raw, dict) else f"a JSONL line must be an object, got {type(raw).__name__}"
        if problem:
            record_id = id_string(raw.get(id_column)) if isinstance(raw, dict) else None
            yield {"id": record_id or f"{source}:{number}", "text": None, "reference": None, "input_error": problem}
            continue
        yield normalize(raw, id_column, text_column, reference_column)


def _salvage(line: bytes) -> dict | None:
    try:
        raw = json.loads(line.decode("utf-8", errors="replace"))
    except json.JSONDecodeError:
        return None
    return raw if isinstance(raw, dict) else None


def apply_prompt(prompt: str | None, text):
    """The text the models see: `text` inside the prompt template; an empty or non-string text stays as it is,
    so that its row fails as empty rather than decoding the template alone."""
    if prompt and isinstance(text, str) and text.strip():
        return prompt.format(text=text)
    return text
