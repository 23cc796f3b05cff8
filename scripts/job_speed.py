"""A job's methods side by side through the CLI: `bild-pipeline run` of the same job file with each method in
turn, rounds alternating (the first method first in odd rounds, last in even ones), at each batch size; each
run's decoding speed is its busy-time output tokens per second (run.json), its quality the report's BLEU.

    python scripts/job_speed.py jobs/demo.yaml --input runs/multi30k_test1000.parquet --batch-sizes 1,8,32 \\
        --methods bild,large --rounds 2

Prints, per batch size, each round's tokens/s and the ratio of each method to the last one (`large`), then the
median ratio and each method's BLEU. A job's own paired baseline is turned off: every run decodes its records
once, with its one method. What the job file sets otherwise (its preset, engine, actors) holds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CLI = [sys.executable, "-m", "pipeline.cli"]  # this Python's bild-pipeline


def run(job: str, method: str, batch_size: int, input_path: str, out: Path, extra: list[str]) -> dict:
    """One run of ``job`` with ``method`` at ``batch_size`` on ``input_path``: its summary and its BLEU."""
    sets = {"decoding.method": method, "compute.batch_size": batch_size, "input.path": input_path,
            "output.path": str(out), "output.mode": "overwrite", "report.baseline": "null"}
    command = [*CLI, "run", job] + [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
    subprocess.run(command + extra, check=True, stdout=subprocess.DEVNULL)
    summary = json.loads((out / "run.json").read_text())["attempts"][-1]["summary"]
    subprocess.run([*CLI, "report", str(out), "--out", str(out / "report")], check=True,
                   stdout=subprocess.DEVNULL)
    quality = json.loads((out / "report" / "summary.json").read_text())["quality"]
    return {"tokens_per_s": summary["decoding_tokens_per_second"], "bleu": quality.get("bleu"),
            "plain_step_share": summary.get("plain_step_share")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job")
    parser.add_argument("--input", required=True, help="The records to decode (input.path).")
    parser.add_argument("--methods", default="bild,large", help="Comma-separated; ratios are to the last one.")
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--set", dest="sets", action="append", default=[], help="More job overrides (KEY=VALUE).")
    args = parser.parse_args()
    methods = args.methods.split(",")
    extra = [arg for value in args.sets for arg in ("--set", value)]
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="job-speed-") as work:
        for batch in (int(size) for size in args.batch_sizes.split(",")):
            for number in range(args.rounds):
                order = methods if number % 2 == 0 else methods[::-1]
                for method in order:
                    found = run(args.job, method, batch, args.input, Path(work) / f"{method}-{batch}-{number}", extra)
                    results.setdefault(batch, {}).setdefault(method, []).append(found)
                    print(f"batch {batch}, round {number + 1}, {method}: {found['tokens_per_s']:.0f} tokens/s, "
                          f"bleu {found['bleu']:.2f}", file=sys.stderr)
    yardstick = methods[-1]
    print(f"| batch | method | tokens/s by round | over `{yardstick}` by round | median ratio | BLEU | plain steps |")
    print("|---|---|---|---|---|---|---|")
    for batch, by_method in results.items():
        for method, runs in by_method.items():
            ratios = [mine["tokens_per_s"] / theirs["tokens_per_s"] for mine, theirs in zip(runs, by_method[yardstick])]
            plain = runs[-1]["plain_step_share"]
            rates = ", ".join(f"{found['tokens_per_s']:.0f}" for found in runs)
            shown = ", ".join(f"{ratio:.3f}" for ratio in ratios)
            print(f"| {batch} | {method} | {rates} | {shown} | {statistics.median(ratios):.3f} | "
                  f"{runs[-1]['bleu']:.2f} | {'' if plain is None else f'{plain:.0%}'} |")


if __name__ == "__main__":
    main()
