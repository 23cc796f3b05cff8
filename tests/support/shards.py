"""Input shards for end-to-end jobs: a few German sentences as Parquet files on any fsspec URL."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io.storage import open_filesystem

SENTENCES = ["Ein Hund läuft.", "Zwei Männer spielen Fußball.", "Eine Frau liest ein Buch.",
             "Kinder bauen eine Sandburg.", "Ein Mann fährt Rad.", "Musiker spielen auf der Bühne."]


def write_parquet_shards(url: str, n_records: int, n_shards: int, storage_options: dict | None = None) -> list[str]:
    """`n_records` records (id, text, ref) in `n_shards` Parquet files under `url`; returns their ids."""
    fs, base = open_filesystem(url, storage_options)
    fs.makedirs(base, exist_ok=True)
    ids = [f"doc-{i}" for i in range(n_records)]
    per = -(-n_records // n_shards)
    for shard in range(n_shards):
        chunk = ids[shard * per: (shard + 1) * per]
        table = pa.table({"id": chunk, "text": [SENTENCES[int(i.split("-")[1]) % len(SENTENCES)] for i in chunk],
                          "ref": [f"reference {i}" for i in chunk]})
        with fs.open(f"{base}/shard-{shard:03d}.parquet", "wb") as handle:
            pq.write_table(table, handle)
    return ids
