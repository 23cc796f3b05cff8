"""Python as the lent GPU machine has it: the packages of ours it lacks cannot be imported.

On PYTHONPATH, this file is imported at every interpreter's start-up (subprocesses too), so a test
can run scripts/gpu_check.py as it runs there (device/KINDS.md: the machine's python3 has torch,
transformers, pyarrow, sacrebleu, click, pytest, onnx, onnxruntime, ... and no ray, pydantic,
polars, s3fs, rouge-score, ctranslate2 or moto).
"""

import importlib.abc
import sys

ABSENT = {"ray", "pydantic", "pydantic_core", "polars", "s3fs", "rouge_score", "ctranslate2", "moto"}


class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r} (absent on the GPU machine)", name=name)
        return None


sys.meta_path.insert(0, _Absent())
