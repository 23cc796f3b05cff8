"""Mirror a translation test split from the Hugging Face hub as flat Parquet: id, de, en.

    python scripts/mirror_translation_test.py wmt14   s3://YOUR-BUCKET/bild/data/wmt14_de_en/test/
    python scripts/mirror_translation_test.py iwslt17 s3://YOUR-BUCKET/bild/data/iwslt17_de_en/test/

The hub's Parquet for these datasets keeps each sentence pair in one nested ``translation`` column
({"de": ..., "en": ...}) and has no id column; a job needs flat text columns and unique ids. Ids
are the dataset name and the row's position (``wmt14-de-en-test-000000``), so they are stable for
as long as the source file is. Needs network access to the hub; the output may be any fsspec URL
(S3 credentials from the usual AWS environment variables). ``--source`` overrides the hub path
when the hub's layout changes.
"""

from __future__ import annotations

import argparse
import posixpath

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

SOURCES = {
    # name: (hub Parquet file or folder of the test split, id prefix)
    "wmt14": ("hf://datasets/wmt/wmt14/de-en/test-00000-of-00001.parquet", "wmt14-de-en-test"),
    "iwslt17": ("hf://datasets/IWSLT/iwslt2017@refs%2Fconvert%2Fparquet/iwslt2017-de-en/test/", "iwslt17-de-en-test"),
}


def flatten_translation(table: pa.Table, id_prefix: str, source: str = "de", target: str = "en") -> pa.Table:
    """``translation: struct<de, en>`` rows -> a table with columns id, <source>, <target>."""
    pairs = table.column("translation").combine_chunks()
    return pa.table(
        {
            "id": pa.array([f"{id_prefix}-{i:06d}" for i in range(table.num_rows)], pa.string()),
            source: pairs.field(source).cast(pa.string()),
            target: pairs.field(target).cast(pa.string()),
        }
    )


def read_split(url: str) -> pa.Table:
    fs, path = fsspec.core.url_to_fs(url)
    files = sorted(f for f in fs.find(path) if f.endswith(".parquet")) if fs.isdir(path) else [path]
    tables = []
    for name in files:
        with fs.open(name, "rb") as handle:
            tables.append(pq.read_table(handle, columns=["translation"]))
    return pa.concat_tables(tables)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", choices=sorted(SOURCES))
    parser.add_argument("output", help="folder (any fsspec URL) that receives test.parquet")
    parser.add_argument("--source", default=None, help="hub Parquet file or folder (default: the known path)")
    args = parser.parse_args()
    source, prefix = SOURCES[args.dataset]
    table = flatten_translation(read_split(args.source or source), prefix)
    fs, out = fsspec.core.url_to_fs(args.output)
    fs.makedirs(out, exist_ok=True)
    target = posixpath.join(out, "test.parquet")
    with fs.open(target, "wb") as handle:
        pq.write_table(table, handle, compression="zstd")
    print(f"wrote {table.num_rows} pairs to {args.output.rstrip('/')}/test.parquet")


if __name__ == "__main__":
    main()
