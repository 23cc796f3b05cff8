"""The onnx engine's own decode-step attention: decode_attention.c, compiled once per process with the
machine's C compiler and called through ctypes between the step's onnxruntime segments
(onnx_segments.py). Where no compiler works, ``kernel()`` is None and the engine keeps onnxruntime's
attention ops (one call per step)."""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

ATTENTIONS = ("onnxruntime", "kernel")  # an onnx engine's attention: onnxruntime's ops, or this kernel
SOURCE = Path(__file__).with_name("decode_attention.c")
# -march=native: the vector width of the machine that runs it (it is built where it runs);
# no -ffast-math: the sums keep the source's order, so a row's result never depends on the call.
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-std=c11")

_pointer, _int, _float = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_SELF_ARGS = (_pointer,) * 7 + (_int,) * 6 + (_float, _pointer, _pointer)
_CROSS_ARGS = (_pointer,) * 6 + (_int,) * 5 + (_float, _pointer, _pointer)


class DecodeAttention:
    """The compiled kernel's two entry points, bound to a step's arrays once: ``self_attention`` and
    ``cross_attention`` return a call without arguments (a step only refills the arrays). Row a of a
    step reads and writes the caches of slot ``slots[a]`` (each row its own slot)."""

    def __init__(self, library: ctypes.CDLL):
        self._self, self._cross = library.self_attention, library.cross_attention
        self._self.argtypes, self._self.restype = _SELF_ARGS, None
        self._cross.argtypes, self._cross.restype = _CROSS_ARGS, None

    def self_attention(self, qkv: np.ndarray, cache_k: np.ndarray, cache_v: np.ndarray, slots: np.ndarray,
                       positions: np.ndarray, counts: np.ndarray, bias: np.ndarray | None, scale: float,
                       out: np.ndarray):
        """qkv [A, W, 3 * H * dk]; cache_k, cache_v [slots, C, H, dk] (written in place); slots,
        positions, counts [A] int32; bias [A, H, W', C] or None; out [A, W, H * dk]."""
        _, capacity, heads, dk = cache_k.shape
        for array in (qkv, cache_k, cache_v, slots, positions, counts, out, *(() if bias is None else (bias,))):
            _check(array)
        scores = np.empty(heads * capacity, dtype=np.float32)
        return _bound(self._self, (qkv, cache_k, cache_v, slots, positions, counts, bias, scores, out),
                      _at(qkv), _at(cache_k), _at(cache_v), _at(slots), _at(positions), _at(counts),
                      None if bias is None else _at(bias), 0 if bias is None else bias.shape[2], len(slots),
                      qkv.shape[1], heads, dk, capacity, scale, _at(scores), _at(out))

    def cross_attention(self, query: np.ndarray, cross_k: np.ndarray, cross_v: np.ndarray, slots: np.ndarray,
                        lengths: np.ndarray, counts: np.ndarray, scale: float, out: np.ndarray):
        """query, out [A, W, H * dk]; cross_k, cross_v [slots, S, H, dk]; slots, counts [A] int32;
        lengths [slots] int32 (each slot's source length)."""
        _, sources, heads, dk = cross_k.shape
        for array in (query, cross_k, cross_v, slots, lengths, counts, out):
            _check(array)
        scores = np.empty(heads * max(sources, 1), dtype=np.float32)
        return _bound(self._cross, (query, cross_k, cross_v, slots, lengths, counts, scores, out),
                      _at(query), _at(cross_k), _at(cross_v), _at(slots), _at(lengths), _at(counts), len(slots),
                      query.shape[1], heads, dk, sources, scale, _at(scores), _at(out))


def _bound(function, arrays: tuple, *arguments):
    """function(*arguments) as a call with none; ``arrays``: what the pointers point into, kept alive."""

    def call():
        function(*arguments)

    call.arrays = arrays
    return call


def _at(array: np.ndarray) -> int:
    return array.ctypes.data


def _check(array: np.ndarray) -> None:
    if not array.flags.c_contiguous or array.dtype not in (np.float32, np.int32):
        raise ValueError(f"decode attention takes C-contiguous float32 or int32 arrays, got {array.dtype} "
                         f"(contiguous: {array.flags.c_contiguous})")


@functools.cache
def kernel() -> DecodeAttention | None:
    """The kernel, compiled on first use in this process (well under a second); None, logged once,
    where there is no C compiler or it fails (set BILD_ATTENTION_KERNEL=0 to skip it)."""
    if os.environ.get("BILD_ATTENTION_KERNEL", "1") == "0":
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler: the onnx engine keeps onnxruntime's attention ops")
        return None
    folder = tempfile.mkdtemp(prefix="bild-attention-")
    library = os.path.join(folder, "decode_attention.so")
    try:
        subprocess.run([compiler, *FLAGS, "-o", library, str(SOURCE), "-lm"], check=True, capture_output=True,
                       text=True, timeout=120)
        return DecodeAttention(ctypes.CDLL(library))
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", "") or error
        log.warning("the decode-attention kernel did not build (%s): the onnx engine keeps onnxruntime's "
                    "attention ops", str(detail).strip()[:500])
        return None
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the loaded library stays mapped
