"""The attention kernel ships compiled (issue 62): a wheel built from the repository carries
decode_attention.c's library (setup.py), and installed where no C compiler can build it at run time,
the onnx engine runs it. The wheel goes into a fresh venv that sees the dependencies this one has
installed but not its editable install of the repository, and everything runs outside the repository
with CC=/bin/false (attention_kernel.compiler() takes $CC first), so only the wheel's library can be
the kernel that runs."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support import REPO

from pipeline.decoding.engines import attention_kernel, onnx_engine

pytestmark = pytest.mark.slow

# What kernel() loaded, and from where, in the fresh venv (one line each).
WHERE = ("import pipeline; from pipeline.decoding.engines import attention_kernel as a; "
         "k = a.kernel(); print(pipeline.__file__); print(k and k.origin)")


def run(command: list, **options) -> subprocess.CompletedProcess:
    """``command``, its output in the failure's message where it fails."""
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=300, **options)
    assert done.returncode == 0, f"{command[:3]}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def built_wheel(folder: Path) -> Path:
    """A wheel of the package, built offline (this venv's setuptools) from a copy of what it ships: no
    library an editable install built in place, no build/ left from another build."""
    source = folder / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, source)
    shutil.copytree(REPO / "pipeline", source / "pipeline", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", folder / "dist",
         source])
    (wheel,) = (folder / "dist").glob("*.whl")
    return wheel


def fresh_venv(folder: Path) -> Path:
    """A venv's python whose sys.path ends with this venv's site-packages: a .pth file's plain path line
    is appended to sys.path, but the .pth files in that folder are not processed, so the editable
    install's (which puts the repository on sys.path) is not seen."""
    run([sys.executable, "-m", "venv", "--without-pip", folder])
    python = folder / "bin" / "python"
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
    ours = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    Path(site, "bild-dependencies.pth").write_text("\n".join(ours) + "\n")
    return python


def without_a_compiler(venv: Path) -> dict:
    """The environment of the fresh venv's commands: no run-time build, no path back to the repository,
    an embedded Ray of its own, the kernel on."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "VIRTUAL_ENV", "RAY_ADDRESS", "BILD_ATTENTION_KERNEL")}
    return {**env, "CC": "/bin/false", "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"}


def test_a_wheel_installed_without_a_compiler_runs_its_kernel(tmp_path):
    if attention_kernel.compiler() is None or shutil.which(attention_kernel.compiler()) is None:
        pytest.skip("no C compiler here to build the wheel's library with")
    wheel = built_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert any(name.startswith("pipeline/decoding/engines/_decode_attention.") for name in names), names

    venv = tmp_path / "venv"
    python = fresh_venv(venv)
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel])
    env, elsewhere = without_a_compiler(venv), tmp_path / "elsewhere"
    elsewhere.mkdir()
    imported, origin = run([python, "-c", WHERE], cwd=elsewhere, env=env).stdout.split()
    assert Path(imported).is_relative_to(venv) and not Path(imported).is_relative_to(REPO), imported
    assert origin == "installed"

    # The demo job on the onnx engine (int8), enough slots for the kernel, a few records, no baseline.
    output, limit = tmp_path / "out", 8
    demo = REPO / "models/demo-de-en"
    settings = {"input.limit": limit, "input.path": REPO / "data/multi30k_sample/test_2016_flickr.parquet",
                "models.small": demo / "small-aligned", "models.large": demo / "large", "models.engine": "onnx",
                "compute.actors": 1, "compute.batch_size": onnx_engine.KERNEL_FROM_SLOTS, "report.baseline": "null",
                "output.path": output}
    sets = [part for key, value in settings.items() for part in ("--set", f"{key}={value}")]
    run([venv / "bin" / "bild-pipeline", "run", REPO / "jobs/demo.yaml", *sets], cwd=elsewhere, env=env)
    rows = pq.read_table(glob.glob(str(output / "data" / "*.parquet"))).to_pylist()
    assert len(rows) == limit and {(row["engine"], row["attention"]) for row in rows} == {("onnx", "kernel")}
