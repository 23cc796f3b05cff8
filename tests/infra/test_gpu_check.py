"""`make gpu-check`'s script runs end to end here, on the CPU with tiny random pairs, and writes its table."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import REPO



@pytest.mark.slow
def test_the_gpu_check_runs_on_the_cpu_and_writes_its_table(tmp_path):
    """As on the lent GPU machine: from the checkout (PYTHONPATH=.), with none of the packages it lacks
    importable (support/gpu_machine/sitecustomize.py, inherited by the device tests' pytest too)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "support" / "gpu_machine"), str(REPO)])}
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--device", "cpu", "--quick",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["device_tests"]["passed"] and "passed" in report["device_tests"]["summary"]
    assert [pair["pair"] for pair in report["pairs"]] == ["demo", "t5", "nllb"]
    for pair in report["pairs"]:
        engines = pair["bench"]["engines"]
        assert engines["identical_records"] == engines["records"]  # float32: the engines agree exactly
        assert all(row["identical_to_b1"] for row in pair["bench_batch"]["rows"])
    assert "absent on the GPU machine" not in run.stderr
    table = (tmp_path / "gpu_check.md").read_text()
    assert table.count("\n| ") == 4 and "demo pair" in table and "Device tests" in table


def test_the_gpu_machine_stand_in_refuses_what_the_machine_lacks():
    """The stand-in would let a dependency on ray or pydantic through unnoticed if it refused nothing."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests" / "support" / "gpu_machine")}
    for module, importable in (("ray", False), ("pydantic", False), ("pyarrow", True), ("torch", True)):
        run = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, env=env)
        assert (run.returncode == 0) == importable, (module, run.stderr[-500:])


def test_the_gpu_check_stops_at_once_on_a_transformers_outside_our_range(monkeypatch):
    """The machine's own transformers (read as 5.17) decodes other tokens in the Hugging Face engine: the
    check names the wheelhouse instead of failing device tests one by one."""
    import runpy

    check = runpy.run_path(str(REPO / "scripts" / "gpu_check.py"))["check_transformers"]
    import transformers  # after the script's imports: a first import of transformers replaces its lazy module

    assert check() == transformers.__version__
    monkeypatch.setattr(transformers, "__version__", "5.17.0")
    with pytest.raises(SystemExit, match="make gpu-wheels"):
        check()
