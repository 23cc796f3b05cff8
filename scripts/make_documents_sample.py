"""Build data/documents_sample/multi30k_documents.parquet: documents of 2-8 Multi30k sentences (offline, shipped).

    python scripts/make_documents_sample.py [--source data/multi30k_sample/test_2016_flickr.parquet]

The input of jobs/documents.yaml (input.segment: sentence). Takes the demo sample's German-English
sentence pairs in order and joins runs of 2-8 of them (lengths drawn with a fixed seed) into documents:
German source `de`, its English reference `en` joined the same way, `sentences` how many were joined.
Every third document of four or more sentences is two paragraphs (a blank line after its first half,
in source and reference alike). A sentence without final punctuation (8 of the 300) gets a full stop,
in both languages, so that the document's sentence boundaries are the sample's. Deterministic:
rerunning gives the same bytes.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
SHORTEST, LONGEST = 2, 8


def ended(sentence: str) -> str:
    sentence = sentence.strip()
    return sentence if sentence[-1:] in ".!?" else sentence + "."


def join(sentences: list[str], paragraph_after: int | None) -> str:
    if paragraph_after is None:
        return " ".join(sentences)
    return " ".join(sentences[:paragraph_after]) + "\n\n" + " ".join(sentences[paragraph_after:])


def documents(pairs: list[dict], seed: int = 0) -> pa.Table:
    rng = random.Random(seed)
    rows, start = [], 0
    while len(pairs) - start >= SHORTEST:
        count = min(rng.randint(SHORTEST, LONGEST), len(pairs) - start)
        if len(pairs) - start - count == 1:  # no one-sentence document at the end
            count += 1 if count < LONGEST else -1
        chunk = pairs[start : start + count]
        number = len(rows)
        paragraph_after = count // 2 if count >= 4 and number % 3 == 2 else None
        rows.append({"id": f"doc-{number:03d}",
                     "de": join([ended(pair["de"]) for pair in chunk], paragraph_after),
                     "en": join([ended(pair["en"]) for pair in chunk], paragraph_after),
                     "sentences": count, "first_sentence": chunk[0]["id"]})
        start += count
    return pa.Table.from_pylist(rows, schema=pa.schema([("id", pa.string()), ("de", pa.string()), ("en", pa.string()),
                                                       ("sentences", pa.int32()), ("first_sentence", pa.string())]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default=str(ROOT / "data" / "multi30k_sample" / "test_2016_flickr.parquet"))
    parser.add_argument("--out", default=str(ROOT / "data" / "documents_sample" / "multi30k_documents.parquet"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    table = documents(pq.read_table(args.source).to_pylist(), args.seed)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, args.out, compression="zstd")
    print(f"wrote {args.out}: {table.num_rows} documents of {sum(table['sentences'].to_pylist())} sentences")


if __name__ == "__main__":
    main()
