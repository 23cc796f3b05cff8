"""Build data/cnn_dm_sample/test.parquet from the FRANK CNN/DailyMail test articles.

    python scripts/make_cnn_dm_sample.py [--source ../shared/data/cnndm_frank_test/frank_cnndm_test.jsonl]

Reads the 250 CNN/DailyMail test articles of the FRANK benchmark (see that folder's SOURCE.md),
keeps three columns -- id, article, highlights (the reference summary, FRANK's "bart_reference"
field, stored there as "reference") -- in the source's order, and writes one zstd-compressed
Parquet file. The source file's sha256 is checked against the one its SOURCE.md records, so the
output is reproducible.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT.parent / "shared" / "data" / "cnndm_frank_test" / "frank_cnndm_test.jsonl"
DEFAULT_OUTPUT = ROOT / "data" / "cnn_dm_sample" / "test.parquet"
SOURCE_SHA256 = "9eeda8b7339ff8cd8173cc7947b3eb032b8dd26ea1a7ee1c07ac1ac28bd09dc7"
SCHEMA = pa.schema([("id", pa.string()), ("article", pa.string()), ("highlights", pa.string())])


def read_source(path: Path) -> list[dict]:
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SOURCE_SHA256:
        raise SystemExit(f"{path}: sha256 {digest} differs from the one SOURCE.md records ({SOURCE_SHA256})")
    rows = []
    for line in data.decode("utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            rows.append({"id": record["id"], "article": record["article"], "highlights": record["reference"]})
    return rows


def to_table(rows: list[dict]) -> pa.Table:
    ids = [row["id"] for row in rows]
    if len(set(ids)) != len(ids):
        raise SystemExit("duplicate ids in the source")
    if any(not row["article"] or not row["highlights"] for row in rows):
        raise SystemExit("an empty article or reference in the source")
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    table = to_table(read_source(args.source))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, args.output, compression="zstd", compression_level=19)
    print(f"wrote {table.num_rows} records to {args.output} ({args.output.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
