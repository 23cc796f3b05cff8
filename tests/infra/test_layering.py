"""docs/design.md §3: imports point downwards only, and no module imports itself in a circle.

Every module of `pipeline` (lazy imports inside functions included) is read with `ast`; each one
belongs to the layer of the longest matching prefix in LAYERS, and may import its own layer or
one ranked below it.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

PACKAGE = REPO / "pipeline"

# (rank, layer, module prefixes), highest first. Layers of one rank (the tools) use the layers
# below them, never one another.
LAYERS = [
    (5, "cli", ["pipeline.cli"]),
    (4, "bench", ["pipeline.bench"]),
    (4, "cluster", ["pipeline.cluster"]),
    (4, "training", ["pipeline.training"]),
    (3, "jobs", ["pipeline.jobs"]),
    (2, "stage", ["pipeline.stage"]),
    (1, "io", ["pipeline.io"]),
    (0, "metrics", ["pipeline.metrics"]),
    (0, "models", ["pipeline.pairs"]),  # model pairs we build
    (-1, "decoding", ["pipeline.decoding"]),
    (-2, "row flags", ["pipeline.metrics.row_flags"]),  # what decoding flags in a row: a leaf, imports nothing
]
RANK = {layer: rank for rank, layer, _ in LAYERS}
FORBIDDEN_IN_DECODING = {"ray", "fsspec", "s3fs", "click"}
FORBIDDEN_IN_CLUSTER = {"click"}  # pipeline/cluster serves the command line and is not part of it


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str | None:
    found = [(len(prefix), layer) for _, layer, prefixes in LAYERS for prefix in prefixes
             if module == prefix or module.startswith(prefix + ".")]
    return max(found)[1] if found else None


def imports_of(path: Path, module: str, known: set[str]) -> set[str]:
    """The `pipeline` modules a file imports anywhere in it, relative imports resolved; `from
    package import name` counts as the submodule where `name` is one, else as the package."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level \
                else node.module
            for alias in node.names:
                child = f"{source}.{alias.name}"
                found.add(child if child in known else source)
    return {name for name in found if name in known}


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    paths = {module_name(path, package): path for path in package.rglob("*.py")}
    return {module: imports_of(path, module, set(paths)) - {module} for module, path in paths.items()}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for module, targets in sorted(graph.items()):
        layer = layer_of(module)
        for target in sorted(targets):
            target_layer = layer_of(target)
            if layer is None or target_layer is None:
                continue  # pipeline/__init__.py
            if target_layer != layer and RANK[target_layer] >= RANK[layer]:
                problems.append(f"{module} ({layer}) imports {target} ({target_layer})")
    return problems


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path (first module repeated at the end), or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target, path + [target])):
                return cycle
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module, [module])):
            return cycle
    return None


def test_every_module_belongs_to_a_layer():
    unplaced = [module for module in import_graph() if layer_of(module) is None and module != "pipeline"]
    assert not unplaced, f"add these to LAYERS: {unplaced}"


def test_imports_point_downwards_only():
    assert upward_imports(import_graph()) == []


def test_no_import_cycle():
    assert find_cycle(import_graph()) is None


# What to draft (drafting.py), what to keep (policies.py) and when (scheduler.py) are the decoding's, not a model's.
POLICY_MODULES = {"pipeline.decoding.policies", "pipeline.decoding.drafting", "pipeline.decoding.scheduler",
                  "pipeline.decoding.rules"}


def policy_imports_of_engines(graph: dict[str, set[str]]) -> list[str]:
    return [f"{module} imports {target}" for module, targets in sorted(graph.items())
            if module == "pipeline.decoding.engine" or module.startswith("pipeline.decoding.engines.")
            for target in sorted(targets & POLICY_MODULES)]


def test_engines_know_no_policy():
    assert policy_imports_of_engines(import_graph()) == []
    planted = {**import_graph(), "pipeline.decoding.engine": {"pipeline.decoding.policies"}}
    assert policy_imports_of_engines(planted) == ["pipeline.decoding.engine imports pipeline.decoding.policies"]


def test_the_checks_catch_a_planted_upward_import_and_a_planted_cycle():
    """The two checks above on the package's graph with one upward import, then one cycle, added."""
    graph = import_graph()
    graph["pipeline.decoding.stats"] = graph["pipeline.decoding.stats"] | {"pipeline.jobs.schema"}
    assert upward_imports(graph) == ["pipeline.decoding.stats (decoding) imports pipeline.jobs.schema (jobs)"]
    graph = import_graph()
    graph["pipeline.metrics.quality"] = graph["pipeline.metrics.quality"] | {"pipeline.metrics.summary"}
    graph["pipeline.metrics.summary"] = graph["pipeline.metrics.summary"] | {"pipeline.metrics.quality"}
    assert find_cycle(graph) in (["pipeline.metrics.quality", "pipeline.metrics.summary", "pipeline.metrics.quality"],
                                 ["pipeline.metrics.summary", "pipeline.metrics.quality", "pipeline.metrics.summary"])


def test_imports_are_read_from_source_including_lazy_and_relative_ones(tmp_path):
    package = tmp_path / "pipeline"
    (package / "decoding").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "decoding" / "__init__.py").write_text("")
    (package / "decoding" / "a.py").write_text("def f():\n    from pipeline.jobs import run\n")
    (package / "jobs").mkdir()
    (package / "jobs" / "__init__.py").write_text("")
    (package / "jobs" / "run.py").write_text("import pipeline.decoding.a\n")
    (package / "decoding" / "b.py").write_text("from ..jobs import run\nfrom . import a\n")
    graph = import_graph(package)
    assert graph["pipeline.decoding.a"] == {"pipeline.jobs.run"}
    assert graph["pipeline.decoding.b"] == {"pipeline.jobs.run", "pipeline.decoding.a"}
    assert upward_imports(graph) == ["pipeline.decoding.a (decoding) imports pipeline.jobs.run (jobs)",
                                     "pipeline.decoding.b (decoding) imports pipeline.jobs.run (jobs)"]
    assert find_cycle(graph) == ["pipeline.decoding.a", "pipeline.jobs.run", "pipeline.decoding.a"]


def third_party_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


DECODING_SOURCES = sorted((PACKAGE / "decoding").rglob("*.py"))  # the engines' sub-package included


@pytest.mark.parametrize("path", DECODING_SOURCES, ids=lambda p: str(p.relative_to(PACKAGE / "decoding")))
def test_decoding_sources_import_no_ray_fsspec_or_click(path):
    assert not third_party_imports(path) & FORBIDDEN_IN_DECODING


@pytest.mark.parametrize("path", sorted((PACKAGE / "cluster").glob("*.py")), ids=lambda p: p.name)
def test_cluster_sources_import_no_click(path):
    assert not third_party_imports(path) & FORBIDDEN_IN_CLUSTER


def test_importing_decoding_loads_none_of_them():
    """At run time too: importing every decoding module adds none of them to what torch and the
    transformers classes it uses already load (some transformers versions pull in click via httpx)."""
    modules = sorted(".".join(path.relative_to(PACKAGE / "decoding").with_suffix("").parts) for path in DECODING_SOURCES
                     if path.stem != "__init__")
    code = (
        "import sys, importlib, torch\n"
        "from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer,\n"
        "    DynamicCache, EncoderDecoderCache, PreTrainedModel, PreTrainedTokenizerBase)\n"
        f"forbidden = {sorted(FORBIDDEN_IN_DECODING)!r}\n"
        "before = {m for m in forbidden if m in sys.modules}\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module('pipeline.decoding.' + name)\n"
        "print(sorted(m for m in forbidden if m in sys.modules and m not in before))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_jobs_driver_loads_no_model_classes():
    """A job's driver (the `run` command, its pre-flight pair check, the stage it hands to Ray Data) reads configs
    and tokenizers only: transformers' model loading, which took 2.3 s of its 5.7 s before Ray started, is the
    actors' alone."""
    code = (
        "import sys\n"
        "import pipeline.cli.jobs, pipeline.jobs.run, pipeline.jobs.preflight, pipeline.stage\n"
        "from pipeline.decoding import IncompatiblePairError, check_pair\n"
        "check_pair('models/demo-de-en/small-aligned', 'models/demo-de-en/large')\n"
        "print(sorted(m for m in ('transformers.modeling_utils', 'pipeline.decoding.models') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout
