"""How long the multi-node test's job takes with a worker node killed mid-job and without, alternating.

    python scripts/node_loss_timing.py --rounds 2

The job of tests/pipeline/test_multinode.py (three Ray nodes on this machine, 600 records at batch 1 on the tiny
T5 pair, local output), run by that test's own helper with and without the kill, in turn; prints each run's
seconds, whether a node was killed, its error rows and records decoded.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "pipeline"), str(ROOT)]

from pipeline.pairs.tiny import save_pair  # noqa: E402
from support.jobs import make_job  # noqa: E402
from support.shards import write_parquet_shards  # noqa: E402
from test_multinode import run_on_a_cluster  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp())
    small, large = save_pair(root / "pair", "t5", small="noisy")
    write_parquet_shards(str(root / "in"), 600, 8, {})
    job = make_job((str(small), str(large)), root / "in", root / "out", decoding={"max_new_tokens": 32},
                   compute={"actors": 2, "batch_size": 1}, output={"mode": "overwrite", "rows_per_file": 8})
    for _ in range(args.rounds):
        for kill in (False, True):
            found = run_on_a_cluster(job, kill=kill)
            print(json.dumps({"kill": kill, "seconds": round(found["seconds"], 1), "killed": bool(found["killed"]),
                              "errors": found["summary"]["errors_now"], "decoded": found["summary"]["decoded_now"]}),
                  flush=True)


if __name__ == "__main__":
    main()
