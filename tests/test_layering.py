"""DESIGN.md §3: pipeline/decoding is pure torch + transformers; pipeline/cluster leaves click to the CLI."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

FORBIDDEN = {"ray", "fsspec", "s3fs", "click"}
DECODING = Path(__file__).resolve().parents[1] / "pipeline" / "decoding"
CLUSTER = Path(__file__).resolve().parents[1] / "pipeline" / "cluster"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_decoding_sources_import_no_ray_fsspec_or_click():
    files = sorted(DECODING.glob("*.py"))
    assert files
    for path in files:
        assert not imported_modules(path) & FORBIDDEN, path.name
        # Anything it imports from the package must stay inside decoding.
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pipeline."):
                assert node.module.startswith("pipeline.decoding"), f"{path.name} imports {node.module}"


def test_importing_decoding_loads_none_of_them():
    """At run time too: importing every decoding module adds none of them to what torch and the
    transformers classes it uses already load (some transformers versions pull in click via httpx)."""
    modules = sorted(path.stem for path in DECODING.glob("*.py") if path.stem != "__init__")
    code = (
        "import sys, importlib, torch\n"
        "from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer,\n"
        "    DynamicCache, EncoderDecoderCache, PreTrainedModel, PreTrainedTokenizerBase)\n"
        f"forbidden = {sorted(FORBIDDEN)!r}\n"
        "before = {m for m in forbidden if m in sys.modules}\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module('pipeline.decoding.' + name)\n"
        "print(sorted(m for m in forbidden if m in sys.modules and m not in before))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_cluster_sources_import_no_click():
    """pipeline/cluster serves the command line and is not part of it: click stays in pipeline/cli."""
    files = sorted(CLUSTER.glob("*.py"))
    assert files
    for path in files:
        assert "click" not in imported_modules(path), path.name
