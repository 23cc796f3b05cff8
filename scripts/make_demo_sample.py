"""Build data/multi30k_sample/test_2016_flickr.parquet: the demo job's input (offline, shipped).

    python scripts/make_demo_sample.py [--data ../shared/data/multi30k] [--count 300]

Takes the first COUNT sentence pairs of Multi30k's test_2016_flickr (German source, English
reference) and writes columns id, de, en. Deterministic: rerunning gives the same bytes.
The val input of the demo's threshold sweep (ids val-0000 ...) is built the same way:

    python scripts/make_demo_sample.py --split val --out runs/multi30k_val300.parquet
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--split", default="test_2016_flickr")
    parser.add_argument("--out", default=str(ROOT / "data" / "multi30k_sample" / "test_2016_flickr.parquet"))
    args = parser.parse_args()
    data = Path(args.data)
    german = (data / f"{args.split}.de").read_text(encoding="utf-8").splitlines()[: args.count]
    english = (data / f"{args.split}.en").read_text(encoding="utf-8").splitlines()[: args.count]
    assert len(german) == len(english) == args.count
    prefix = "flickr2016" if args.split == "test_2016_flickr" else args.split
    table = pa.table({"id": [f"{prefix}-{i:04d}" for i in range(args.count)], "de": german, "en": english})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, args.out, compression="zstd")
    print(f"wrote {args.out}: {table.num_rows} rows")


if __name__ == "__main__":
    main()
