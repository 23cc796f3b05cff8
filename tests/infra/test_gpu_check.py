"""`make gpu-check`'s script runs end to end here, on the CPU with tiny random pairs, and writes its table."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import REPO



@pytest.mark.slow
def test_the_gpu_check_runs_on_the_cpu_and_writes_its_table(tmp_path):
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--device", "cpu", "--quick",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["device_tests"]["passed"] and "passed" in report["device_tests"]["summary"]
    assert [pair["pair"] for pair in report["pairs"]] == ["demo", "t5", "nllb"]
    for pair in report["pairs"]:
        engines = pair["bench"]["engines"]
        assert engines["identical_records"] == engines["records"]  # float32: the engines agree exactly
        assert all(row["identical_to_b1"] for row in pair["bench_batch"]["rows"])
    table = (tmp_path / "gpu_check.md").read_text()
    assert table.count("\n| ") == 4 and "demo pair" in table and "Device tests" in table
