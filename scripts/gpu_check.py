"""The GPU check: one command for a machine with an NVIDIA GPU, nothing to download but packages.

    make gpu-check                                          # CUDA torch (make setup), then this script
    python scripts/gpu_check.py --device cpu --quick --out runs/gpu-check-cpu   # the same code on the CPU (CI)

1. the device tests (``pytest -m gpu tests/decoding/test_gpu.py`` with BILD_TEST_DEVICE set): the native and
   the Hugging Face engine on the device in bfloat16 and float16;
2. ``bench`` (batch 1, with --compare-engines) and ``bench-batch`` (batch 1, 8, 32) on the demo
   pair and on random pairs at T5-small/T5-large and NLLB-200 600M/3.3B shapes
   (pipeline/pairs/random_shapes.py; --quick: tiny random T5 and NLLB-architecture pairs instead);
3. one Markdown table and the whole JSON into --out: gpu_check.md, gpu_check.json.

Sized to finish within 10 minutes on one GPU; it prints the time each stage took.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.bench.batch import run_batch_bench  # noqa: E402
from pipeline.bench.methods import run_bench  # noqa: E402
from pipeline.decoding import DecodingConfig, ModelPair  # noqa: E402
from pipeline.decoding.models import resolve_device  # noqa: E402

PAIRS = ("demo", "t5", "nllb")


def demo_sentences(count: int) -> tuple[list[str], list[str]]:
    import pyarrow.parquet as pq

    table = pq.read_table(ROOT / "data" / "multi30k_sample" / "test_2016_flickr.parquet")
    return table.column("de").to_pylist()[:count], table.column("en").to_pylist()[:count]


def load_pair(name: str, device: torch.device, dtype: torch.dtype, quick: bool) -> tuple[ModelPair, str]:
    """(pair, what it is): the shipped demo pair, or random weights at real or (quick) tiny shapes."""
    if name == "demo":
        models = ROOT / "models" / "demo-de-en"
        pair = ModelPair.from_pretrained(str(models / "small-aligned"), str(models / "large"), device=str(device),
                                         dtype=dtype)
        return pair, "demo pair (T5, 6/1 and 6/12 layers, d 256)"
    if quick:
        from pipeline.pairs.tiny import build_pair

        small, large, tokenizer = build_pair(name, small="noisy")
        described = f"tiny random {name} pair (quick)"
    else:
        from pipeline.pairs.random_shapes import shaped_pair

        small, large, tokenizer = shaped_pair(name, device=str(device), dtype=dtype)
        described = {"t5": "random T5-small / T5-large shapes", "nllb": "random NLLB-200 600M / 3.3B shapes"}[name]
    return ModelPair(small.to(device, dtype), large.to(device, dtype), tokenizer, device), described


def device_tests(device: torch.device) -> dict:
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                          "tests/decoding/test_gpu.py"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "BILD_TEST_DEVICE": str(device)})
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    return {"passed": run.returncode == 0, "summary": lines[-1] if lines else run.stderr[-500:],
            "seconds": time.perf_counter() - started}


def measure(name: str, device: torch.device, dtype: torch.dtype, quick: bool) -> dict:
    started = time.perf_counter()
    pair, described = load_pair(name, device, dtype, quick)
    texts, references = demo_sentences(8 if quick else 32)
    config = DecodingConfig(method="bild", max_new_tokens=16 if quick else 32, fallback_threshold=0.4,
                            rollback_threshold=1.0)
    references = references if name == "demo" else None
    bench = run_bench(pair, texts[: 4 if quick else 8], references, config, repeats=1, with_projection=False,
                      with_engines=True)
    batch = run_batch_bench(pair, texts, references, config, methods=("large", "bild"),
                            batch_sizes=(1, 4) if quick else (1, 8, 32), verify_shares=(1.0,), repeats=1)
    del pair
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"pair": name, "described": described, "bench": bench, "bench_batch": batch,
            "seconds": time.perf_counter() - started}


def table_row(result: dict) -> str:
    methods = {row["method"]: row for row in result["bench"]["methods"]}
    engines = result["bench"].get("engines", {})
    cells = {row["cell"]: row for row in result["bench_batch"]["rows"]}
    batched = [f"B={row['batch_size']} {row['ratio_vs_large_same_b']:.2f}x" for row in result["bench_batch"]["rows"]
               if row["method"] == "bild" and row["path"] == "batch"]
    step = engines.get("step_speed_native_over_hf", {})
    return " | ".join([
        result["described"], result["bench"]["dtype"], result["bench"]["engine"],
        f"{methods['large']['tokens_per_s']:.0f}", f"{methods['bild']['speedup_vs_large']:.2f}x",
        f"{methods['speculative']['speedup_vs_large']:.2f}x", f"{1 / methods['hf_generate']['speedup_vs_large']:.2f}x",
        f"{step.get('large', float('nan')):.2f}x / {step.get('verify_5', float('nan')):.2f}x",
        f"{engines.get('identical_records', '-')}/{engines.get('records', '-')}", ", ".join(batched),
        "yes" if all(row["identical_to_b1"] for row in cells.values()) else "NO", f"{result['seconds']:.0f} s"])


def render(report: dict) -> str:
    tests = report["device_tests"]
    lines = [f"# GPU check: {report['device_name']}", "",
             f"device {report['device']}, dtype {report['dtype']}, torch {report['torch']}, "
             f"transformers {report.get('transformers')}, {report['date']}; "
             f"{'quick (tiny random pairs)' if report['quick'] else 'full'}; total {report['seconds']:.0f} s", "",
             f"Device tests (`pytest -m gpu`): {'passed' if tests['passed'] else 'FAILED'} — {tests['summary']}", "",
             "| pair | dtype | engine | our `large` tokens/s (B=1) | `bild` vs `large` (B=1) | `speculative` vs `large` "
             "| ours vs HF generate | native vs hf: step / 5-draft verification | same tokens native/hf "
             "| batched `bild` vs batched `large` | batched = batch 1 | time |",
             "|" + "---|" * 12]
    lines += ["| " + table_row(result) + " |" for result in report["pairs"]]
    return "\n".join(lines) + "\n"


def check_transformers() -> str:
    """The installed transformers' version, or exit naming the fix when pyproject.toml's range excludes
    it (the lent GPU machine's own has been read as 5.17, whose cache API our engines do not speak)."""
    import re

    import transformers
    from packaging.requirements import Requirement

    # The dependency line itself, e.g. "transformers>=5.24,<6" (tomllib is Python 3.11+; we support 3.10).
    wanted = Requirement(re.search(r'"(transformers[<>=!~,.0-9 ]+)"', (ROOT / "pyproject.toml").read_text())[1])
    if transformers.__version__ not in wanted.specifier:
        sys.exit(f"transformers {transformers.__version__} is outside {wanted.specifier}, the range the engines are "
                 "tested with: carry the wheelhouse (make gpu-wheels here; docs/benchmarking.md, 'On the lent GPU "
                 "machine') and put it first on PYTHONPATH")
    return transformers.__version__


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/gpu-check")
    parser.add_argument("--device", default="auto", help="auto (cuda where present), cuda, cpu ...")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on a GPU, float32 on the CPU")
    parser.add_argument("--quick", action="store_true", help="tiny random pairs instead of real shapes (CI, CPU)")
    parser.add_argument("--pairs", default=",".join(PAIRS))
    args = parser.parse_args()
    started = time.perf_counter()
    transformers_version = check_transformers()
    device = resolve_device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    torch.set_num_threads(1 if device.type == "cpu" else torch.get_num_threads())
    report = {"device": str(device), "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__,
              "transformers": transformers_version,
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "quick": args.quick}
    report["device_tests"] = device_tests(device)
    print(f"device tests: {report['device_tests']['summary']} ({report['device_tests']['seconds']:.0f} s)", flush=True)
    report["pairs"] = []
    for name in args.pairs.split(","):
        report["pairs"].append(measure(name, device, dtype, args.quick))
        print(f"{name}: {report['pairs'][-1]['seconds']:.0f} s", flush=True)
    report["seconds"] = time.perf_counter() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "gpu_check.md").write_text(render(report))
    print(render(report))
    sys.exit(0 if report["device_tests"]["passed"] else 1)


if __name__ == "__main__":
    main()
