"""The install-time build of the onnx engine's attention kernel; everything else about the package is in
pyproject.toml. decode_attention.c becomes a shared library beside attention_kernel.py, which loads it
with ctypes: it is named and built like an extension module (setuptools puts it in the wheel, and builds
it in place for `pip install -e .`), but nothing imports it. ``optional``: an install on a machine
without a C compiler still succeeds, and attention_kernel.py then builds the kernel at run time where
it can, or the engine keeps onnxruntime's attention."""

import ast
import hashlib
from pathlib import Path

from setuptools import Extension, setup

ENGINES = Path("pipeline/decoding/engines")
SOURCE = ENGINES / "decode_attention.c"


def kernel_flags() -> list[str]:
    """attention_kernel.FLAGS, read from its source: importing it needs numpy, which a build may not have."""
    for node in ast.parse((ENGINES / "attention_kernel.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "FLAGS" for target in node.targets):
            return list(ast.literal_eval(node.value))
    raise RuntimeError(f"no FLAGS in {ENGINES / 'attention_kernel.py'}")


def source_digest() -> str:
    """The C string literal of decode_attention.c's sha256: the library carries it, and
    attention_kernel.py loads an installed library only where it matches the source beside it."""
    return '"' + hashlib.sha256(SOURCE.read_bytes()).hexdigest() + '"'


# The flags come after Python's own CFLAGS (setuptools' order), so ours decide where both name one.
kernel = Extension("pipeline.decoding.engines._decode_attention", sources=[str(SOURCE)], libraries=["m"],
                   extra_compile_args=kernel_flags(), define_macros=[("SOURCE_DIGEST", source_digest())],
                   optional=True)

setup(ext_modules=[kernel])
